"""The committed gRPC stubs must equal what `make proto` generates from worker.proto and tp.proto."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTOS = ["worker", "tp"]
GENERATED = [f"{p}{suffix}" for p in PROTOS for suffix in ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")]


def test_committed_stubs_are_fresh(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}", f"--python_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}", *(f"proto/pdorch/v1/{p}.proto" for p in PROTOS)],
        check=True, cwd=ROOT,
    )
    for name in GENERATED:
        fresh = (tmp_path / "proto/pdorch/v1" / name).read_text()
        committed = (ROOT / "proto/pdorch/v1" / name).read_text()
        assert fresh == committed, f"proto/pdorch/v1/{name} is stale: run `make proto` and commit"


def test_every_proto_field_is_documented():
    for proto in PROTOS:
        lines = (ROOT / f"proto/pdorch/v1/{proto}.proto").read_text().splitlines()
        for i, line in enumerate(lines):
            stripped = line.strip()
            is_field = stripped.endswith(";") and "=" in stripped and not stripped.startswith(
                ("syntax", "package", "option"))
            if is_field:
                assert lines[i - 1].strip().startswith("///"), f"{proto}.proto:{i + 1} field has no /// comment"


def test_the_cache_tiers_of_the_workers_and_the_router_are_the_protocol_s():
    from pdorch.worker.prefill_rpc import CACHE_TIERS
    from proto.pdorch.v1 import worker_pb2

    assert CACHE_TIERS == tuple(f.name for f in worker_pb2.CachedTokens.DESCRIPTOR.fields)
