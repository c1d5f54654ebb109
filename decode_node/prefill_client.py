"""PrefillClient: D's side of the Prefill RPC, with a deadline and cancellation.

The call is made as a gRPC future so the handler can watch its own cancellation (Abort, or the
router going away) and cancel the call, which makes P abort and free its pages. gRPC status codes
from P become WorkerErrors with a message naming the prefill worker.

NOTE: a killed prefill process resets its TCP connections, so an in-flight call fails with
UNAVAILABLE within milliseconds; a hung one is bounded by the call's deadline
(decode.prefill_timeout_s, never more than the request's own remaining time).
"""

from __future__ import annotations

import threading

import grpc

from pdorch.worker_errors import Aborted, DeadlineExceeded, InvalidRequest, Overloaded, PeerFailed
from prefill_node import convert
from prefill_node.job import PrefillJob, PrefillResult
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc

CANCEL_CHECK_S = 0.05
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 3000),
    # Reconnect quickly to a restarted prefill worker instead of backing off for minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class PrefillClient:
    def __init__(self):
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, pb_grpc.PrefillServiceStub]] = {}

    def _stub(self, address: str) -> pb_grpc.PrefillServiceStub:
        with self._lock:
            if address not in self._stubs:
                channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                self._stubs[address] = (channel, pb_grpc.PrefillServiceStub(channel))
            return self._stubs[address][1]

    def prefill(self, address: str, job: PrefillJob, timeout_s: float, is_cancelled) -> PrefillResult:
        call = self._stub(address).Prefill.future(convert.job_to_proto(job), timeout=timeout_s)
        done = threading.Event()
        call.add_done_callback(lambda _: done.set())
        while not done.wait(CANCEL_CHECK_S):
            if is_cancelled():
                call.cancel()
                raise Aborted(f"request {job.request_id} cancelled during prefill")
        try:
            return convert.result_from_proto(call.result())
        except grpc.RpcError as e:
            raise _map_error(e, address, job.request_id, timeout_s) from None
        except grpc.FutureCancelledError:
            raise Aborted(f"request {job.request_id} cancelled during prefill") from None

    def close(self) -> None:
        with self._lock:
            for channel, _ in self._stubs.values():
                channel.close()
            self._stubs.clear()


def _map_error(e: grpc.RpcError, address: str, request_id: str, timeout_s: float) -> Exception:
    code, details = e.code(), e.details()
    where = f"prefill worker {address}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"{where} did not answer request {request_id} within {timeout_s:.1f}s")
    if code == grpc.StatusCode.CANCELLED:
        return Aborted(f"{where} cancelled request {request_id}: {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(f"{where} rejected request {request_id}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return Overloaded(f"{where} is overloaded: {details}")
    return PeerFailed(f"{where} failed request {request_id}: {code.name}: {details}")
