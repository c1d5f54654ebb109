"""Reading a JSONL trace file: one JSON object per line (blank lines skipped), and the field checks
every reader shares. A bad record is a TraceError naming the file, the line and the field, never a
stack trace from deep inside the replay."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from bench.trace.request import TraceError


def records(path: str | Path) -> Iterator[tuple[str, dict]]:
    """(where, record) of every non-blank line; `where` is "FILE:LINE" for error messages."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"{where}: not a JSON object ({e.msg})") from None
            if not isinstance(record, dict):
                raise TraceError(f"{where}: not a JSON object")
            yield where, record


def refuse(record: dict, where: str, fields: tuple[str, ...], why: str) -> None:
    """A TraceError for the first of `fields` the record has."""
    for name in fields:
        if record.get(name) is not None:
            raise TraceError(f"{where}: field '{name}' is not supported ({why})")


def integer(record: dict, name: str, where: str, minimum: int = 0, required: bool = False) -> int | None:
    value = record.get(name)
    if value is None:
        if required:
            raise TraceError(f"{where}: field '{name}' is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(f"{where}: field '{name}' must be an integer >= {minimum}, got {value!r}")
    return value


def number(record: dict, name: str, where: str, required: bool = False) -> float | None:
    """A non-negative number (timestamps, delays)."""
    value = record.get(name)
    if value is None:
        if required:
            raise TraceError(f"{where}: field '{name}' is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TraceError(f"{where}: field '{name}' must be a number >= 0, got {value!r}")
    return float(value)


def hash_ids(record: dict, where: str, name: str = "hash_ids") -> tuple[int, ...]:
    value = record.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in value):
        raise TraceError(f"{where}: field '{name}' must be a list of integers")
    return tuple(value)


def text(record: dict, where: str) -> str | None:
    """aiperf's `text`, or `texts` holding exactly one string (several are a client-side batch)."""
    if record.get("text") is not None and record.get("texts") is not None:
        raise TraceError(f"{where}: fields 'text' and 'texts' cannot be set together")
    if record.get("text") is not None:
        if not isinstance(record["text"], str):
            raise TraceError(f"{where}: field 'text' must be a string")
        return record["text"]
    texts = record.get("texts")
    if texts is None:
        return None
    if not isinstance(texts, list) or len(texts) != 1 or not isinstance(texts[0], str):
        raise TraceError(f"{where}: field 'texts' must hold exactly one string here (a batch of several "
                         "is not replayed)")
    return texts[0]
