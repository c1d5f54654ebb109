"""`python -m prefill_node --config FILE [--set section.key=value ...]`."""

from __future__ import annotations


def build(cfg, worker_id: str):
    from pdorch.worker.metrics import WorkerRecorder
    from pdorch.worker.runtime import build_runtime
    from prefill_node.worker import PrefillWorker, add_to_server

    recorder = WorkerRecorder("prefill")
    rt = build_runtime(cfg, cfg.prefill.num_pages, use_store=True, registry=recorder.registry, evict=True,
                       component=worker_id, tp_size=cfg.prefill.tp_size)
    return PrefillWorker(rt, cfg.prefill, cfg.store, worker_id, recorder), add_to_server


if __name__ == "__main__":
    from pdorch.worker.main import run_worker

    run_worker("prefill", build)
