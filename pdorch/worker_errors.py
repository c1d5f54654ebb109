"""Moved to pdorch/worker/errors.py (temporary name until tests/unit/test_prefill_push_fence.py moves)."""

from pdorch.worker.errors import Aborted, DeadlineExceeded  # noqa: F401
