"""Agent frameworks, unmodified (dev dependencies), on the real stack: each framework's own openai
client -> the real router -> D -> P (tiny random-weights model; every prompt prefilled by P).
LangChain's ChatOpenAI, instructor, pydantic-ai and the OpenAI Agents SDK (its chat-completions model,
and its default Responses model on /v1/responses), each over nested pydantic models (their JSON
schemas carry $defs).

Random weights cannot be smart: the checks are that the framework parsed what it asked for (an
instance of the nested model, a call whose arguments validate, a loop that ends in text) from the
first answer (no re-ask), not that the answer is true. Every value is bounded (enums, at most two
list items) so a random model ends within max_tokens. Each test also checks what the framework sent
(tool_choice, response_format, $defs): the rows of docs/api.md's "Frameworks".
"""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import httpx2
import openai
import pytest
from pydantic import BaseModel, Field

from pdorch.local_stack.router import cluster_router
from tests.integration.test_agent_tools import cluster  # noqa: F401  (P + D, every prompt prefilled by P)

PROMPT = "Save Ann, who lives in Oslo."
MAX_TOKENS = 200  # a Person is ~70 tokens in JSON, its call in the model's format ~90


class Address(BaseModel):
    city: Literal["Oslo", "Rome"]
    zip: Literal["0150", "00184"]


class Person(BaseModel):
    """A person to save (a nested model: its JSON schema holds Address in $defs)."""

    name: Literal["Ann", "Bo"]
    home: Address
    past: list[Address] = Field(max_length=2)


class Recorder:
    """The JSON bodies a framework's openai client sends, in order (an httpx2 request hook); owns the
    HTTP clients it hands out."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.clients: list[httpx2.Client] = []
        self.async_clients: list[httpx2.AsyncClient] = []

    def _note(self, request: httpx2.Request) -> None:
        self.bodies.append(json.loads(request.content))

    async def _note_async(self, request: httpx2.Request) -> None:
        self._note(request)

    def http_client(self) -> httpx2.Client:
        self.clients.append(httpx2.Client(event_hooks={"request": [self._note]}, timeout=120))
        return self.clients[-1]

    def async_http_client(self) -> httpx2.AsyncClient:
        # no connection kept alive: each test's run has its own event loop, closed when it ends
        self.async_clients.append(httpx2.AsyncClient(event_hooks={"request": [self._note_async]}, timeout=120,
                                                     limits=httpx2.Limits(max_keepalive_connections=0)))
        return self.async_clients[-1]

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for c in self.async_clients:
            asyncio.run(c.aclose())


@pytest.fixture(scope="module")
def served(cluster, tiny_model_dir):  # noqa: F811
    """(the router's /v1 URL, the served model's name)."""
    r = cluster_router(cluster, tiny_model_dir)
    try:
        with openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0) as c:
            name = c.models.list().data[0].id
        yield r.url + "/v1", name
    finally:
        r.stop()


@pytest.fixture
def recorder():
    rec = Recorder()
    yield rec
    rec.close()


def sync_client(served, recorder: Recorder) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[0], api_key="unused", max_retries=0, http_client=recorder.http_client())


def async_client(served, recorder: Recorder) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=served[0], api_key="unused", max_retries=0,
                              http_client=recorder.async_http_client())


def run_agent(agent, stream: bool, max_turns: int):
    """An Agents SDK run of PROMPT, streamed (its events consumed) or not, in an event loop of its own."""
    from agents import Runner

    async def streamed():
        run = Runner.run_streamed(agent, PROMPT, max_turns=max_turns)
        async for _ in run.stream_events():
            pass
        return run

    return asyncio.run(streamed() if stream else Runner.run(agent, PROMPT, max_turns=max_turns))


def has_defs(schema: dict) -> bool:
    """The schema sent carries the nested model as a definition and refers to it (what issue 51's
    first requests failed on)."""
    return any(d.endswith("Address") and f"#/$defs/{d}" in json.dumps(schema) for d in schema.get("$defs", {}))


def inlined(schema: dict) -> bool:
    """The nested model written out where it is used (no $defs, no $ref)."""
    return "$ref" not in json.dumps(schema) and set(schema["properties"]["home"]["properties"]) == {"city", "zip"}


def tool_schema(body: dict, name: str) -> dict:
    (tool,) = [t["function"] for t in body["tools"] if t["function"]["name"] == name]
    return tool["parameters"]


# LangChain


def chat_openai(served, recorder: Recorder):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=served[1], base_url=served[0], api_key="unused", temperature=0, max_tokens=MAX_TOKENS,
                      max_retries=0, http_client=recorder.http_client())


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output_returns_the_nested_model(served, recorder, method):
    out = chat_openai(served, recorder).with_structured_output(Person, method=method).invoke(PROMPT)
    assert isinstance(out, Person), out
    (body,) = recorder.bodies
    if method == "json_schema":
        assert body["response_format"]["type"] == "json_schema" and "tools" not in body
        assert has_defs(body["response_format"]["json_schema"]["schema"])
    else:  # LangChain writes the nested model inline (its own $ref resolution), parallel_tool_calls false
        assert body["tool_choice"] == {"type": "function", "function": {"name": "Person"}}
        assert body["parallel_tool_calls"] is False and inlined(tool_schema(body, "Person"))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["any", "auto"])
def test_langchain_bind_tools_reads_calls_whose_arguments_validate(served, recorder, tool_choice, stream):
    from langchain_core.tools import tool

    @tool
    def save_person(person: Person) -> str:
        """Store a person."""
        return "saved"

    llm = chat_openai(served, recorder).bind_tools([save_person], tool_choice=tool_choice)
    if stream:  # the chunks put together as LangChain does (tool_call_chunks -> tool_calls)
        chunks = list(llm.stream(PROMPT))
        msg = chunks[0]
        for c in chunks[1:]:
            msg = msg + c
    else:
        msg = llm.invoke(PROMPT)
    (body,) = recorder.bodies
    assert body["tool_choice"] == {"any": "required", "auto": "auto"}[tool_choice] and body.get("stream") is stream
    assert inlined(tool_schema(body, "save_person")["properties"]["person"])
    assert not msg.invalid_tool_calls, msg
    if tool_choice == "any":
        assert msg.tool_calls and all(c["name"] == "save_person" for c in msg.tool_calls), msg
        for c in msg.tool_calls:
            Person.model_validate(c["args"]["person"])
    else:
        assert isinstance(msg.content, str) and msg.content and not msg.tool_calls  # a random model's text


# instructor


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_returns_the_nested_model_from_the_first_answer(served, recorder, mode, stream):
    import instructor

    client = instructor.from_openai(sync_client(served, recorder), mode=getattr(instructor.Mode, mode))
    kwargs = {"model": served[1], "response_model": Person, "max_tokens": MAX_TOKENS, "temperature": 0,
              "messages": [{"role": "user", "content": PROMPT}]}
    if stream:  # partial models as the arguments stream in; the last one is whole
        out = Person.model_validate(list(client.chat.completions.create_partial(**kwargs))[-1].model_dump())
    else:
        out = client.chat.completions.create(**kwargs)
    assert isinstance(out, Person), out
    (body,) = recorder.bodies  # parsed from the first answer: no re-ask
    assert body.get("stream", False) is stream
    name = "PartialPerson" if stream else "Person"  # instructor's partial model streams
    if mode == "TOOLS":
        assert body["tool_choice"] == {"type": "function", "function": {"name": name}}
        assert has_defs(tool_schema(body, name))
    else:
        assert body["response_format"]["type"] == "json_schema" and "tools" not in body
        assert has_defs(body["response_format"]["json_schema"]["schema"])


# pydantic-ai


def pydantic_ai_model(served, recorder: Recorder):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(served[1], provider=OpenAIProvider(openai_client=async_client(served, recorder)))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("output", ["tool", "native"])
def test_pydantic_ai_output_type_returns_the_nested_model(served, recorder, output, stream):
    """output_type=Person: pydantic-ai's output tool (final_result, tool_choice required, strict);
    NativeOutput(Person): response_format json_schema, strict."""
    from pydantic_ai import Agent, NativeOutput

    agent = Agent(pydantic_ai_model(served, recorder), output_type=Person if output == "tool" else NativeOutput(Person),
                  model_settings={"max_tokens": MAX_TOKENS, "temperature": 0})

    async def streamed() -> Person:
        async with agent.run_stream(PROMPT) as run:
            return await run.get_output()

    out = asyncio.run(streamed()) if stream else asyncio.run(agent.run(PROMPT)).output
    assert isinstance(out, Person), out
    (body,) = recorder.bodies  # no output retry
    assert body["stream"] is stream and body.get("stream_options") == ({"include_usage": True} if stream else None)
    if output == "tool":
        (tool,) = body["tools"]
        assert body["tool_choice"] == "required" and "response_format" not in body
        assert tool["function"]["strict"] is True and has_defs(tool["function"]["parameters"])
    else:
        fmt = body["response_format"]["json_schema"]
        assert "tools" not in body and fmt["strict"] is True and has_defs(fmt["schema"])


def test_pydantic_ai_calls_a_tool_then_returns_the_nested_model(served, recorder):
    """A tool over the nested model, then the output: the first request names the tool, the next
    only the output (model settings per step, a pydantic-ai feature), so a random model's loop ends."""
    from pydantic_ai import Agent

    saved: list[Person] = []

    def save_person(person: Person) -> str:
        """Store a person."""
        saved.append(person)
        return "saved"

    def settings(ctx) -> dict:
        return {"max_tokens": MAX_TOKENS, "temperature": 0,
                "tool_choice": ["save_person"] if ctx.run_step <= 1 else "none"}

    agent = Agent(pydantic_ai_model(served, recorder), output_type=Person, tools=[save_person],
                  model_settings=settings)
    out = asyncio.run(agent.run(PROMPT)).output
    assert isinstance(out, Person) and len(saved) == 1 and isinstance(saved[0], Person), (out, saved)
    first, second = recorder.bodies
    assert first["tool_choice"] == {"type": "function", "function": {"name": "save_person"}}
    assert has_defs(tool_schema(first, "save_person"))
    assert second["tool_choice"] == {"type": "function", "function": {"name": "final_result"}}
    assert [m["role"] for m in second["messages"]][-2:] == ["assistant", "tool"]


def test_pydantic_ai_tool_or_output_is_an_allowed_tools_choice_the_call_keeps_to(served, recorder):
    """ToolOrOutput(save_person): pydantic-ai sends OpenAI's allowed_tools (save_person or the
    output; lookup stays in the prompt, not callable); the first answer is a call of one of those two."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.settings import ToolOrOutput

    def save_person(person: Person) -> str:
        """Store a person."""
        return "saved"

    def lookup(name: Literal["Ann", "Bo"]) -> str:
        """Look a person up."""
        raise AssertionError("lookup is not an allowed tool")

    def settings(ctx) -> dict:
        return {"max_tokens": MAX_TOKENS, "temperature": 0,
                "tool_choice": ToolOrOutput(function_tools=["save_person"]) if ctx.run_step <= 1 else "none"}

    agent = Agent(pydantic_ai_model(served, recorder), output_type=Person, tools=[save_person, lookup],
                  model_settings=settings)
    run = asyncio.run(agent.run(PROMPT))
    assert isinstance(run.output, Person), run.output
    first = recorder.bodies[0]
    assert first["tool_choice"] == {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": n}} for n in ("save_person", "final_result")]}}
    assert {t["function"]["name"] for t in first["tools"]} == {"save_person", "lookup", "final_result"}
    calls = [p.tool_name for p in run.all_messages()[1].parts if isinstance(p, ToolCallPart)]
    assert calls and set(calls) <= {"save_person", "final_result"}, calls


# OpenAI Agents SDK, its chat-completions model


@pytest.mark.parametrize("stream", [False, True])
def test_openai_agents_required_tool_then_a_loop_that_ends_in_text(served, recorder, stream):
    """tool_choice required: the first answer calls the tool (its arguments validated into the
    nested model by the SDK); the SDK then resets tool_choice and the next answer is text, the
    run's final output."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # traces would go to OpenAI's servers
    saved: list[Person] = []

    @function_tool
    def save_person(person: Person) -> str:
        """Store a person."""
        saved.append(person)
        return "saved"

    model = OpenAIChatCompletionsModel(served[1], openai_client=async_client(served, recorder))
    agent = Agent(name="saver", instructions="Save people.", model=model, tools=[save_person],
                  model_settings=ModelSettings(tool_choice="required", max_tokens=MAX_TOKENS, temperature=0))

    result = run_agent(agent, stream, max_turns=3)
    assert isinstance(result.final_output, str) and result.final_output, result
    assert len(saved) == 1 and isinstance(saved[0], Person), saved
    first, second = recorder.bodies
    assert first["tool_choice"] == "required" and first.get("stream", False) is stream
    (tool,) = first["tools"]
    assert tool["function"]["strict"] is True and has_defs(tool["function"]["parameters"])
    assert "tool_choice" not in second  # reset after the call (the SDK's reset_tool_choice): auto
    assert [m["role"] for m in second["messages"]][-2:] == ["assistant", "tool"]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_agents_output_type_returns_the_nested_model(served, recorder, stream):
    """output_type=Person: response_format json_schema (final_output, strict); streamed with usage."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, set_tracing_disabled

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(served[1], openai_client=async_client(served, recorder))
    agent = Agent(name="reader", model=model, output_type=Person,
                  model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=0, include_usage=stream))

    result = run_agent(agent, stream, max_turns=1)
    assert isinstance(result.final_output, Person), result.final_output
    assert result.context_wrapper.usage.output_tokens > 0  # streamed: from the usage chunk
    (body,) = recorder.bodies
    fmt = body["response_format"]["json_schema"]
    assert (fmt["name"], fmt["strict"]) == ("final_output", True) and has_defs(fmt["schema"]) and "tools" not in body


# OpenAI Agents SDK, its default model: the Responses API (/v1/responses, router/http/responses.py)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_agents_default_responses_model_forces_a_call_of_a_nested_model_tool(served, recorder, stream):
    """The Agents SDK's own default (OpenAIResponsesModel) with output_type and tool_choice required: the
    call's arguments are validated into the nested model and the tool runs (stop_on_first_tool: its
    output is the run's). The SDK sends text.format beside the forced call: the call is the turn."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    saved: list[Person] = []

    @function_tool
    def save_person(person: Person) -> str:
        """Store a person."""
        saved.append(person)
        return "saved"

    model = OpenAIResponsesModel(served[1], openai_client=async_client(served, recorder))
    agent = Agent(name="saver", instructions="Save people.", model=model, tools=[save_person], output_type=Person,
                  tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", max_tokens=MAX_TOKENS, temperature=0))

    result = run_agent(agent, stream, max_turns=1)
    assert result.final_output == "saved" and len(saved) == 1 and isinstance(saved[0], Person), saved
    (body,) = recorder.bodies
    assert body["tool_choice"] == "required" and body.get("stream", False) is stream
    assert body["instructions"] == "Save people." and body["max_output_tokens"] == MAX_TOKENS
    (tool,) = body["tools"]
    assert tool["type"] == "function" and tool["strict"] is True and has_defs(tool["parameters"])
    assert body["text"]["format"]["type"] == "json_schema"  # beside the forced call: the call wins


def test_openai_agents_default_responses_model_continues_a_previous_response(served, recorder):
    """Two runs chained by previous_response_id (the SDK sends only the new input): the second answers
    on the first's conversation, stored by the router, and reads its prompt pages from the KV cache
    (the chain is routed to where its KV lives)."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(served[1], openai_client=async_client(served, recorder))
    agent = Agent(name="reader", model=model, output_type=Person,
                  model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=0))
    first = asyncio.run(Runner.run(agent, PROMPT, max_turns=1))
    second = asyncio.run(Runner.run(agent, "And Bo, who lives in Rome.", max_turns=1,
                                    previous_response_id=first.last_response_id))
    assert isinstance(first.final_output, Person) and isinstance(second.final_output, Person)
    _, body = recorder.bodies
    assert body["previous_response_id"] == first.last_response_id and len(body["input"]) == 1
    usage = second.context_wrapper.usage
    assert usage.input_tokens > first.context_wrapper.usage.input_tokens  # the first turn is in its prompt
    assert usage.input_tokens_details.cached_tokens > 0


def test_openai_agents_default_responses_model_output_type_returns_the_nested_model(served, recorder):
    """output_type=Person on the Responses model: text.format json_schema, the answer parsed by the SDK."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(served[1], openai_client=async_client(served, recorder))
    agent = Agent(name="reader", model=model, output_type=Person,
                  model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=0))
    result = asyncio.run(Runner.run(agent, PROMPT, max_turns=1))
    assert isinstance(result.final_output, Person), result.final_output
    (body,) = recorder.bodies
    fmt = body["text"]["format"]
    assert (fmt["type"], fmt["name"], fmt["strict"]) == ("json_schema", "final_output", True) and has_defs(fmt["schema"])
