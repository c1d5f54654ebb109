"""bench/trace/plan.py: whole sessions kept by a seeded draw, time compressed and shifted, outputs
scaled, the cuts, and requests that wait for the previous one of their session."""

from __future__ import annotations

from bench.trace.plan import PlanOptions, plan
from bench.trace.request import TraceRequest


def r(index, session, at, out=10, **kw) -> TraceRequest:
    return TraceRequest(index=index, session=session, arrival_s=at, output_tokens=out, blocks=(index,),
                        input_length=16, **kw)


def test_speedup_shifts_to_zero_and_orders_by_time():
    reqs = [r(0, "a", 20.0), r(1, "b", 10.0), r(2, "c", 12.0), r(3, "d", 12.0)]
    out = plan(reqs, PlanOptions(speedup=2.0))
    # (arrival - 10) / 2; equal times keep file order
    assert [(p.req.index, p.due_s) for p in out] == [(1, 0.0), (2, 1.0), (3, 1.0), (0, 5.0)]
    assert all(p.previous is None and p.delay_s == 0.0 for p in out)


def test_output_scale_rounds_and_keeps_at_least_one():
    reqs = [r(0, "a", 0.0, out=10), r(1, "a", 1.0, out=1), r(2, "a", 2.0, out=None), r(3, "a", 3.0, out=0)]
    out = plan(reqs, PlanOptions(output_scale=0.3, default_output_tokens=20))
    # 10 x 0.3 = 3; 1 x 0.3 -> 0 -> 1; none recorded: 20 x 0.3 = 6; 0 -> 1
    assert [p.output_tokens for p in out] == [3, 1, 6, 1]


def test_sessions_fraction_keeps_whole_sessions_the_same_way_each_time():
    reqs = [r(i, f"s{i % 100}", float(i)) for i in range(400)]
    kept = {p.req.session for p in plan(reqs, PlanOptions(sessions_fraction=0.5, seed=3))}
    again = {p.req.session for p in plan(reqs, PlanOptions(sessions_fraction=0.5, seed=3))}
    other = {p.req.session for p in plan(reqs, PlanOptions(sessions_fraction=0.5, seed=4))}
    assert kept == again and kept != other and 30 <= len(kept) <= 70
    out = plan(reqs, PlanOptions(sessions_fraction=0.5, seed=3))
    assert len(out) == 4 * len(kept)  # every request of a kept session, none of the others
    assert out[0].due_s == 0.0  # shifted to the first kept request


def test_duration_and_max_requests_cut():
    reqs = [r(i, f"s{i}", float(i)) for i in range(10)]
    assert [p.req.index for p in plan(reqs, PlanOptions(duration_s=3.0))] == [0, 1, 2, 3]
    assert [p.req.index for p in plan(reqs, PlanOptions(max_requests=2, speedup=0.5))] == [0, 1]


def test_followers_wait_for_the_previous_of_their_session():
    reqs = [r(0, "a", 1.0), TraceRequest(1, "a", None, 5, text="t2", delay_s=4.0, follows_previous=True,
                                         carries_history=True),
            r(2, "b", 2.0), TraceRequest(3, "a", 3.0, 5, text="t3", follows_previous=True)]
    out = plan(reqs, PlanOptions(speedup=2.0))
    # estimated due: 0 at 0; 1 after 0 + 4 / 2 = 2.0; 2 at 0.5; 3 at max(1.0, 2.0 + 0) = 2.0 (after 1)
    assert [p.req.index for p in out] == [0, 2, 1, 3]
    follower = out[2]
    assert follower.due_s is None and follower.delay_s == 2.0 and follower.previous == 0
    assert out[3].due_s == 1.0 and out[3].previous == 2  # waits for request 1 (position 2), due at 1.0 at least
    # a cut that drops request 1 drops the request that follows it too
    assert [p.req.index for p in plan(reqs, PlanOptions(speedup=2.0, duration_s=1.0))] == [0, 2]
