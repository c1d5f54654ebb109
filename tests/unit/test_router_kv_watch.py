"""router/kv/watch.py against stand-in workers (real gRPC on loopback, scripted KV event batches):
a gap makes the router resubscribe from its resume point, a worker without WatchKV is left to the
guess, a live stream feeds the index."""

from __future__ import annotations

import asyncio

from pdorch.local_stack.processes import free_port
from pdorch.local_stack.standin import StandinServer
from proto.pdorch.v1 import worker_pb2 as pb
from router.fleet.workers import WorkerPool
from router.kv.index import KVIndex
from router.kv.watch import KVWatcher


def _batch(seq: int, snapshot: bool = False, stored=(), epoch: str = "e1") -> pb.KVEventBatch:
    return pb.KVEventBatch(worker_id="w", epoch=epoch, seq=seq, snapshot=snapshot, l1_stored=list(stored),
                           page_size=16)


async def _until(cond, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _run(standin: StandinServer, check) -> None:
    async def main():
        pool = WorkerPool(3, 1.0, 10.0)
        pool.upsert("prefill", standin.address)
        index = KVIndex()
        watcher = KVWatcher(pool, index, page_size=16, stale_after_s=2.0)
        await watcher.start()
        try:
            await check(index, watcher)
        finally:
            await watcher.stop()
            await pool.close()
    asyncio.run(main())


def test_a_gap_makes_the_router_resubscribe_from_its_resume_point():
    s = StandinServer("prefill", free_port()).start()
    s.behavior.kv_script = [[_batch(1, snapshot=True, stored=["a"]), _batch(3, stored=["c"])],  # seq 2 lost
                            [_batch(2, stored=["b"]), _batch(3, stored=["c"])]]
    try:
        async def check(index, watcher):
            await _until(lambda: index.resume_point(s.address) == ("e1", 3))
            assert index.l1_runs(["a", "b", "c"], [s.address]) == {s.address: 3}
            subs = s.behavior.kv_subscriptions
            assert [(r.epoch, r.after_seq) for r in subs] == [("", 0), ("e1", 1)]
            assert subs[0].hash_scheme == "sha256-chain" and subs[0].page_size == 16
            st = watcher.streams[s.address]
            assert (st.resyncs, st.snapshots, st.state) == (1, 1, "live")
            assert index.is_live(s.address)
        _run(s, check)
    finally:
        s.stop()


def test_a_worker_without_watchkv_is_left_to_the_guess():
    s = StandinServer("prefill", free_port()).start()
    s.behavior.kv_events = False
    try:
        async def check(index, watcher):
            await _until(lambda: watcher.streams[s.address].state == "unsupported")
            assert not index.is_live(s.address)
        _run(s, check)
    finally:
        s.stop()


def test_a_silent_stream_goes_stale_and_is_subscribed_again():
    s = StandinServer("prefill", free_port()).start()
    s.behavior.kv_script = [[_batch(1, snapshot=True, stored=["a"])]]  # then silence: no heartbeat
    try:
        async def check(index, watcher):
            await _until(lambda: watcher.streams[s.address].state == "live")
            await _until(lambda: len(s.behavior.kv_subscriptions) == 2, timeout_s=10)  # 2 s silent -> again
            assert s.behavior.kv_subscriptions[1].epoch == "e1"
            await _until(lambda: watcher.streams[s.address].state == "live")  # the stand-in's own stream now
            assert watcher.streams[s.address].disconnects == 1
        _run(s, check)
    finally:
        s.stop()


class _HeldStream:
    """A WatchKV call whose batches the test hands over one at a time (`arrive`)."""

    def __init__(self):
        self.waiting: asyncio.Future | None = None
        self.cancelled = False

    def WatchKV(self, request):  # the worker's stub: the call itself
        return self

    def __aiter__(self):
        return self

    async def __anext__(self):
        self.waiting = asyncio.get_running_loop().create_future()
        return await self.waiting

    def arrive(self, batch) -> None:
        self.waiting.set_result(batch)

    def cancel(self) -> None:
        self.cancelled = True


def test_stop_ends_a_watch_whose_batch_arrives_in_the_same_loop_pass_as_the_cancel():
    """Python 3.11's asyncio.wait_for returns a result that completed in the loop pass that also
    delivered a cancel, and drops the cancel: the watch loop then went on for ever, stop() never
    returned, and a router's shutdown hung (seen once in a whole-suite run: a router that did not
    stop within 15 s). The batch and the cancel here come in exactly that order."""
    async def main():
        pool = WorkerPool(3, 1.0, 10.0)
        worker = pool.upsert("prefill", f"127.0.0.1:{free_port()}")
        stream = worker.stub = _HeldStream()
        watcher = KVWatcher(pool, KVIndex(), page_size=16, stale_after_s=30.0)
        await watcher.start()
        try:
            await _until(lambda: stream.waiting is not None)
            stream.arrive(_batch(1, snapshot=True, stored=["a"]))  # the batch is in, its reader not yet woken
            t0 = asyncio.get_running_loop().time()
            await watcher.stop(timeout_s=5.0)
            took = asyncio.get_running_loop().time() - t0
            assert not any(not t.done() for t in asyncio.all_tasks() if t.get_name().startswith("kv-watch")), \
                f"the watch went on after stop() ({took:.1f} s)"
            assert took < 1.0, f"stop() waited out its bound ({took:.1f} s): a cancelled watch did not end"
            assert stream.cancelled
        finally:
            await pool.close()
    asyncio.run(main())
