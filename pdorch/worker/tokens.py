"""The shared worker gRPC token (`grpc.token`), and how a rotation changes it without an outage.

    server   TokenCheck(rpc): a call must carry `authorization: Bearer <token>` of grpc.token or,
             during a rotation, grpc.previous_token; anything else is UNAUTHENTICATED before the
             handler runs.
    callers  CallerTokens(rpc): the token to send to each worker address: grpc.token first; a worker
             that refuses it (one not rolled yet) is sent grpc.previous_token from then on, and the
             other way round.

A rotation in two steps, each an ordinary rolling upgrade (docs/operations.md):

    step 0   token A                      every pod sends A, accepts A
    step 1   token B, previous_token A    new pods send B and accept A and B; to a pod of step 0
                                          (refuses B) they fall back to A; old pods send A: accepted
    step 2   token B                      new pods accept only B; every pod of step 1 sends B first

A caller learns a worker's answer on its first call there (the router's health check, the decode
worker's Info before its first Prefill to a prefill worker), so requests themselves are not refused.
Torch-free: the router uses it too.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable

import grpc

from pdorch.config import GrpcConfig

TOKEN_HEADER = "authorization"
UNAUTHENTICATED_DETAILS = "this worker requires the shared gRPC token (grpc.token)"


def bearer(token: str) -> str:
    return f"Bearer {token}"


def accepted_tokens(rpc: GrpcConfig) -> tuple[str, ...]:
    """grpc.token, then grpc.previous_token; () = no check. NOTE: without grpc.token there is no
    check at all, so a previous token alone never turns one on."""
    if not rpc.token:
        return ()
    return (rpc.token, rpc.previous_token) if rpc.previous_token and rpc.previous_token != rpc.token else (rpc.token,)


class TokenCheck(grpc.ServerInterceptor):
    """Rejects every call without an accepted token with UNAUTHENTICATED, before the handler runs.
    `on_refused(method)` counts refusals (a metric), e.g. `/pdorch.v1.PrefillService/Prefill`."""

    def __init__(self, tokens: tuple[str, ...], on_refused: Callable[[str], None] | None = None):
        self._expected = [bearer(t).encode() for t in tokens]
        self._on_refused = on_refused

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        got = str(next((v for k, v in handler_call_details.invocation_metadata or () if k == TOKEN_HEADER), ""))
        # NOTE: compare with every accepted token (no early exit): the time taken says nothing about which.
        ok = [hmac.compare_digest(got.encode(), want) for want in self._expected]
        if handler is None or any(ok):
            return handler
        if self._on_refused is not None:
            self._on_refused(handler_call_details.method)
        return _rejecting(handler)


def _deny(request, context):
    context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_DETAILS)


def _rejecting(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` (so the request still decodes) that only refuses."""
    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[(handler.request_streaming, handler.response_streaming)]
    return make(_deny, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


class CallerTokens:
    """Which accepted token to send to each worker address. Thread-safe; one per caller process part
    (the router's pool, a decode worker's prefill client) so every channel to a worker agrees."""

    def __init__(self, rpc: GrpcConfig):
        self.tokens = accepted_tokens(rpc)
        self._chosen: dict[str, str] = {}  # address -> the token it took last (absent: grpc.token)
        self._lock = threading.Lock()

    @property
    def rotating(self) -> bool:
        """Two tokens: a worker may refuse the first and take the other."""
        return len(self.tokens) > 1

    def token(self, address: str) -> str:
        """The token to send to `address` ("" = none)."""
        if not self.tokens:
            return ""
        with self._lock:
            return self._chosen.get(address, self.tokens[0])

    def authorization(self, address: str) -> str:
        token = self.token(address)
        return bearer(token) if token else ""

    def refused(self, address: str, sent: str) -> bool:
        """`address` answered UNAUTHENTICATED to `sent`: send it the other token from now on. True
        when there is one (the call is worth repeating once with it)."""
        others = [t for t in self.tokens if t != sent]
        if not others:
            return False
        with self._lock:
            self._chosen[address] = others[0]
        return True
