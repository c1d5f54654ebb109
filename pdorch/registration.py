"""Moved to pdorch/worker/registration.py; this name stays while router/ and tests still import it."""

from pdorch.worker.registration import WorkerRegistration, connect, worker_key, workers_prefix  # noqa: F401
