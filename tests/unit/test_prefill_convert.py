"""Prefill protocol <-> engine objects: round trips, proto3 "unset" defaults, bad values named."""

import pytest

from decode_node.convert import event_to_proto, job_from_proto
from decode_node.request import DecodeEvent
from engine.sampler import TokenLogprob
from engine.sampling_params import SamplingParams
from pdorch.worker import convert
from pdorch.worker.errors import InvalidRequest
from pdorch.worker.prefill_rpc import CachedTokens, PrefillJob, PrefillResult
from proto.pdorch.v1 import worker_pb2 as pb


def test_job_round_trip():
    # NOTE: temperature and top_p travel as proto float32: use values float32 represents exactly.
    job = PrefillJob(request_id="r1", token_ids=(1, 2, 3), decode_segment="127.0.0.1:1234",
                     params=SamplingParams(temperature=0.5, top_p=0.75, top_k=20, min_p=0.125, max_tokens=7, stop=("x",),
                                           stop_token_ids=(5,), ignore_eos=True, seed=42),
                     dest_page_addrs=(4096, 8192), timeout_s=3.5, page_size=16, model_fingerprint="fp",
                     page_hashes=("ab" * 32,))
    assert convert.job_from_proto(convert.job_to_proto(job)) == job


def test_the_output_fields_and_token_masks_round_trip():
    params = SamplingParams(include_stop_str_in_output=True, skip_special_tokens=False,
                            spaces_between_special_tokens=False, allowed_token_ids=(3, 9),
                            bad_words=((4,), (5, 6, 7)), max_tokens=7)
    assert convert.sampling_from_proto(convert.sampling_to_proto(params)) == params
    unset = convert.sampling_from_proto(pb.SamplingParams())
    assert unset.skip_special_tokens and unset.spaces_between_special_tokens and not unset.include_stop_str_in_output
    assert unset.allowed_token_ids == () and unset.bad_words == ()
    lp = TokenLogprob(-0.5, ((3, -0.25),), rank=2)
    assert convert.logprob_from_proto(convert.logprob_to_proto(lp)) == lp
    assert convert.logprob_from_proto(convert.logprob_to_proto(TokenLogprob(-0.5))).rank is None


def test_result_round_trip():
    res = PrefillResult(request_id="r", first_token_id=9, prompt_tokens=40, cached=CachedTokens(16, 0, 16),
                        transfer_bytes=100, transfer_s=0.5, compute_s=0.25)
    assert convert.result_from_proto(convert.result_to_proto(res)) == res
    assert res.cached.total == 32


def test_unset_sampling_fields_mean_defaults():
    params = convert.sampling_from_proto(pb.SamplingParams())
    assert params.temperature == 0.0 and params.top_p == 1.0 and params.top_k == -1 and params.min_p == 0.0
    assert params.max_tokens == SamplingParams().max_tokens and params.seed is None


def test_bad_sampling_value_is_an_invalid_request_naming_it():
    with pytest.raises(InvalidRequest, match="temperature"):
        convert.sampling_from_proto(pb.SamplingParams(temperature=-1.0))


def test_generate_job_and_event():
    msg = pb.GenerateRequest(request_id="g", token_ids=[4, 5], prefill_address="h:1", timeout_s=2.0,
                             sampling=pb.SamplingParams(max_tokens=3))
    job = job_from_proto(msg)
    assert (job.request_id, job.token_ids, job.prefill_address, job.params.max_tokens) == ("g", (4, 5), "h:1", 3)
    out = event_to_proto("g", DecodeEvent(token_ids=(7,), text="hi", finish_reason="stop", matched_stop="2"),
                         2, CachedTokens(store=16))
    assert (list(out.token_ids), out.text, out.finish_reason, out.cached.store, out.prompt_tokens) == (
        [7], "hi", "stop", 16, 2)
