"""bench/trace/generate.py: deterministic with a seed; sessions whose turns carry the previous one,
fan-out groups sharing one prefix evenly over their window; readable by the Mooncake reader."""

from __future__ import annotations

import itertools

from bench.trace.formats import read_trace
from bench.trace.generate import GenerateParams, generate, main

PARAMS = GenerateParams(seed=5, sessions=3, turns=3, system_prompts=2, system_blocks=2, first_blocks=3,
                        turn_blocks=2, answer_blocks=1, fanout_groups=2, fanout_width=4, fanout_prefix_blocks=5,
                        fanout_suffix_blocks=1, fanout_window_s=2.0, fanout_interval_s=30.0, fanout_start_s=1.0)


def test_deterministic_with_a_seed():
    assert generate(PARAMS) == generate(PARAMS)
    other = generate(GenerateParams(**{**PARAMS.__dict__, "seed": 6}))
    assert [r["timestamp"] for r in other] != [r["timestamp"] for r in generate(PARAMS)]


def test_sessions_and_fanout_shapes():
    recs = generate(PARAMS)
    assert [r["timestamp"] for r in recs] == sorted(r["timestamp"] for r in recs)
    assert all(r["input_length"] == len(r["hash_ids"]) * 512 for r in recs)
    sessions = {}
    for rec in recs:
        sessions.setdefault(rec["session_id"], []).append(rec)
    assert len(sessions) == 3 + 2
    for s in range(3):
        turns = sessions[f"session-{s}"]
        # system prompt s mod 2 (blocks 0-1 or 2-3) + 3 first blocks; each turn + 1 answer + 2 new blocks
        assert [len(t["hash_ids"]) for t in turns] == [5, 8, 11]
        assert turns[0]["hash_ids"][:2] == [2 * (s % 2), 2 * (s % 2) + 1]
        for prev, nxt in itertools.pairwise(turns):
            assert nxt["hash_ids"][:len(prev["hash_ids"])] == prev["hash_ids"]
            assert nxt["timestamp"] > prev["timestamp"]
    for g in range(2):
        group = sessions[f"fanout-{g}"]
        assert [m["timestamp"] for m in group] == [1000 + g * 30000 + m * 500 for m in range(4)]
        prefix = group[0]["hash_ids"][:7]  # system prompt (2) + the group's 5
        assert prefix[:2] == [2 * (g % 2), 2 * (g % 2) + 1]
        assert all(m["hash_ids"][:7] == prefix and len(m["hash_ids"]) == 8 for m in group)
        assert len({m["hash_ids"][7] for m in group}) == 4  # each member's own suffix
    # fresh blocks are never reused outside their session or group
    owners = {}
    for rec in recs:
        for b in rec["hash_ids"][2:]:
            owners.setdefault(b, set()).add(rec["session_id"])
    assert all(len(o) == 1 for o in owners.values())


def test_written_file_reads_back_as_mooncake(tmp_path):
    out = tmp_path / "g.jsonl"
    assert main([str(out), "--sessions", "2", "--turns", "2", "--fanout-groups", "1", "--fanout-width", "3"]) == 0
    fmt, reqs = read_trace(out)
    assert fmt == "mooncake" and len(reqs) == 2 * 2 + 3
    assert {r.session for r in reqs} == {"session-0", "session-1", "fanout-0"}
