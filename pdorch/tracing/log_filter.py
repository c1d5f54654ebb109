"""Every log line about a traced request names its trace: ` trace=<32 hex>` after the message.

The current span is the request's wherever its code runs: a worker's RPC interceptor attaches it to the
handler thread (grpc_server.py). The router, whose request spans are plain records until the response
is out (pdorch/tracing/deferred.py), sets `REQUEST_TRACE_ID` on the request's task instead (one
contextvar set, no OpenTelemetry context; router/http/hot_path.py). Installed
on the process's log handlers (`install_trace_ids`); lines outside any request get nothing added.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from opentelemetry import trace

REQUEST_TRACE_ID: ContextVar[int] = ContextVar("pdorch_request_trace_id", default=0)


class TraceIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        trace_id = REQUEST_TRACE_ID.get()
        if not trace_id:
            sc = trace.get_current_span().get_span_context()
            trace_id = sc.trace_id if sc.is_valid else 0
        record.trace = f" trace={trace_id:032x}" if trace_id else ""
        return True


def install_trace_ids(fmt: str) -> None:
    """The root logger's handlers add the trace (`%(trace)s` appended to `fmt`, the format they use)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(TraceIdFilter())
        handler.setFormatter(logging.Formatter(fmt + "%(trace)s"))
