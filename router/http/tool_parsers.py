"""Tool calls in a model's free output (tool_choice "auto"), one parser per family's call format.

    hermes       Qwen2.5, Qwen3, Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call> ...
                 (text before the first call is the message's content)
    llama3_json  Llama 3.1 / 3.2: the whole output is {"name": ..., "parameters": {...}} (calls may be
                 joined by ";"; the <|python_tag|> token is a special one, gone from the text)
    mistral      Mistral: [{"name": ..., "arguments": {...}}, ...] after the [TOOL_CALLS] token (special,
                 gone from the text)

parse(text) -> (content or None, [ToolCallOut]); an output that is not a well-formed call in the
format is returned as text with no calls, as vLLM does. Streamed, `AutoToolStream` sends text until
a call may begin (a possible start of "<tool_call>" is held back, as a possible stop string is; a
JSON-format output that begins with "{" or "[" is held whole) and the calls in the last chunk.
"""

from __future__ import annotations

import json
import re

from router.http.reasoning import tag_start_at_end
from router.http.tools import ToolCallOut

PARSERS = ("hermes", "llama3_json", "mistral")
# model family (engine/families.py) -> its call format
FAMILY_PARSER = {"qwen2": "hermes", "qwen3": "hermes", "llama": "llama3_json", "mistral": "mistral"}
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_HERMES_START = "<tool_call>"


def _call(obj, args_key: str) -> ToolCallOut | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCallOut(obj["name"], json.dumps(args, ensure_ascii=False))


def parse(parser: str, text: str) -> tuple[str | None, list[ToolCallOut]]:
    if parser == "hermes":
        start = text.find(_HERMES_START)
        if start < 0:
            return text, []
        calls = []
        for body in _HERMES.findall(text[start:]):
            try:
                call = _call(json.loads(body), "arguments")
            except ValueError:
                return text, []
            if call is None:
                return text, []
            calls.append(call)
        if not calls:
            return text, []
        content = text[:start].strip()
        return content or None, calls
    stripped = text.strip().removeprefix("<|python_tag|>").strip()
    if parser == "llama3_json":
        if not stripped.startswith("{"):
            return text, []
        parts = [p for p in stripped.split(";") if p.strip()]
        key = "parameters"
    else:  # mistral
        if not stripped.startswith("["):
            return text, []
        parts, key = [stripped], "arguments"
    calls = []
    for part in parts:
        try:
            value = json.loads(part)
        except ValueError:
            return text, []
        for obj in value if isinstance(value, list) else [value]:
            call = _call(obj, key)
            if call is None:
                return text, []
            calls.append(call)
    return (None, calls) if calls else (text, [])


class AutoToolStream:
    """Text deltas held back while they may be the start of a call; the calls at the end."""

    def __init__(self, parser: str):
        self.parser = parser
        self.sent = 0  # characters of the output already sent as content
        self.sent_role = False

    def _safe_end(self, text: str) -> int:
        """How much of `text` is content for sure."""
        if self.parser == "hermes":
            start = text.find(_HERMES_START)
            return start if start >= 0 else len(text) - tag_start_at_end(text, _HERMES_START)
        head = text.lstrip()
        if not head:
            return 0  # only blanks so far: the format may still begin
        return 0 if head[0] in "{[" else len(text)

    def delta(self, text: str) -> dict | None:
        """The delta for the output so far (`text`: all of it), or None."""
        end = max(self._safe_end(text), self.sent)
        out: dict = {}
        if not self.sent_role:
            out["role"], self.sent_role = "assistant", True
        if end > self.sent:
            out["content"], self.sent = text[self.sent:end], end
        return out or None

    def finish(self, text: str, finish_reason: str) -> tuple[dict, str]:
        content, calls = parse(self.parser, text) if finish_reason == "stop" else (text, [])
        out = {} if self.sent_role else {"role": "assistant"}
        self.sent_role = True
        if not calls:
            if len(text) > self.sent:
                out["content"] = text[self.sent:]
            return out, finish_reason
        if content and len(content) > self.sent:
            out["content"] = content[self.sent:]
        out["tool_calls"] = [c.to_openai(i) for i, c in enumerate(calls)]
        return out, "tool_calls"
