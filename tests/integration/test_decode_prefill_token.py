"""With `grpc.token` set, the decode worker's Prefill calls (and its fence's Abort calls) carry the
token: real prefill and decode processes (tiny model, no store) that reject calls without it."""

from __future__ import annotations

import time

import grpc

from pdorch.config import GrpcConfig
from pdorch.local_stack.processes import wait_for_port
from pdorch.local_stack.workers import START_TIMEOUT_S, WorkerCluster, make_config
from pdorch.worker.rpc import client_channel
from proto.pdorch.v1 import worker_pb2 as pb
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc

TOKEN = "decode-to-prefill-token"


def wait_info(stub, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            stub.Info(pb.InfoRequest(), timeout=5)
            return
        except grpc.RpcError:
            assert time.monotonic() < deadline, "the worker never answered Info"
            time.sleep(0.2)


def test_decode_calls_prefill_with_the_shared_token(tmp_path, tiny_model_dir):
    cluster = WorkerCluster(cfg=make_config(tmp_path, tiny_model_dir, grpc={"token": TOKEN}), tmp=tmp_path,
                            master=None)
    try:
        p, d = cluster.spawn_worker("prefill"), cluster.spawn_worker("decode")
        for wp in (p, d):
            wait_for_port(wp.port, START_TIMEOUT_S, wp.proc)
        rpc = GrpcConfig(token=TOKEN)
        with client_channel(p.address, rpc) as pch, client_channel(d.address, rpc) as dch, \
                grpc.insecure_channel(p.address) as bare:
            wait_info(pb_grpc.PrefillServiceStub(pch), START_TIMEOUT_S)
            wait_info(pb_grpc.DecodeServiceStub(dch), START_TIMEOUT_S)
            try:
                pb_grpc.PrefillServiceStub(bare).Info(pb.InfoRequest(), timeout=10)
                raise AssertionError("the prefill worker answered a call without the token")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAUTHENTICATED
            req = pb.GenerateRequest(request_id="with-token", token_ids=list(range(10, 50)), timeout_s=60,
                                     prefill_address=p.address,
                                     sampling=pb.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
            chunks = list(pb_grpc.DecodeServiceStub(dch).Generate(req, timeout=70))
            assert sum(len(c.token_ids) for c in chunks) == 3 and chunks[-1].finish_reason == "length"
            st = pb_grpc.DecodeServiceStub(dch).Stats(pb.StatsRequest(), timeout=10)
            assert st.pool_integrity_ok and st.info.free_pages == st.info.total_pages
    finally:
        cluster.stop()
