"""Moved to pdorch/worker/metrics.py (temporary name until tests/unit/test_prefill_push_fence.py moves)."""

from pdorch.worker.metrics import WorkerRecorder  # noqa: F401
