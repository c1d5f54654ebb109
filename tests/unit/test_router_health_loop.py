"""router/fleet/workers.py: a worker removed while its health check is in flight (its channel closed under
the call) is not a reason for the health loop to stop. A real gRPC server whose Info is slow."""

from __future__ import annotations

import asyncio

import grpc

from proto.pdorch.v1 import worker_pb2, worker_pb2_grpc
from router.fleet.workers import WorkerPool


class SlowInfo(worker_pb2_grpc.DecodeServiceServicer):
    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.calls = 0

    async def Info(self, request, context):
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        return worker_pb2.WorkerInfo()


async def serve(servicer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    worker_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_a_worker_removed_during_its_health_check_leaves_the_health_loop_running():
    async def main() -> None:
        leaving, leaving_at = await serve(SlowInfo(0.5))
        staying_servicer = SlowInfo(0.0)
        staying, staying_at = await serve(staying_servicer)
        pool = WorkerPool(failure_threshold=1, cooldown_s=0.0, health_interval_s=0.2)
        try:
            pool.upsert("decode", leaving_at)
            pool.upsert("decode", staying_at)
            pool.start()
            await asyncio.sleep(0.3)  # the loop's first round: the leaving worker's Info is in flight
            await pool.remove("decode", leaving_at)
            before = staying_servicer.calls
            await asyncio.sleep(1.0)
            assert not pool._health_task.done(), "the health loop ended"
            assert staying_servicer.calls >= before + 3  # still checked every 0.2 s
        finally:
            await pool.close()
            await leaving.stop(None)
            await staying.stop(None)

    asyncio.run(main())
