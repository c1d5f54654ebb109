"""gRPC PrefillService: thin transport over PrefillWorker; errors mapped by pdorch.worker_errors."""

from __future__ import annotations

from pdorch.worker_errors import grpc_errors
from prefill_node import convert
from prefill_node.worker import PrefillWorker
from proto.pdorch.v1 import worker_pb2 as pb
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc


class PrefillServicer(pb_grpc.PrefillServiceServicer):
    def __init__(self, worker: PrefillWorker):
        self._worker = worker

    def Prefill(self, request, context):
        with grpc_errors(context, "Prefill"):
            job = convert.job_from_proto(request)
            # Fires when the RPC ends for any reason; after a success the abort is a no-op. When D
            # cancels (its client went away) or dies, this frees our pages at once.
            context.add_callback(lambda: self._worker.abort(job.request_id, wait=False))
            return convert.result_to_proto(self._worker.prefill(job))

    def Abort(self, request, context):
        with grpc_errors(context, "Abort"):
            return pb.AbortResponse(found=self._worker.abort(request.request_id))

    def Flush(self, request, context):
        with grpc_errors(context, "Flush"):
            return pb.FlushResponse(pages_freed=self._worker.flush())

    def Info(self, request, context):
        with grpc_errors(context, "Info"):
            return self._worker.info()

    def Stats(self, request, context):
        with grpc_errors(context, "Stats"):
            return self._worker.stats()


def add_to_server(worker: PrefillWorker, server) -> None:
    pb_grpc.add_PrefillServiceServicer_to_server(PrefillServicer(worker), server)
