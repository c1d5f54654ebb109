"""What other threads tell the decode scheduler (through SchedulerLoop.post; `Call` is the loop's own)."""

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
    """Pages no request uses any more: a request that failed before joining, or the fence letting go."""

    page_ids: tuple[int, ...]


@dataclass(frozen=True)
class Evicted:
    """The store evictor removed these keys: the prefix cache keeps their pages longer."""

    keys: tuple[str, ...]
