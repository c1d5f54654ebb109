"""Moved to pdorch/worker/protocol.py (temporary name until tests/unit/test_prefill_push_fence.py moves)."""

from pdorch.worker.protocol import PrefillJob  # noqa: F401
