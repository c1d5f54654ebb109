"""router/kv/index.py: the precise index built from KV event batches (real KVEventBatch protobufs)."""

from __future__ import annotations

from proto.pdorch.v1.worker_pb2 import KVEventBatch
from router.kv.index import KVIndex


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def snap(seq=1, epoch="e1", l1=(), store=(), queued=0, running=0, free=100):
    return KVEventBatch(worker_id="w", epoch=epoch, seq=seq, snapshot=True, l1_stored=list(l1),
                        store_written=list(store), queued_requests=queued, running_requests=running,
                        free_pages=free, page_size=16)


def delta(seq, epoch="e1", stored=(), removed=(), written=(), store_removed=(), queued=0, running=0):
    return KVEventBatch(worker_id="w", epoch=epoch, seq=seq, l1_stored=list(stored), l1_removed=list(removed),
                        store_written=list(written), store_removed=list(store_removed),
                        queued_requests=queued, running_requests=running, page_size=16)


def live(idx: KVIndex, addr: str, **kw) -> None:
    assert idx.apply(addr, snap(**kw)) == "snapshot"
    idx.set_live(addr, True)


def test_snapshot_then_in_order_deltas_apply_and_load_is_recorded():
    idx = KVIndex()
    assert idx.resume_point("a") == ("", 0)
    live(idx, "a", seq=7, l1=["h1", "h2"], queued=2, running=3)
    assert idx.resume_point("a") == ("e1", 7) and idx.load("a") == 5 and idx.is_live("a")
    assert idx.apply("a", delta(8, stored=["h3"], running=1)) == "applied"
    assert idx.l1_runs(["h1", "h2", "h3", "h4"]) == {"a": 3}
    assert idx.load("a") == 1 and idx.resume_point("a") == ("e1", 8)
    assert idx.apply("a", delta(9, removed=["h2"])) == "applied"
    assert idx.l1_runs(["h1", "h2", "h3"]) == {"a": 1}  # a hole ends the run


def test_a_delta_before_any_snapshot_is_a_gap_and_applies_nothing():
    idx = KVIndex()
    assert idx.apply("a", delta(1, stored=["h1"])) == "gap"
    assert idx.l1_runs(["h1"]) == {} and idx.resume_point("a") == ("", 0) and not idx.is_live("a")


def test_a_skipped_seq_is_a_gap_until_the_missed_batches_are_replayed():
    idx = KVIndex()
    live(idx, "a", seq=1, l1=["h1"])
    assert idx.apply("a", delta(3, stored=["h2"])) == "gap"
    assert idx.l1_runs(["h1", "h2"]) == {"a": 1} and not idx.is_live("a")
    assert idx.resume_point("a") == ("e1", 1)  # resubscribe from what was applied
    assert idx.apply("a", delta(2, stored=["h2"])) == "applied"  # the worker replays from 2
    assert idx.is_live("a") and idx.l1_runs(["h1", "h2"]) == {"a": 2}
    assert idx.apply("a", delta(2, stored=["zz"])) == "duplicate"  # replayed twice: ignored
    assert idx.l1_runs(["zz"]) == {} and idx.is_live("a")


def test_another_epoch_is_a_gap_and_its_snapshot_replaces_the_old_pages():
    idx = KVIndex()
    live(idx, "a", seq=5, l1=["h1", "h2"], store=["s1"])
    assert idx.apply("a", delta(1, epoch="e2", stored=["n1"])) == "gap"  # restarted worker
    assert not idx.is_live("a") and idx.resume_point("a") == ("e1", 5)
    assert idx.apply("a", snap(seq=1, epoch="e2")) == "snapshot"  # its answer to the resubscribe
    assert idx.l1_runs(["h1"]) == {} and idx.store_run(["s1"]) == 0
    assert idx.resume_point("a") == ("e2", 1) and idx.is_live("a")
    assert idx.apply("a", delta(2, epoch="e2", stored=["n1"])) == "applied"
    assert idx.l1_runs(["n1"]) == {"a": 1}


def test_stream_down_keeps_entries_but_the_worker_is_not_live():
    idx = KVIndex()
    live(idx, "a", l1=["h1"])
    idx.set_live("a", False)
    assert not idx.is_live("a") and idx.l1_runs(["h1"]) == {"a": 1}
    idx.set_live("a", True)
    assert idx.is_live("a")
    idx.set_live("b", True)  # up, but no snapshot yet
    assert not idx.is_live("b")


def test_speculative_entries_count_until_expiry_unless_confirmed():
    clock = Clock()
    idx = KVIndex(speculative_ttl_s=5.0, clock=clock)
    live(idx, "a", l1=["h1"])
    idx.speculate("a", ["h1", "h2", "h3"])  # h1 is already held: not speculative
    assert idx.l1_runs(["h1", "h2", "h3"]) == {"a": 3}
    assert idx.stats()["speculative_live"] == 2
    assert idx.apply("a", delta(2, stored=["h2"])) == "applied"  # the worker's event confirms h2
    clock.t += 5.0
    assert idx.l1_runs(["h1", "h2", "h3"]) == {"a": 2}  # h3 expired, h2 stays
    st = idx.stats()
    assert (st["speculative_live"], st["speculative_confirmed"], st["speculative_expired"]) == (0, 1, 1)
    assert idx.apply("a", delta(3, removed=["h2"])) == "applied"  # a confirmed page leaves like any other
    assert idx.l1_runs(["h1", "h2"]) == {"a": 1}


def test_a_repeated_guess_extends_the_speculation():
    clock = Clock()
    idx = KVIndex(speculative_ttl_s=5.0, clock=clock)
    idx.speculate("b", ["x"])  # a worker without a stream yet may be speculated on
    clock.t += 3.0
    idx.speculate("b", ["x"])
    clock.t += 3.0  # 6 s after the first guess, 3 s after the second
    assert idx.l1_runs(["x"]) == {"b": 1}
    clock.t += 2.0
    assert idx.l1_runs(["x"]) == {}
    assert idx.stats()["speculative_expired"] == 1


def test_a_guess_after_the_walk_of_the_same_prompt_adds_only_the_pages_past_the_held_run():
    clock = Clock()
    idx = KVIndex(speculative_ttl_s=5.0, clock=clock)
    live(idx, "a", l1=["p0"])
    live(idx, "b")
    idx.speculate("a", ["p0", "p1"])  # turn 1: p1 guessed until 105
    clock.t += 3.0
    turn2 = ["p0", "p1", "p2"]
    assert idx.longest_l1(turn2)[0] == 2
    idx.speculate("a", turn2)  # the walk found a holding p0, p1: only p2 is guessed (until 108)
    assert idx.stats()["speculative_live"] == 2
    clock.t += 3.0  # 106: p1's guess is over (no event confirmed it), p2's is not
    assert idx.l1_runs(turn2) == {"a": 1}
    assert idx.stats()["speculative_expired"] == 1

    # the same pages in another list, another worker, or an event in between: the whole prompt
    idx.speculate("a", list(turn2))
    assert idx.l1_runs(turn2) == {"a": 3}
    turn3 = ["p0", "p1", "p2", "p3"]
    assert idx.longest_l1(turn3) == (3, idx._mask(["a"]))
    idx.speculate("b", turn3)  # the choice went elsewhere: b holds nothing of it
    assert idx.l1_runs(turn3) == {"a": 3, "b": 4}
    assert idx.longest_l1(turn3)[0] == 4
    assert idx.apply("a", delta(2, removed=["p0"])) == "applied"
    idx.speculate("b", turn3)  # no skipped page: b's guesses of p0..p3 all renewed
    clock.t += 4.0  # past the first guesses of b, within the renewed ones
    assert idx.l1_runs(turn3)["b"] == 4


def test_a_guess_whose_pages_were_all_confirmed_expires_nothing():
    clock = Clock()
    idx = KVIndex(speculative_ttl_s=5.0, clock=clock)
    live(idx, "a")
    idx.speculate("a", ["h1", "h2"])
    assert idx.apply("a", delta(2, stored=["h1", "h2"])) == "applied"
    assert idx.apply("a", delta(3, removed=["h2"])) == "applied"
    clock.t += 6.0
    assert idx.l1_runs(["h1", "h2"]) == {"a": 1}
    st = idx.stats()
    assert (st["speculative_live"], st["speculative_confirmed"], st["speculative_expired"]) == (0, 2, 0)


def test_guesses_expire_as_a_model_of_per_page_expiries_says_under_random_guesses_and_events():
    import random

    rng = random.Random(7)
    clock = Clock()
    idx = KVIndex(speculative_ttl_s=5.0, clock=clock)
    pages = [f"h{i}" for i in range(12)]
    seq = {"a": 1, "b": 1}
    for a in seq:
        live(idx, a)
    held = {a: set() for a in seq}  # what each worker's events said its L1 holds
    guessed = {a: {} for a in seq}  # the model: page -> expiry of its last guess, until confirmed
    for _ in range(400):
        clock.t += rng.uniform(0, 2.0)
        a = rng.choice(list(seq))
        op = rng.random()
        if op < 0.5:
            hs = rng.sample(pages, rng.randint(1, 5))
            idx.speculate(a, hs)
            for h in hs:
                if h not in held[a]:
                    guessed[a][h] = clock.t + 5.0
        else:
            stored = rng.sample(pages, rng.randint(0, 3))
            removed = [h for h in rng.sample(pages, rng.randint(0, 3)) if h not in stored]
            seq[a] += 1
            assert idx.apply(a, delta(seq[a], stored=stored, removed=removed)) == "applied"
            for h in stored:
                if h not in held[a]:
                    guessed[a].pop(h, None)
            held[a] = (held[a] | set(stored)) - set(removed)
        for w in seq:
            guessed[w] = {h: e for h, e in guessed[w].items() if e > clock.t}
            want = held[w] | set(guessed[w])
            assert {h for h in pages if idx.l1_runs([h]).get(w)} == want
        assert idx.stats()["speculative_live"] == sum(len(g) for g in guessed.values())


def test_a_snapshot_keeps_live_speculation_and_confirms_what_it_holds():
    clock = Clock()
    idx = KVIndex(speculative_ttl_s=5.0, clock=clock)
    idx.speculate("a", ["h1", "h2"])
    live(idx, "a", l1=["h1"])
    assert idx.l1_runs(["h1", "h2"]) == {"a": 2}
    clock.t += 6.0
    assert idx.l1_runs(["h1", "h2"]) == {"a": 1}
    assert idx.stats()["speculative_confirmed"] == 1


def test_store_is_the_union_of_claims_and_any_workers_removal_removes_the_page():
    idx = KVIndex()
    live(idx, "a", store=["s1", "s2"])
    live(idx, "b", store=["s2", "s3"])
    assert idx.store_run(["s1", "s2", "s3", "s4"]) == 3
    assert idx.apply("b", delta(2, store_removed=["s1"])) == "applied"  # b's evictor removed a's page
    assert idx.store_run(["s1"]) == 0 and idx.store_run(["s2", "s3"]) == 2
    assert idx.apply("a", delta(2, written=["s1"])) == "applied"
    assert idx.store_run(["s1"]) == 1
    idx.drop_worker("a")  # its claims go; b's stay
    assert idx.store_run(["s1"]) == 0 and idx.store_run(["s2", "s3"]) == 2
    assert idx.stats()["store_pages"] == 2


def test_drop_worker_removes_its_pages_and_frees_its_slot():
    idx = KVIndex()
    live(idx, "a", l1=["h1", "h2"])
    live(idx, "b", l1=["h1", "h2", "h3"])
    idx.speculate("a", ["h3"])
    idx.drop_worker("a")
    assert idx.l1_runs(["h1", "h2", "h3"]) == {"b": 3}
    assert idx.resume_point("a") == ("", 0) and "a" not in idx.stats()["l1_pages"]
    live(idx, "c", l1=["h1"])  # takes a's slot: no stale bit of a's may show up as c
    assert idx.l1_runs(["h1", "h2", "h3"]) == {"b": 3, "c": 1}


def test_l1_runs_with_shared_prefixes_holes_and_restrictions():
    idx = KVIndex()
    live(idx, "a", l1=["p0", "p1", "a2", "a3"])
    live(idx, "b", l1=["p0", "p1", "b2"])
    live(idx, "c", l1=["p0", "p1", "a2", "a4"])  # holds a2 but not a3
    live(idx, "d", l1=["p1", "a2", "a3"])  # no p0: a hole at the start
    prompt = ["p0", "p1", "a2", "a3", "a5"]
    assert idx.l1_runs(prompt) == {"a": 4, "b": 2, "c": 3}
    assert idx.l1_runs(prompt, {"b", "c"}) == {"b": 2, "c": 3}
    assert idx.l1_runs(prompt, ["d"]) == {}
    assert idx.longest_l1(prompt) == (4, idx._mask(["a"]))
    run, mask = idx.longest_l1(["p0", "p1", "zz"])
    assert run == 2 and sorted(idx.addresses_of(mask)) == ["a", "b", "c"]
    assert idx.longest_l1(prompt, ["b", "c"]) == (3, idx._mask(["c"]))
    assert idx.l1_runs([]) == {} and idx.longest_l1(["zz"]) == (0, 0)


def test_a_page_losing_all_but_one_holder_is_still_matched():
    idx = KVIndex()
    live(idx, "a", l1=["h1", "h2"])
    live(idx, "b", l1=["h1", "h2"])
    assert idx.apply("a", delta(2, removed=["h1", "h2"])) == "applied"
    assert idx.l1_runs(["h1", "h2"]) == {"b": 2} and idx.longest_l1(["h1", "h2"]) == (2, idx._mask(["b"]))
    assert idx.apply("b", delta(2, removed=["h2"])) == "applied"
    assert idx.l1_runs(["h1", "h2"]) == {"b": 1}
    assert idx.stats()["l1_distinct_pages"] == 1


def test_stats_count_pages_and_estimate_memory_linearly():
    small, big = KVIndex(), KVIndex()
    for n, idx in ((1000, small), (4000, big)):
        for w in range(4):
            live(idx, f"w{w}", l1=[f"{w}-{i:060d}" for i in range(n)], store=[f"s{w}-{i:059d}" for i in range(n)])
    s, b = small.stats(), big.stats()
    assert s["l1_entries"] == 4000 and b["l1_pages"]["w0"] == 4000 and b["store_pages"] == 16000
    ratio = b["memory_bytes"] / s["memory_bytes"]
    assert 3.0 < ratio < 5.0, ratio
    assert 150 < b["memory_bytes"] / (b["l1_entries"] + b["store_pages"]) < 600


# --- claims: pages a prefill worker's request computes right now (prefill_node/inflight.py) ------------

def claims(seq, claimed=(), released=(), stored=(), epoch="e1", snapshot=False):
    return KVEventBatch(worker_id="w", epoch=epoch, seq=seq, snapshot=snapshot, inflight_claimed=list(claimed),
                        inflight_released=list(released), l1_stored=list(stored), page_size=16)


def test_a_claim_holds_its_pages_until_l1_confirms_them_or_it_is_released():
    from router.kv.index import CLAIM_TTL_S

    clock = Clock()
    idx = KVIndex(speculative_ttl_s=5.0, clock=clock)
    live(idx, "a")
    live(idx, "b")
    assert idx.apply("a", claims(2, claimed=["h1", "h2", "h3"])) == "applied"
    assert idx.l1_runs(["h1", "h2", "h3"]) == {"a": 3} and idx.claimed("a", "h3")
    clock.t += 10.0  # past a routing guess's TTL: a claim lasts until the worker ends it
    assert idx.l1_runs(["h1", "h2", "h3"]) == {"a": 3}
    # its request ended: h1, h2 computed (l1_stored, same batch), h3 never was
    assert idx.apply("a", claims(3, released=["h1", "h2", "h3"], stored=["h1", "h2"])) == "applied"
    assert idx.l1_runs(["h1", "h2", "h3"]) == {"a": 2} and not idx.claimed("a", "h1")
    # a claim never released (a lost stream) is forgotten after CLAIM_TTL_S; b's own page stays
    assert idx.apply("b", claims(2, claimed=["h9"])) == "applied"
    clock.t += CLAIM_TTL_S
    assert idx.l1_runs(["h9"]) == {}


def test_a_snapshot_replaces_the_claims():
    idx = KVIndex()
    live(idx, "a")
    assert idx.apply("a", claims(2, claimed=["h1", "h2"])) == "applied"
    assert idx.apply("a", claims(5, claimed=["h7"], snapshot=True)) == "snapshot"
    assert idx.l1_runs(["h1"]) == {} and idx.l1_runs(["h7"]) == {"a": 1} and idx.claimed("a", "h7")
