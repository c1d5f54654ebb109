"""The generation endpoints: /v1/chat/completions, /v1/completions, /generate.

Each handler takes the request (headers) and its raw body and returns a Response: JSON for
`stream: false`, an `SSEResponse` otherwise. Errors before the first token raise APIError
(the caller answers them as JSON with their status); after it they become an error event.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import NamedTuple

from starlette.requests import Request
from starlette.responses import Response

from pdorch.config import Config
from router.dispatch.dispatch import StreamFailed
from router.errors import APIError, stream_error_event, upstream_error
from router.http import formats
from router.http.auth import Auth
from router.http.bodies import ChatCompletionRequest, CompletionRequest, GenerateRequest, parse
from router.http.body_sampling import openai_sampling, sglang_sampling
from router.http.chat_output import ChatShape
from router.http.chat_prompt import chat_prompt_ids
from router.http.choices import GenerateChoices, OpenAIChoices
from router.http.logprobs import Logprobs, check_top, with_prompt_logprobs
from router.http.plain_generate import PlainGenerateReader, SamplingKey
from router.http.reasoning import NO_THINKING, start_of
from router.http.service import DEFAULT_GENERATE_MAX_TOKENS, JobSpec, RouterService, Run
from router.http.sse import SSEResponse
from router.http.structured import grammar_of
from router.http.tool_grammar import after_thinking, answer_or_calls
from router.http.tools import ToolPlan, tool_plan


async def _sse_events(run, progress, first: str, chunk, tail):
    """One streamed OpenAI response: `chunk(delta, is_first)` per worker chunk, the body ended with
    the last one and `tail()` (usage, [DONE]); a failed stream ends with an error event."""
    try:
        out = chunk(first, True)
        if progress.finish_reason:
            yield out + tail()
            return
        if out:
            yield out
        async for delta in run:
            out = chunk(delta, False)
            if progress.finish_reason:  # the worker's last chunk: end the HTTP body with it
                yield out + tail()
                return
            if out:
                yield out
    except StreamFailed as e:
        yield formats.sse(stream_error_event(str(e))) + formats.DONE
        return
    yield tail()


class PreparedOpenAI(NamedTuple):  # NOTE: made per request: immutable as a frozen dataclass, 3x cheaper to make
    """An OpenAI body (chat or completions) made ready to run (`GenerationHandlers.openai_job`)."""

    spec: JobSpec  # what RouterService.start runs: the prompt's ids and the sampling
    plan: ToolPlan | None  # the chat's tools (None: completions, or a chat without tools)
    start: str  # where a reasoning model's output starts (router/http/reasoning.py start_of)
    echo: bool  # completions' echo: the prompt leads the text


class PreparedGenerate(NamedTuple):  # NOTE: made per request: immutable as a frozen dataclass, 3x cheaper to make
    """An SGLang /generate body made ready to run (`GenerationHandlers.generate_job`)."""

    spec: JobSpec  # what RouterService.start runs
    stream: bool
    logprobs: bool = False  # return_logprob
    text_in_logprobs: bool = False  # return_text_in_logprobs
    prompt: list[int] | None = None  # the prompt's ids when its logprobs are asked
    start: int = -1  # logprob_start_len (>= 0: the prompt's logprobs from there)


class GenerationHandlers:
    def __init__(self, cfg: Config, svc: RouterService, auth: Auth):
        self.cfg = cfg
        self.svc = svc
        self.auth = auth
        self.plain = PlainGenerateReader()  # /generate bodies whose sampling was validated before

    def sse(self, events, run: Run) -> SSEResponse:
        """The stream of a request's `run` (router/http/service.py), closed with it, kept alive."""
        return SSEResponse(events, run.aclose, self.cfg.router.keepalive_s, run)

    async def chat(self, request: Request, body: bytes):
        return await self._openai(request, body, chat=True)

    async def completions(self, request: Request, body: bytes):
        return await self._openai(request, body, chat=False)

    async def _openai(self, request: Request, body: bytes, chat: bool):
        t0, arrived = time.perf_counter(), time.monotonic()
        svc = self.svc
        self.auth.check_request(request)
        req = parse(ChatCompletionRequest if chat else CompletionRequest, body)
        svc.served.check(req.model)
        prep = self.openai_job(req, chat, arrived)
        plan, start, echo, ids = prep.plan, prep.start, prep.echo, prep.spec.ids
        sampling, top = prep.spec.sampling.params, prep.spec.sampling.top
        route = "/v1/chat/completions" if chat else "/v1/completions"
        run = await svc.start(request, route, t0, prep.spec)
        progress, first = run.progress, run.first
        oid = ("chatcmpl-" if chat else "cmpl-") + progress.request_id
        created = int(time.time())
        model = svc.model_name
        # completions echo: the prompt leads the text
        lead = echo_text(req.prompt, ids, svc) if echo and isinstance(req, CompletionRequest) else ""

        def logprobs_of(p):  # one choice's
            return None if top is None else Logprobs(svc.tokenizer, p, (ids, lead) if echo else None, top)

        def shape_of():  # one choice's
            return ChatShape(plan, svc.tool_parser, svc.reasoning_parser, start) if chat else None

        so = req.stream_options
        include_usage = bool(so is not None and so.include_usage)
        continuous = bool(so is not None and so.include_usage and so.continuous_usage_stats)

        def answer(body: dict) -> dict:  # vLLM's prompt_logprobs (never streamed: check_prompt_logprobs)
            if req.prompt_logprobs is None:
                return body
            return with_prompt_logprobs(body, chat, svc.tokenizer, ids, progress.prompt_logprobs, req.prompt_logprobs)

        if sampling.n > 1:  # router/http/choices.py
            many = OpenAIChoices(run, chat, [shape_of() for _ in run.choices], [logprobs_of(p) for p in run.choices],
                                 oid, created, model, lead)
            if not req.stream:
                return await _collect(run, lambda: answer(many.final()))
            return self.sse(many.events(include_usage, continuous), run)
        lp, shape = logprobs_of(progress), shape_of()
        plain = shape is None or shape.plain
        if not req.stream:
            def final():
                if not chat:
                    return answer(formats.completion_final(
                        progress, oid, created, model, lp and lp.completion(progress.output_ids, progress.logprobs, 0),
                        lead))
                assert shape is not None  # a chat's
                message, finish = shape.message(progress.text, progress.finish_reason)
                return answer(formats.chat_final(progress, oid, created, model, message, finish,
                                                 logprobs=lp and lp.chat(progress.output_ids, progress.logprobs)))
            return await _collect(run, final)
        chunk: Callable[..., bytes]
        if plain:
            chunk = functools.partial(formats.chat_chunk if chat else formats.completion_chunk,
                                      continuous_usage=continuous)
        else:
            step = shape.stream()

            def chunk(p, oid, created, model, _text, _first, include_usage, logprobs=None) -> bytes:
                out = step(p, logprobs)  # router/http/chat_output.py: the delta; here its bytes
                return b"" if out is None else formats.chat_delta_chunk(p, oid, created, model, out[0], out[1],
                                                                        include_usage, continuous, out[2])

        def tail() -> bytes:
            return (formats.usage_chunk(progress, oid, created, model, chat) if include_usage else b"") + formats.DONE

        def chunk_lp(delta: str) -> dict:
            """The chunk's tokens' logprobs (a shaped chat's stream holds them while it holds their text)."""
            if lp is None:
                return {}
            return {"logprobs": lp.take_chat() if chat else lp.take_completion(len(progress.text) - len(delta))}

        def one(delta: str, is_first: bool) -> bytes:
            text = lead + delta if is_first else delta
            return chunk(progress, oid, created, model, text, is_first, include_usage, **chunk_lp(delta))

        return self.sse(_sse_events(run, progress, first, one, tail), run)

    def openai_job(self, req, chat: bool, arrived: float) -> PreparedOpenAI:
        """An OpenAI body (chat or completions) checked and made into what RouterService.start runs."""
        svc = self.svc
        sampling = openai_sampling(req, chat, svc.sampling_defaults, self.cfg.router.max_n, svc.tokenizer)
        plan = tool_plan(req, svc.tool_parser) if chat else None
        echo = not chat and bool(req.echo)
        if chat:
            ids = chat_prompt_ids(svc.chat, req, template_kwargs(req, plan))
        else:
            ids = completion_prompt(req.prompt, svc)
        # the prompt's end (the template's generation prompt) says whether the output starts in a think block
        thinks = chat and svc.reasoning_parser != "none"
        start = start_of(svc.reasoning_parser, svc.tokenizer.decode(ids[-8:])) if thinks else NO_THINKING
        grammar = constraint(req, plan, start)
        if grammar is not None:
            sampling.params.grammar.CopyFrom(grammar[0])
        spec = JobSpec(ids, sampling, arrived, req.request_id, grammar[1] if grammar else "",
                       req.prompt_cache_key or req.session_id)
        return PreparedOpenAI(spec, plan, start, echo)

    async def generate(self, request: Request, body: bytes):
        t0, arrived = time.perf_counter(), time.monotonic()
        svc = self.svc
        self.auth.check_request(request)
        ask = self.generate_job(body, arrived)
        spec, prompt, start = ask.spec, ask.prompt, ask.start
        run = await svc.start(request, "/generate", t0, spec)
        progress = run.progress
        if spec.sampling.params.n > 1:  # router/http/choices.py
            lps = [Logprobs(svc.tokenizer, p) if ask.logprobs else None for p in run.choices]
            def choice_body(p, i: int) -> dict:
                lp_i = lps[i]
                return formats.generate_body(p, time.perf_counter() - t0, None if lp_i is None else
                                             lp_i.sglang(ask.text_in_logprobs, prompt, start))

            many = GenerateChoices(run, choice_body)
            if not ask.stream:
                return await _collect(run, many.final)
            return self.sse(many.events(), run)
        lp = Logprobs(svc.tokenizer, progress) if ask.logprobs else None

        def answer() -> dict:
            return formats.generate_body(progress, time.perf_counter() - t0,
                                         None if lp is None else lp.sglang(ask.text_in_logprobs, prompt, start))

        if not ask.stream:
            return await _collect(run, answer)

        async def events():
            # NOTE: each event made here, not by a helper: this runs per token, where each call is a cold
            # one in the bench's latency phase (docs/benchmarks.md, "The router runs cold")
            generate_body, sse, done = formats.generate_body, formats.sse, formats.DONE
            try:
                out = sse(answer())
                if progress.finish_reason:
                    yield out + done  # the last chunk ends the body
                    return
                yield out
                async for _ in run:
                    out = sse(generate_body(progress, time.perf_counter() - t0, None if lp is None else
                                            lp.sglang(ask.text_in_logprobs, prompt, start)))
                    if progress.finish_reason:
                        yield out + done
                        return
                    yield out
            except StreamFailed as e:
                yield formats.sse(stream_error_event(str(e))) + formats.DONE
                return
            yield formats.DONE

        return self.sse(events(), run)

    def generate_job(self, body: bytes, arrived: float) -> PreparedGenerate:
        """An SGLang /generate body checked and made into what RouterService.start runs: a plain body
        whose sampling was validated before from its memo (router/http/plain_generate.py), any other
        the full way (pydantic, then the sampling's checks), which teaches the memo."""
        plain, key = self.plain.read(body)
        if plain is not None:
            ids = plain.prompt if isinstance(plain.prompt, list) else self.svc.encode(plain.prompt)
            return PreparedGenerate(JobSpec(ids, plain.sampling, arrived, plain.rid,
                                            default_max_tokens=DEFAULT_GENERATE_MAX_TOKENS), plain.stream)
        return self._generate_job(parse(GenerateRequest, body), arrived, key)

    def _generate_job(self, req: GenerateRequest, arrived: float, key: SamplingKey | None) -> PreparedGenerate:
        """What RouterService.start runs of a parsed /generate body, with what its answer needs
        (logprobs: from which prompt position, the prompt ids when its logprobs are asked)."""
        svc = self.svc
        if (req.text is None) == (req.input_ids is None):
            raise APIError(400, "give exactly one of `text` or `input_ids`", param="text")
        body_sampling = sglang_sampling(req.sampling_params, svc.sampling_defaults, self.cfg.router.max_n)
        sampling = body_sampling.params
        start = -1 if req.logprob_start_len is None else req.logprob_start_len  # >= 0: prompt logprobs from there
        if req.return_logprob:  # (a body that asks them has no memo key: `sampling` is learnt unchanged below)
            check_top(req.top_logprobs_num, "top_logprobs_num")
            sampling.logprobs = req.top_logprobs_num
            if start >= 0:  # P computes the whole prompt for them (prefill_node/prefix.py)
                sampling.prompt_logprobs = req.top_logprobs_num
        grammar = grammar_of(req.sampling_params, "sampling_params.")
        if grammar is not None:
            sampling.grammar.CopyFrom(grammar[0])
        elif key is not None:
            self.plain.learn(key, req.sampling_params, body_sampling)
        ids = svc.encode(req.text) if req.text is not None else list(req.input_ids or ())  # one of them (above)
        if req.return_logprob and start >= max(len(ids), 1):
            raise APIError(400, f"logprob_start_len {start} is past the prompt's {len(ids)} tokens",
                           param="logprob_start_len")
        prompt = ids if req.return_logprob and start >= 0 else None
        spec = JobSpec(ids, body_sampling, arrived, req.rid, grammar[1] if grammar else "",
                       default_max_tokens=DEFAULT_GENERATE_MAX_TOKENS)
        return PreparedGenerate(spec, req.stream, req.return_logprob, req.return_text_in_logprobs, prompt, start)


async def drain(run: Run) -> None:
    """Run a worker stream to its end (its chunks fold into its progress); a failure is a 502."""
    try:
        async for _ in run:
            pass
    except StreamFailed as e:
        raise upstream_error(str(e)) from None
    finally:
        await run.aclose()


async def _collect(run, final) -> Response:
    await drain(run)
    return formats.json_response(final())


# the chat template's own variables: chat_template_kwargs may not replace them
_TEMPLATE_RESERVED = ("messages", "add_generation_prompt", "bos_token", "eos_token", "tools")


def template_kwargs(req, plan) -> dict:
    if not req.chat_template_kwargs and plan is None:  # a plain chat: no extra variables
        return {}
    kwargs = dict(req.chat_template_kwargs or {})
    taken = [k for k in kwargs if k in _TEMPLATE_RESERVED]
    if taken:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(taken)} (the request's own fields do)",
                       param="chat_template_kwargs")
    if plan is not None:
        kwargs["tools"] = plan.template_tools
    return kwargs


def constraint(req, plan, start: str = NO_THINKING):
    """(Grammar, the field it came from) of a request: a structured output, tool calls (forced, or
    strict tools), or response_format's answer or calls ("auto"); after the thinking of a reasoning
    model (`start`: router/http/reasoning.py start_of). A forced call with response_format: the call
    (the format shapes text answers). Another structured output (regex, grammar, ...) with "auto"
    tools constrains the whole output, as on vLLM; with a forced call or strict tools it is a 400."""
    grammar = grammar_of(req)
    if plan is not None and grammar is not None:
        if plan.mode == "auto" and grammar[1].startswith("response_format"):
            grammar = answer_or_calls(grammar[0], plan.parser, list(plan.call_tags), plan.one_call), grammar[1]
        elif plan.forced and grammar[1].startswith("response_format"):
            # NOTE: a forced call's turn is calls only: response_format shapes a text answer, and this
            # turn has none (OpenAI, and vLLM's tool schema taking over); the Agents SDK sends both
            # with output_type and tool_choice "required"
            grammar = plan.grammar, "tool_choice"
        elif plan.grammar is not None:
            what = f"tool_choice {plan.mode!r}" if plan.forced else "tools with strict: true"
            raise APIError(400, f"{what} and {grammar[1]} both constrain the output; give one", param=grammar[1])
    elif plan is not None and plan.grammar is not None:
        grammar = plan.grammar, "tool_choice" if plan.forced else "tools"
    if grammar is None:
        return None
    return after_thinking(grammar[0], start), grammar[1]


def echo_text(prompt, ids: list[int], svc: RouterService) -> str:
    """The prompt as completions' echo gives it back: the text as sent, token ids decoded."""
    if isinstance(prompt, str):
        return prompt
    if prompt and isinstance(prompt[0], str):
        return prompt[0]
    return svc.tokenizer.decode(ids)


def completion_prompt(prompt, svc: RouterService) -> list[int]:
    if isinstance(prompt, str):
        return svc.encode(prompt)
    if not prompt:
        raise APIError(400, "prompt is empty", param="prompt")
    if isinstance(prompt[0], int):
        return list(prompt)
    if len(prompt) != 1:
        raise APIError(400, f"batched prompts are not supported (got {len(prompt)}); send one prompt per request",
                       param="prompt")
    one = prompt[0]
    return svc.encode(one) if isinstance(one, str) else list(one)
