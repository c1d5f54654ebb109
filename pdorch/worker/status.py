"""Info and Stats answers of a worker, built the same way for prefill and decode."""

from __future__ import annotations

from dataclasses import dataclass

from pdorch.worker.metrics import WorkerRecorder
from proto.pdorch.v1 import worker_pb2 as pb


@dataclass(frozen=True)
class WorkerLoad:
    queued: int
    running: int
    free_pages: int
    active_pages: int


def worker_info(rt, role: str, worker_id: str, load: WorkerLoad) -> pb.WorkerInfo:
    arch = rt.arch
    return pb.WorkerInfo(
        role=role, worker_id=worker_id, model=rt.served_name, model_fingerprint=rt.fingerprint,
        page_size=rt.page_size, total_pages=rt.allocator.num_total, free_pages=load.free_pages,
        queued_requests=load.queued, running_requests=load.running, transfer_segment=rt.segment,
        store_enabled=bool(rt.store is not None and rt.store.enabled), max_context_tokens=rt.max_context,
        kv_dtype=rt.dtypes.kv, dtype=rt.dtypes.compute, model_family=arch.family,
        store_evicted_pages=rt.evictor.removed_total if rt.evictor is not None else 0,
        tp_size=getattr(rt, "tp_size", 1),
    )


def worker_stats(rec: WorkerRecorder, info: pb.WorkerInfo, integrity: tuple[bool, str],
                 active_pages: int) -> pb.WorkerStats:
    with rec._lock:  # one consistent snapshot of the counters
        return pb.WorkerStats(
            requests_finished=rec.requests_finished, requests_failed=rec.requests_failed,
            prompt_tokens_computed=rec.prompt_tokens_computed,
            prompt_tokens_cached=pb.CachedTokens(**rec.cached), generated_tokens=rec.generated_tokens,
            store_pages_written=rec.store_pages_written, info=info, pool_integrity_ok=integrity[0],
            pool_integrity_error=integrity[1], active_pages=active_pages,
            store_pages_loaded=rec.store_pages_loaded, transfer_bytes=rec.transfer_bytes,
            requests_aborted=rec.requests_aborted,
        )
