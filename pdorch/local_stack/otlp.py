"""An OTLP trace receiver for tests: OpenTelemetry's gRPC TraceService (opentelemetry-proto's stubs) served
by grpcio on a free port, keeping every span it is sent. Point `observability.otlp_endpoint` at `endpoint`."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
import time
from dataclasses import dataclass

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from pdorch.stop_signal import stop_on_signals, wait_for_stop


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    name: str
    service: str  # the resource's service.name
    instance: str  # the resource's service.instance.id
    start_ns: int
    end_ns: int
    attributes: dict
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, address: str = "127.0.0.1:0"):
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._server = grpc.server(concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="otlp"))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(address)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)

    def Export(self, request, context):
        received = []
        for rs in request.resource_spans:
            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    received.append(ReceivedSpan(
                        s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                        resource.get("service.name", ""), resource.get("service.instance.id", ""),
                        s.start_time_unix_nano, s.end_time_unix_nano, _attributes(s.attributes),
                        s.status.code, s.status.message))
        with self._lock:
            self._spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return sorted((s for s in self._spans if s.trace_id == trace_id), key=lambda s: s.start_ns)

    def wait_for(self, trace_id: str, names: set[str], timeout_s: float = 10.0) -> list[ReceivedSpan]:
        """The trace's spans once every name in `names` is among them (AssertionError after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans(trace_id)
            if names <= {s.name for s in spans} or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        missing = names - {s.name for s in spans}
        assert not missing, f"trace {trace_id}: no {sorted(missing)} within {timeout_s} s; got {spans}"
        return spans


def _attributes(kvs) -> dict:
    out = {}
    for kv in kvs:
        value = MessageToDict(kv.value)  # {"stringValue": ...} / {"intValue": "3"} / {"arrayValue": ...}
        (kind, v), = value.items() if value else (("stringValue", ""),)
        out[kv.key] = int(v) if kind == "intValue" else v if kind != "arrayValue" else json.dumps(v)
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m pdorch.local_stack.otlp --port N`: a receiver in a process of its own (bench/router_overhead/
    tracing.py), counting what it receives, until SIGTERM."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    receiver = OtlpReceiver(f"127.0.0.1:{args.port}").start()
    stop = stop_on_signals((signal.SIGTERM,))
    wait_for_stop(stop)
    receiver.stop()


if __name__ == "__main__":
    main()
