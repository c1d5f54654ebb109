"""Worker gRPC security (issue 14): the optional shared token (`grpc.token`) and TLS (`grpc.tls*`).

The server is the workers' own (pdorch/worker/main.make_server + rpc.add_port: the options,
the token check, TLS) serving a small DecodeService; the callers are the real ones: the router's
WorkerPool (grpc.aio for Info, the lean client for Generate) and pdorch/worker/rpc.client_channel (what a
decode worker uses to call a prefill worker). Certificates come from the `openssl` CLI.
"""

from __future__ import annotations

import asyncio
import subprocess
from dataclasses import replace

import grpc
import pytest

from pdorch.config import GrpcConfig
from pdorch.local_stack.processes import free_port
from pdorch.worker.main import make_server
from pdorch.worker.rpc import add_port, aio_channel, bearer, client_channel
from proto.pdorch.v1 import worker_pb2, worker_pb2_grpc
from router.dispatch.dispatch import GENERATE_PATH
from router.fleet.workers import WorkerPool
from router.grpc.stream import Channel, RpcError

TOKEN = "s3cret-worker-token"


class _Prefill(worker_pb2_grpc.PrefillServiceServicer):
    def Info(self, request, context):
        return worker_pb2.WorkerInfo(role="prefill", worker_id="auth-test")

    def Abort(self, request, context):
        return worker_pb2.AbortResponse(found=False)


class _Decode(worker_pb2_grpc.DecodeServiceServicer):
    def Generate(self, request, context):
        for i in range(3):
            yield worker_pb2.GenerateResponse(request_id=request.request_id, token_ids=[1000 + i],
                                              finish_reason="length" if i == 2 else "")

    def Info(self, request, context):
        return worker_pb2.WorkerInfo(role="decode", worker_id="auth-test")


@pytest.fixture
def serve():
    """serve(rpc, refused=None) -> address of a started worker gRPC server (refused: a list the methods
    it refuses are appended to); all stopped at teardown."""
    servers = []

    def start(rpc: GrpcConfig, refused: list | None = None) -> str:
        server = make_server(rpc, max_rpcs=8, on_refused=None if refused is None else refused.append)
        worker_pb2_grpc.add_DecodeServiceServicer_to_server(_Decode(), server)
        worker_pb2_grpc.add_PrefillServiceServicer_to_server(_Prefill(), server)
        port = free_port()
        assert add_port(server, f"127.0.0.1:{port}", rpc) == port
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(None).wait(5)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA and a worker certificate for DNS:worker.test and IP:127.0.0.1; a second, unrelated CA."""
    d = tmp_path_factory.mktemp("certs")

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=30)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=pdorch test CA")
    openssl("req", "-x509", *ec, "-keyout", "other.key", "-out", "other.pem", "-days", "1", "-subj", "/CN=other CA")
    openssl("req", *ec, "-keyout", "worker.key", "-out", "worker.csr", "-subj", "/CN=worker.test")
    (d / "ext.cnf").write_text("subjectAltName=DNS:worker.test,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "worker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "worker.pem", "-days", "1", "-extfile", "ext.cnf")
    return d


def _request(rid: str) -> bytes:
    return worker_pb2.GenerateRequest(request_id=rid, token_ids=[1, 2, 3]).SerializeToString()


async def _generate(channel: Channel, rid: str = "r") -> list[int]:
    call = await channel.call(GENERATE_PATH, _request(rid), worker_pb2.GenerateResponse.FromString, 5)
    out = []
    while batch := await call.next_batch():
        out.extend(t for m in batch for t in m.token_ids)
    return out


async def _pool_check(address: str, rpc: GrpcConfig | None) -> tuple[bool, str, list[int] | RpcError]:
    """The router's view: health check (grpc.aio Info) and one Generate (lean client)."""
    pool = WorkerPool(3, 1.0, 1.0, rpc=rpc)
    try:
        w = pool.upsert("decode", address)
        healthy = await pool.check(w)
        try:
            got = await _generate(w.calls)
        except RpcError as e:
            got = e
        return healthy, w.last_error, got
    finally:
        await pool.close()


def test_with_a_token_unauthenticated_calls_are_rejected_and_the_clients_send_it(serve):
    rpc = GrpcConfig(token=TOKEN)
    address = serve(rpc)

    # Plain callers: every RPC shape is refused, and the details never echo a token.
    with grpc.insecure_channel(address) as ch:
        stub = worker_pb2_grpc.DecodeServiceStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Info(worker_pb2.InfoRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "grpc.token" in err.value.details() and TOKEN not in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(worker_pb2.GenerateRequest(request_id="x"), timeout=5))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with client_channel(address, GrpcConfig(token="wrong")) as ch:
        with pytest.raises(grpc.RpcError) as err:
            worker_pb2_grpc.DecodeServiceStub(ch).Info(worker_pb2.InfoRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # The decode worker's kind of client (sync, unary and streaming) with the token.
    with client_channel(address, rpc) as ch:
        stub = worker_pb2_grpc.DecodeServiceStub(ch)
        assert stub.Info(worker_pb2.InfoRequest(), timeout=5).worker_id == "auth-test"
        assert stub.Info.future(worker_pb2.InfoRequest(), timeout=5).result().role == "decode"  # D's call style
        assert [m.token_ids[0] for m in stub.Generate(worker_pb2.GenerateRequest(request_id="y"), timeout=5)] \
            == [1000, 1001, 1002]

    # The router: with the token its health checks and Generate streams pass, without it neither.
    healthy, _, got = asyncio.run(_pool_check(address, rpc))
    assert healthy and got == [1000, 1001, 1002]
    healthy, last_error, got = asyncio.run(_pool_check(address, None))
    assert not healthy and "UNAUTHENTICATED" in last_error
    assert isinstance(got, RpcError) and got.code() == grpc.StatusCode.UNAUTHENTICATED


def test_tls_with_the_token(serve, certs):
    server_rpc = GrpcConfig(token=TOKEN, tls=True, tls_cert=str(certs / "worker.pem"),
                            tls_key=str(certs / "worker.key"))
    address = serve(server_rpc)
    caller = GrpcConfig(token=TOKEN, tls=True, tls_ca=str(certs / "ca.pem"))

    healthy, _, got = asyncio.run(_pool_check(address, caller))
    assert healthy and got == [1000, 1001, 1002]
    # The certificate's DNS name instead of the address's IP.
    healthy, _, got = asyncio.run(_pool_check(address, replace(caller, tls_server_name="worker.test")))
    assert healthy and got == [1000, 1001, 1002]
    with client_channel(address, caller) as ch:
        assert worker_pb2_grpc.DecodeServiceStub(ch).Info(worker_pb2.InfoRequest(), timeout=5).role == "decode"

    async def aio_info(rpc):
        async with aio_channel(address, rpc) as ch:
            return await worker_pb2_grpc.DecodeServiceStub(ch).Info(worker_pb2.InfoRequest(), timeout=5)

    assert asyncio.run(aio_info(caller)).worker_id == "auth-test"

    # A certificate the caller does not trust, and a plaintext caller: clear errors, no hang.
    healthy, last_error, got = asyncio.run(_pool_check(address, replace(caller, tls_ca=str(certs / "other.pem"))))
    assert not healthy and "UNAVAILABLE" in last_error
    assert isinstance(got, RpcError) and got.code() == grpc.StatusCode.UNAVAILABLE
    assert "CERTIFICATE_VERIFY_FAILED" in got.details()
    healthy, _, got = asyncio.run(_pool_check(address, GrpcConfig(token=TOKEN)))
    assert not healthy and isinstance(got, RpcError) and got.code() == grpc.StatusCode.UNAVAILABLE


def test_tls_without_a_certificate_is_refused_at_start_up():
    server = make_server(GrpcConfig(tls=True), max_rpcs=1)
    with pytest.raises(ValueError, match="grpc.tls_cert and grpc.tls_key"):
        add_port(server, f"127.0.0.1:{free_port()}", GrpcConfig(tls=True))
    with pytest.raises(ValueError, match="grpc.tls_(cert|key): cannot read '/nonexistent"):
        add_port(server, f"127.0.0.1:{free_port()}", GrpcConfig(tls=True, tls_cert="/nonexistent.pem",
                                                                 tls_key="/nonexistent.key"))
    server.stop(None)
    assert bearer("t") == "Bearer t"


def test_a_rotation_in_two_steps_refuses_no_generate(serve):
    """Step 1 pods (token B, previous A) accept both and fall back to A towards a pod of step 0; step 2
    pods accept only B, which every step-1 caller sends first. Only the first health check of a
    step-0 worker is refused (that is how the caller learns); no Generate ever is."""
    a, b = "token-A-1f0e", "token-B-7c2d"
    step0, step1, step2 = GrpcConfig(token=a), GrpcConfig(token=b, previous_token=a), GrpcConfig(token=b)
    refused: dict[str, list] = {name: [] for name in ("w0", "w1", "w2")}
    w0, w1, w2 = serve(step0, refused["w0"]), serve(step1, refused["w1"]), serve(step2, refused["w2"])

    async def route_all(rpc: GrpcConfig, addresses=(w0, w1, w2)) -> list:
        pool = WorkerPool(3, 1.0, 1.0, rpc=rpc)
        try:
            out = []
            for address in addresses:
                w = pool.upsert("decode", address)
                healthy = await pool.check(w)
                try:
                    out.append((healthy, await _generate(w.calls, f"r-{address}")))
                except RpcError as e:
                    out.append((healthy, e.code()))
            return out
        finally:
            await pool.close()

    ok = (True, [1000, 1001, 1002])
    # a step-1 router reaches every worker of steps 0 and 1; step 2 workers too (it sends B first)
    assert asyncio.run(route_all(step1)) == [ok, ok, ok]
    # (the pool's own first check and ours may both go out before either learns)
    assert set(refused["w0"]) == {"/pdorch.v1.DecodeService/Info"} and refused["w1"] == refused["w2"] == []
    # a step-0 router (not rolled yet) reaches step-0 and step-1 workers (step 2 starts after step 1)
    assert asyncio.run(route_all(step0, (w0, w1))) == [ok, ok]
    # a step-2 router reaches step-1 and step-2 workers (no step-0 pod is left then)
    assert asyncio.run(route_all(step2, (w1, w2))) == [ok, ok]
    assert set(refused["w0"]) == {"/pdorch.v1.DecodeService/Info"} and refused["w1"] == refused["w2"] == []
    # the control: a caller with B alone (step 2) cannot reach a step-0 worker
    assert asyncio.run(route_all(step2, (w0,))) == [(False, grpc.StatusCode.UNAUTHENTICATED)]


def test_the_decode_workers_prefill_client_learns_the_token_before_its_first_prefill(serve):
    """D (step 1) -> P (step 0): one Info is refused, the Prefill itself is not."""
    from decode_node.prefill_client import PrefillClient

    a, b = "token-A-1f0e", "token-B-7c2d"
    refused: list[str] = []
    address = serve(GrpcConfig(token=a), refused)
    client = PrefillClient(GrpcConfig(token=b, previous_token=a))
    try:
        client._stub(address)  # the first contact: Info with B refused, A chosen
        assert client._tokens.token(address) == a
        assert refused == ["/pdorch.v1.PrefillService/Info"]
        assert client.confirm_writes_over(address, "r-1") == "confirmed"  # a unary call with the learnt token
        assert refused == ["/pdorch.v1.PrefillService/Info"]
    finally:
        client.close()
