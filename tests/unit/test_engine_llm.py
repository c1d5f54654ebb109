"""LLM reference engine on the tiny model: continuous batching and chunked prefill are
greedy-exact against one-request-at-a-time; the prefix cache is reused; pages all come back."""

import pytest
import torch

from engine.llm import LLM
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 40000, (n,), generator=g).tolist() for n in (5, 17, 33, 8, 50)]


@pytest.fixture(scope="module")
def one_at_a_time(tiny_model_dir):
    llm = LLM(tiny_model_dir, num_pages=64, page_size=4, max_num_seqs=1, max_num_batched_tokens=4096,
              enable_prefix_cache=False, torch_threads=2)
    return [llm.generate([p], GREEDY)[0] for p in prompts()]


def test_batched_chunked_generation_is_greedy_exact(tiny_model_dir, one_at_a_time):
    llm = LLM(tiny_model_dir, num_pages=128, page_size=4, max_num_seqs=3, max_num_batched_tokens=7)
    assert llm.generate(prompts(), GREEDY) == one_at_a_time
    assert all(len(o) == 12 for o in one_at_a_time)
    llm.allocator.check_integrity()
    assert llm.allocator.num_available() == 128


def test_prefix_cache_reused_and_exact(tiny_model_dir, one_at_a_time):
    llm = LLM(tiny_model_dir, num_pages=128, page_size=4)
    llm.generate(prompts(), GREEDY)
    seqs = [llm.add_request(p, GREEDY) for p in prompts()]
    while llm.has_unfinished():
        llm.step()
    assert [s.output_ids for s in seqs] == one_at_a_time
    # every full prompt page except one computed token is found again: (len - 1) // 4 pages
    assert [s.num_cached_tokens for s in seqs] == [4, 16, 32, 4, 48]
    llm.allocator.check_integrity()


def test_small_pool_queues_requests(tiny_model_dir, one_at_a_time):
    # each request needs <= 16 pages; 20 pages fit only one at a time
    llm = LLM(tiny_model_dir, num_pages=20, page_size=4)
    assert llm.generate(prompts(), GREEDY) == one_at_a_time
    llm.allocator.check_integrity()
    with pytest.raises(ValueError, match="more KV pages than the pool"):
        llm.add_request(list(range(3, 100)), GREEDY)
    with pytest.raises(ValueError, match=r"\[49152\] outside the vocabulary"):
        llm.add_request([5, 49152], GREEDY)
    with pytest.raises(ValueError, match="empty prompt"):
        llm.add_request([], GREEDY)


def test_seeded_sampling_and_stop(tiny_model_dir):
    llm = LLM(tiny_model_dir, num_pages=64, page_size=4)
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=10, ignore_eos=True)
    a = llm.generate(prompts()[:2], p)
    b = llm.generate(prompts()[:2][::-1], p)[::-1]
    assert a == b  # per-request generators: batch order does not matter
    first = a[0][0]
    stop = llm.generate(prompts()[:1], SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=10,
                                                      stop_token_ids=(first,)))
    assert stop == [[first]]
