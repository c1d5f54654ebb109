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
class Pushed:
    """The pusher thread's transfer of `task` into D's pages returned (`error` None: it succeeded)."""

    task: PrefillTask
    error: Exception | None


@dataclass(frozen=True)
class Read:
    """The pusher thread's read of `task`'s prefix pages from D's pool returned (`error` None: it succeeded)."""

    task: PrefillTask
    error: Exception | None


# What the store I/O thread hands back with a completion (IOCompletion.tag). eq=False: a tag is
# one submission, compared by identity (its lists are not hashable).


@dataclass(frozen=True, eq=False)
class PrefixLoaded:
    """A task's store read of the prefix pages L1 lacked (prefill_node/admission.py)."""

    task: PrefillTask


@dataclass(frozen=True, eq=False)
class TaskSaved:
    """A task's write-back (and backfill) of its pages (prefill_node/persistence.py); the task keeps
    its pages until it completes. Without L1, `pages` is empty: there is no persistence to track."""

    task: PrefillTask
    pages: list[int]  # the L1 pages written, each whose persistence the completion settles
    keys: list[str]
    depths: list  # per page, its index in its chain (the evictor ranks stored pages by it)
    why: list[str]  # per page, why it is written: computed, backfill, selective (store.write_policy)


@dataclass(frozen=True, eq=False)
class EvictSaved:
    """A write-before-evict: L1 pages retained until the store holds them, released on completion."""

    pages: list[int]
    keys: list[str]
    depths: list  # per page, its index in its chain when known (write_back keeps it), else None
    why: list[str]  # all "evict", "restore" (after a leader switch) or "drain" (written back as the worker drains)
