"""The prefill worker's sampler state on the decode worker: continued when it is a generator of the same
device kind (the seeded stream goes on), the seed taken again when P sampled on another kind of device
(a CPU prefill worker and a GPU decode worker: 5056 vs 16 bytes), never a failed request."""

from __future__ import annotations

import pytest
import torch

from decode_node.request import GenerateJob
from decode_node.worker import DecodeWorker
from engine.sampling_params import SamplingParams
from pdorch.local_stack.workers import make_config
from pdorch.worker.metrics import WorkerRecorder
from pdorch.worker.prefill_rpc import PrefillResult
from pdorch.worker.runtime import build_runtime

PARAMS = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=5)


@pytest.fixture(scope="module")
def worker(tmp_path_factory, tiny_model_dir):
    cfg = make_config(tmp_path_factory.mktemp("decode_state"), tiny_model_dir, decode={"num_pages": 32, "prefix_cache": False})  # every request calls P
    w = DecodeWorker(build_runtime(cfg, cfg.decode.num_pages, use_store=False), cfg.decode, cfg.store, cfg.grpc,
                     "d-state", WorkerRecorder("decode"))
    yield w
    w.close()


def generate(worker, monkeypatch, name: str, state: bytes) -> list[int]:
    monkeypatch.setattr(worker.prefill_client, "prefill", lambda a, job, t, c: PrefillResult(
        job.request_id, 42, len(job.token_ids), sampler_state=state))
    job = GenerateJob(request_id=name, token_ids=tuple(range(10, 40)), params=PARAMS, prefill_address="127.0.0.1:1",
                      timeout_s=30.0)
    return [t for e in worker.run(worker.create(job)) for t in e.token_ids]


def test_state_of_the_same_kind_continues_the_stream(worker, monkeypatch):
    gen = torch.Generator().manual_seed(5)
    torch.empty(100).exponential_(generator=gen)  # P drew its first token's noise
    moved = generate(worker, monkeypatch, "same-a", gen.get_state().numpy().tobytes())
    assert moved == generate(worker, monkeypatch, "same-b", gen.get_state().numpy().tobytes())
    assert moved != generate(worker, monkeypatch, "seed-only", torch.Generator().manual_seed(5)
                             .get_state().numpy().tobytes())


def test_state_of_another_device_kind_falls_back_to_the_seed(worker, monkeypatch, caplog):
    cuda_like = bytes(16)  # a CUDA generator's state: Philox seed + offset
    out = generate(worker, monkeypatch, "other-kind", cuda_like)
    assert len(out) == 6 and "continuing from the seed" in caplog.text
    fresh = torch.Generator().manual_seed(5).get_state().numpy().tobytes()
    assert out == generate(worker, monkeypatch, "fresh", fresh)  # same as a stream started from the seed
