"""A tensor-parallel worker's steps across real processes (pdorch/worker/tp_steps.py): rank 0's
GroupRunner sends each step as words with delta page tables over the group's CPU (gloo) group, the
follower decodes and runs them (follow()). A batch that changes at every step (requests join with a
prefill chunk, finish and give their pages to later ones, a page is copied, prompt logprobs once)
gives, greedy, the same tokens and logits at TP 2 as one process with the whole model: a follower
that rebuilt any table wrong would write or read other KV and change rank 0's logits."""

from __future__ import annotations

import multiprocessing as mp
import traceback

import pytest
import torch

from engine.kv_pool import KVPool
from engine.loader import load_model
from engine.model_runner import Chunk, ModelRunner
from engine.tensor_parallel import NO_TP, TPShard, init_tp_group
from pdorch.local_stack.hf_checkpoints import build_checkpoint
from tests.fixtures.ranks import run_ranks

TIMEOUT_S = 90
PAGE = 4
VOCAB = 1001
STEPS = 24


class Schedule:
    """Requests in a batch that changes every step; greedy tokens from `runner`'s logits."""

    def __init__(self, runner):
        self.runner = runner
        self.free = list(range(63, -1, -1))  # pages handed out from the end, freed pages reused first
        self.rows: list[dict] = []
        self.rng = torch.Generator().manual_seed(11)

    def pages(self, n: int) -> list[int]:
        return [self.free.pop() for _ in range(n)]

    def run(self) -> dict:
        tokens, logits, extra = [], [], []
        for step in range(STEPS):
            chunks = [Chunk(r["pages"], r["len"], [r["next"]]) for r in self.rows]
            if step % 3 == 0:  # a request joins: its prompt in one prefill chunk
                prompt = torch.randint(0, VOCAB, (5 + step % 7,), generator=self.rng).tolist()
                row = {"pages": self.pages(-(-(len(prompt) + STEPS) // PAGE)), "len": 0, "prompt": prompt}
                self.rows.append(row)
                chunks.append(Chunk(row["pages"], 0, prompt))
            if step == 10:
                out, every = self.runner.forward_every_row(chunks, [i == len(chunks) - 1 for i in range(len(chunks))])
                extra.append(torch.cat(list(every.values())))
            else:
                out = self.runner.forward(chunks)
            picked = out.argmax(-1).tolist()
            for r, c, t in zip(self.rows, chunks, picked):
                r["len"], r["next"] = c.end, t
            tokens.append(picked)
            logits.append(out)
            if step % 4 == 3 and len(self.rows) > 1:  # the oldest finishes; its pages go to the next ones
                done = self.rows.pop(0)
                self.free += done["pages"]
            if step == 7:
                self.runner.copy_page(self.rows[0]["pages"][0], self.free[0])
        return {"tokens": tokens, "logits": torch.cat(logits), "prompt_logits": torch.cat(extra)}


def rank_main(rank: int, model_dir: str, store: str, out_dir, results: mp.Queue) -> None:
    torch.set_num_threads(1)
    try:
        from pdorch.worker.tp_steps import GroupRunner, StepChannel, follow

        group = init_tp_group(rank, 2, f"file://{store}", "gloo", TIMEOUT_S)
        _, model = load_model(model_dir, shard=TPShard(rank, 2), group=group)
        pool = KVPool(model.local_arch, 64, PAGE)
        broken: list[BaseException] = []
        channel = StepChannel(group, broken.append)
        if rank == 0:
            res = Schedule(GroupRunner(model, model.local_arch, pool, "auto", channel)).run()
            channel.stop(TIMEOUT_S)
            assert not broken, broken
            torch.save(res, out_dir / "rank0.pt")
        else:
            follow(channel, ModelRunner(model, model.local_arch, pool))
        group.close()
        results.put((rank, None))
    except Exception:  # noqa: BLE001 - the parent shows it
        results.put((rank, traceback.format_exc()))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_checkpoint("qwen2", tmp_path_factory.mktemp("tp_steps") / "ckpt", seed=4, tokenizer=False,
                            vocab_size=VOCAB, std=0.3)


def test_tp2_steps_with_a_changing_batch_equal_one_process(model_dir, tmp_path):
    torch.set_num_threads(1)
    _, whole = load_model(model_dir, shard=NO_TP)
    ref = Schedule(ModelRunner(whole, whole.local_arch, KVPool(whole.local_arch, 64, PAGE))).run()
    assert len({t for step in ref["tokens"] for t in step}) > 3  # varied tokens: the check has teeth

    answers = run_ranks(rank_main, lambda r: (r, str(model_dir), str(tmp_path / "store"), tmp_path), 2, TIMEOUT_S)
    for rank, error in sorted(answers.items()):
        assert error is None, f"rank {rank} failed:\n{error}"
    got = torch.load(tmp_path / "rank0.pt")
    assert got["tokens"] == ref["tokens"]
    assert (got["logits"] - ref["logits"]).abs().max() < 1e-5
    assert (got["prompt_logits"] - ref["prompt_logits"]).abs().max() < 1e-5
