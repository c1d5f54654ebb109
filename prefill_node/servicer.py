"""gRPC PrefillService: thin transport over PrefillWorker; errors mapped by pdorch.worker.errors."""

from __future__ import annotations

from pdorch.tracing.grpc_server import current_trace_ctx
from pdorch.worker import convert
from pdorch.worker.errors import grpc_errors
from pdorch.worker.prefill_rpc import WRITES_OVER_KEY
from pdorch.worker.rpc import WorkerServicer
from prefill_node.worker import PrefillWorker
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc


class PrefillServicer(WorkerServicer):
    """Prefill here; Abort, Flush, Info, Stats from WorkerServicer."""

    def Prefill(self, request, context):
        task = None
        with grpc_errors(context, "Prefill"):
            try:
                job = convert.job_from_proto(request)
                task = self._worker.start(job, current_trace_ctx())
                # Fires when the RPC ends for any reason; after a success the cancel is a no-op. When D
                # cancels (its client went away) or dies, this frees our pages at once.
                # NOTE: registered after start(): an RPC already over (D cancelled before we got here)
                # returns False, and the task is cancelled before any push of it can start.
                if not context.add_callback(lambda: self._worker.cancel(task)):
                    self._worker.cancel(task)
                return convert.result_to_proto(self._worker.wait(task))
            finally:
                if task is None or task.push.writes_over:  # never queued, or its push is over
                    context.set_trailing_metadata(((WRITES_OVER_KEY, "1"),))


def add_to_server(worker: PrefillWorker, server) -> None:
    pb_grpc.add_PrefillServiceServicer_to_server(PrefillServicer(worker), server)
