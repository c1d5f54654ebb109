"""What other threads tell the decode scheduler (through SchedulerLoop.post; `Call` is the loop's own),
and the tags its store I/O completions carry."""

from __future__ import annotations

from dataclasses import dataclass

from decode_node.admission import AdmitTicket
from decode_node.request import DecodeRequest


@dataclass(frozen=True)
class Admit:
    """A handler thread asks for the prompt's pages (answered through the ticket's future)."""

    ticket: AdmitTicket


@dataclass(frozen=True)
class Join:
    """A prefilled request (its prompt KV in its pages) joins the decode batch."""

    req: DecodeRequest


@dataclass(frozen=True)
class Release:
    """Pages no request uses any more: a request that failed before joining (`request_id`: its
    admission is settled), or the fence letting go."""

    page_ids: tuple[int, ...]
    request_id: str = ""


# What the store I/O thread hands back with a completion (IOCompletion.tag). eq=False: a tag is
# one submission, compared by identity. (PrefixRead, a handler's own prompt read, is in prefix_load.py.)


@dataclass(frozen=True, eq=False)
class ResumeRead:
    """A preempted request's pages read back from the store on resume (decode_node/preemption.py)."""

    req: DecodeRequest
    pages: tuple[int, ...]  # indexes in its hash chain (and page_ids), in read order
    tail_lost: bool  # its partial last page was not kept: recomputed after the read


@dataclass(frozen=True, eq=False)
class PageWrite:
    """One page of this step's store write (the scheduler's step buffer)."""

    req: DecodeRequest
    key: str
    page: int  # page id in the pool
    depth: int  # its index in the request's hash chain
    kind: str  # "offload" (generated) or "writeback" (a prompt page computed here)


@dataclass(frozen=True, eq=False)
class StepSaved:
    """One step's store write of every page that filled in it (decode_node/step.py)."""

    owners: tuple[DecodeRequest, ...]  # the distinct requests, each holding the lease `lease` for it
    writes: tuple[PageWrite, ...]
    lease: str  # the name of this write's I/O lease (decode_node/step_writes.py)
