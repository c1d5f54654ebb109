"""A response's output items, put together from the chat pipeline's output, and every change to them
as a Responses streaming event (OpenAI's names and shapes; the `openai` SDK's ResponseStreamEvent).

`OutputItems.feed` takes what router/http/chat_output.py gives a chat client as a delta
(`reasoning_content`, `content`, `tool_calls` pieces with their `index`, `id`, `function.name`,
`function.arguments`); a non-streamed answer's message is one such delta (`message_delta`). Items
open as their first piece comes and close when another kind begins or the output ends:

    reasoning       output_item.added, content_part.added (reasoning_text),
                    reasoning_text.delta..., reasoning_text.done, content_part.done, output_item.done
    message         output_item.added, content_part.added (output_text),
                    output_text.delta..., output_text.done, content_part.done, output_item.done
    function_call   output_item.added, function_call_arguments.delta..., function_call_arguments.done,
                    output_item.done

`ResponseEvents` numbers them (`sequence_number`) and frames them as SSE (`event:` + `data:` lines).
"""

from __future__ import annotations

import orjson


class OutputItems:
    """`key`: makes the item ids unique ("msg_<key>_0", "fc_<key>_1", ...)."""

    def __init__(self, key: str):
        self.key = key
        self.items: list[dict] = []
        self._open: dict | None = None  # the item still growing
        self._pieces: list[str] = []  # its text (arguments) so far, joined when it closes
        self._call = -1  # the chat index of the open function call

    def _add(self, item: dict, part: dict | None) -> list[dict]:
        self.items.append(item)
        self._open, self._pieces = item, []
        index = len(self.items) - 1
        events = [{"type": "response.output_item.added", "output_index": index, "item": _copy(item)}]
        if part is not None:
            item["content"].append(part)
            events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "part": dict(part)})
        return events

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self.key}_{len(self.items)}"

    def feed(self, delta: dict) -> list[dict]:
        """The events of one chat-shaped delta."""
        events: list[dict] = []
        thinking = delta.get("reasoning_content")
        if thinking:
            events += self.text("reasoning", thinking)
        content = delta.get("content")
        if content:
            events += self.text("message", content)
        for call in delta.get("tool_calls") or ():
            events += self._call_piece(call)
        return events

    def text(self, kind: str, text: str) -> list[dict]:
        """The events of a piece of `kind` ("reasoning" or "message") text."""
        events: list[dict] = []
        item = self._open
        if item is None or item["type"] != kind:
            events += self.close("completed")
            if kind == "reasoning":
                item = {"type": "reasoning", "id": self._item_id("rs"), "summary": [], "content": [],
                        "status": "in_progress"}
                part: dict = {"type": "reasoning_text", "text": ""}
            else:
                item = {"type": "message", "id": self._item_id("msg"), "role": "assistant", "content": [],
                        "status": "in_progress"}
                part = {"type": "output_text", "text": "", "annotations": []}
            events += self._add(item, part)
        if not text:
            return events
        self._pieces.append(text)
        event = {"type": "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta",
                 "item_id": item["id"], "output_index": len(self.items) - 1, "content_index": 0, "delta": text}
        if kind == "message":
            event["logprobs"] = []
        events.append(event)
        return events

    def _call_piece(self, call: dict) -> list[dict]:
        events: list[dict] = []
        fn = call.get("function") or {}
        index = call.get("index", 0)
        item = self._open
        if item is None or item["type"] != "function_call" or call.get("id") or index != self._call:
            events += self.close("completed")
            item = {"type": "function_call", "id": self._item_id("fc"), "call_id": call.get("id") or "",
                    "name": fn.get("name") or "", "arguments": "", "status": "in_progress"}
            self._call = index
            events += self._add(item, None)
        piece = fn.get("arguments") or ""
        if piece:
            self._pieces.append(piece)
            events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                           "output_index": len(self.items) - 1, "delta": piece})
        return events

    def close(self, status: str) -> list[dict]:
        """The events that finish the open item (none open: none), its status `status`."""
        item, self._open, self._call = self._open, None, -1
        if item is None:
            return []
        index, events, text = len(self.items) - 1, [], "".join(self._pieces)
        item["status"] = status
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            item["arguments"] = text
            events.append({"type": "response.function_call_arguments.done", **where, "arguments": text})
        else:
            part = item["content"][0]
            part["text"] = text
            kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
            done = {"type": f"response.{kind}.done", **where, "content_index": 0, "text": part["text"]}
            if kind == "output_text":
                done["logprobs"] = []
            events += [done, {"type": "response.content_part.done", **where, "content_index": 0, "part": part}]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})  # final now
        return events

    def finish(self, status: str) -> list[dict]:
        """Close the last item; an output with no item at all gets an empty message (every finished
        response has one)."""
        events = self.close(status)
        if not self.items:
            events += self.text("message", "")
            events += self.close(status)
        return events


def _copy(item: dict) -> dict:
    """The item as it is now (the added event keeps its own copy; the item goes on growing)."""
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out


def message_delta(message: dict) -> dict:
    """A whole chat message (ChatShape.message) as one delta, its calls numbered."""
    calls = message.get("tool_calls") or []
    return {"reasoning_content": message.get("reasoning_content"), "content": message.get("content"),
            "tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}


class ResponseEvents:
    """Numbered, SSE-framed events of one stream."""

    def __init__(self):
        self.seq = 0

    def encode(self, events: list[dict]) -> bytes:
        out = []
        for event in events:
            event["sequence_number"] = self.seq
            self.seq += 1
            out.append(b"event: %s\ndata: %s\n\n" % (event["type"].encode(), orjson.dumps(event)))
        return b"".join(out)
