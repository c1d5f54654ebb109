"""PrefillClient: D's side of the Prefill RPC, with a deadline and cancellation.

The call is made as a gRPC future so the handler can watch its own cancellation (Abort, or the
router going away) and cancel the call, which makes P abort and free its pages. gRPC status codes
from P become WorkerErrors with a message naming the prefill worker.

NOTE: a killed prefill process resets its TCP connections, so an in-flight call fails with
UNAVAILABLE within milliseconds; a hung one is bounded by the request's own deadline (the worker
passes its remaining time). P gets that time minus ANSWER_MARGIN_S, so at the deadline its own
answer (with `writes_over`, see decode_node/fence.py) usually arrives before D stops waiting.

Every error raised by `prefill()` carries `writes_over`: True only when P's answer said that no KV
write of the request into D's pages can land any more.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace

import grpc

from pdorch.config import GrpcConfig
from pdorch.worker import convert
from pdorch.worker.errors import Aborted, DeadlineExceeded, InvalidRequest, Overloaded, PeerFailed
from pdorch.worker.prefill_rpc import WRITES_OVER_KEY, PrefillJob, PrefillResult
from pdorch.worker.rpc import CallerTokens, client_channel
from proto.pdorch.v1 import worker_pb2 as pb
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc

CANCEL_CHECK_S = 0.05
ANSWER_MARGIN_S = 0.5  # P's deadline ends this much before ours (at most half the time left)
ABORT_TIMEOUT_S = 3.0
GONE_GRACE_S = 1.0  # after P's port refuses: lets a push of a P that was shutting down end  # one confirmation attempt (P's Abort waits up to 2 s for a running push)
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
    def __init__(self, rpc: GrpcConfig | None = None):
        self._rpc = rpc or GrpcConfig()  # the shared token and TLS of worker gRPC (config section grpc)
        self._tokens = CallerTokens(self._rpc)  # which token each P takes (rotation: pdorch/worker/tokens.py)
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, pb_grpc.PrefillServiceStub]] = {}

    def _stub(self, address: str) -> pb_grpc.PrefillServiceStub:
        with self._lock:
            if address not in self._stubs:
                channel = client_channel(address, self._rpc, options=CHANNEL_OPTIONS, tokens=self._tokens)
                self._stubs[address] = (channel, pb_grpc.PrefillServiceStub(channel))
                if self._tokens.rotating:
                    self._learn_token(address, self._stubs[address][1])
            return self._stubs[address][1]

    def _learn_token(self, address: str, stub: pb_grpc.PrefillServiceStub) -> None:
        """During a token rotation: ask P once (Info) which token it takes, so no Prefill is refused."""
        sent = self._tokens.token(address)
        try:
            stub.Info(pb.InfoRequest(), timeout=ABORT_TIMEOUT_S)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                self._tokens.refused(address, sent)

    def prefill(self, address: str, job: PrefillJob, timeout_s: float, is_cancelled, retried: bool = False
                ) -> PrefillResult:
        """Run `job` on P, waiting at most `timeout_s` (the request's remaining time)."""
        t0 = time.monotonic()
        asked = job
        job = replace(job, timeout_s=max(timeout_s - ANSWER_MARGIN_S, timeout_s / 2))
        sent = self._tokens.token(address)
        call = self._stub(address).Prefill.future(convert.job_to_proto(job), timeout=timeout_s)
        done = threading.Event()
        call.add_done_callback(lambda _: done.set())
        while not done.wait(CANCEL_CHECK_S):
            if is_cancelled():
                call.cancel()
                raise _unconfirmed(Aborted(f"request {job.request_id} cancelled during prefill"))
        try:
            return convert.result_from_proto(call.result())
        except grpc.RpcError as e:
            # NOTE: refused before P's handler ran (pdorch/worker/tokens.py): nothing to undo; once more
            # with the other token of a rotation (P restarted at the same address, say).
            if e.code() == grpc.StatusCode.UNAUTHENTICATED and not retried and self._tokens.refused(address, sent):
                return self.prefill(address, asked, timeout_s - (time.monotonic() - t0), is_cancelled, retried=True)
            err = _map_error(e, address, job.request_id, timeout_s)
            metadata = e.trailing_metadata() or ()
            err.writes_over = any(k == WRITES_OVER_KEY and v == "1" for k, v in metadata)  # type: ignore[attr-defined]
            raise err from None
        except grpc.FutureCancelledError:
            raise _unconfirmed(Aborted(f"request {job.request_id} cancelled during prefill")) from None

    def confirm_writes_over(self, address: str, request_id: str) -> str | None:
        """PageFence's question: "confirmed" when P's Abort answered (it returns once no push of the
        request runs), "peer_gone" when nothing listens on P's address any more, else None."""
        try:
            self._stub(address).Abort(pb.AbortRequest(request_id=request_id), timeout=ABORT_TIMEOUT_S)
            return "confirmed"
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE and _refused(address):
                return "peer_gone"
            return None

    def close(self) -> None:
        with self._lock:
            for channel, _ in self._stubs.values():
                channel.close()
            self._stubs.clear()


def _unconfirmed(err: Exception) -> Exception:
    err.writes_over = False  # type: ignore[attr-defined]  # read by PageFence through getattr
    return err


def _refused(address: str, timeout_s: float = 1.0) -> bool:
    """True when P's host actively refuses a connection to its port: P's process is gone.

    NOTE: refused, not merely unreachable: a partitioned or stopped P may still be writing, and a
    timeout says nothing. A dead process cannot write; its TCP streams were reset with it. (A P
    shutting down closes its port while a push may still run for a moment: the fence releases
    pages only after GONE_GRACE_S.)"""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return False
    except ConnectionRefusedError:
        time.sleep(GONE_GRACE_S)
        return True
    except OSError:
        return False


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
