"""bench/router_overhead/responses.py: the two routes it compares ask the router for the same work (the
same chat messages, tokens and sampling once converted), and its result is the median of the repeats'
differences, not a difference of medians."""

from __future__ import annotations

import json

from bench.router_overhead.responses import added, bodies
from router.http.bodies import ChatCompletionRequest, parse
from router.http.responses_convert import chat_body, conversation, input_messages
from router.http.responses_request import ResponsesRequest


def test_both_routes_ask_for_the_same_prompt_tokens_and_sampling():
    requests = bodies(12)
    chat = parse(ChatCompletionRequest, json.dumps(requests["chat"][1]).encode())
    req = parse(ResponsesRequest, json.dumps(requests["responses"][1]).encode())
    converted = ChatCompletionRequest.model_validate(chat_body(req, conversation(req, [], input_messages(req)), "s"))
    assert [(m.role, m.content) for m in converted.messages] == [(m.role, m.content) for m in chat.messages]
    assert (converted.max_completion_tokens, converted.temperature, converted.stream) == (12, 0.0, True)
    assert (chat.max_tokens, chat.temperature, chat.stream) == (12, 0.0, True)
    assert [path for path, _ in requests.values()] == ["/v1/chat/completions", "/v1/responses"]


def test_the_result_is_the_median_of_the_repeats_differences():
    runs = [{"responses": {"x": 10.0}, "chat": {"x": 9.0}}, {"responses": {"x": 3.0}, "chat": {"x": 1.0}},
            {"responses": {"x": 7.0}, "chat": {"x": 2.0}}]
    assert added(runs, "x") == 2.0  # differences 1, 2, 5; the difference of medians would be 5
