"""Mooncake's trace format (FAST'25 release, kvcache-ai/Mooncake FAST25-release/traces; also aiperf's
`mooncake_trace` dataset type), one request per line:

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2354]}

`timestamp` is the arrival in milliseconds since the trace's start; `hash_ids` are the prompt's
blocks of 512 tokens (the last one may be partial: `input_length` says how many tokens there are),
remapped so that equal ids mean an equal prefix. aiperf's extensions are read too: `session_id` (the
requests of one conversation), `delay` (milliseconds after the previous request of its session
ended, for a record without a timestamp) and `text_input` (a literal prompt instead of lengths).
Its `messages` and `payload` modes carry chat messages / raw bodies and are refused.

Records without `session_id` get their session from their blocks (bench/trace/sessions.py).
"""

from __future__ import annotations

from pathlib import Path

from bench.trace import jsonl
from bench.trace.request import TraceError, TraceRequest
from bench.trace.sessions import infer_sessions

BLOCK_SIZE = 512  # tokens per hash block in the FAST'25 traces


def read(path: str | Path) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    explicit: list[bool] = []
    for where, rec in jsonl.records(path):
        jsonl.refuse(rec, where, ("messages", "payload", "tools"), "a token-id replay sends no chat messages")
        text = rec.get("text_input")
        if text is not None and not isinstance(text, str):
            raise TraceError(f"{where}: field 'text_input' must be a string")
        input_length = jsonl.integer(rec, "input_length", where, minimum=1, required=text is None)
        if text is not None and input_length is not None:
            raise TraceError(f"{where}: fields 'input_length' and 'text_input' cannot be set together")
        blocks = jsonl.hash_ids(rec, where)
        if blocks and text is not None:
            raise TraceError(f"{where}: field 'hash_ids' needs 'input_length', not 'text_input'")
        timestamp = jsonl.number(rec, "timestamp", where)
        delay = jsonl.number(rec, "delay", where)
        if timestamp is not None and delay is not None:
            raise TraceError(f"{where}: fields 'timestamp' and 'delay' cannot be set together")
        session = rec.get("session_id")
        if session is not None and not isinstance(session, (str, int)):
            raise TraceError(f"{where}: field 'session_id' must be a string or an integer")
        explicit.append(session is not None)
        out.append(TraceRequest(
            index=len(out), session="" if session is None else str(session),
            arrival_s=None if timestamp is None else timestamp / 1000.0,
            output_tokens=jsonl.integer(rec, "output_length", where), blocks=blocks,
            input_length=input_length, text=text, delay_s=None if delay is None else delay / 1000.0,
            follows_previous=delay is not None))
    if not all(explicit):
        out = infer_sessions(out, keep=explicit)
    return out
