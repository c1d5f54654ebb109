"""What the HTTP handlers share: the model's tokenizer, chat templates and parsers, the limits, and
the one call that runs a request (`RouterService.start`).

The handlers (router/http/generation.py for the generation routes, which the router's HTTP protocol
answers itself: router/http/hot_path.py; router/http/admin.py for the others) parse bodies and format responses
(router/http/formats.py); between them a handler makes one call, `start` (the job's checks against
the context and the decode pools, the 429 gate, the run to its first token), and iterates the `Run`
it returns, whose end gives everything back (the admission, D's share of the load, the metrics).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from typing import NamedTuple

from pdorch.config import ModelConfig, RouterConfig
from router.dispatch.dispatch import Dispatcher, Job
from router.dispatch.policies import Policy
from router.errors import bad_request, overloaded
from router.fleet.workers import WorkerPool
from router.http.body_sampling import DEFAULTABLE, BodySampling
from router.http.chat_prompt import chat_prompts, chat_status
from router.http.formats import Progress
from router.http.reasoning import FAMILY_PARSER as REASONING_FORMATS
from router.http.served_model import ServedModel
from router.http.tool_parsers import FAMILY_PARSER as TOOL_FORMATS
from router.metrics import RouterMetrics

DEFAULT_GENERATE_MAX_TOKENS = 128  # SGLang's default max_new_tokens
# The body field that holds the prompt, per route (named by prompt errors).
_PROMPT_PARAM = {"/v1/chat/completions": "messages", "/v1/completions": "prompt", "/generate": "input_ids"}
_TOKEN_ID_MAX = 2**31 - 1  # worker.proto's int32 token ids


def parser_of(setting: str, model_dir: Path | None, by_family: dict[str, str], template: str | None = None) -> str:
    """model.tool_call_parser / model.reasoning_parser, with auto resolved from the built-in tool template
    in use (`template`: the format its calls are written in, engine/tool_templates.py), else from the
    model's family (config.json); "none" when the family has no known format or the directory does not say."""
    if setting != "auto":
        return setting
    if template is not None:
        return template
    if model_dir is None:
        return "none"
    from engine.families import FAMILIES

    try:
        arch = (json.loads((model_dir / "config.json").read_text()).get("architectures") or [""])[0]
    except (OSError, ValueError):
        return "none"
    family = FAMILIES.get(arch)
    return by_family.get(family.name, "none") if family is not None else "none"


def sampling_defaults(setting: str, model_dir: Path | None) -> dict:
    """model.generation_config auto: the sampling defaults of the model's generation_config.json
    (temperature, top_p, top_k, min_p, repetition_penalty) for requests that leave them unset."""
    if setting != "auto" or model_dir is None:
        return {}
    try:
        gen = json.loads((model_dir / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for key in DEFAULTABLE:
        value = gen.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[key] = int(value) if key == "top_k" else float(value)
    return out  # NOTE: do_sample is not read, as vLLM does not


def context_from_model_dir(model_dir: Path | None) -> int:
    if model_dir is None:
        return 0
    try:
        return int(json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings") or 0)
    except (OSError, ValueError):
        return 0


class RouterService:
    def __init__(self, model: ModelConfig, router: RouterConfig, failover: bool, tokenizer, pool: WorkerPool,
                 policy: Policy, metrics: RouterMetrics, model_dir: Path | None = None):
        """`model`, `router`: the config sections it reads; `failover`: mid-stream failover is on
        (failover_enabled, from router, store and decode keys)."""
        self.model_cfg, self.router_cfg = model, router
        self.tokenizer = tokenizer
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.model_dir = model_dir
        self.dispatcher = Dispatcher(pool, policy, metrics, failover=failover, tokenizer=tokenizer,
                                     page_size=model.page_size)
        self.model_name = model.served_name
        self.served = ServedModel.of(model.served_name, model.source, model_dir)  # the `model` a body may name
        self._dir_context = context_from_model_dir(model_dir)
        self.chat = chat_prompts(tokenizer, model)
        self.tool_parser = parser_of(model.tool_call_parser, model_dir, TOOL_FORMATS, self.chat.setup.call_format)
        self.chat_status = chat_status(self.chat, self.tool_parser)
        self.reasoning_parser = parser_of(model.reasoning_parser, model_dir, REASONING_FORMATS)
        self.sampling_defaults = sampling_defaults(model.generation_config, model_dir)
        self._vocab_size = getattr(tokenizer, "vocab_size", 0)
        self.in_flight = 0
        # NOTE: request ids are a random per-process prefix + a counter: unique across routers
        # sharing workers, without uuid4's urandom syscall per request.
        self._id_prefix = os.urandom(8).hex()
        self._id_counter = itertools.count()

    def _new_request_id(self) -> str:
        return f"{self._id_prefix}{next(self._id_counter):016x}"

    def context_limit(self) -> int:
        """Longest prompt + output: config, else the workers' own limit, else the model's."""
        if self.model_cfg.max_context_tokens:
            return self.model_cfg.max_context_tokens
        return self.pool.context_tokens() or self._dir_context

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    # ------------------------------------------------------------------ running
    async def start(self, request, route: str, t0: float, spec: JobSpec) -> Run:
        """Run a request to its first token: its job made and checked (400s naming the field), the
        admission gate (429 past router.max_queued_requests; a 503 without a healthy P and D comes
        from the dispatcher's first routing), the stream opened on a P/D pair. `request`: the HTTP
        request (its headers, its spans); `route`: the path, for the metrics and the prompt's field.
        Cancelling the caller (client disconnect) cancels the worker call."""
        job = self._job(request, route, spec)
        if self.in_flight >= self.router_cfg.max_queued_requests:
            raise overloaded(f"the router has {self.in_flight} requests in flight "
                             f"(router.max_queued_requests={self.router_cfg.max_queued_requests}); retry later")
        self.in_flight += 1
        run = Run(self, job, route, t0)
        try:
            await run.open()
        except BaseException:
            await run.aclose()
            raise
        return run

    def _job(self, request, route: str, spec: JobSpec) -> Job:
        """The dispatch job of a validated prompt. `spec.arrived` (time.monotonic() when the request came
        in) starts its one deadline, so tokenizing counts too; None = from now."""
        token_ids, sampling = spec.ids, spec.sampling.params
        max_tokens, max_tokens_param = spec.sampling.max_tokens, spec.sampling.max_tokens_param
        prompt_param = _PROMPT_PARAM.get(route, "prompt")
        n = len(token_ids)
        if n == 0:
            raise bad_request("the prompt is empty", param=prompt_param)
        vocab = self._vocab_size or _TOKEN_ID_MAX + 1
        low, high = min(token_ids), max(token_ids)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise bad_request(f"token ids must be in [0, {vocab}) (the model's vocabulary), got {bad}",
                              param=prompt_param)
        if sampling.logit_bias:  # NOTE: the proto's empty map and list cost a pass each: only bodies that set them
            biased = [t for t in sampling.logit_bias if t >= vocab]
            if biased:
                param = "sampling_params.logit_bias" if prompt_param == "input_ids" else "logit_bias"
                raise bad_request(f"logit_bias: token id {biased[0]} is not in the model's vocabulary [0, {vocab})",
                                  param=param)
        if sampling.allowed_token_ids:
            outside = [t for t in sampling.allowed_token_ids if t >= vocab]
            if outside:
                raise bad_request(f"allowed_token_ids: token id {outside[0]} is not in the model's vocabulary "
                                  f"[0, {vocab})", param="allowed_token_ids")
        limit = self.context_limit()
        if limit and n >= limit:
            raise bad_request(f"the prompt has {n} tokens but the model's context is {limit} tokens "
                              "(prompt + output must fit)", param=prompt_param)
        # NOTE: a request no decode worker's KV pool could hold whole is refused here, not admitted to
        # wait or be preempted forever (decode_node/preemption.py); the largest pool decides, and one
        # only the larger pools hold is routed to those (Job.kv_tokens, WorkerPool.decode_fits)
        pool = self.pool.decode_pool_tokens()
        if pool and n >= pool:
            raise bad_request(f"the prompt has {n} tokens but the largest decode worker's KV pool holds {pool} tokens "
                              "(decode.num_pages x model.page_size; prompt + output must fit)",
                              param=prompt_param)
        if max_tokens is None:
            default = spec.default_max_tokens
            max_tokens = default if default is not None else (limit - n if limit else 16)
            if limit:
                max_tokens = min(max_tokens, limit - n)
            if pool:
                max_tokens = min(max_tokens, pool - n)
        elif limit and n + max_tokens > limit:
            raise bad_request(f"{max_tokens_param}={max_tokens} plus the prompt's {n} tokens exceeds the "
                              f"model's context of {limit} tokens", param=max_tokens_param)
        elif pool and n + max_tokens > pool:
            raise bad_request(f"{max_tokens_param}={max_tokens} plus the prompt's {n} tokens exceeds the largest "
                              f"decode worker's KV pool of {pool} tokens (decode.num_pages x model.page_size): the "
                              "request could never be held whole", param=max_tokens_param)
        sampling.max_tokens = max_tokens
        kv_tokens = n + max_tokens
        if sampling.n > 1 and pool:  # n sequences share the prompt's pages, each grows its own
            need = kv_tokens = n + sampling.n * (max_tokens + self.model_cfg.page_size)
            if need > pool:
                raise bad_request(f"n={sampling.n} sequences of up to {max_tokens} tokens each after the prompt's "
                                  f"{n} tokens need about {need} tokens of KV, more than the largest decode worker's pool of "
                                  f"{pool} (decode.num_pages x model.page_size)", param=_n_param(prompt_param))
        hashes = self.policy.prompt_hashes(token_ids, self.model_cfg.page_size)
        header = self.router_cfg.session_affinity_header
        session = (request.headers.get(header) if header else None) or spec.session
        timeout_s = self.router_cfg.request_timeout_s
        trace = getattr(request, "trace", None)  # the hot path's RequestTrace; None with tracing off
        arrived = spec.arrived if spec.arrived is not None else time.monotonic()
        job = Job(spec.request_id or self._new_request_id(), token_ids, sampling, hashes, timeout_s,
                  arrived + timeout_s, session, spec.grammar_param, kv_tokens if pool else 0, trace)
        if trace is not None:
            trace.request(job.request_id, n)
        return job


class JobSpec(NamedTuple):  # NOTE: made per request: immutable as a frozen dataclass, 3x cheaper to make
    """What a handler asks `RouterService.start` to run: the prompt and its sampling, as the body gave them."""

    ids: list[int]  # the prompt's token ids
    sampling: BodySampling
    arrived: float | None = None  # time.monotonic() when the request came in (its deadline starts there)
    request_id: str | None = None  # the client's (vLLM's request_id, SGLang's rid); None: one is made
    grammar_param: str = ""  # the field the sampling's grammar came from (a worker's refusal names it)
    session: str | None = None  # the routing session (prompt_cache_key, ...); a configured header wins
    default_max_tokens: int | None = None  # when the body gives none (None: what the context leaves)


def _paused_only(batch: list) -> bool:
    """D's chunks say only that the request was preempted (decode_node/preemption.py): no text."""
    if batch and not batch[0].paused:  # NOTE: every chunk asks: the common answer from one field
        return False
    return all(m.paused and not m.token_ids and not m.finish_reason for m in batch)


def _n_param(prompt_param: str) -> str:
    return "sampling_params.n" if prompt_param == "input_ids" else "n"


class Run:
    """One admitted request's stream of text deltas, with timing metrics and cleanup (`RouterService.start`).

    `first`: the first batch's text delta; iterating gives the rest, one per batch of D's chunks
    (`progress`, the first sequence's Progress, updates as it goes). The batch that ends the request
    ends the run: the dispatcher's stream has given D back, and the run gives back its place in the
    admission gate and records the request's metrics, before that batch's text is returned. `aclose()`
    (idempotent) does the same for a run stopped early (a client gone, a failure).
    n > 1: `choices` holds one Progress per sequence (`progress` is the first's); each batch's
    deltas per sequence are in `deltas`, [(index, text)] (the text returned joins them)."""

    def __init__(self, svc: RouterService, job: Job, route: str, t0: float):
        self.svc = svc
        self.route = route
        self.t0 = t0
        self.trace = job.trace
        self.choices = [Progress(job.request_id, len(job.token_ids)) for _ in range(max(job.sampling.n, 1))]
        self.progress = self.choices[0]
        self._one = len(self.choices) == 1
        self.first = ""
        self.deltas: list[tuple[int, str]] = []
        self._agen = svc.dispatcher.stream(job)
        self._closed = False
        self._last = t0
        self.on_pause = None  # the stream's keep-alive, told when D pauses the request (router/http/keepalive.py)

    async def open(self) -> None:
        """Wait for the first batch (`first`)."""
        batch = await self._agen.__anext__()
        now = time.perf_counter()
        m = self.svc.metrics
        m.ttft.labels(self.route).observe(now - self.t0)
        self._last = now
        self.first = self._fold(batch)
        p = self.progress
        m.prompt_tokens.inc(p.prompt_tokens)
        for tier, child in m.cached_tokens_by_tier:
            if cached := getattr(p, tier):  # most requests read from one tier or none
                child.inc(cached)
        if self._ended():
            await self._end()

    # NOTE: an async iterator class, not an async generator: a consumer that stops early (the
    # handlers stop at finish_reason) would leave a generator for the GC, whose finalizer makes
    # the loop schedule its aclose() through call_soon_threadsafe: a task and an eventfd wake-up
    # per request.
    def __aiter__(self) -> Run:
        return self

    async def __anext__(self) -> str:
        if self._closed:
            raise StopAsyncIteration
        try:
            batch = await self._agen.__anext__()
            while batch[0].paused and _paused_only(batch):  # D preempted the request: counted, the client kept, no event
                self._fold(batch)
                if self.on_pause is not None:
                    self.on_pause()
                batch = await self._agen.__anext__()
        except StopAsyncIteration:  # D ended the stream without a finish reason: a clean end all the same
            await self.aclose()
            raise
        now = time.perf_counter()
        self.svc.metrics.itl.observe(now - self._last)  # NOTE: per chunk; tokens that arrive together share one
        self._last = now
        # NOTE: one sequence folded here, not through _fold and _ended: this runs per token, and in the
        # latency phase of bench/router_overhead each call on it is a cold one, microseconds each
        # (docs/benchmarks.md, "The router runs cold")
        if self._one:
            progress = self.progress
            text = progress.add(batch[0]) if len(batch) == 1 else "".join([progress.add(m) for m in batch])
            if progress.finish_reason:
                await self._end()
            return text
        text = self._fold(batch)
        if self._ended():
            await self._end()
        return text

    def _fold(self, batch: list) -> str:
        """Fold D's chunks into the Progress; returns their text delta."""
        if len(self.choices) > 1:
            self.deltas = [(msg.index, self.choices[msg.index].add(msg)) for msg in batch]
            return "".join(text for _, text in self.deltas)
        if len(batch) == 1:
            return self.progress.add(batch[0])
        return "".join([self.progress.add(msg) for msg in batch])

    def _ended(self) -> bool:
        """Every sequence has its finish reason: D's last chunk is in."""
        if len(self.choices) == 1:
            return bool(self.progress.finish_reason)
        return all(p.finish_reason for p in self.choices)

    async def _end(self) -> None:
        """The request is complete: the dispatcher's stream ends (it closed D's attempt with the last
        chunk) and everything is given back."""
        try:
            await self._agen.__anext__()
        except StopAsyncIteration:
            pass
        await self.aclose()  # NOTE: a stream that went on after the last chunk (none does) is closed here

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._agen.aclose()
        finally:
            m = self.svc.metrics
            choices = self.choices
            m.completion_tokens.inc(len(self.progress.output_ids) if len(choices) == 1
                                    else sum(len(p.output_ids) for p in choices))
            if self.progress.preemptions:
                m.preemptions.inc(self.progress.preemptions)
            m.e2e.labels(self.route).observe(time.perf_counter() - self.t0)
            self.svc.in_flight -= 1
            if self.trace is not None:
                self.trace.finished(self.choices)
