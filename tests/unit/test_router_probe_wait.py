"""router/dispatch/dispatch.py: a retry waits for the failed pair's probes at most PROBE_WAIT_S, however
long the request's own deadline (a probe that never ends must not hold the request)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from router.dispatch import dispatch
from router.dispatch.dispatch import Dispatcher


def test_a_probe_that_never_ends_holds_a_retry_only_probe_wait_s(monkeypatch):
    monkeypatch.setattr(dispatch, "PROBE_WAIT_S", 0.2)

    async def never(p, d, error):
        await asyncio.Event().wait()

    async def main() -> float:
        fake = SimpleNamespace(_probes=set(), _blame=never)
        job = SimpleNamespace(remaining_s=lambda: 600.0)
        t0 = time.monotonic()
        await Dispatcher._charge(fake, "p", "d", "UNAVAILABLE", job, final=False)
        waited = time.monotonic() - t0
        for task in fake._probes:
            task.cancel()
        return waited

    assert 0.15 < asyncio.run(main()) < 5.0  # 600 s before the cap
