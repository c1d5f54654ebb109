"""router/http/responses_events.py and responses_object.py: the chat pipeline's output (the real ChatShape,
router/http/chat_output.py) as Responses output items and streaming events, every event and every
Response parsed with the installed `openai` SDK's types (pure logic, no server)."""

from __future__ import annotations

import json

import orjson
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from router.http.bodies import ChatCompletionRequest, parse
from router.http.chat_output import ChatShape
from router.http.formats import Progress
from router.http.responses import output_feeder
from router.http.responses_convert import chat_body, conversation, input_messages
from router.http.responses_events import OutputItems, ResponseEvents, message_delta
from router.http.responses_object import base, finished, status_of, usage
from router.http.responses_request import ResponsesRequest
from router.http.tools import tool_plan

EVENT = TypeAdapter(ResponseStreamEvent)
WEATHER = {"type": "function", "name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
NOW = {"type": "function", "name": "now"}


def request(**fields) -> ResponsesRequest:
    return parse(ResponsesRequest, json.dumps({"input": "hi", **fields}).encode())


def shape_of(req: ResponsesRequest, tool_parser: str = "none", reasoning_parser: str = "none") -> ChatShape:
    chat = ChatCompletionRequest.model_validate(chat_body(req, conversation(req, [], input_messages(req)), "s"))
    return ChatShape(tool_plan(chat, tool_parser), tool_parser, reasoning_parser)


def sse(raw: bytes) -> list[dict]:
    """The events of an SSE body, each `event:` line checked against its data's type."""
    out = []
    for frame in raw.split(b"\n\n")[:-1]:
        event_line, data_line = frame.split(b"\n")
        event = orjson.loads(data_line.removeprefix(b"data: "))
        assert event_line == b"event: " + event["type"].encode()
        out.append(event)
    return out


def stream(shape: ChatShape, pieces: list[str], finish: str, req: ResponsesRequest | None = None):
    """(events as the SDK parses them, final Response) of an output that arrives in `pieces`."""
    p = Progress("r", 40)
    p.device, p.store = 16, 8
    items, numbering = OutputItems("k"), ResponseEvents()
    feed = output_feeder(shape, p, items)
    head = base(req or request(), "resp_k", 1, "m")
    raw = numbering.encode([{"type": "response.created", "response": head},
                            {"type": "response.in_progress", "response": head}])
    for i, piece in enumerate(pieces):
        p.text += piece
        p.output_ids.append(i)
        if i == len(pieces) - 1:
            p.finish_reason = finish
        raw += numbering.encode(feed(piece, i == 0))
    status = status_of(finish)
    end = items.finish(status)
    response = finished(head, status, items.items, usage(p, 0))
    raw += numbering.encode(end + [{"type": f"response.{status}", "response": response}])
    events = sse(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    parsed = [EVENT.validate_python(e) for e in events]
    assert [e.type for e in parsed] == [e["type"] for e in events]
    return parsed, Response.model_validate(response)


def whole(shape: ChatShape, text: str, finish: str) -> list[dict]:
    """The output items of the same output answered whole (stream: false)."""
    msg, _ = shape.message(text, finish)
    items = OutputItems("k")
    items.feed(message_delta(msg) if msg is not None else {"content": text})
    items.finish(status_of(finish))
    return items.items


def types(events) -> list[str]:
    return [e.type.removeprefix("response.") for e in events]


def test_a_text_answer_streams_as_openai_does_and_completes_with_usage_and_cached_tokens():
    shape = shape_of(request())
    events, response = stream(shape, ["Hel", "lo", " there"], "stop")
    assert types(events) == ["created", "in_progress", "output_item.added", "content_part.added",
                             "output_text.delta", "output_text.delta", "output_text.delta", "output_text.done",
                             "content_part.done", "output_item.done", "completed"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello there"
    assert events[7].text == "Hello there" and events[9].item.content[0].text == "Hello there"
    assert response.status == "completed" and response.output_text == "Hello there"
    assert response.output[0].status == "completed" and response.output[0].role == "assistant"
    u = response.usage
    assert (u.input_tokens, u.output_tokens, u.total_tokens) == (40, 3, 43)
    assert u.input_tokens_details.cached_tokens == 24
    assert u.input_tokens_details.model_extra["cached_tokens_details"] == {"device": 16, "host": 0, "store": 8,
                                                                           "ssd": 0, "inflight": 0}
    assert [i for i in whole(shape, "Hello there", "stop")] == [o.model_dump(exclude_none=True)
                                                                for o in response.output]


def test_an_output_cut_by_max_output_tokens_is_incomplete():
    events, response = stream(shape_of(request()), ["a", "b"], "length")
    assert events[-1].type == "response.incomplete" and response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens" and response.output[0].status == "incomplete"


def test_an_empty_output_still_has_its_message():
    events, response = stream(shape_of(request()), [""], "stop")
    assert "output_text.delta" not in types(events) and response.output_text == ""
    assert [o.type for o in response.output] == ["message"]


def test_thinking_is_a_reasoning_item_before_the_message():
    shape = shape_of(request(), reasoning_parser="qwen3")
    pieces = ["<thi", "nk>\nIt is", " cold.\n</th", "ink>\n\nYes", ", cold."]
    events, response = stream(shape, pieces, "stop")
    reasoning, message = response.output
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning.type == "reasoning" and reasoning.content[0].text == streamed and reasoning.summary == []
    # NOTE: the chat pipeline's reasoning stream sends the newline before </think> that its whole answer
    # strips (router/http/reasoning.py): the item is what was streamed
    assert streamed.rstrip("\n") == "It is cold."
    assert response.output_text == "Yes, cold." and message.type == "message"
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [d.output_index for d in done] == [0, 1] and done[0].item.type == "reasoning"
    thought, answer = whole(shape, "".join(pieces), "stop")
    assert thought["content"] == [{"type": "reasoning_text", "text": "It is cold."}]
    assert answer == message.model_dump(exclude_none=True)


def test_a_named_call_streams_its_arguments_as_they_come():
    shape = shape_of(request(tools=[WEATHER, NOW], tool_choice={"type": "function", "name": "weather"}))
    events, response = stream(shape, ['{"ci', 'ty": "Os', 'lo"}'], "stop")
    assert types(events) == ["created", "in_progress", "output_item.added", "function_call_arguments.delta",
                             "function_call_arguments.delta", "function_call_arguments.delta",
                             "function_call_arguments.done", "output_item.done", "completed"]
    (call,) = response.output
    assert call.type == "function_call" and call.name == "weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Oslo"} and events[6].arguments == call.arguments
    assert events[2].item.name == "weather" and events[2].item.call_id == call.call_id


def test_required_calls_come_as_items_in_order_and_match_the_whole_answer():
    shape = shape_of(request(tools=[WEATHER, NOW], tool_choice="required"))
    text = '[{"name": "weather", "parameters": {"city": "Oslo"}}, {"name": "now", "parameters": {}}]'
    events, response = stream(shape, [text[:30], text[30:]], "stop")
    assert [(o.name, json.loads(o.arguments)) for o in response.output] == [("weather", {"city": "Oslo"}),
                                                                             ("now", {})]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [a.output_index for a in added] == [0, 1] and response.status == "completed"
    calls = whole(shape, text, "stop")
    assert [(c["name"], c["arguments"]) for c in calls] == [(o.name, o.arguments) for o in response.output]


def test_a_call_the_model_writes_itself_is_read_by_the_familys_parser():
    shape = shape_of(request(tools=[WEATHER, NOW]), tool_parser="llama3_json")
    events, response = stream(shape, ['{"name": "now", ', '"parameters": {}}'], "stop")
    (call,) = response.output
    assert (call.type, call.name, call.arguments) == ("function_call", "now", "{}")
    assert "output_text.delta" not in types(events)  # held back: it was a call
    _, response = stream(shape, ["Sunny", " today"], "stop")
    assert response.output_text == "Sunny today"


def test_a_forced_call_cut_short_is_text_as_on_chat():
    shape = shape_of(request(tools=[WEATHER], tool_choice="required"))
    _, response = stream(shape, ['[{"name": "wea'], "length")
    assert response.status == "incomplete" and response.output_text == '[{"name": "wea'


def test_the_response_echoes_the_request():
    req = request(instructions="Be brief.", tools=[WEATHER], tool_choice={"type": "function", "name": "weather"},
                  parallel_tool_calls=False, max_output_tokens=9, temperature=0.2, metadata={"a": "b"}, store=False,
                  previous_response_id="resp_1", text={"format": {"type": "json_schema", "name": "x",
                                                                  "schema": {"type": "object"}}})
    head = base(req, "resp_2", 5, "m")
    r = Response.model_validate(finished(head, "completed", [], None))
    assert (r.id, r.created_at, r.model, r.instructions, r.metadata) == ("resp_2", 5, "m", "Be brief.", {"a": "b"})
    assert (r.parallel_tool_calls, r.max_output_tokens, r.temperature, r.previous_response_id) == \
        (False, 9, 0.2, "resp_1")
    assert r.tool_choice.name == "weather" and r.tools[0].name == "weather" and r.text.format.type == "json_schema"
    assert r.model_extra["store"] is False and r.completed_at is not None


def test_a_failed_response_carries_its_error():
    r = Response.model_validate(finished(base(request(), "resp_3", 5, "m"), "failed", [], None, "decode worker died"))
    assert r.status == "failed" and r.error.code == "server_error" and r.error.message == "decode worker died"


def test_the_last_event_ends_the_body_in_its_own_write_before_the_runs_cleanup():
    """No [DONE] in a Responses stream: the terminal event is a LastEvent, which the SSE writer sends
    as the body's last (no empty end message after it) before `finalize` runs."""
    import asyncio

    from router.http.sse import LastEvent, SSEResponse, is_last

    log = []

    async def events():
        yield b"event: a\n\n"
        yield LastEvent(b"event: b\n\n")
        log.append("generator went on")

    async def finalize():
        log.append("finalize")

    async def send(message: dict):
        if message["type"] == "http.response.body":
            log.append((message["body"], not message["more_body"]))

    asyncio.run(SSEResponse(events(), finalize)({"type": "http"}, None, send))
    assert log == [(b"event: a\n\n", False), (b"event: b\n\n", True), "finalize"]
    assert is_last(LastEvent(b"x")) and is_last(b"data: [DONE]\n\n") and not is_last(b"event: a\n\n")
