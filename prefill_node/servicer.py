"""gRPC PrefillService: thin transport over PrefillWorker; errors mapped by pdorch.worker_errors."""

from __future__ import annotations

from pdorch.worker_errors import grpc_errors
from pdorch.worker_rpc import WorkerServicer
from prefill_node import convert
from prefill_node.worker import PrefillWorker
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc


class PrefillServicer(WorkerServicer):
    """Prefill here; Abort, Flush, Info, Stats from WorkerServicer."""

    def Prefill(self, request, context):
        with grpc_errors(context, "Prefill"):
            job = convert.job_from_proto(request)
            # Fires when the RPC ends for any reason; after a success the abort is a no-op. When D
            # cancels (its client went away) or dies, this frees our pages at once.
            context.add_callback(lambda: self._worker.abort(job.request_id, wait=False))
            return convert.result_to_proto(self._worker.prefill(job))


def add_to_server(worker: PrefillWorker, server) -> None:
    pb_grpc.add_PrefillServiceServicer_to_server(PrefillServicer(worker), server)
