"""The RPCs both worker services share (Abort, Flush, Info, Stats): one servicer base class.

A worker passed in must offer `abort(request_id) -> bool`, `flush() -> int`, `info()` and
`stats()`. The role's servicer subclasses this and adds its own request RPC; the generated
`add_*Servicer_to_server` only needs the method names.
"""

from __future__ import annotations

from pdorch.worker_errors import grpc_errors
from proto.pdorch.v1 import worker_pb2 as pb


class WorkerServicer:
    def __init__(self, worker):
        self._worker = worker

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
