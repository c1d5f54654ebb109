"""The prefill protocol's engine-side objects: what D asks of P, and what P answers.

Plain frozen dataclasses (no protobuf): `pdorch/worker/convert.py` maps them to and from
`worker_pb2`, so the scheduler, the tests and the decode worker's client code never touch
generated classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # engine.sampler imports torch; the type is all this file needs
    from engine.sampler import TokenLogprob

# Trailing metadata P sets on a Prefill answer (any status) when no KV write of the request into D's
# pages can land any more: D may then give those pages to another request at once (docs/workers.md).
WRITES_OVER_KEY = "pdorch-writes-over"


@dataclass(frozen=True)
class CachedTokens:
    """Prompt tokens reused instead of computed, per tier (docs/design.md section 4)."""

    device: int = 0
    host: int = 0
    store: int = 0  # the store's DRAM
    ssd: int = 0  # the store's SSD offload files
    inflight: int = 0  # another request's pages, computed while this one waited for them (prefill_node/inflight.py)

    @property
    def total(self) -> int:
        return self.device + self.host + self.store + self.ssd + self.inflight


CACHE_TIERS = tuple(f.name for f in fields(CachedTokens))  # the label values of cached-token metrics


@dataclass(frozen=True)
class PrefillJob:
    """One Prefill call: produce the prompt KV into D's pages and sample the first token."""

    request_id: str
    token_ids: tuple[int, ...]
    params: SamplingParams
    decode_segment: str
    dest_page_addrs: tuple[int, ...]
    timeout_s: float
    page_size: int
    model_fingerprint: str
    page_hashes: tuple[str, ...] = ()  # the prompt's full pages, hashed once by D; () = P hashes them
    decode_loaded_pages: tuple[int, ...] = ()  # pages D holds or reads from the store itself: P does not push them
    decode_cached_pages: tuple[int, ...] = ()  # of those, pages already in D's pool: P may read them from it
    decode_ranks: tuple = ()  # D's TP ranks (tp_transfer.PoolRank), rank 0 first; () = D is one rank


@dataclass(frozen=True)
class FirstToken:
    """Another output sequence's first token (params.n > 1), sampled from the same logits."""

    token_id: int
    sampler_state: bytes = b""  # its generator (seed + i) after sampling, for seeded requests
    logprob: TokenLogprob | None = None  # when asked for


@dataclass(frozen=True)
class PrefillResult:
    """What P returns once the KV sits in D's pages."""

    request_id: str
    first_token_id: int
    prompt_tokens: int
    cached: CachedTokens = field(default_factory=CachedTokens)
    transfer_bytes: int = 0
    transfer_s: float = 0.0
    compute_s: float = 0.0
    sampler_state: bytes = b""  # torch.Generator state after the first token (seeded requests)
    unstored_pages: tuple[int, ...] = ()  # pushed pages P does not write to the store (selective write-back)
    first_logprob: TokenLogprob | None = None  # of the first token, when asked for
    more_first: tuple[FirstToken, ...] = ()  # sequences 1 .. n-1's first tokens (params.n > 1)
    prompt_logprobs: tuple = ()  # engine.sampler.TokenLogprob of prompt tokens 1 .. n-1 (params.prompt_logprobs)
