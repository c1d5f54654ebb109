"""Presets of `pdorch bench multiturn`: cluster sizes derived from the workload, so each preset means
the same thing for any --clients / --rounds / turn sizes:

    sglang  SGLang's benchmark/hicache/bench_multiturn.py shape on the default config (configs/local.yaml
            sizes: prefill L1 512 pages, decode pool 1,024, 2 x 256 MiB store): only the bench's own
            timeout is set
    fits  every page of the run fits in the prefill workers' L1 (the store is not needed)
    l3    L1 holds about the round-1 working set but not round 2's, so late rounds must read the
          store; the store holds 1.5x the final working set (no eviction)
    ssd   as full, but the store's DRAM holds about a third of the final working set and the SSD
          tier (`store.ssd_path`, a temporary directory per run) the rest: DRAM overflows into disk.
          The decode worker's prefix cache is off: its pool, sized for every client's longest
          prompt, would otherwise hold the whole working set and no read would reach the store.
          The master's read lease is 1 s and it evicts 20% at a time, as docs/operations.md
          advises for the SSD tier
    full  the store holds about half the final working set: eviction every late round, the steady
          state of a production cache. As in production, L1 is small next to the store (one
          longest prompt and a page margin: the prefill pool is working memory more than cache),
          and the default workload has more, shorter conversations (16 x 128-token turns), so that
          one prompt is small next to the store: the capacity-bound ideal counts L1 pages as
          capacity, but a prompt being prefilled occupies them, so with L1 the size of two
          prompts no policy could come near that bound.

Working set of round r = full pages of every client's previous context (prompt + answer of round
r-1), estimated here from the turn sizes (OpenAI adds the chat template's tokens). Every preset
also sizes the decode pool for the longest prompts of the run and lets a prefill call wait up to
the router's deadline (a benchmark measures slow rounds rather than failing them).
"""

from __future__ import annotations

import dataclasses
import inspect
import math

from engine.dtypes import DTYPE_BYTES, resolve_dtypes
from pdorch.config import Config

PRESETS = ("sglang", "fits", "l3", "full", "ssd", "none")
# The workload each preset runs unless --clients / --rounds / --*-tokens say otherwise.
_SGLANG_SEED = {"clients": 8, "rounds": 6, "first_tokens": 256, "turn_tokens": 256, "output_tokens": 64}
PRESET_WORKLOADS = {"sglang": _SGLANG_SEED, "fits": _SGLANG_SEED, "l3": _SGLANG_SEED, "none": _SGLANG_SEED,
                    "full": {"clients": 16, "rounds": 6, "first_tokens": 128, "turn_tokens": 128, "output_tokens": 32}}
PRESET_WORKLOADS["ssd"] = PRESET_WORKLOADS["full"]
MIB = 1 << 20
_OPENAI_SYSTEM_TOKENS = 24   # SmolLM2's default system prompt with its markers
_OPENAI_TURN_TOKENS = 5      # "<|im_start|>role\n" ... "<|im_end|>\n" around each message


@dataclasses.dataclass(frozen=True)
class Workload:
    clients: int
    rounds: int
    first_tokens: int
    turn_tokens: int
    output_tokens: int
    api: str = "sglang"
    max_parallel: int = 0  # 0 = clients

    def prompt_tokens(self, r: int) -> int:
        """Estimated prompt tokens of one client in round r."""
        n = self.first_tokens + r * (self.turn_tokens + self.output_tokens)
        if self.api == "openai":
            n += _OPENAI_SYSTEM_TOKENS + (2 * r + 1) * _OPENAI_TURN_TOKENS
        return n

    def context_tokens(self, r: int) -> int:
        """Prompt + answer of round r."""
        return self.prompt_tokens(r) + self.output_tokens


def working_set_pages(w: Workload, r: int, page_size: int) -> int:
    """Full pages of every client's previous context in round r (0 in round 0)."""
    if r <= 0:
        return 0
    return w.clients * ((w.context_tokens(r - 1) - 1) // page_size)


def final_working_set_pages(w: Workload, page_size: int) -> int:
    """Pages of every client's whole conversation after the last round."""
    return w.clients * math.ceil(w.context_tokens(w.rounds - 1) / page_size)


def page_bytes(cfg: Config, kv_values_per_token: int, checkpoint_dtype: str | None = None) -> int:
    m = cfg.model
    kv = resolve_dtypes(m.dtype, m.kv_dtype, m.device, checkpoint_dtype).kv
    return kv_values_per_token * m.page_size * DTYPE_BYTES[kv]


def default_high_watermark(cfg: Config | None = None) -> float:
    """mooncake_master's eviction high watermark as the launcher starts it: the config key where
    the config has one, else MasterProcess's default."""
    configured = getattr(cfg.store, "master_eviction_high_watermark", None) if cfg is not None else None
    if configured is not None:
        return configured
    from store_client.master import MasterProcess
    return inspect.signature(MasterProcess).parameters["eviction_high_watermark_ratio"].default


def preset_overrides(name: str, w: Workload, cfg: Config, kv_values_per_token: int, num_prefill: int = 1,
                     num_decode: int = 1, ssd_dir: str = "") -> list[str]:
    """The --set flags of a preset (before the user's own, which win). `ssd_dir`: the SSD tier's
    directory of the `ssd` preset."""
    if name == "none":
        return []
    if name == "sglang":  # the default config as it is: a benchmark measures a slow round instead of failing it
        return ["decode.prefill_timeout_s=600"]
    P = cfg.model.page_size
    pb = page_bytes(cfg, kv_values_per_token)
    last = w.rounds - 1
    final = final_working_set_pages(w, P)
    prompt_pages = math.ceil(w.prompt_tokens(last) / P)
    in_flight = min(w.clients, w.max_parallel or w.clients)
    decode_pages = math.ceil(in_flight * math.ceil((w.prompt_tokens(last) + w.output_tokens + 1) / P)
                             / cfg.decode.kv_watermark) + 16
    sets = [f"decode.num_pages={decode_pages}", "decode.prefill_timeout_s=600"]
    if name == "fits":
        new_pages = math.ceil((w.turn_tokens + w.output_tokens) / P) + 2  # per request beyond its cached prefix
        l1 = math.ceil((final + w.clients * new_pages + 16) / num_prefill)
        return sets + [f"prefill.num_pages={l1}"]
    if name in ("full", "ssd"):  # L1 small next to the store, as in production: one longest prompt + a margin
        l1 = prompt_pages + 16
    else:  # l3: L1 between the round-1 and round-2 working sets, never below two of the longest prompts
        ws1, ws2 = working_set_pages(w, 1, P), working_set_pages(w, min(2, last), P)
        l1 = max(2 * prompt_pages + 16, (ws1 + ws2) // 2 // num_prefill)
    segments = num_prefill + (num_decode if cfg.decode.offload_generated_kv else 0)
    share = {"l3": 1.5 / default_high_watermark(cfg), "full": 1 / 2, "ssd": 1 / 3}[name]
    segment_mb = max(16, math.ceil(share * final * pb / segments / MIB))
    sets += [f"prefill.num_pages={l1}", f"store.global_segment_size_mb={segment_mb}"]
    if name != "ssd":
        return sets
    # NOTE: a read leases a page in DRAM for master_kv_lease_ttl_ms (10 s by default): every round
    # reads the whole working set, so DRAM filled with leased pages and refused writes (docs/workers.md)
    return sets + [f"store.ssd_path={ssd_dir}", "decode.prefix_cache=false", "store.master_kv_lease_ttl_ms=1000",
                   "store.master_eviction_ratio=0.2"]


def describe(name: str, w: Workload, cfg: Config, kv_values_per_token: int) -> str:
    """One paragraph printed at start: what the preset sized and from which numbers."""
    P = cfg.model.page_size
    pb = page_bytes(cfg, kv_values_per_token)
    final = final_working_set_pages(w, P)
    ws = ", ".join(str(working_set_pages(w, r, P)) for r in range(w.rounds))
    return (f"preset {name}: page {P} tokens = {pb:,} bytes; working set by round (pages): {ws}; "
            f"final {final} pages = {final * pb / MIB:.0f} MiB")
