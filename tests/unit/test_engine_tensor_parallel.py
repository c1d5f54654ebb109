"""Tensor parallelism (engine/tensor_parallel.py): the head / column / vocabulary split of TPShard, then
whole models run sharded across processes.

The multi-process tests spawn tp_size ranks (gloo, a file rendezvous in tmp_path). Each rank loads its
shard of the same random checkpoint and runs the same steps through a ModelRunner over its own KV pool
(chunked prefill, a mixed prefill + prefill-on-prefix batch, batched greedy decode). Against one
process running the whole model (fp32):
- the logits of every rank agree within 1e-5 and the greedy tokens are identical;
- rank r's pool holds the whole model's pool restricted to TPShard(r, size).kv_heads(): the
  head-to-rank map a KV transfer between workers of other TP sizes relies on.

Models: a Qwen2 (q/k/v biases, tied embeddings) with 4 query and 2 KV heads, at TP 2 and TP 4 (KV heads
replicated); a Llama with 8 query and 8 KV heads, untied lm_head, o and MLP biases, at TP 2 and 4. Both
have a vocabulary of 2051, not a multiple of 2 or 4: the last rank holds padding rows.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback

import pytest
import torch

from engine.arch import ModelArch
from engine.kv_pool import KVPool
from engine.loader import load_model
from engine.model_runner import Chunk, ModelRunner
from engine.tensor_parallel import NO_TP, TPGroup, TPShard, init_tp_group
from pdorch.local_stack.hf_checkpoints import build_checkpoint
from tests.fixtures.ranks import run_ranks

TIMEOUT_S = 60
PAGE = 4
VOCAB = 2051
MODELS = {
    "qwen2-kv2": ("qwen2", {}),
    "llama-kv8": ("llama3", {"shape": {"num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 8},
                             "attention_bias": True, "mlp_bias": True}),
}
DECODE_STEPS = 4
# Ids at the edges of every rank's vocabulary range (513 rows each at TP 4, 1026 at TP 2), then random ones.
EDGES = [0, 512, 513, 1025, 1026, 1538, 1539, VOCAB - 1]
PROMPT_A = EDGES + torch.randint(0, VOCAB, (13,), generator=torch.Generator().manual_seed(1)).tolist()
PROMPT_B = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(2)).tolist()
PAGES_A = [0, 1, 2, 3, 4, 5, 6]          # 21 + 4 positions
PAGES_B = [11, 9, 14, 8]                 # 9 + 4 positions, out of order


def arch_of(heads: int, kv_heads: int, intermediate: int = 128) -> ModelArch:
    return ModelArch(vocab_size=VOCAB, hidden_size=64, intermediate_size=intermediate, num_layers=1,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=16, rope_theta=10000.0)


def heads(arch: ModelArch, size: int) -> list[tuple[range, range]]:
    return [(TPShard(r, size).q_heads(arch), TPShard(r, size).kv_heads(arch)) for r in range(size)]


# --- TPShard: the split, no processes ---------------------------------------------------------------

def test_two_kv_heads_split_then_replicate():
    a = arch_of(4, 2)
    assert heads(a, 1) == [(range(4), range(2))]
    assert heads(a, 2) == [(range(2), range(1)), (range(2, 4), range(1, 2))]
    # TP 4 > 2 KV heads: ranks 0,1 share KV head 0, ranks 2,3 KV head 1; one query head each
    assert heads(a, 4) == [(range(r, r + 1), range(r // 2, r // 2 + 1)) for r in range(4)]
    assert not TPShard(1, 2).replicated_kv(a) and TPShard(1, 4).replicated_kv(a)


def test_eight_kv_heads_split():
    a = arch_of(32, 8)
    for size in (1, 2, 4, 8):
        q, kv = 32 // size, 8 // size
        assert heads(a, size) == [(range(r * q, (r + 1) * q), range(r * kv, (r + 1) * kv)) for r in range(size)]


def test_local_arch():
    a = arch_of(4, 2)
    assert NO_TP.local_arch(a) is a
    local = TPShard(3, 4).local_arch(a)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (1, 1, 32)
    assert (local.vocab_size, local.hidden_size, local.head_dim) == (VOCAB, 64, 16)
    assert local.kv_values_per_token * 2 == a.kv_values_per_token   # each KV head stored on 2 ranks


def test_vocab_ranges_cover_the_vocabulary_once():
    a = arch_of(4, 2)
    assert TPShard(0, 4).vocab_per_rank(a) == 513
    assert [TPShard(r, 4).vocab_rows(a) for r in range(4)] == [range(513), range(513, 1026),
                                                                range(1026, 1539), range(1539, 2051)]
    assert [TPShard(r, 2).vocab_rows(a) for r in range(2)] == [range(1026), range(1026, 2051)]


@pytest.mark.parametrize("heads_, kv, size, what", [
    (4, 2, 3, "must divide num_attention_heads"),
    (24, 4, 6, "must divide num_key_value_heads or be a multiple of it"),
    (8, 8, 16, "must divide num_attention_heads"),
])
def test_unsupported_sizes_name_tp_size(heads_, kv, size, what):
    with pytest.raises(ValueError, match=f"tp_size={size} {what} \\(num_attention_heads={heads_}, "
                                         f"num_key_value_heads={kv}"):
        TPShard(0, size).local_arch(arch_of(heads_, kv))


def test_unsupported_intermediate_size_and_bad_ranks():
    with pytest.raises(ValueError, match="tp_size=8 must divide intermediate_size"):
        TPShard(0, 8).check(arch_of(8, 8, intermediate=100))
    with pytest.raises(ValueError, match="tp rank 2 outside 0..1"):
        TPShard(2, 2)
    with pytest.raises(ValueError, match="tp_size=2 needs a torch.distributed process group"):
        TPGroup(0, 2)


def test_loader_refuses_a_size_the_model_cannot_split(checkpoints):
    with pytest.raises(ValueError, match="tp_size=3 must divide num_attention_heads"):
        load_model(checkpoints["qwen2-kv2"], shard=TPShard(0, 3))


# --- whole models across processes ------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    return {name: build_checkpoint(family, root / name, seed=7, tokenizer=False, vocab_size=VOCAB, **kw)
            for name, (family, kw) in MODELS.items()}


def run_steps(model_dir, shard: TPShard, group: TPGroup) -> dict:
    """Prefill A's first chunk; A's second chunk with all of B; then greedy decode of both."""
    _, model = load_model(model_dir, shard=shard, group=group)
    pool = KVPool(model.local_arch, num_pages=16, page_size=PAGE)
    runner = ModelRunner(model, model.local_arch, pool)
    runner.forward([Chunk(PAGES_A, 0, PROMPT_A[:12])])
    logits = [runner.forward([Chunk(PAGES_A, 12, PROMPT_A[12:]), Chunk(PAGES_B, 0, PROMPT_B)])]
    tokens = []
    for i in range(DECODE_STEPS):
        a, b = (int(t) for t in logits[-1].argmax(-1))
        if group.size > 1:  # rank 0 alone has the whole vocabulary's logits: its tokens are everyone's
            box = [(a, b)]
            torch.distributed.broadcast_object_list(box, src=0, group=group.cpu_pg)
            a, b = box[0]
        tokens.append((a, b))
        logits.append(runner.forward([Chunk(PAGES_A, len(PROMPT_A) + i, [a]), Chunk(PAGES_B, len(PROMPT_B) + i, [b])]))
    return {"logits": torch.stack(logits), "tokens": tokens, "pool": pool.tensor.clone()}


def rank_main(rank: int, size: int, store: str, dirs: dict, out_dir, results: mp.Queue) -> None:
    """One spawned rank: join the group, run every model's steps, save them; report (rank, error)."""
    torch.set_num_threads(1)
    try:
        group = init_tp_group(rank, size, f"file://{store}", "gloo", TIMEOUT_S)
        try:
            runs = {name: run_steps(d, TPShard(rank, size), group) for name, d in dirs.items()}
        finally:
            group.close()
        torch.save(runs, out_dir / f"rank{rank}.pt")
        results.put((rank, None))
    except Exception:  # noqa: BLE001 - the parent shows it
        results.put((rank, traceback.format_exc()))


def run_tp(size: int, dirs: dict, tmp) -> list[dict]:
    """Every rank's runs of every model, from `size` spawned processes; each wait has a deadline."""
    answers = run_ranks(rank_main, lambda r: (r, size, str(tmp / "store"), dirs, tmp), size, TIMEOUT_S,
                        what=f"TP {size}", check_exit=True)
    for rank, error in sorted(answers.items()):
        assert error is None, f"TP {size} rank {rank} failed:\n{error}"
    return [torch.load(tmp / f"rank{r}.pt") for r in range(size)]


@pytest.fixture(scope="module")
def whole(checkpoints):
    torch.set_num_threads(1)
    return {name: run_steps(d, NO_TP, TPGroup()) for name, d in checkpoints.items()}


@pytest.fixture(scope="module")
def sharded(checkpoints, tmp_path_factory):
    """{tp_size: [rank 0's runs, rank 1's, ...]}: one group of processes per size runs both models."""
    return {size: run_tp(size, checkpoints, tmp_path_factory.mktemp(f"tp{size}")) for size in (2, 4)}


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("name", list(MODELS))
def test_sharded_model_matches_the_whole(name, size, whole, sharded, checkpoints):
    ref = whole[name]
    arch = ModelArch.from_model_dir(checkpoints[name])
    assert ref["logits"].shape == (DECODE_STEPS + 1, 2, VOCAB)
    for rank, runs in enumerate(sharded[size]):
        got = runs[name]
        assert got["tokens"] == ref["tokens"]
        if rank == 0:  # the logits are gathered to rank 0 alone (the one that samples)
            assert got["logits"].shape == ref["logits"].shape
            assert (got["logits"] - ref["logits"]).abs().max() < 1e-5
        else:  # the others keep their own vocabulary rows (the last rank's padding rows are zero)
            rows = TPShard(rank, size).vocab_rows(arch)
            assert got["logits"].shape[-1] == TPShard(rank, size).vocab_per_rank(arch) < VOCAB
            assert (got["logits"][..., :len(rows)] - ref["logits"][..., rows.start:rows.stop]).abs().max() < 1e-5
        kv = TPShard(rank, size).kv_heads(arch)
        # pool[page, head, layer, K|V, slot, dim]: rank r's heads are the whole pool's heads kv
        assert got["pool"].shape[1] == len(kv)
        assert (got["pool"] - ref["pool"][:, kv.start:kv.stop]).abs().max() < 1e-5
