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
