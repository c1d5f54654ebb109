"""decode_node/step_batch.py draw_tokens: each request's penalties read its own TokenCounts, kept
with the request step after step (engine/sampler.py), and equal counting its whole history."""

from types import SimpleNamespace

import torch

from decode_node.request import DecodeRequest, GenerateJob
from decode_node.step_batch import draw_tokens
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams


def request(prompt: list[int], params: SamplingParams) -> DecodeRequest:
    job = GenerateJob("r", tuple(prompt), params, "p:1", 0)
    return DecodeRequest(job=job, deadline=0.0, own_deadline=False, stopper=None, token_ids=list(prompt))


def test_each_request_counts_its_own_tokens_step_by_step():
    rt = SimpleNamespace(eos_token_ids=[0], sampler=Sampler())
    penalised = SamplingParams(temperature=0.0, frequency_penalty=1.5, presence_penalty=0.5)
    batch = [request([3, 4, 5], penalised), request([6], penalised), request([7, 7], SamplingParams(temperature=0.0))]
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 2.9, 2.8, 2.7, 2.6]] * 3)
    for _ in range(6):
        tokens, _ = draw_tokens(rt, batch, logits.clone())
        for r, t in zip(batch, tokens):
            r.token_ids.append(t)
    for r in batch[:2]:
        assert r.token_counts.length == len(r.token_ids) - 1  # counted up to the step's history, kept
        out = r.token_ids[r.prompt_len:]
        assert r.token_counts.table[1].tolist() == [float(out[:-1].count(i)) for i in range(8)]
    # greedy with a presence + frequency penalty walks down the logits instead of repeating token 3
    assert batch[0].token_ids[3:] == [3, 4, 5, 6, 7, 2] and batch[2].token_ids[2:] == [3] * 6
