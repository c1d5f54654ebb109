"""What other threads tell the prefill scheduler (through SchedulerLoop.post; `Call` is the loop's own)."""

from __future__ import annotations

from dataclasses import dataclass

from prefill_node.task import PrefillTask


@dataclass(frozen=True)
class Submit:
    """A validated task from a gRPC handler thread."""

    task: PrefillTask


@dataclass(frozen=True)
class Abort:
    """The Abort RPC: fail the unanswered task with this request id, if any."""

    request_id: str


@dataclass(frozen=True)
class Cancel:
    """This very task's RPC ended (whatever other task shares its request id)."""

    task: PrefillTask


@dataclass(frozen=True)
class Evicted:
    """The store evictor removed these keys (see Persister.left_store)."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class Pushed:
    """The pusher thread's transfer of `task` into D's pages returned (`error` None: it succeeded)."""

    task: PrefillTask
    error: Exception | None


@dataclass(frozen=True)
class Read:
    """The pusher thread's read of `task`'s prefix pages from D's pool returned (`error` None: it succeeded)."""

    task: PrefillTask
    error: Exception | None
