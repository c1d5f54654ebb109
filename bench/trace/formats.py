"""Which reader a trace file needs: named with --format, or told by its first record's fields.

    mooncake        hash_ids / input_length / text_input     (bench/trace/mooncake.py)
    bailian         chat_id                                  (bench/trace/bailian.py)
    aiperf-multi    turns                                    (bench/trace/aiperf.py)
    aiperf-single   text / texts                             (bench/trace/aiperf.py)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.trace import aiperf, bailian, jsonl, mooncake
from bench.trace.request import TraceError, TraceRequest

READERS: dict[str, Callable[[str | Path], list[TraceRequest]]] = {
    "mooncake": mooncake.read, "bailian": bailian.read,
    "aiperf-single": aiperf.read_single_turn, "aiperf-multi": aiperf.read_multi_turn}
# tokens per hash block as recorded: a partial last block and a prompt without hash ids scale by it
BLOCK_SIZES = {"mooncake": mooncake.BLOCK_SIZE, "bailian": bailian.BLOCK_SIZE}
FORMATS = ("auto", *READERS)


def detect(path: str | Path) -> str:
    for where, rec in jsonl.records(path):
        if "turns" in rec:
            return "aiperf-multi"
        if "chat_id" in rec:
            return "bailian"
        if any(k in rec for k in ("hash_ids", "input_length", "text_input")):
            return "mooncake"
        if "text" in rec or "texts" in rec:
            return "aiperf-single"
        raise TraceError(f"{where}: cannot tell the trace format from the fields {sorted(rec)}; "
                         f"name it with --format ({', '.join(READERS)})")
    raise TraceError(f"{path}: no records")


def read_trace(path: str | Path, fmt: str = "auto") -> tuple[str, list[TraceRequest]]:
    """(format, requests in file order)."""
    if fmt == "auto":
        fmt = detect(path)
    if fmt not in READERS:
        raise TraceError(f"unknown trace format {fmt!r} (choose from {', '.join(FORMATS)})")
    requests = READERS[fmt](path)
    if not requests:
        raise TraceError(f"{path}: no records")
    return fmt, requests
