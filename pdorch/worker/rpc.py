"""The worker gRPC wire both ends share: the servicer base of both worker services, and the optional
shared token and TLS (`grpc.*` config keys) on the workers' servers and on their callers.

A worker passed to `WorkerServicer` must offer `abort(request_id) -> bool`, `flush() -> int`,
`info()`, `stats()` and `kv_events` (a KVEventJournal, streamed by WatchKV). The role's servicer subclasses it and adds its own request RPC; the
generated `add_*Servicer_to_server` only needs the method names.

    server side   grpc.server(..., interceptors=server_interceptors(rpc)); add_port(server, address, rpc)
    callers       client_channel(address, rpc, options, tokens)   sync, e.g. decode -> prefill
                  aio_channel(address, rpc, options, tokens)      grpc.aio, the router's Info / Flush / health
                  CallerTokens.authorization(address), client_ssl_context(rpc)   the router's lean client

NOTE: the token travels as `authorization: Bearer <token>` metadata in every call; without TLS it is
readable on the network, so it keeps strangers out of a private network, no more (docs/operations.md).
Which token, during a rotation (grpc.previous_token): pdorch/worker/tokens.py. A grpc.aio unary call
a worker refuses with one token is repeated once with the other; sync callers repeat it themselves
(the decode worker's Prefill is a future) after `CallerTokens.refused`.
No torch import here: the router uses these helpers too.
"""

from __future__ import annotations

import collections
import ssl
from collections.abc import Callable
from pathlib import Path

import grpc

from pdorch.config import GrpcConfig
from pdorch.tracing.grpc_client import SendTraceContext
from pdorch.tracing.grpc_server import RpcSpans
from pdorch.tracing.process import process_tracing
from pdorch.worker.errors import grpc_errors
from pdorch.worker.tokens import TOKEN_HEADER, CallerTokens, TokenCheck, accepted_tokens, bearer
from proto.pdorch.v1 import worker_pb2 as pb

__all__ = ["CallerTokens", "WorkerServicer", "add_port", "aio_channel", "bearer", "client_channel",
           "client_ssl_context", "server_interceptors"]


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

    def WatchKV(self, request, context):
        from pdorch.worker.kv_events_rpc import watch_kv  # here: the router imports this module too

        yield from watch_kv(self._worker.kv_events, request, context)

    def Traces(self, request, context):
        """The spans this process's ring keeps of one trace (observability.keep_traces; none when 0)."""
        with grpc_errors(context, "Traces"):
            return pb.TracesReply(spans=process_tracing().records(request.trace_id, request.request_id))


def _read(path: str, key: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as e:
        raise ValueError(f"{key}: cannot read {path!r}: {e.strerror or e}") from None


# ---------------------------------------------------------------------------------------- server side
def server_interceptors(rpc: GrpcConfig, on_refused: Callable[[str], None] | None = None
                        ) -> list[grpc.ServerInterceptor]:
    """The token check (grpc.token, and grpc.previous_token during a rotation), then, with tracing on,
    the request RPCs' server spans (pdorch/tracing/grpc_server.py); none without either."""
    tokens = accepted_tokens(rpc)
    tracing = process_tracing()
    return ([TokenCheck(tokens, on_refused)] if tokens else []) + ([RpcSpans(tracing)] if tracing.enabled else [])


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
    """Adds the token `tokens` chose for `address` to every call (looked up per call: it may change)."""

    def __init__(self, tokens: CallerTokens, address: str):
        self._tokens, self._address = tokens, address

    def _details(self, d):
        return _CallDetails(d.method, d.timeout, _with_token(d.metadata, self._tokens.token(self._address)),
                            d.credentials, getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)


class _AioSendToken(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """As _SendToken; a unary call refused UNAUTHENTICATED is repeated once with the other token."""

    def __init__(self, tokens: CallerTokens, address: str):
        self._tokens, self._address = tokens, address

    def _details(self, d, token: str):
        return grpc.aio.ClientCallDetails(d.method, d.timeout, _with_token(d.metadata, token),
                                          d.credentials, d.wait_for_ready)

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        sent = self._tokens.token(self._address)
        call = await continuation(self._details(client_call_details, sent), request)
        if (self._tokens.rotating and await call.code() == grpc.StatusCode.UNAUTHENTICATED
                and self._tokens.refused(self._address, sent)):
            return await continuation(self._details(client_call_details, self._tokens.token(self._address)),
                                      request)
        return call

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details, self._tokens.token(self._address)), request)


def _tls_options(rpc: GrpcConfig, options) -> list:
    opts = list(options)
    if rpc.tls_server_name:
        opts.append(("grpc.ssl_target_name_override", rpc.tls_server_name))
    return opts


def _channel_credentials(rpc: GrpcConfig) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(_read(rpc.tls_ca, "grpc.tls_ca") if rpc.tls_ca else None)


def client_channel(address: str, rpc: GrpcConfig, options=(), tokens: CallerTokens | None = None) -> grpc.Channel:
    """A sync channel to a worker that sends the token with every call (and speaks TLS with grpc.tls).
    `tokens`: shared by a caller's channels (default: this channel's own)."""
    tokens = tokens or CallerTokens(rpc)
    if rpc.tls:
        channel = grpc.secure_channel(address, _channel_credentials(rpc), options=_tls_options(rpc, options))
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    interceptors = ([_SendToken(tokens, address)] if tokens.tokens else []) + (
        [SendTraceContext()] if process_tracing().enabled else [])  # D -> P carries the Generate's span
    return grpc.intercept_channel(channel, *interceptors) if interceptors else channel


def aio_channel(address: str, rpc: GrpcConfig, options=(), tokens: CallerTokens | None = None) -> grpc.aio.Channel:
    """A grpc.aio channel to a worker that sends the token with every call (and speaks TLS with grpc.tls)."""
    tokens = tokens or CallerTokens(rpc)
    interceptors = [_AioSendToken(tokens, address)] if tokens.tokens else None
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
