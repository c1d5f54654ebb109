"""Moved to pdorch/worker/rpc.py; this name stays while router/ and bench/ still import it."""

from pdorch.worker.rpc import add_port, aio_channel, bearer, client_channel, client_ssl_context  # noqa: F401
