"""Protobuf <-> engine objects for the Generate protocol (the decode worker's own RPC).

Sampling parameters and cached-token counts share the prefill protocol's converters.
"""

from __future__ import annotations

from decode_node.request import DecodeEvent, GenerateJob
from pdorch.worker.convert import cached_to_proto, logprob_to_proto, sampling_from_proto
from pdorch.worker.prefill_rpc import CachedTokens
from proto.pdorch.v1 import worker_pb2 as pb


def job_from_proto(msg: pb.GenerateRequest) -> GenerateJob:
    return GenerateJob(request_id=msg.request_id, token_ids=tuple(msg.token_ids),
                       params=sampling_from_proto(msg.sampling), prefill_address=msg.prefill_address,
                       timeout_s=float(msg.timeout_s))


def event_to_proto(request_id: str, event: DecodeEvent, prompt_tokens: int,
                   cached: CachedTokens) -> pb.GenerateResponse:
    return pb.GenerateResponse(request_id=request_id, token_ids=list(event.token_ids), text=event.text,
                               prompt_tokens=prompt_tokens, cached=cached_to_proto(cached),
                               finish_reason=event.finish_reason, matched_stop=event.matched_stop,
                               preemptions=event.preemptions, paused_s=event.paused_s, paused=event.paused,
                               logprobs=[logprob_to_proto(lp) for lp in event.logprobs], index=event.index,
                               prompt_logprobs=[logprob_to_proto(lp) for lp in event.prompt_logprobs])
