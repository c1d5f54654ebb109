"""aiperf's custom dataset formats with text prompts (ai-dynamo/aiperf, `--custom-dataset-type
single_turn` and `multi_turn`), replayed as token ids: the text is tokenized with the served model's
tokenizer as is (no chat template: a turn's `role` only names it).

    single_turn   {"text": "...", "timestamp": 1000, "output_length": 40, "session_id": "s1"}
                  one request per line; `timestamp` (ms since the start) or `delay` (ms after the
                  previous request of its session ended); lines sharing a `session_id` are sent one
                  after another, each self-contained
    multi_turn    {"session_id": "s1", "turns": [{"text": "...", "delay": 0}, {"text": "...", ...}]}
                  one conversation per line (lines sharing a session_id are joined); turn k is sent
                  after turn k-1 ended and carries the conversation so far: its prompt is turn k-1's
                  prompt + turn k-1's answer + its own text; a leading text-only `role: system`
                  turn opens every prompt of the conversation (aiperf hoists it the same way)

`text` or a one-element `texts`; images, audio, video and `extra` are refused.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from bench.trace import jsonl
from bench.trace.request import TraceError, TraceRequest

UNSUPPORTED = ("image", "images", "image_uuids", "audio", "audios", "video", "videos", "extra")


def _turn(rec: dict, where: str, index: int, session: str, follows: bool, history: bool,
          prefix: str = "") -> TraceRequest:
    jsonl.refuse(rec, where, UNSUPPORTED, "the replay sends token ids of text only")
    text = jsonl.text(rec, where)
    if text is None:
        raise TraceError(f"{where}: field 'text' is missing")
    timestamp, delay = jsonl.number(rec, "timestamp", where), jsonl.number(rec, "delay", where)
    if timestamp is not None and delay is not None:
        raise TraceError(f"{where}: fields 'timestamp' and 'delay' cannot be set together")
    return TraceRequest(index=index, session=session, arrival_s=None if timestamp is None else timestamp / 1000.0,
                        output_tokens=jsonl.integer(rec, "output_length", where, minimum=1), text=prefix + text,
                        delay_s=None if delay is None else delay / 1000.0, follows_previous=follows,
                        carries_history=history)


def _session(rec: dict, where: str, default: str) -> str:
    value = rec.get("session_id")
    if value is None:
        return default
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise TraceError(f"{where}: field 'session_id' must be a string")
    return str(value)


def read_single_turn(path: str | Path) -> list[TraceRequest]:
    out = []
    for n, (where, rec) in enumerate(jsonl.records(path)):
        session = _session(rec, where, f"line-{n}")
        out.append(_turn(rec, where, n, session, follows="session_id" in rec, history=False))
    return out


def _system_text(turn: dict) -> str | None:
    """The text of a leading system turn aiperf hoists into every prompt, else None."""
    if turn.get("role") != "system" or any(turn.get(k) is not None for k in
                                           ("timestamp", "delay", "output_length") + UNSUPPORTED):
        return None
    text = turn.get("text")
    return text if isinstance(text, str) and text else None


def read_multi_turn(path: str | Path) -> list[TraceRequest]:
    sessions: dict[str, list[tuple[str, dict]]] = defaultdict(list)
    for n, (where, rec) in enumerate(jsonl.records(path)):
        turns = rec.get("turns")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
            raise TraceError(f"{where}: field 'turns' must be a non-empty list of objects")
        sessions[_session(rec, where, f"line-{n}")].extend((f"{where} turn {i}", t) for i, t in enumerate(turns))
    out: list[TraceRequest] = []
    for session, turns in sessions.items():
        system = _system_text(turns[0][1]) if len(turns) > 1 else None
        if system is not None:
            turns = turns[1:]
        for k, (where, turn) in enumerate(turns):
            prefix = system + "\n" if system is not None and k == 0 else ""
            out.append(_turn(turn, where, len(out), session, follows=k > 0, history=k > 0, prefix=prefix))
    return out
