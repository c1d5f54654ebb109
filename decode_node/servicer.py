"""gRPC DecodeService: thin transport over DecodeWorker; errors mapped by pdorch.worker_errors."""

from __future__ import annotations

from decode_node import convert
from decode_node.worker import DecodeWorker
from pdorch.worker_errors import grpc_errors
from proto.pdorch.v1 import worker_pb2 as pb
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc


class DecodeServicer(pb_grpc.DecodeServiceServicer):
    def __init__(self, worker: DecodeWorker):
        self._worker = worker

    def Generate(self, request, context):
        with grpc_errors(context, "Generate"):
            job = convert.job_from_proto(request)
            req = self._worker.create(job)
            # Client cancellation (router gone): abort here, which also cancels the call to P.
            context.add_callback(lambda: self._worker.abort(job.request_id))
            for event in self._worker.run(req, is_active=context.is_active):
                if event.error is not None:
                    raise event.error
                yield convert.event_to_proto(job.request_id, event, req.prompt_len, req.cached)

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


def add_to_server(worker: DecodeWorker, server) -> None:
    pb_grpc.add_DecodeServiceServicer_to_server(DecodeServicer(worker), server)
