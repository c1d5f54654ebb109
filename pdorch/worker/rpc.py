"""The worker gRPC wire both ends share: the servicer base of both worker services, and the optional
shared token and TLS (`grpc.*` config keys) on the workers' servers and on their callers.

A worker passed to `WorkerServicer` must offer `abort(request_id) -> bool`, `flush() -> int`,
`info()` and `stats()`. The role's servicer subclasses it and adds its own request RPC; the
generated `add_*Servicer_to_server` only needs the method names.

    server side   grpc.server(..., interceptors=server_interceptors(rpc)); add_port(server, address, rpc)
    callers       client_channel(address, rpc, options)      sync, e.g. decode -> prefill
                  aio_channel(address, rpc, options)         grpc.aio, the router's Info / Flush / health
                  bearer(rpc.token), client_ssl_context(rpc) the router's lean Generate client

NOTE: the token travels as `authorization: Bearer <token>` metadata in every call; without TLS it is
readable on the network, so it keeps strangers out of a private network, no more (docs/operations.md).
No torch import here: the router uses these helpers too.
"""

from __future__ import annotations

import collections
import hmac
import ssl
from pathlib import Path

import grpc

from pdorch.config import GrpcConfig
from pdorch.worker.errors import grpc_errors
from proto.pdorch.v1 import worker_pb2 as pb

TOKEN_HEADER = "authorization"
UNAUTHENTICATED_DETAILS = "this worker requires the shared gRPC token (grpc.token)"


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


def bearer(token: str) -> str:
    return f"Bearer {token}"


def _read(path: str, key: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as e:
        raise ValueError(f"{key}: cannot read {path!r}: {e.strerror or e}") from None


# ---------------------------------------------------------------------------------------- server side
class TokenCheck(grpc.ServerInterceptor):
    """Rejects every call without the shared token with UNAUTHENTICATED, before the handler runs."""

    def __init__(self, token: str):
        self._expected = bearer(token).encode()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        got = next((v for k, v in handler_call_details.invocation_metadata or () if k == TOKEN_HEADER), "")
        if handler is None or hmac.compare_digest(str(got).encode(), self._expected):
            return handler
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


def server_interceptors(rpc: GrpcConfig) -> list[grpc.ServerInterceptor]:
    return [TokenCheck(rpc.token)] if rpc.token else []


def add_port(server: grpc.Server, address: str, rpc: GrpcConfig) -> int:
    """Listen on `address`, over TLS with grpc.tls; the bound port (0 = failed). ValueError names a
    missing or unreadable certificate key."""
    if not rpc.tls:
        return server.add_insecure_port(address)
    if not rpc.tls_cert or not rpc.tls_key:
        raise ValueError("grpc.tls is on: grpc.tls_cert and grpc.tls_key must name the worker's PEM files")
    creds = grpc.ssl_server_credentials([(_read(rpc.tls_key, "grpc.tls_key"), _read(rpc.tls_cert, "grpc.tls_cert"))])
    return server.add_secure_port(address, creds)


# ---------------------------------------------------------------------------------------------- callers
class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                           "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


def _with_token(metadata, token: str) -> list[tuple[str, str]]:
    return [*(metadata or ()), (TOKEN_HEADER, bearer(token))]


class _SendToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, token: str):
        self._token = token

    def _details(self, d):
        return _CallDetails(d.method, d.timeout, _with_token(d.metadata, self._token), d.credentials,
                            getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)


class _AioSendToken(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, token: str):
        self._token = token

    def _details(self, d):
        return grpc.aio.ClientCallDetails(d.method, d.timeout, _with_token(d.metadata, self._token),
                                          d.credentials, d.wait_for_ready)

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


def _tls_options(rpc: GrpcConfig, options) -> list:
    opts = list(options)
    if rpc.tls_server_name:
        opts.append(("grpc.ssl_target_name_override", rpc.tls_server_name))
    return opts


def _channel_credentials(rpc: GrpcConfig) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(_read(rpc.tls_ca, "grpc.tls_ca") if rpc.tls_ca else None)


def client_channel(address: str, rpc: GrpcConfig, options=()) -> grpc.Channel:
    """A sync channel to a worker that sends the token with every call (and speaks TLS with grpc.tls)."""
    if rpc.tls:
        channel = grpc.secure_channel(address, _channel_credentials(rpc), options=_tls_options(rpc, options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    return grpc.intercept_channel(channel, _SendToken(rpc.token)) if rpc.token else channel


def aio_channel(address: str, rpc: GrpcConfig, options=()) -> grpc.aio.Channel:
    """A grpc.aio channel to a worker that sends the token with every call (and speaks TLS with grpc.tls)."""
    interceptors = [_AioSendToken(rpc.token)] if rpc.token else None
    if rpc.tls:
        return grpc.aio.secure_channel(address, _channel_credentials(rpc), options=_tls_options(rpc, options),
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)


def client_ssl_context(rpc: GrpcConfig) -> ssl.SSLContext | None:
    """The TLS context of the router's lean client (HTTP/2 by ALPN, as grpc-core requires); None
    without grpc.tls."""
    if not rpc.tls:
        return None
    ctx = ssl.create_default_context(cadata=_read(rpc.tls_ca, "grpc.tls_ca").decode() if rpc.tls_ca else None)
    ctx.set_alpn_protocols(["h2"])
    return ctx
