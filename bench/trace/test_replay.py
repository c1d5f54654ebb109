"""bench/trace/replay.py with a fake backend (answers after a set time): requests go out at their due
time whether or not earlier ones answered (open loop); a follower waits for the previous request of
its session and, carrying history, sends its prompt + answer + its own ids; a missing answer length
and a deadline are errors."""

from __future__ import annotations

import asyncio

from bench.multiturn.client import Reply
from bench.trace.plan import Planned
from bench.trace.replay import Replay
from bench.trace.request import TraceRequest


class FakeBackend:
    def __init__(self, seconds: dict[int, float], short: set[int] = frozenset()):
        self.seconds, self.short, self.prompts = seconds, short, {}

    async def send(self, prompt, output_tokens):
        self.prompts[prompt.client] = prompt.ids
        await asyncio.sleep(self.seconds.get(prompt.client, 0.0))
        n = output_tokens - (1 if prompt.client in self.short else 0)
        return Reply(output_ids=[100 + prompt.client] * n, prompt_tokens=len(prompt.ids), cached_tokens=0,
                     ttft_s=0.01, itl_s=[0.001] * (n - 1))


def item(index, due, previous=None, history=False, delay=0.0, out=2) -> Planned:
    req = TraceRequest(index=index, session="s", arrival_s=due, output_tokens=out, carries_history=history,
                       follows_previous=previous is not None)
    return Planned(req=req, due_s=due, delay_s=delay, previous=previous, output_tokens=out, estimate_s=due or 0.0)


def test_open_loop_followers_and_history():
    plan = [item(0, 0.0), item(1, 0.05), item(2, None, previous=0, history=True, delay=0.05)]
    backend = FakeBackend({0: 0.3, 1: 0.0})
    sent = asyncio.run(Replay(plan, [[1, 2], [3], None], [[1, 2], [3], [9]], backend, timeout_s=5.0).run())
    first, second, follower = sent
    assert second.sent_s < first.end_s        # not held back by the slow first answer
    assert follower.sent_s >= first.end_s + 0.05
    assert backend.prompts[2] == [1, 2, 100, 100, 9] and follower.prompt_ids == [1, 2, 100, 100, 9]
    assert all(s.error is None for s in sent) and first.first_token_s == first.sent_s + 0.01


def test_short_answers_and_deadlines_are_errors():
    plan = [item(0, 0.0), item(1, 0.0)]
    sent = asyncio.run(Replay(plan, [[1], [2]], [[1], [2]], FakeBackend({1: 2.0}, short={0}), timeout_s=0.2).run())
    assert sent[0].error == "1 output tokens, asked for 2"
    assert sent[1].error == "no answer within 0.2 s" and sent[1].end_s < 1.0
