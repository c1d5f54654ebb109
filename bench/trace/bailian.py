"""Alibaba Bailian's trace format (alibaba-edu/qwen-bailian-usagetraces-anon, the traces of "KVCache
Cache in the Wild", USENIX ATC'25), one request per line:

    {"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521,
     "output_length": 132, "type": "text", "turn": 2, "hash_ids": [1089, 1090, ..., 13148]}

`timestamp` is in seconds since the trace's start; `hash_ids` are the prompt's blocks of 16 tokens;
`parent_chat_id` is the previous turn's `chat_id` (-1 for a conversation's first turn), so a
session is the chain back to its root (or to the earliest turn the file holds). `type` (text,
search, image, file) and `turn` are informational: the prompt is its blocks whatever the type.
"""

from __future__ import annotations

from pathlib import Path

from bench.trace import jsonl
from bench.trace.request import TraceError, TraceRequest

BLOCK_SIZE = 16  # tokens per hash block in the Bailian traces


def read(path: str | Path) -> list[TraceRequest]:
    rows: list[tuple[str, int, int, float, int, int, tuple[int, ...]]] = []
    for where, rec in jsonl.records(path):
        chat = rec.get("chat_id")
        parent = rec.get("parent_chat_id", -1)
        for name, value in (("chat_id", chat), ("parent_chat_id", parent)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TraceError(f"{where}: field '{name}' must be an integer, got {value!r}")
        rows.append((where, chat, parent, jsonl.number(rec, "timestamp", where, required=True),
                     jsonl.integer(rec, "input_length", where, minimum=1, required=True),
                     jsonl.integer(rec, "output_length", where, required=True),
                     jsonl.hash_ids(rec, where)))
    parent_of = {chat: parent for _, chat, parent, *_ in rows}

    def root(chat: int) -> int:
        seen = {chat}
        while parent_of.get(chat, -1) in parent_of:  # NOTE: a parent outside the file ends the chain
            chat = parent_of[chat]
            if chat in seen:
                break  # a cycle: the ids name it once
            seen.add(chat)
        return chat

    return [TraceRequest(index=i, session=f"chat-{root(chat)}", arrival_s=timestamp, output_tokens=output,
                         blocks=blocks, input_length=input_length)
            for i, (_, chat, _, timestamp, input_length, output, blocks) in enumerate(rows)]
