"""Mid-stream failover: a stream whose decode worker dies goes on from another decode worker.

    prompt p0 .. pn-1, tokens already streamed g0 .. gk-1, then D's stream breaks (UNAVAILABLE)
    -> another D: Generate(token_ids = prompt + g0 .. gk-1, max_tokens = max_tokens - k,
                           same sampling, what is left of the request's deadline)
    -> its P looks up prompt + g0 .. gk-1 like any prompt. With decode.offload_generated_kv the dead
       D wrote each page it filled to the store, continuing the prompt's hash chain
       (decode_node/offload.py), so P finds those pages and computes only the partial last page,
       then samples gk: the token an uninterrupted D would have sampled (greedy).
       Without offload P recomputes prompt and generated tokens: correct, only slower.

Text across the join: D detokenizes and applies stop strings to its own output only. A new D knows
nothing of g0 .. gk-1, so its text would be wrong exactly at the join: a UTF-8 character split by the
join, a stop string spanning it, text the dead D held back as a possible stop-string start. So the
router replays g0 .. gk-1 through the same StopChecker D runs (engine/stop.py, deterministic given
the tokenizer and the stop parameters), then feeds it the new D's tokens and sends the text *it*
releases, not the new D's. The stream's text is then what one uninterrupted D would have sent.

NOTE: a seeded request (temperature > 0) resumes with a fresh random stream on the new worker: its
tokens stay valid samples but differ from an uninterrupted run (the generator state died with D).
"""

from __future__ import annotations

from engine.sampling_params import SamplingParams
from engine.stop import StopChecker
from proto.pdorch.v1 import worker_pb2
from store_client.page_hash import page_hashes

# Cap on resumptions of one request, so a request that kills its workers (say one that makes a
# worker run out of memory) cannot take down one decode worker after another.
MAX_FAILOVERS = 2

FAILOVER_MODES = ("auto", "on", "off")


def failover_enabled(mode: str, store_enabled: bool, offload_generated_kv: bool) -> bool:
    """`auto`: on only where the resumed worker can load the generated pages from the store. Without
    them every stream of a dead worker is recomputed from scratch by the prefill workers at once;
    `on` accepts that cost."""
    if mode not in FAILOVER_MODES:
        raise ValueError(f"router.mid_stream_failover must be one of {FAILOVER_MODES}, got {mode!r}")
    return mode == "on" or (mode == "auto" and store_enabled and offload_generated_kv)


class Resumption:
    """One resumed stream: builds the new Generate request and rewrites the new worker's chunks.

    Rewritten chunks carry the router's own text, the original prompt_tokens (usage counts the
    client's prompt, not prompt + streamed tokens) and no `cached` (the client's cached counts are
    those of its prompt; the resumed prefill's counts go to metrics via `cached`)."""

    def __init__(self, tokenizer, job, streamed_ids: list[int], page_size: int, attempt: int):
        s = job.sampling
        self.prompt_tokens = len(job.token_ids)
        self.token_ids = list(job.token_ids) + list(streamed_ids)
        self.remaining = s.max_tokens - len(streamed_ids)
        if self.remaining < 1:
            raise ValueError(f"all {s.max_tokens} tokens were streamed; nothing to resume")
        self.request_id = f"{job.request_id}-r{attempt}"  # a fresh id: the dead D's P may still know the old one
        self.page_hashes = page_hashes(self.token_ids, page_size) if job.page_hashes else []
        params = SamplingParams(max_tokens=s.max_tokens, stop=tuple(s.stop), stop_token_ids=tuple(s.stop_token_ids),
                                ignore_eos=s.ignore_eos, min_tokens=s.min_tokens,
                                include_stop_str_in_output=s.include_stop_str_in_output,
                                skip_special_tokens=not s.HasField("skip_special_tokens") or s.skip_special_tokens,
                                spaces_between_special_tokens=not s.HasField("spaces_between_special_tokens")
                                or s.spaces_between_special_tokens)
        self.checker = StopChecker(tokenizer, params, eos_token_ids=tokenizer.eos_token_ids)
        for t in streamed_ids:
            if self.checker.append(t).finish_reason:
                raise ValueError("the streamed tokens already end the request")
        self.sampling = worker_pb2.SamplingParams()
        self.sampling.CopyFrom(s)
        self.sampling.max_tokens = self.remaining
        self.sampling.ClearField("prompt_logprobs")  # the client has them; the resumed prefill may use its caches
        # the new workers count the streamed tokens as output (penalties, a grammar's matcher) ...
        self.sampling.resumed_tokens = s.resumed_tokens + len(streamed_ids)
        # ... and min_tokens counts from here, as max_tokens does
        self.sampling.min_tokens = max(0, s.min_tokens - len(streamed_ids))
        self.cached: worker_pb2.CachedTokens | None = None  # the resumed prefill's counts (first chunk)
        self.finished = False
        self.cut_short = False  # finished by the router's stop check while the worker still generates

    def request(self, prefill_address: str, timeout_s: float) -> worker_pb2.GenerateRequest:
        return worker_pb2.GenerateRequest(request_id=self.request_id, token_ids=self.token_ids,
                                          sampling=self.sampling, prefill_address=prefill_address,
                                          timeout_s=timeout_s)

    def rewrite(self, batch: list[worker_pb2.GenerateResponse]) -> list[worker_pb2.GenerateResponse]:
        """The new worker's chunks as the client's stream continues them (nothing after a finish)."""
        out = []
        for msg in batch:
            if self.finished:
                break
            if self.cached is None and msg.HasField("cached"):
                self.cached = msg.cached
            out.append(self._rewrite(msg))
        return out

    def _rewrite(self, msg: worker_pb2.GenerateResponse) -> worker_pb2.GenerateResponse:
        ids, text, finish, matched = [], [], "", ""
        for t in msg.token_ids:
            step = self.checker.append(t)
            ids.append(t)
            text.append(step.text)
            if step.finish_reason:
                finish = step.finish_reason
                m = self.checker.matched_stop
                matched = "" if m is None else str(m)
                break
        self.cut_short = bool(finish) and not msg.finish_reason
        if not finish and msg.finish_reason:
            # The worker ended for a reason the checker does not see (the model's context limit):
            # release what the checker still holds back as a possible stop-string start.
            finish, matched = msg.finish_reason, msg.matched_stop
            text.append(self.checker.text[len(self.checker.output_text):])
        self.finished = bool(finish)
        return worker_pb2.GenerateResponse(request_id=msg.request_id, token_ids=ids, text="".join(text),
                                           prompt_tokens=self.prompt_tokens, finish_reason=finish,
                                           matched_stop=matched, preemptions=msg.preemptions,
                                           paused_s=msg.paused_s, paused=msg.paused,
                                           logprobs=msg.logprobs[:len(ids)])
