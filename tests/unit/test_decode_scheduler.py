"""DecodeScheduler on its own thread with the tiny random-weights model: admission into the batch,
out of pages while decoding, and draining (a finished request's pages wait for its offload write).

No P here: the prompt's pages hold no real KV, which changes the tokens, not what is asserted.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from decode_node.request import DecodeRequest, GenerateJob
from decode_node.scheduler import DecodeScheduler
from decode_node.stopping import check_stop, make_stopper
from engine.dtypes import ModelDtypes
from engine.kv_pool import KVPool
from engine.loader import load_model
from engine.model_runner import ModelRunner
from engine.page_allocator import PageAllocator
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer
from pdorch.local_stack.workers import make_config
from pdorch.worker.metrics import WorkerRecorder
from pdorch.worker.runtime import WorkerRuntime
from store_client.io_thread import IOCompletion
from store_client.page_hash import page_hashes, store_key

PAGE_SIZE = 16  # make_config's page size
FIRST_TOKEN = 7  # what P would have answered


class HeldStoreIO:
    """Records offload saves; their completions wait for release() (then wake the loop, like StoreIO)."""

    def __init__(self):
        self.saves, self.held, self.done = [], [], []
        self.on_complete = None

    def submit_save(self, tag, keys, addrs, owners=None):
        self.saves.append(list(keys))
        self.held.append(IOCompletion(tag, "save", len(keys), "ok", len(keys), page_ok=(True,) * len(keys)))
        return True

    def release(self):
        self.done.extend(self.held)
        self.held = []
        self.on_complete()

    def poll(self):
        out, self.done = self.done, []
        return out

    def cancel_owner(self, owner):
        return 0


def load_tiny(tmp, tiny_model_dir):
    """(config, arch, model, tokenizer) of the tiny random-weights model."""
    cfg = make_config(tmp, tiny_model_dir)
    arch, net = load_model(tiny_model_dir)
    return cfg, arch, net, Tokenizer.from_dir(tiny_model_dir)


def start_scheduler(model, num_pages: int, store_io=None, max_running: int = 4, local_prefill_tokens: int = 256,
                    **scheduler_keys):
    """A started DecodeScheduler over a fresh pool of `num_pages` (offload on when store_io is given);
    `scheduler_keys` go to DecodeScheduler (prefix_cache, preemption, reserve)."""
    cfg, arch, net, _ = model
    pool = KVPool(arch, num_pages, PAGE_SIZE, torch.float32, "cpu")
    rt = WorkerRuntime(cfg=cfg, model_dir=cfg.model.source, arch=arch, runner=ModelRunner(net, arch, pool),
                       pool=pool, allocator=PageAllocator(num_pages), sampler=Sampler(), fingerprint="fp",
                       dtypes=ModelDtypes("float32", "float32"), transfer=None, segment="", store=SimpleNamespace(enabled=store_io is not None),
                       store_io=store_io)
    sched = DecodeScheduler(rt, max_running, offload=store_io is not None, recorder=WorkerRecorder("decode"),
                            max_queued=4, watermark=1.0, local_prefill_tokens=local_prefill_tokens, **scheduler_keys)
    sched.start()
    return sched, rt


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_model_dir):
    return load_tiny(tmp_path_factory.mktemp("decode_sched"), tiny_model_dir)


@pytest.fixture
def make(model):
    """make(num_pages, store_io=None) -> (scheduler, runtime); every scheduler is stopped at the end."""
    made = []

    def _make(num_pages: int, store_io=None):
        made.append(start_scheduler(model, num_pages, store_io))
        return made[-1]

    yield _make
    for sched, _ in made:
        sched.stop()


def admitted(sched, tokenizer, rid: str, prompt: list[int], max_tokens: int) -> DecodeRequest:
    """A greedy request with its pages admitted and its prompt hashed, as DecodeWorker has it
    before the prompt KV is in place."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    job = GenerateJob(request_id=rid, token_ids=tuple(prompt), params=params, prefill_address="-", timeout_s=30)
    req = DecodeRequest(job=job, deadline=time.monotonic() + 30, own_deadline=True,
                        stopper=make_stopper(tokenizer, params, prompt), token_ids=list(prompt))
    sched.admit_request(req, (len(prompt) + PAGE_SIZE) // PAGE_SIZE, 0, lambda: False)
    req.page_hashes = page_hashes(prompt, PAGE_SIZE)
    return req


def prefilled(sched, tokenizer, rid: str, prompt: list[int], max_tokens: int) -> DecodeRequest:
    """What DecodeWorker hands the batch after P's answer: pages admitted, first token accounted."""
    req = admitted(sched, tokenizer, rid, prompt, max_tokens)
    req.token_ids.append(FIRST_TOKEN)
    assert not check_stop(req, FIRST_TOKEN, 10_000).final
    return req


def events_until_final(req: DecodeRequest, timeout_s: float = 30.0) -> list:
    deadline, events = time.monotonic() + timeout_s, []
    while not events or not events[-1].final:
        events.append(req.events.get(timeout=max(0.0, deadline - time.monotonic())))
    return events


def free_pages(sched, rt) -> int:
    return sched.call(rt.allocator.num_available)


def test_admitted_requests_join_decode_and_give_their_pages_back(make, model):
    sched, rt = make(8)
    reqs = [prefilled(sched, model[3], f"r{i}", list(range(10 + i, 30 + i)), max_tokens=20) for i in range(2)]
    assert free_pages(sched, rt) == 8 - 2 * 2  # 20 prompt tokens + the first decode position: 2 pages each
    for req in reqs:
        sched.join(req)
    for req in reqs:
        events = events_until_final(req)
        assert events[-1].finish_reason == "length" and events[-1].error is None
        assert req.num_generated == 20  # the first token (P's) + 19 decoded here
    assert free_pages(sched, rt) == 8
    sched.call(rt.allocator.check_integrity)


def test_out_of_pages_while_decoding_fails_only_that_request(make, model):
    sched, rt = make(1)
    req = prefilled(sched, model[3], "big", list(range(10, 24)), max_tokens=50)  # 14 tokens: 1 page
    sched.join(req)
    events = events_until_final(req)
    # positions 14 and 15 fit in the one page; feeding position 16 needs a second page
    assert [len(e.token_ids) for e in events[:-1]] == [1, 1]
    assert "KV pool exhausted" in str(events[-1].error)
    assert free_pages(sched, rt) == 1
    sched.call(rt.allocator.check_integrity)


def test_a_finished_request_keeps_its_pages_until_its_offload_write_completes(make, model):
    io = HeldStoreIO()
    sched, rt = make(4, store_io=io)
    prompt = list(range(10, 24))  # 14 tokens: page 0 fills when position 15 is fed
    req = prefilled(sched, model[3], "drain", prompt, max_tokens=3)
    sched.join(req)
    events = events_until_final(req)
    assert events[-1].finish_reason == "length"
    # the page filled in the request's last step is still being written: it drains, pages held
    assert io.saves == [[store_key("fp", page_hashes(req.token_ids, PAGE_SIZE)[0])]]
    assert free_pages(sched, rt) == 4 - 1
    io.release()  # the write completes: the loop is woken and gives the page back
    deadline = time.monotonic() + 5
    while free_pages(sched, rt) != 4:
        assert time.monotonic() < deadline, "a drained request's pages never came back"
        time.sleep(0.01)
    sched.call(rt.allocator.check_integrity)
