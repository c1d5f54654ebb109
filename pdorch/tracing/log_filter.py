"""Every log line about a traced request names its trace: ` trace=<32 hex>` after the message.

The current span is the request's wherever its code runs: the router attaches it to the request's task
(router/http/hot_path.py), a worker's RPC interceptor to the handler thread (grpc_server.py). Installed
on the process's log handlers (`install_trace_ids`); lines outside any request get nothing added.
"""

from __future__ import annotations

import logging

from opentelemetry import trace


class TraceIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        sc = trace.get_current_span().get_span_context()
        record.trace = f" trace={sc.trace_id:032x}" if sc.is_valid else ""
        return True


def install_trace_ids(fmt: str) -> None:
    """The root logger's handlers add the trace (`%(trace)s` appended to `fmt`, the format they use)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(TraceIdFilter())
        handler.setFormatter(logging.Formatter(fmt + "%(trace)s"))
