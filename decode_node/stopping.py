"""Per-request stop handling of the decode worker: engine/stop.py's StopChecker, turned into stream events.

Besides the request's own conditions (eos, stop token ids, stop strings, max_tokens), a request
also ends with "length" when it reaches the model's context limit.
"""

from __future__ import annotations

from decode_node.request import DecodeEvent
from engine.stop import StopChecker


def make_stopper(tokenizer, params, prompt_ids: list[int]) -> StopChecker:
    return StopChecker(tokenizer, params, eos_token_ids=tokenizer.eos_token_ids)


def check_stop(req, token_id: int, max_context: int, logprob=None) -> DecodeEvent:
    """Account `token_id` (already appended to req.token_ids) and return the event to stream, with
    the token's `logprob` (engine.sampler.TokenLogprob) when the request asked for it."""
    out = req.stopper.append(token_id)
    finish = out.finish_reason or ""
    if not finish and len(req.token_ids) >= max_context:
        finish = "length"
    matched = req.stopper.matched_stop
    return DecodeEvent(token_ids=(token_id,), text=out.text, finish_reason=finish,
                       matched_stop="" if matched is None or not finish else str(matched),
                       logprobs=() if logprob is None else (logprob,))
