"""Protobuf <-> engine objects for the prefill protocol (used by P's servicer and D's client).

The only module of the prefill worker that knows `worker_pb2` message layouts besides the
servicer; the engine never imports generated code.
"""

from __future__ import annotations

from engine.sampler import TokenLogprob
from engine.sampling_params import GrammarSpec, SamplingParams
from pdorch.worker.errors import InvalidRequest
from pdorch.worker.prefill_rpc import CachedTokens, FirstToken, PrefillJob, PrefillResult
from pdorch.worker.tp_transfer import PoolRank
from proto.pdorch.v1 import worker_pb2 as pb


def sampling_from_proto(msg: pb.SamplingParams) -> SamplingParams:
    """proto3 zero values mean "unset": top_p 0 -> 1.0, top_k 0 -> disabled, max_tokens 0 -> default."""
    default = SamplingParams()
    try:
        return _sampling(msg, default)
    except ValueError as e:
        raise InvalidRequest(f"sampling: {e}") from None


def _sampling(msg: pb.SamplingParams, default: SamplingParams) -> SamplingParams:
    return SamplingParams(
        temperature=float(msg.temperature),
        top_p=float(msg.top_p) if msg.top_p > 0 else 1.0,
        top_k=int(msg.top_k) if msg.top_k > 0 else -1,
        min_p=float(msg.min_p),
        max_tokens=int(msg.max_tokens) if msg.max_tokens > 0 else default.max_tokens,
        stop=tuple(msg.stop),
        stop_token_ids=tuple(int(t) for t in msg.stop_token_ids),
        ignore_eos=bool(msg.ignore_eos),
        seed=int(msg.seed) if msg.HasField("seed") else None,
        grammar=GrammarSpec(msg.grammar.kind, msg.grammar.spec) if msg.HasField("grammar") else None,
        logprobs=int(msg.logprobs) if msg.HasField("logprobs") else None,
        presence_penalty=float(msg.presence_penalty), frequency_penalty=float(msg.frequency_penalty),
        repetition_penalty=float(msg.repetition_penalty) if msg.repetition_penalty > 0 else 1.0,
        logit_bias=tuple(sorted(msg.logit_bias.items())), min_tokens=int(msg.min_tokens),
        resumed_tokens=int(msg.resumed_tokens), n=max(int(msg.n), 1),
        prompt_logprobs=int(msg.prompt_logprobs) if msg.HasField("prompt_logprobs") else None,
        include_stop_str_in_output=bool(msg.include_stop_str_in_output),
        skip_special_tokens=msg.skip_special_tokens if msg.HasField("skip_special_tokens") else True,
        spaces_between_special_tokens=msg.spaces_between_special_tokens
        if msg.HasField("spaces_between_special_tokens") else True,
        allowed_token_ids=tuple(msg.allowed_token_ids), bad_words=tuple(tuple(w.ids) for w in msg.bad_words),
    )


def sampling_to_proto(params: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        temperature=params.temperature, top_p=params.top_p, top_k=max(params.top_k, 0), min_p=params.min_p,
        max_tokens=params.max_tokens, stop=list(params.stop), stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos, presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty, repetition_penalty=params.repetition_penalty,
        logit_bias=dict(params.logit_bias), min_tokens=params.min_tokens, resumed_tokens=params.resumed_tokens,
        n=params.n, include_stop_str_in_output=params.include_stop_str_in_output,
        allowed_token_ids=list(params.allowed_token_ids), bad_words=[pb.TokenIds(ids=w) for w in params.bad_words],
    )
    if not params.skip_special_tokens:
        msg.skip_special_tokens = False
    if not params.spaces_between_special_tokens:
        msg.spaces_between_special_tokens = False
    if params.seed is not None:
        msg.seed = params.seed
    if params.grammar is not None:
        g = params.grammar
        msg.grammar.CopyFrom(pb.Grammar(kind=g.kind, spec=g.spec))
    if params.logprobs is not None:
        msg.logprobs = params.logprobs
    if params.prompt_logprobs is not None:
        msg.prompt_logprobs = params.prompt_logprobs
    return msg


def logprob_to_proto(lp: TokenLogprob) -> pb.TokenLogprob:
    return pb.TokenLogprob(logprob=lp.logprob, top_ids=[i for i, _ in lp.top], top_logprobs=[v for _, v in lp.top],
                           rank=lp.rank)


def logprob_from_proto(msg: pb.TokenLogprob) -> TokenLogprob:
    return TokenLogprob(msg.logprob, tuple(zip(msg.top_ids, msg.top_logprobs)),
                        msg.rank if msg.HasField("rank") else None)


def cached_to_proto(cached: CachedTokens) -> pb.CachedTokens:
    return pb.CachedTokens(device=cached.device, host=cached.host, store=cached.store, ssd=cached.ssd,
                           inflight=cached.inflight)


def cached_from_proto(msg: pb.CachedTokens) -> CachedTokens:
    return CachedTokens(device=msg.device, host=msg.host, store=msg.store, ssd=msg.ssd, inflight=msg.inflight)


def rank_to_proto(r: PoolRank) -> pb.PoolRank:
    return pb.PoolRank(segment=r.segment, pool_base=r.pool_base, page_nbytes=r.page_nbytes,
                       kv_head_start=r.heads.start, kv_head_count=len(r.heads))


def rank_from_proto(m: pb.PoolRank) -> PoolRank:
    if m.kv_head_count < 1 or m.page_nbytes < 1:
        raise InvalidRequest(f"decode_ranks: a rank ({m.segment!r}) with {m.kv_head_count} KV heads and "
                             f"{m.page_nbytes}-byte pages")
    return PoolRank(m.segment, m.pool_base, m.page_nbytes, range(m.kv_head_start, m.kv_head_start + m.kv_head_count))


def job_from_proto(msg: pb.PrefillRequest) -> PrefillJob:
    return PrefillJob(
        request_id=msg.request_id, token_ids=tuple(msg.token_ids), params=sampling_from_proto(msg.sampling),
        decode_segment=msg.decode_segment, dest_page_addrs=tuple(msg.dest_page_addrs),
        timeout_s=float(msg.timeout_s), page_size=int(msg.page_size), model_fingerprint=msg.model_fingerprint,
        page_hashes=tuple(msg.page_hashes), decode_loaded_pages=tuple(msg.decode_loaded_pages),
        decode_cached_pages=tuple(msg.decode_cached_pages),
        decode_ranks=tuple(rank_from_proto(r) for r in msg.decode_ranks),
    )


def job_to_proto(job: PrefillJob) -> pb.PrefillRequest:
    return pb.PrefillRequest(
        request_id=job.request_id, token_ids=list(job.token_ids), sampling=sampling_to_proto(job.params),
        decode_segment=job.decode_segment, dest_page_addrs=list(job.dest_page_addrs), timeout_s=job.timeout_s,
        page_size=job.page_size, model_fingerprint=job.model_fingerprint, page_hashes=list(job.page_hashes),
        decode_loaded_pages=list(job.decode_loaded_pages), decode_cached_pages=list(job.decode_cached_pages),
        decode_ranks=[rank_to_proto(r) for r in job.decode_ranks],
    )


def result_to_proto(res: PrefillResult) -> pb.PrefillResponse:
    return pb.PrefillResponse(
        request_id=res.request_id, first_token_id=res.first_token_id, prompt_tokens=res.prompt_tokens,
        cached=cached_to_proto(res.cached), transfer_bytes=res.transfer_bytes, transfer_s=res.transfer_s,
        compute_s=res.compute_s, sampler_state=res.sampler_state, unstored_pages=list(res.unstored_pages),
        first_logprob=None if res.first_logprob is None else logprob_to_proto(res.first_logprob),
        more_first=[pb.FirstToken(token_id=f.token_id, sampler_state=f.sampler_state,
                                  logprob=None if f.logprob is None else logprob_to_proto(f.logprob))
                    for f in res.more_first],
        prompt_logprobs=[logprob_to_proto(lp) for lp in res.prompt_logprobs],
    )


def result_from_proto(msg: pb.PrefillResponse) -> PrefillResult:
    return PrefillResult(
        request_id=msg.request_id, first_token_id=msg.first_token_id, prompt_tokens=msg.prompt_tokens,
        cached=cached_from_proto(msg.cached), transfer_bytes=msg.transfer_bytes, transfer_s=msg.transfer_s,
        compute_s=msg.compute_s, sampler_state=msg.sampler_state, unstored_pages=tuple(msg.unstored_pages),
        first_logprob=logprob_from_proto(msg.first_logprob) if msg.HasField("first_logprob") else None,
        more_first=tuple(FirstToken(f.token_id, f.sampler_state,
                                    logprob_from_proto(f.logprob) if f.HasField("logprob") else None)
                         for f in msg.more_first),
        prompt_logprobs=tuple(logprob_from_proto(lp) for lp in msg.prompt_logprobs),
    )
