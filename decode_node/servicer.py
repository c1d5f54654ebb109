"""gRPC DecodeService: thin transport over DecodeWorker; errors mapped by pdorch.worker.errors."""

from __future__ import annotations

from decode_node import convert
from decode_node.worker import DecodeWorker
from pdorch.tracing.grpc_server import current_trace_ctx
from pdorch.worker.errors import grpc_errors
from pdorch.worker.rpc import WorkerServicer
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc


class DecodeServicer(WorkerServicer):
    """Generate here; Abort, Flush, Info, Stats from WorkerServicer."""

    def Generate(self, request, context):
        with grpc_errors(context, "Generate"):
            job = convert.job_from_proto(request)
            req = self._worker.create(job, current_trace_ctx())
            # Client cancellation (router gone): abort here, which also cancels the call to P.
            context.add_callback(lambda: self._worker.abort(job.request_id))
            for event in self._worker.run(req, is_active=context.is_active):
                if event.error is not None:
                    raise event.error
                yield convert.event_to_proto(job.request_id, event, req.prompt_len, req.cached)


def add_to_server(worker: DecodeWorker, server) -> None:
    pb_grpc.add_DecodeServiceServicer_to_server(DecodeServicer(worker), server)
