"""`python -m decode_node --config FILE [--set section.key=value ...]`."""

from __future__ import annotations


def uses_store(dc) -> bool:
    """D reads the store for prompt prefixes (its own load, local prefill) and writes generated pages."""
    return dc.offload_generated_kv or dc.load_prefix_from_store or dc.max_local_prefill_tokens > 0


def build(cfg, worker_id: str):
    from decode_node.worker import DecodeWorker, add_to_server
    from pdorch.worker.metrics import WorkerRecorder
    from pdorch.worker.runtime import build_runtime

    recorder = WorkerRecorder("decode")
    # NOTE: evict: every request passes a decode worker, so its chain index sees every prompt's whole
    # chain; its writes (offload, local prefill) make room through the same chain policy as P's.
    rt = build_runtime(cfg, cfg.decode.num_pages, use_store=uses_store(cfg.decode), registry=recorder.registry,
                       evict=True, component=worker_id, tp_size=cfg.decode.tp_size)
    # At tp_size > 1 every rank captures the same graphs together and replays its own in lockstep
    # (pdorch/worker/tp_steps.py GroupRunner.capture_decode_graphs).
    if cfg.model.device.startswith("cuda") and cfg.decode.cuda_graph_max_batch:
        rt.runner.capture_decode_graphs(min(cfg.decode.cuda_graph_max_batch, cfg.decode.max_running_requests),
                                        rt.max_context)
    return DecodeWorker(rt, cfg.decode, cfg.store, cfg.grpc, worker_id, recorder), add_to_server


if __name__ == "__main__":
    from pdorch.worker.main import run_worker

    run_worker("decode", build)
