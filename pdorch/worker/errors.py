"""Errors a worker raises to its gRPC layer, and the one place that maps them to status codes.

Worker code raises these with a message that names what went wrong; the servicers of both
workers wrap each RPC in `grpc_errors(context)`, which turns them into a gRPC status. Anything
else is a bug and becomes INTERNAL with the exception text (never a silent hang).
Torch-free: the router catches the same codes on the client side.
"""

from __future__ import annotations

import contextlib
import logging

import grpc

log = logging.getLogger(__name__)


class WorkerError(Exception):
    """Base class: a request failed for a reason the caller should see."""

    code = grpc.StatusCode.INTERNAL


class InvalidRequest(WorkerError):
    """The request itself is wrong (bad page size, fingerprint, token ids, addresses)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class Overloaded(WorkerError):
    """The worker's bounded queue is full; retry on another worker or later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(WorkerError):
    """The request's deadline passed before it finished."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Aborted(WorkerError):
    """The request was cancelled by Abort or by its caller going away."""

    code = grpc.StatusCode.CANCELLED


class PeerFailed(WorkerError):
    """The other worker of the pair (prefill or decode) failed or vanished."""

    code = grpc.StatusCode.UNAVAILABLE


class ShuttingDown(WorkerError):
    """The worker is stopping and takes no more work."""

    code = grpc.StatusCode.UNAVAILABLE


@contextlib.contextmanager
def grpc_errors(context: grpc.ServicerContext, what: str):
    """Map WorkerError (and unexpected exceptions) raised inside an RPC handler to a gRPC status."""
    try:
        yield
    except WorkerError as e:
        context.abort(e.code, str(e))
    except Exception as e:  # last-resort mapping, logged with the traceback
        # NOTE: handlers never call context.abort themselves (it raises a bare Exception that
        # this clause would swallow); they raise WorkerError and let this function map it.
        log.exception("%s failed", what)
        context.abort(grpc.StatusCode.INTERNAL, f"{what} failed: {type(e).__name__}: {e}")
