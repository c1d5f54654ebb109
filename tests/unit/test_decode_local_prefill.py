"""The decode scheduler computing prompt KV itself (decode_node/prompt_plan.py): a whole local
prefill with its first token, chunked by the per-step budget, and a page D could not read filled in
after P answered. Tiny random-weights model: it repeats one token, so besides the engine's greedy
output the KV itself is compared with one plain forward over the whole prompt."""

from __future__ import annotations

import pytest
import torch

from decode_node.request import DecodeRequest
from decode_node.stopping import check_stop
from engine.llm import LLM
from engine.model_runner import Chunk
from engine.sampling_params import SamplingParams
from pdorch.local_stack.router import wait_until
from pdorch.worker.prompt_pages import compute_ranges, computed_full_pages, reusable_pages
from store_client.page_hash import page_hashes, store_key
from tests.unit.test_decode_scheduler import (
    HeldStoreIO,
    admitted,
    events_until_final,
    load_tiny,
    start_scheduler,
)

PAGE_SIZE = 16
MAX_TOKENS = 8
PROMPT = list(range(40, 104))  # 64 tokens: pages 0..3 full, page 3 holds the last token


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_model_dir):
    return load_tiny(tmp_path_factory.mktemp("decode_local"), tiny_model_dir)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    llm = LLM(tiny_model_dir, num_pages=64, page_size=PAGE_SIZE)
    return llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))[0]


def prompt_kv_reference(sched, rt, pages: list[int]) -> torch.Tensor:
    """The prompt's KV from one plain forward into `pages` (on the scheduler thread)."""
    def forward():
        with torch.inference_mode():
            rt.runner.forward([Chunk(page_ids=pages, start_pos=0, token_ids=PROMPT)])
        return rt.pool.tensor[pages].clone()

    return sched.call(forward)


def written(sched, kind: str) -> float:
    sample = sched._rec.registry.get_sample_value("pdorch_decode_store_pages_written_total", {"kind": kind})
    return sample or 0.0


def new_request(sched, tokenizer, rid: str) -> DecodeRequest:
    return admitted(sched, tokenizer, rid, PROMPT, MAX_TOKENS)


@pytest.mark.parametrize("budget", [256, 16])
def test_a_local_prefill_samples_the_first_token_and_writes_its_full_pages(model, reference, budget):
    io = HeldStoreIO()
    sched, rt = start_scheduler(model, 8, store_io=io, local_prefill_tokens=budget)
    try:
        req = new_request(sched, model[3], f"local-{budget}")
        holes = list(range(reusable_pages(len(PROMPT), PAGE_SIZE)))  # nothing read from the store: all computed here
        req.compute.plan(compute_ranges(holes, len(PROMPT), PAGE_SIZE),
                         computed_full_pages(holes, len(PROMPT), PAGE_SIZE), sample_first=True)
        req_pages = req.page_ids[:len(PROMPT) // PAGE_SIZE]
        sched.join(req)
        events = events_until_final(req)
        assert events[-1].finish_reason == "length" and events[-1].error is None
        assert req.token_ids[len(PROMPT):] == reference
        assert [t for e in events for t in e.token_ids] == reference  # the first token streamed too
        # the 4 prompt pages computed here went to the store in one write, before any decoded page
        assert io.saves[0] == [store_key("fp", h) for h in page_hashes(PROMPT, PAGE_SIZE)]
        io.release()
        # counted as prompt write-back (as a prefill worker's), not as generated-KV offload
        wait_until(lambda: written(sched, "writeback") == 4, 10, "the 4 prompt pages counted as writeback")
        assert written(sched, "offload") == 0  # no generated page filled: 8 tokens after 64
        computed = sched.call(lambda: rt.pool.tensor[req_pages].clone())
        spare = [p for p in range(8) if p not in req_pages][:len(req_pages)]
        torch.testing.assert_close(computed, prompt_kv_reference(sched, rt, spare))
    finally:
        sched.stop()


def test_a_page_d_could_not_read_is_computed_before_decoding(model, reference):
    sched, rt = start_scheduler(model, 8)
    try:
        req = new_request(sched, model[3], "hole")
        prompt_pages = req.page_ids[:len(PROMPT) // PAGE_SIZE]

        # what P and D's own read left: every page in place but page 1 (its read failed)
        want = prompt_kv_reference(sched, rt, prompt_pages)
        sched.call(lambda: rt.pool.tensor[prompt_pages[1]].zero_())
        req.token_ids.append(reference[0])  # P's first token, accounted as D does (take_first_token)
        assert not check_stop(req, reference[0], 10_000).final
        req.compute.plan([[PAGE_SIZE, 2 * PAGE_SIZE]], [1])
        sched.join(req)
        events = events_until_final(req)
        assert req.token_ids[len(PROMPT):] == reference
        assert events[-1].finish_reason == "length"
        torch.testing.assert_close(sched.call(lambda: rt.pool.tensor[prompt_pages].clone()), want)
        sched.call(rt.allocator.check_integrity)
    finally:
        sched.stop()
