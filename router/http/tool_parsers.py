"""Tool calls in a model's output, in its family's own call format: tool_choice "auto", and forced
calls under their structural tag (router/http/tool_grammar.py), which writes the same format.

    hermes       Qwen2.5, Qwen3, Hermes: text <tool_call>{"name": ..., "arguments": {...}}</tool_call> text ...
    llama3_json  Llama 3.1 / 3.2: the output is {"name": ..., "parameters": {...}}, calls joined by ";"
                 (a leading <|python_tag|> is a special token, gone from the text, or kept as written)
    mistral      Mistral: [{"name": ..., "arguments": {...}}, ...] after the [TOOL_CALLS] token (likewise)

A call is a JSON object (read with the json module's parser: a ";" or a tag inside a string is
part of the string) whose "name" is one of the request's tools, with "arguments" (or
"parameters"): an object, or a JSON string holding one. Anything else is text: a JSON answer
such as {"name": "Alice", "age": 30}, a call without arguments, a call whose JSON never closes.
The text around hermes calls is the message's content (blanks next to a call dropped, the pieces
joined by a newline).

One reading serves both answers: `read(parser, text, names, final)` gives the content and the calls
of the output so far, each a prefix of what the whole output gives (text that may still become a
call is held back: a possible start of "<tool_call>", an object whose name is not complete, a
trailing run of blanks). A stream (`AutoToolStream`) sends the difference between readings, as
OpenAI's deltas: a call opens with its index, id, type and name once its name is read and its
arguments begin, and its arguments then stream as the model writes them (the model's own text).
The whole answer (`parse`) is the reading with final=True, so the stream and the answer agree
however the output is cut into chunks. The one exception: a call cut before its JSON closes
(max_tokens, or the model stopping there) has streamed its pieces; the whole answer gives it as text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from router.http.reasoning import tag_start_at_end
from router.http.tools import ToolCallOut, new_call_id

PARSERS = ("hermes", "llama3_json", "mistral")
# model family (engine/families.py) -> its call format
FAMILY_PARSER = {"qwen2": "hermes", "qwen3": "hermes", "llama": "llama3_json", "mistral": "mistral"}
HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
_ARGUMENT_KEYS = ('"arguments"', '"parameters"')  # hermes and mistral write the first, Llama the second
_WS = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_DECODER = json.JSONDecoder()
_MORE = "more"  # not decided yet: the text so far may still become a call


@dataclass(frozen=True)
class WholeFormat:
    """A format whose output is the calls (llama3_json, mistral): special markers that may lead it
    (kept in the text when decoded without skipping them), calls in one JSON array or not, and the
    separator between calls."""

    markers: tuple[str, ...]
    array: bool
    separator: str


WHOLE = {"llama3_json": WholeFormat(("<|python_tag|>",), array=False, separator=";"),
         "mistral": WholeFormat(("[TOOL_CALLS]",), array=True, separator=",")}


@dataclass
class Call:
    """One call in the output so far: `arguments` is its JSON text so far (all of it once `done`)."""

    name: str
    arguments: str = ""
    done: bool = False


@dataclass
class Reading:
    content: str = ""
    calls: list[Call] = field(default_factory=list)


def _skip_ws(text: str, i: int) -> int:
    m = _WS.match(text, i)  # always matches (zero or more)
    return i if m is None else m.end()


def _header(text: str, i: int) -> tuple[str | None, int | None] | None:
    """`{"name": "<name>", "arguments": ` at text[i] (a "{"): (name, where the arguments begin), either
    None while the text ends before it is read; None when the object does not begin so."""
    i += 1
    name = None
    for expect in ('"name"', ":", "name", ",", "key", ":"):
        i = _skip_ws(text, i)
        if i == len(text):
            return name, None
        if expect == "name":
            m = _STRING.match(text, i)
            if m is None:
                return (None, None) if text[i] == '"' else None  # an unterminated string may still close
            try:
                name = json.loads(m.group())
            except ValueError:
                return None
            i = m.end()
            continue
        options = _ARGUMENT_KEYS if expect == "key" else (expect,)
        hit = next((o for o in options if text.startswith(o, i)), None)
        if hit is None:
            return (name, None) if any(o.startswith(text[i:]) for o in options) else None
        i += len(hit)
    return name, _skip_ws(text, i)


def _whole_call(obj, names) -> Call | None:
    """A complete JSON value as a call, or None."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    key = "arguments" if "arguments" in obj else "parameters" if "parameters" in obj else None
    if key is None:
        return None
    args = obj[key]
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return Call(obj["name"], json.dumps(args, ensure_ascii=False), done=True)


def _object_call(text: str, i: int, names, final: bool):
    """The call at text[i]: (Call, end) when one closed there; (Call or None, _MORE) while it may
    still become one (the Call: an open call, its arguments so far); None when it is not one."""
    if i == len(text):
        return None if final else (None, _MORE)
    if text[i] != "{":
        return None
    head = _header(text, i)
    if head is None:  # another layout of an object: judged once it closes
        j = _skip_ws(text, i + 1)
        if j < len(text) and text[j] != '"':
            return None
        try:
            obj, end = _DECODER.raw_decode(text, i)
        except ValueError:  # not closed yet, or not JSON: the end of the output decides
            return None if final else (None, _MORE)
        call = _whole_call(obj, names)
        return None if call is None else (call, end)
    name, a = head
    if name is not None and name not in names:
        return None  # not a call, as soon as the name is read
    if a is None:
        return None if final else (None, _MORE)
    assert name is not None  # the arguments come after the name: it was read
    try:
        obj, end = _DECODER.raw_decode(text, i)
    except ValueError:
        if final:
            return None  # never closed: text
        if a < len(text) and text[a] == "{":  # the arguments so far (all of the rest while they are open)
            try:
                args_end = _DECODER.raw_decode(text, a)[1]
            except ValueError:
                args_end = len(text)
            return Call(name, text[a:args_end]), _MORE
        return Call(name), _MORE  # arguments in another layout: sent whole once the call closes
    call = _whole_call(obj, names)
    if call is None:
        return None
    if isinstance(obj.get("arguments", obj.get("parameters")), dict) and text[a] == "{":
        call.arguments = text[a:_DECODER.raw_decode(text, a)[1]]  # as the model wrote them (what streamed)
    return call, end


class _Content:
    """The text outside the calls: blanks next to a call dropped; while not final, a trailing run of
    blanks (a call may follow) and a possible start of `hold` are held back."""

    def __init__(self, final: bool):
        self.parts: list[str] = []
        self.final = final

    def add(self, text: str, after_call: bool, before_call: bool) -> None:
        if after_call:
            text = text.lstrip()
        if before_call:
            text = text.rstrip()
        self.parts.append(text)

    def last(self, text: str, after_call: bool, hold: str = "") -> None:
        """The text after the last call, to the end of the output so far."""
        if not self.final:
            if hold:
                text = text[:len(text) - tag_start_at_end(text, hold)]
            text = text.rstrip()
        self.add(text, after_call, False)

    def text(self) -> str:
        return "\n".join(p for p in self.parts if p)  # the text before a call and after it: two lines


def _hermes(text: str, names, final: bool) -> Reading:
    out, content = Reading(), _Content(final)
    seg = search = 0  # where the current text segment began; where to look for the next tag
    after_call = False
    while True:
        start = text.find(HERMES_START, search)
        if start < 0:
            content.last(text[seg:], after_call, hold=HERMES_START)
            break
        found = _object_call(text, _skip_ws(text, start + len(HERMES_START)), names, final)
        if found is None:  # not a call: the tag is text
            search = start + 1
            continue
        call, end = found
        if end == _MORE:  # may still become a call, or one is open: nothing after it is known yet
            content.add(text[seg:start], after_call, True)
            out.calls += [call] if call is not None else []
            break
        content.add(text[seg:start], after_call, True)
        out.calls.append(call)
        k = _skip_ws(text, end)
        if text.startswith(HERMES_END, k):
            k += len(HERMES_END)
        elif not final and HERMES_END.startswith(text[k:]):
            break  # the closing tag may be on its way
        seg = search = k
        after_call = True
    out.content = content.text()
    return out


def _whole(text: str, fmt: WholeFormat, names, final: bool) -> Reading:
    plain = Reading(content=text)
    i = _skip_ws(text, 0)
    for marker in fmt.markers:
        if text.startswith(marker, i):
            i = _skip_ws(text, i + len(marker))
        elif not final and i < len(text) and marker.startswith(text[i:]):
            return Reading()
    if fmt.array:
        if i == len(text):
            return plain if final else Reading()
        if text[i] != "[":
            return plain
        i = _skip_ws(text, i + 1)
    out = Reading()
    while True:
        found = _object_call(text, i, names, final)
        if found is None:
            if not out.calls:
                return plain
            break  # after the calls: text
        call, end = found
        if end == _MORE:
            out.calls += [call] if call is not None else []
            return out
        out.calls.append(call)
        i = _skip_ws(text, end)
        if text.startswith(fmt.separator, i):
            i = _skip_ws(text, i + 1)
            continue
        if fmt.array and text.startswith("]", i):
            i = _skip_ws(text, i + 1)
        break
    if i == len(text) and not final:
        return out  # a separator, another call or the text after them may follow
    content = _Content(final)
    content.last(text[i:], after_call=True)
    out.content = content.text()
    return out


def read(parser: str, text: str, names, final: bool) -> Reading:
    """The content and calls of the output so far (`final`: the whole output); `names`: the tools'."""
    if parser == "hermes":
        return _hermes(text, names, final)
    return _whole(text, WHOLE[parser], names, final)


def parse(parser: str, text: str, names) -> tuple[str | None, list[ToolCallOut]]:
    """(content or None, calls) of a whole output; no calls: (text, [])."""
    got = read(parser, text, names, final=True)
    if not got.calls:
        return text, []
    return got.content or None, [ToolCallOut(c.name, c.arguments, new_call_id(parser)) for c in got.calls]


class AutoToolStream:
    """The output so far in, OpenAI's content and tool_calls deltas out; `max_calls` 1: calls after
    the first are dropped (parallel_tool_calls false, as vLLM does)."""

    def __init__(self, parser: str, names, max_calls: int | None = None):
        self.parser, self.names, self.max_calls = parser, frozenset(names), max_calls
        self.sent = 0  # characters of content sent
        self.ids: list[str] = []  # the calls opened so far
        self.args_sent: list[int] = []  # characters of each call's arguments sent

    def _delta(self, got: Reading) -> dict:
        out: dict = {}
        if len(got.content) > self.sent:
            out["content"], self.sent = got.content[self.sent:], len(got.content)
        calls = []
        for i, call in enumerate(got.calls[:self.max_calls]):
            if i == len(self.ids):  # opens once its arguments begin (a name alone may be a JSON answer)
                if not call.arguments and not call.done:
                    break
                self.ids.append(new_call_id(self.parser))
                self.args_sent.append(len(call.arguments))
                calls.append({"index": i, "id": self.ids[i], "type": "function",
                              "function": {"name": call.name, "arguments": call.arguments}})
            elif len(call.arguments) > self.args_sent[i]:
                calls.append({"index": i, "function": {"arguments": call.arguments[self.args_sent[i]:]}})
                self.args_sent[i] = len(call.arguments)
        if calls:
            out["tool_calls"] = calls
        return out

    def delta(self, text: str) -> dict | None:
        """The delta for the output so far (`text`: all of it), or None."""
        return self._delta(read(self.parser, text, self.names, final=False)) or None

    def finish(self, text: str, finish_reason: str) -> tuple[dict, str]:
        """The last chunk's delta and finish_reason: "tool_calls" when a whole output ended in calls."""
        got = read(self.parser, text, self.names, final=True)
        if not got.calls:
            got = Reading(content=text)
        delta = self._delta(got)
        return delta, "tool_calls" if got.calls and finish_reason == "stop" else finish_reason
