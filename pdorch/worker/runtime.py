"""WorkerRuntime: what a prefill or decode worker process builds once at start-up.

Model (prepared, loaded), KV pool + page allocator, model runner and sampler, the model
fingerprint used in store keys, the transfer engine (P2P handshake; the pool registered once),
and the store client with its I/O thread (with `store.eviction: chain` also the chain index the
schedulers touch and the evictor thread that reads it). Both workers use the same function so
their pools, fingerprints and store keys can never diverge.
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pdorch.config import Config

if TYPE_CHECKING:  # the heavy modules load in build_runtime, only when a worker starts
    from prometheus_client import CollectorRegistry

    from engine.arch import ModelArch
    from engine.dtypes import ModelDtypes
    from engine.grammar import Grammars
    from engine.kv_pool import KVPool
    from engine.model import DecoderModel
    from engine.model_runner import ModelRunner
    from engine.page_allocator import PageAllocator
    from engine.sampler import Sampler
    from engine.tensor_parallel import TPGroup, TPShard
    from engine.tokenizer import Tokenizer
    from pdorch.worker.tp_group import TPState
    from pdorch.worker.tp_io import GroupTransfer
    from pdorch.worker.tp_transfer import PoolRank
    from store_client.chain_index import ChainIndex
    from store_client.evictor import StoreEvictor
    from store_client.io_thread import StoreIO
    from store_client.metrics import StoreMetrics
    from store_client.store import KVStore
    from store_client.transfer import KVTransfer

log = logging.getLogger(__name__)


@dataclass
class WorkerRuntime:
    """What one worker process owns. NOTE: `allocator` is touched only by the scheduler thread
    (pdorch/worker/loop.py); everything else here is safe to read from any thread."""

    cfg: Config
    model_dir: pathlib.Path
    arch: ModelArch
    runner: ModelRunner
    pool: KVPool
    allocator: PageAllocator
    sampler: Sampler
    fingerprint: str  # model fingerprint, the prefix of every store key
    dtypes: ModelDtypes  # the resolved model.dtype / model.kv_dtype
    transfer: KVTransfer | None  # None only in tests that push nothing
    segment: str  # this process's transfer-engine segment name (D gives it to P)
    store: KVStore | None = None  # None: store disabled, or not used by this role
    store_io: StoreIO | None = None
    chain_index: ChainIndex | None = None  # schedulers call chain_index.touch(keys, first_depth)
    evictor: StoreEvictor | None = None  # StoreEvictor thread, started here
    grammars: Grammars | None = None  # structured outputs (compiles on the first grammar; None in unit fakes)
    tokenizer: Tokenizer | None = None  # loaded once per worker (D detokenizes; both read the EOS ids)
    tp: TPState | None = None  # rank 0 of a tensor-parallel worker: its followers (tp_group.py)
    tp_ranks: list[PoolRank] = field(default_factory=list)  # every rank's pool, rank 0 first (D sends them to P)
    peer_transfer: GroupTransfer | None = None  # KV transfers to / from other workers, any TP sizes

    @property
    def tp_size(self) -> int:
        return 1 if self.tp is None else self.tp.size

    @property
    def thread_init(self) -> Callable[[], None]:
        """What every thread of this worker that does device work runs first (engine/device.py)."""
        from engine.device import device_initializer

        return device_initializer(self.cfg.model.device)

    @property
    def page_size(self) -> int:
        """Tokens per KV page: the pool's, the one place both workers read it from (a prefill job's
        own page_size is checked against it when the job arrives)."""
        return self.pool.page_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The model's end-of-sequence ids (min_tokens keeps them out); () without a tokenizer."""
        return () if self.tokenizer is None else self.tokenizer.eos_token_ids

    @property
    def served_name(self) -> str:
        """The model's name in the API (model.served_name), which the router checks workers against."""
        return self.cfg.model.served_name

    @property
    def max_context(self) -> int:
        """Tokens a request may reach: model.max_context_tokens, else the model's own limit."""
        return self.cfg.model.max_context_tokens or self.arch.max_position_embeddings

    def close(self) -> None:
        if self.tp is not None:  # first: the followers stop their loops and close their own store and engine
            self.tp.close()
        if self.grammars is not None:
            self.grammars.close()
        if self.evictor is not None:  # first: it removes through the store closed below
            self.evictor.stop()
        if self.store_io is not None:
            self.store_io.close()
        for obj in (self.store, self.transfer):
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # best effort at shutdown
                    log.exception("closing %s failed", type(obj).__name__)


def default_torch_threads(local_workers: int = 2) -> int:
    """Cores divided among the local workers (docs/design.md section 8), at least 1."""
    return max(1, (os.cpu_count() or 1) // local_workers)


def configure_torch(threads: int) -> None:
    torch.set_num_threads(threads if threads > 0 else default_torch_threads())


def check_integrity(allocator: PageAllocator) -> tuple[bool, str]:
    """allocator.check_integrity() as (ok, error text) so it can travel in a Stats answer."""
    try:
        allocator.check_integrity()  # raises on the first broken invariant; returns nothing
    except Exception as e:  # noqa: BLE001 - the failure text is the payload
        return False, f"{type(e).__name__}: {e}"
    return True, ""


def max_forward_tokens(cfg: Config) -> int:
    """The most tokens one forward of either worker carries (pool sizing profiles that forward)."""
    d = cfg.decode
    return max(cfg.prefill.chunk_tokens, d.max_running_requests + d.max_local_prefill_tokens)


def build_runtime(cfg: Config, num_pages: int, use_store: bool, registry: CollectorRegistry | None = None,
                  evict: bool = False,
                  component: str = "", tp_size: int = 1) -> WorkerRuntime:
    """Everything a worker needs; store metrics go to `registry` (the worker's own /metrics).

    `evict`: run the chain evictor here, so this worker's store writes make room through the chain
    policy (both roles: each touches the whole chain of every prompt it sees).
    `tp_size` > 1: this process is rank 0 of a tensor-parallel worker; it starts the other ranks
    (pdorch/worker/tp_group.py) and its runner, store and transfers drive theirs too.
    """
    from engine.device import device_initializer, use_device
    from engine.grammar import Grammars
    from engine.model_runner import ModelRunner
    from engine.page_allocator import PageAllocator
    from engine.sampler import Sampler
    from engine.tensor_parallel import TPShard
    from engine.tokenizer import Tokenizer
    from pdorch.worker.startup_checks import check_startup
    from pdorch.worker.tp_io import GroupTransfer
    from pdorch.worker.tp_transfer import PoolRank

    check_startup(cfg)  # one line per misconfiguration, before anything loads
    m = cfg.model
    use_device(m.device)  # before any kernel, graph or stream (engine/device.py)
    model_dir, dtypes = prepare(cfg, tp_size)
    tp = None
    if tp_size > 1:
        from pdorch.worker.tp_group import FollowerProcesses, TPState

        procs = FollowerProcesses(cfg, tp_size, num_pages, use_store, component)
        tp = TPState(procs, procs.join(m.device, m.tp_timeout_s), m.tp_timeout_s, device_initializer(m.device))
    shard = TPShard(0, tp_size)
    arch, model, pool, fingerprint = load_shard(cfg, model_dir, dtypes, num_pages, shard,
                                                None if tp is None else tp.group)
    transfer, segment = start_transfer(cfg, pool)
    mine = PoolRank(segment, pool.base_ptr, pool.page_nbytes, shard.kv_heads(arch))
    ranks, runner = [mine], ModelRunner(model, model.local_arch, pool, m.attention_backend)
    if tp is not None:
        ranks, runner = tp.connect(mine, model, pool, m.attention_backend)
    store = store_io = chain_index = evictor = None
    if use_store and cfg.store.enabled:
        store, store_io, chain_index, evictor = _store_tier(cfg, pool, registry, evict, component or segment,
                                                            arch.num_kv_heads, mine.heads, tp)
    log.info("runtime ready: %s (%s, dtype %s, kv_dtype %s, tp_size %d), %d pages of %d bytes, segment %s, "
             "fingerprint %s, store %s", model_dir, arch.family, dtypes.compute, dtypes.kv, tp_size, pool.num_pages,
             pool.page_nbytes, segment, fingerprint, "on" if store else "off")
    rt = WorkerRuntime(cfg=cfg, model_dir=model_dir, arch=arch, runner=runner, pool=pool,
                       allocator=PageAllocator(pool.num_pages), sampler=Sampler(model.device), fingerprint=fingerprint,
                       dtypes=dtypes, transfer=transfer, segment=segment, store=store, store_io=store_io,
                       chain_index=chain_index, evictor=evictor, grammars=Grammars(model_dir, arch.vocab_size),
                       tokenizer=Tokenizer.from_dir(model_dir), tp=tp, tp_ranks=ranks,
                       peer_transfer=GroupTransfer(transfer, ranks, arch.num_kv_heads,
                                                  None if tp is None else tp.followers))
    if tp is not None:
        tp.channel.start_heartbeat()
    return rt


def prepare(cfg: Config, tp_size: int) -> tuple[pathlib.Path, ModelDtypes]:
    """(the prepared model directory, its resolved dtypes); StartupError when tp_size cannot split it."""
    from engine.arch import ModelArch
    from engine.dtypes import resolve_dtypes
    from engine.prepare import prepare_model
    from engine.tensor_parallel import TPShard
    from pdorch.worker.startup_checks import StartupError

    m = cfg.model
    model_dir = prepare_model(m.source, os.path.expanduser(m.cache_dir), progress=log.info)
    arch = ModelArch.from_model_dir(model_dir)
    try:
        TPShard(0, tp_size).check(arch)
        if tp_size > 1:
            from store_client.page_objects import PageObjects

            for r in range(tp_size):
                PageObjects.for_heads(arch.num_kv_heads, TPShard(r, tp_size).kv_heads(arch), 1)
    except ValueError as e:
        raise StartupError(f"prefill.tp_size / decode.tp_size: {e}") from None
    return model_dir, resolve_dtypes(m.dtype, m.kv_dtype, m.device, arch.checkpoint_dtype)


def load_shard(cfg: Config, model_dir: pathlib.Path, dtypes: ModelDtypes, num_pages: int, shard: TPShard,
               group: TPGroup | None) -> tuple[ModelArch, DecoderModel, KVPool, str]:
    """(whole-model arch, this rank's model, its KV pool, the fingerprint): the part every TP rank
    builds alike (rank 0 and the followers, in lockstep: pool sizing may run a forward)."""
    from engine.cuda_graphs import graph_memory_bytes
    from engine.kv_pool import KVPool
    from engine.loader import load_model
    from engine.pool_sizing import profile_activation_bytes, size_pool
    from engine.prepare import weights_digest
    from pdorch.worker.tp_group import agree_pages
    from store_client.page_hash import KV_LAYOUT_VERSION, model_fingerprint

    m = cfg.model
    arch, model = load_model(model_dir, device=m.device, dtype=getattr(torch, dtypes.compute), shard=shard,
                             group=group)
    local = model.local_arch
    kv_dtype, on_gpu = getattr(torch, dtypes.kv), m.device.startswith("cuda")
    size = size_pool(num_pages, local.kv_values_per_token * m.page_size * kv_dtype.itemsize, m.page_size, m.device,
                     m.gpu_memory_utilization, lambda: profile_activation_bytes(
                         model, local, m.page_size, kv_dtype, max_forward_tokens(cfg), m.attention_backend)
                     + graph_memory_bytes(min(cfg.decode.cuda_graph_max_batch, cfg.decode.max_running_requests),
                                          arch.vocab_size))
    log.info(size.describe())
    pages = agree_pages(group, size.num_pages)
    pool = KVPool(local, pages, m.page_size, kv_dtype, m.device, scratch_page=on_gpu)  # scratch: CUDA graphs
    fingerprint = model_fingerprint(weights_digest(model_dir), dtypes.kv, m.page_size, KV_LAYOUT_VERSION)
    return arch, model, pool, fingerprint


def start_transfer(cfg: Config, pool: KVPool) -> tuple[KVTransfer, str]:
    """(the started transfer engine with the pool registered, its segment name)."""
    from store_client.transfer import KVTransfer

    transfer = KVTransfer(cfg.store.local_hostname, cfg.store.protocol, cfg.store.device_name)
    segment = transfer.start()
    transfer.register(pool.base_ptr, pool.nbytes)
    return transfer, segment


def _store_tier(cfg: Config, pool: KVPool, registry: CollectorRegistry | None, evict: bool, component: str,
                model_kv_heads: int, heads: range, tp: TPState | None = None
                ) -> tuple[KVStore, StoreIO, ChainIndex | None, StoreEvictor | None]:
    """(KVStore, StoreIO, ChainIndex | None, StoreEvictor | None) over this worker's pool (of a TP
    worker: a GroupStore, whose loads and saves every rank does on its own pool)."""
    from prometheus_client import CollectorRegistry

    from engine.device import device_initializer
    from store_client.io_thread import StoreIO
    from store_client.metrics import StoreMetrics

    # NOTE: a private registry when none is given (tests): the metrics exist but are not served.
    # component (the worker id: role, host, port) names this worker's SSD directory: distinct per
    # worker and the same after a restart, which then reads its files again (docs/workers.md).
    store = make_store(cfg, pool, StoreMetrics(registry or CollectorRegistry()), component, model_kv_heads, heads, tp)
    store.register_buffer(pool.base_ptr, pool.nbytes)
    if registry is not None:
        from store_client.ssd_metrics import register_ssd_metrics

        register_ssd_metrics(store, registry)  # only with store.ssd_path set
    store_io = StoreIO(store, thread_init=device_initializer(cfg.model.device))  # NOTE: reads into device memory
    if evict and cfg.store.eviction == "chain" and cfg.store.eviction_in_effect != "chain":
        log.info("store.ssd_path is set: mooncake_master's eviction moves pages from DRAM to disk; "
                 "no chain eviction (its removals would delete the disk copies)")
    if not (evict and cfg.store.eviction_in_effect == "chain"):
        return store, store_io, None, None
    from store_client.chain_index import ChainIndex
    from store_client.evictor import StoreEvictor, master_metrics_url

    chain_index = ChainIndex(cfg.store.evict_index_pages, cfg.store.evict_depth_weight_s)
    # NOTE: HA masters: the leader the store connector reads from etcd each second, not a read per pass
    evictor = StoreEvictor(store, chain_index, cfg.store,
                           lambda: master_metrics_url(cfg.store, store.master_leader)).start()
    store.before_write = evictor.make_room  # bursts of writes make room first
    return store, store_io, chain_index, evictor


def make_store(cfg: Config, pool: KVPool, metrics: StoreMetrics, component: str, model_kv_heads: int, heads: range,
               tp: TPState | None = None) -> KVStore:
    """The store client of a pool holding the model's KV heads `heads`: one object per group of them
    (store_client/page_objects.py); rank 0 of a TP worker gets a GroupStore driving its followers'."""
    from store_client.page_objects import PageObjects
    from store_client.store import KVStore

    objects = PageObjects.for_heads(model_kv_heads, heads, pool.head_nbytes)
    if tp is None:
        return KVStore(cfg.store, pool.page_nbytes, metrics, component, objects)
    from pdorch.worker.tp_io import GroupStore

    if tp.followers is None:  # build_runtime connects the group (TPState.connect) before its store tier
        raise RuntimeError("a tensor-parallel worker's store is made before its group connected")
    return GroupStore(cfg.store, pool.page_nbytes, metrics, component, objects, pool_base=pool.base_ptr,
                      followers=tp.followers)
