"""bench/multiturn/{conversation,metrics,presets}.py: what a conversation sends and its ideal, counter
deltas from Prometheus text, and the preset sizes, on fixed inputs computed by hand."""

from __future__ import annotations

import dataclasses

from bench.multiturn.conversation import Conversation
from bench.multiturn.metrics import counters, delta, parse_prometheus
from bench.multiturn.presets import Workload, final_working_set_pages, preset_overrides, working_set_pages
from pdorch.config import Config


class FakeTurns:
    """Turn r of client c: ids 1000*c + 100*r + i."""

    def turn(self, client, round_index, n):
        ids = [1000 * client + 100 * round_index + i for i in range(n)]
        return ids, " ".join(map(str, ids))


def test_sglang_conversation_sends_everything_so_far_and_its_ideal():
    conv = Conversation(client=1, api="sglang", tokenizer=None, turns=FakeTurns(), page_size=4, first_tokens=6,
                        turn_tokens=5)
    p0 = conv.next_prompt(0)
    assert p0.ids == [1000, 1001, 1002, 1003, 1004, 1005] and p0.ideal_tokens == 0 and p0.previous_context_pages == 0
    conv.record_answer([7, 8, 9], "", 3, "length")
    p1 = conv.next_prompt(1)
    # 6 prompt + 3 answer + 5 turn = 14 tokens; KV of 6 + 3 - 1 = 8 tokens -> 2 pages = 8 tokens
    assert p1.ids == p0.ids + [7, 8, 9] + [1100, 1101, 1102, 1103, 1104]
    assert p1.ideal_tokens == 8 and p1.previous_context_pages == 2
    conv.record_answer([5, 5], "", 2, "length")
    p2 = conv.next_prompt(2)
    # 14 + 2 + 5 = 21 tokens; KV of 14 + 2 - 1 = 15 tokens -> 3 pages = 12 tokens
    assert len(p2.ids) == 21 and p2.ideal_tokens == 12 and p2.previous_context_pages == 3


def test_a_failed_request_leaves_the_prompt_as_context():
    conv = Conversation(0, "sglang", None, FakeTurns(), page_size=4, first_tokens=9, turn_tokens=3)
    conv.next_prompt(0)
    conv.record_answer([], "", 0, None)
    p1 = conv.next_prompt(1)
    # 9 prompt tokens had their KV computed -> 2 pages = 8 tokens
    assert len(p1.ids) == 12 and p1.ideal_tokens == 8


PROM = """# HELP pdorch_store_pages_read_total Pages loaded
# TYPE pdorch_store_pages_read_total counter
pdorch_store_pages_read_total 12.0
pdorch_store_pages_written_total 30.0
pdorch_store_save_dropped_pages_total{reason="cancelled"} 5.0
pdorch_store_miss_pages_total{op="load",reason="absent"} 7.0
pdorch_store_miss_pages_total{op="match",reason="absent"} 100.0
pdorch_prefill_prompt_tokens_total{source="computed"} 300.0
pdorch_prefill_prompt_tokens_total{source="store"} 64.0
pdorch_decode_prompt_tokens_total{source="computed"} 316.0
pdorch_decode_prompt_tokens_total{source="store"} 80.0
pdorch_prefill_transfer_bytes_total 4096.0
pdorch_decode_prompt_plans_total{where="prefill",reason="long_tail"} 3.0
pdorch_decode_prompt_plans_total{where="local",reason="short_tail"} 2.0
"""


def test_counters_sum_workers_and_read_the_master():
    worker = parse_prometheus(PROM)
    assert ("pdorch_store_miss_pages_total", {"op": "load", "reason": "absent"}, 7.0) in worker
    master = parse_prometheus("master_evicted_key_count 4\nmaster_total_capacity_bytes 1024\n")
    c = counters([worker, None, worker], master)  # a worker that did not answer counts nothing
    assert c["store_pages_read"] == 24 and c["store_pages_written"] == 60 and c["store_pages_evicted"] == 4
    assert c["store_save_dropped_pages"] == {"cancelled": 10.0}
    assert c["store_load_miss_pages"] == {"absent": 14.0}          # op="match" misses are not loads
    # the decode workers' split: it includes requests no prefill worker saw (316 - 300 computed here)
    assert c["tiers"] == {"computed": 632.0, "store": 160.0}
    assert c["transfer_bytes"] == 8192 and c["prompt_plans"] == {"prefill": 6.0, "local": 4.0}
    assert counters([worker], None)["store_pages_evicted"] is None


def test_delta_of_nested_counters():
    before = {"read": 10, "dropped": {"cancelled": 2}, "evicted": None}
    after = {"read": 25, "dropped": {"cancelled": 5, "queue_full": 1}, "evicted": 3}
    assert delta(before, after) == {"read": 15, "dropped": {"cancelled": 3, "queue_full": 1}, "evicted": None}


def _cfg(**decode):
    c = Config()
    return dataclasses.replace(c, decode=dataclasses.replace(c.decode, **decode))


def test_preset_sizes_by_hand():
    # 2 clients x 3 rounds, 30-token turns, 10-token answers, page 16:
    #   prompt(r) = 30 + 40 r; context(r) = prompt(r) + 10 -> 40, 80, 120 tokens
    w = Workload(clients=2, rounds=3, first_tokens=30, turn_tokens=30, output_tokens=10)
    assert [working_set_pages(w, r, 16) for r in range(3)] == [0, 2 * 2, 2 * 4]   # (40-1)//16, (80-1)//16
    assert final_working_set_pages(w, 16) == 2 * 8                                # ceil(120 / 16)
    cfg = _cfg(kv_watermark=0.5)
    sets = dict(s.split("=", 1) for s in preset_overrides("full", w, cfg, kv_values_per_token=1024))
    # page = 1024 values x 16 tokens x 4 bytes = 65536 B; final 16 pages = 1 MiB; half of it over
    # 2 segments (P and D with offload) = 0.25 MiB -> the 16 MiB floor
    assert sets["store.global_segment_size_mb"] == "16"
    # full L1: one longest prompt + a margin: ceil(110 / 16) + 16 = 23
    assert sets["prefill.num_pages"] == "23"
    l3 = dict(s.split("=", 1) for s in preset_overrides("l3", w, cfg, kv_values_per_token=1024))
    # l3 L1: max(2 x ceil(110 / 16) + 16 = 30, (4 + 8) // 2 = 6) = 30
    assert l3["prefill.num_pages"] == "30"
    # decode: ceil(2 clients x ceil((110 + 10 + 1) / 16) = 16 pages / 0.5 watermark) + 16 = 48
    assert sets["decode.num_pages"] == "48"
    fits = dict(s.split("=", 1) for s in preset_overrides("fits", w, cfg, 1024))
    # 16 final pages + 2 clients x (ceil(40 / 16) + 2 = 5) + 16 = 42
    assert fits["prefill.num_pages"] == "42" and "store.global_segment_size_mb" not in fits
    assert preset_overrides("none", w, cfg, 1024) == []
    assert preset_overrides("sglang", w, cfg, 1024) == ["decode.prefill_timeout_s=600"]  # the default sizes


def test_the_ssd_preset_gives_dram_a_third_and_the_rest_to_the_ssd_tier():
    # 8 clients x 6 rounds, 128-token turns, 32-token answers, page 16: context(5) = 128 + 5 x 160 + 32
    # = 960 tokens = 60 pages a client, 480 pages in all; page = 1024 values x 16 x 4 B = 64 KiB, so
    # the final working set is 30 MiB; a third over 2 segments = 5 MiB -> the 16 MiB floor. With
    # 4096 values a token the pages are 256 KiB: 120 MiB, a third over 2 segments = 20 MiB.
    w = Workload(clients=8, rounds=6, first_tokens=128, turn_tokens=128, output_tokens=32)
    cfg = _cfg(kv_watermark=0.5)
    small = dict(s.split("=", 1) for s in preset_overrides("ssd", w, cfg, 1024, ssd_dir="/tmp/x"))
    assert small["store.global_segment_size_mb"] == "16" and small["store.ssd_path"] == "/tmp/x"
    assert small["decode.prefix_cache"] == "false"  # else D's pool would hold the whole working set
    assert (small["store.master_kv_lease_ttl_ms"], small["store.master_eviction_ratio"]) == ("1000", "0.2")
    big = dict(s.split("=", 1) for s in preset_overrides("ssd", w, cfg, 4096, ssd_dir="/tmp/x"))
    full = dict(s.split("=", 1) for s in preset_overrides("full", w, cfg, 4096))
    assert big["store.global_segment_size_mb"] == "20" and full["store.global_segment_size_mb"] == "30"
    assert big["prefill.num_pages"] == full["prefill.num_pages"] and "store.ssd_path" not in full
