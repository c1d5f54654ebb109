"""P's answer on the decode worker: its first token (sampled on P, under the request's grammar) taken
into the request and accounted, and P's random stream continued here, so that a seeded request
samples what the single-process engine would (sequence 0, and each fork of n > 1,
decode_node/forks.py)."""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from decode_node.request import DecodeEvent, DecodeRequest
from decode_node.stopping import check_stop
from pdorch.worker.metrics import WorkerRecorder

log = logging.getLogger(__name__)

GENERATOR_STATE_BYTES = {5056: "CPU (mt19937)", 16: "CUDA (Philox seed + offset)"}


def take_first_token(rt, recorder: WorkerRecorder, req: DecodeRequest, res) -> DecodeEvent:
    """Take P's answer `res` (KV in our pages, first token) into `req` and account the first token."""
    n = req.prompt_len
    req.cached = res.cached
    if req.inflight_pages:  # D's own pages it waited for (decode_node/admission.py): P counts them as device
        moved = min(req.inflight_pages * rt.page_size, res.cached.device)
        req.cached = replace(res.cached, device=res.cached.device - moved, inflight=res.cached.inflight + moved)
    req.unstored_pages = res.unstored_pages
    if res.sampler_state and req.generator is not None:
        req.generator = continue_generator(rt.sampler, req.job.params, res.sampler_state)
    recorder.prompt_tokens(computed=n - res.cached.total, cached=res.cached)
    if req.grammar is not None:  # P sampled it under the same grammar
        req.grammar.accept(res.first_token_id)
    req.token_ids.append(res.first_token_id)
    recorder.generated(1)
    event = check_stop(req, res.first_token_id, rt.max_context, res.first_logprob)
    return replace(event, prompt_logprobs=res.prompt_logprobs) if res.prompt_logprobs else event


def continue_generator(sampler, params, sampler_state: bytes):
    """A generator for `params` that continues P's random stream (seeded output equals the
    single-process engine's); None without a seed."""
    gen = sampler.make_generator(params)
    if gen is None or not sampler_state:
        return gen
    state = torch.frombuffer(bytearray(sampler_state), dtype=torch.uint8)
    if state.numel() != gen.get_state().numel() and state.numel() in GENERATOR_STATE_BYTES:
        # P samples on another kind of device (a CPU prefill worker, a GPU decode worker)
        log.warning("prefill's sampler state is a %s generator's; this worker's is on %s: continuing "
                    "from the seed", GENERATOR_STATE_BYTES[state.numel()], gen.device)
    else:
        gen.set_state(state)
    return gen
