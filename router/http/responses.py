"""`/v1/responses` (OpenAI's Responses API) on the chat pipeline: `POST` creates a response, streamed or
not; `GET` and `DELETE /v1/responses/{id}` read and remove a stored one.

    body -> ResponsesRequest (responses_request.py), refused fields 400 (responses_convert.check_served)
         -> previous_response_id: the chain's conversation (responses_store.py; 404 when not stored)
         -> the chat request (responses_convert.py) -> GenerationHandlers' job: template, tools, grammar
         -> ChatShape (router/http/chat_output.py) reads the output -> output items and events
            (responses_events.py) -> the Response object (responses_object.py) -> stored (store: true)

A chain's first response id is the routing session (make_job's `session`, as `prompt_cache_key` is on
chat): every turn of a chain goes to the prefill worker that holds its prefix. A chat-side error names
the Responses field (responses_convert.responses_param).
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass

import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from router.dispatch.dispatch import StreamFailed
from router.errors import APIError, bad_request
from router.http.bodies import ChatCompletionRequest, explain, parse
from router.http.chat_output import ChatShape
from router.http.formats import dumps, json_response
from router.http.generation import GenerationHandlers, drain
from router.http.responses_convert import (
    chat_body,
    check_served,
    conversation,
    input_messages,
    item_messages,
    responses_param,
)
from router.http.responses_events import OutputItems, ResponseEvents, message_delta
from router.http.responses_object import base, finished, status_of, usage
from router.http.responses_request import ResponsesRequest, input_item
from router.http.responses_store import ResponseStore
from router.http.sse import LastEvent

ROUTE = "/v1/responses"


@dataclass(frozen=True, slots=True)
class _Turn:
    """One request's response, as it is finished: its head (the echoed request), its place in the
    chain, this turn's input as chat messages, and how its output is read."""

    head: dict
    key: str  # the id's unique part (item ids are made from it)
    parent: str | None  # previous_response_id
    root: str  # the chain's first response id
    new: list[dict]
    shape: ChatShape
    store: bool


class ResponsesHandlers:
    def __init__(self, gen: GenerationHandlers, store: ResponseStore):
        self.gen, self.svc, self.store = gen, gen.svc, store
        # NOTE: ids as the router's request ids: a random per-process prefix + a counter
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count()

    async def create(self, request: Request, body: bytes):
        t0, arrived = time.perf_counter(), time.monotonic()
        svc = self.svc
        self.gen.auth.check_request(request)
        req = parse(ResponsesRequest, body)
        svc.served.check(req.model)
        check_served(req)
        chain = self.store.chain(req.previous_response_id) if req.previous_response_id else None
        key = f"{self._prefix}{next(self._counter):08x}"
        rid = "resp_" + key
        root = chain.root if chain is not None else rid
        new = input_messages(req)
        history = [m for turn in chain.turns for m in orjson.loads(turn)] if chain is not None else []
        try:
            chat = _chat_request(chat_body(req, conversation(req, history, new), req.prompt_cache_key or root))
            prep = self.gen.openai_job(chat, True, arrived)
            run = await svc.start(request, ROUTE, t0, prep.spec)
        except APIError as e:
            raise responses_param(e) from None
        progress, first = run.progress, run.first
        shape = ChatShape(prep.plan, svc.tool_parser, svc.reasoning_parser, prep.start)
        turn = _Turn(base(req, rid, int(time.time()), svc.model_name), key, req.previous_response_id, root, new,
                     shape, req.store)
        if not req.stream:
            return await self._whole(turn, progress, run)
        return self.gen.sse(self._events(turn, progress, first, run), run)

    async def _whole(self, turn: _Turn, progress, run) -> Response:
        await drain(run)
        msg, _ = turn.shape.message(progress.text, progress.finish_reason)
        items = OutputItems(turn.key)
        items.feed(message_delta(msg) if msg is not None else {"content": progress.text})
        status = status_of(progress.finish_reason)
        items.finish(status)
        return Response(self._finish(turn, progress, items, status), media_type="application/json")

    async def _events(self, turn: _Turn, p, first: str, run):
        """The stream: created and in_progress with the first token's events, then one write per
        batch of the worker's chunks; the last ends with the response's own end event."""
        events, items = ResponseEvents(), OutputItems(turn.key)
        feed = output_feeder(turn.shape, p, items)
        try:
            head = orjson.Fragment(dumps(turn.head))  # NOTE: serialized once for both events
            out = [{"type": "response.created", "response": head}, {"type": "response.in_progress", "response": head},
                   *feed(first, True)]
            if not p.finish_reason:
                yield events.encode(out)
                out = []
                async for text in run:
                    out = feed(text, False)
                    if p.finish_reason:  # the worker's last chunk: its events go with the end
                        break
                    if out:
                        yield events.encode(out)
                    out = []
        except StreamFailed as e:
            failed = finished(turn.head, "failed", items.items, None, str(e))
            yield LastEvent(events.encode(items.close("incomplete") + [{"type": "response.failed", "response": failed}]))
            return
        status = status_of(p.finish_reason)
        out += items.finish(status)
        response = orjson.Fragment(self._finish(turn, p, items, status))
        # NOTE: the body ends in this write, before the run's cleanup (as a chat stream's [DONE] does)
        yield LastEvent(events.encode(out + [{"type": f"response.{status}", "response": response}]))

    def _finish(self, turn: _Turn, p, items: OutputItems, status: str) -> bytes:
        """The finished Response object (JSON), stored when asked."""
        thinking = "".join(i["content"][0]["text"] for i in items.items if i["type"] == "reasoning")
        reasoning_tokens = len(self.svc.tokenizer.encode(thinking, add_special_tokens=False)) if thinking else 0
        response = dumps(finished(turn.head, status, items.items, usage(p, reasoning_tokens)))
        if turn.store:
            output = item_messages([input_item(i, f"output.{n}") for n, i in enumerate(items.items)], "output")
            self.store.put(turn.head["id"], turn.parent, turn.root, dumps(turn.new + output), response)
        return response

    def add_routes(self, app, auth) -> None:
        """GET and DELETE /v1/responses/{response_id} (FastAPI: not on the hot path)."""
        async def get(request: Request, response_id: str):
            auth.check_client(request.headers.get("authorization"))
            for name in ("stream", "include", "starting_after"):
                if name in request.query_params:
                    raise bad_request(f"{name}: replaying a stored response as events is not served", param=name)
            return Response(self.store.response(response_id), media_type="application/json")

        async def delete(request: Request, response_id: str):
            auth.check_client(request.headers.get("authorization"))
            self.store.delete(response_id)
            return json_response({"id": response_id, "object": "response.deleted", "deleted": True})

        app.add_api_route("/v1/responses/{response_id}", get, methods=["GET"], name="responses_get",
                          summary="A stored response (store: true), as it was answered")
        app.add_api_route("/v1/responses/{response_id}", delete, methods=["DELETE"], name="responses_delete",
                          summary="Remove a stored response (a chain through it ends there)")


def _chat_request(body: dict) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        loc, msg = explain(e.errors(include_url=False))
        raise bad_request(f"{loc}: {msg}" if loc else msg, param=loc or None) from None


def output_feeder(shape: ChatShape, p, items: OutputItems):
    """feed(text delta, first) -> the events of it, `items` growing. A plain chat's text is its content;
    a shaped one's deltas are what ChatShape streams to a chat client (its chunks' `delta`s)."""
    if shape.plain:
        return lambda text, first: items.text("message", text) if text else []
    step = shape.stream()

    def feed(text: str, first: bool) -> list[dict]:
        out = step(p)
        return items.feed(out[0]) if out is not None else []
    return feed
