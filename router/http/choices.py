"""n > 1: one request's several output sequences, answered as OpenAI's `choices` and SGLang's list.

The decode worker streams every sequence on one Generate call, each chunk tagged with its `index`
(decode_node/forks.py: one prefill, one KV push, the prompt's pages shared). The router folds the
chunks into one Progress per sequence (router/http/service.py `Run.choices`); here they become
`choices[i]` (non-streamed), chunks whose choice carries `index: i` (streamed, each choice with its
own role delta, tool-call and reasoning parsers and logprobs) or, for /generate, a list of bodies
(streamed: bodies with an `index`). Usage counts the prompt once and every choice's tokens.
"""

from __future__ import annotations

import functools

from router.dispatch.dispatch import StreamFailed
from router.errors import stream_error_event
from router.http import formats


class Total:
    """The whole request's usage: the prompt once (its cached counts too), every choice's output."""

    def __init__(self, choices):
        self.choices = choices

    @property
    def finished(self) -> bool:
        return all(p.finish_reason for p in self.choices)

    def usage(self) -> dict:
        out = self.choices[0].usage()
        generated = sum(len(p.output_ids) for p in self.choices)
        out["completion_tokens"], out["total_tokens"] = generated, out["prompt_tokens"] + generated
        out["preemptions"] = sum(p.preemptions for p in self.choices)
        return out


async def stream(run, total: Total, out, tail):
    """The SSE events of every batch's chunks (`out(run.deltas)`) until every choice ended, `tail()`
    after the last; a stream failed after its first token ends with an error event."""
    try:
        data = out(run.deltas)
        while not total.finished:
            if data:
                yield data
            try:
                await run.__anext__()
            except StopAsyncIteration:
                yield tail()
                return
            data = out(run.deltas)
        yield data + tail()
    except StreamFailed as e:
        yield formats.sse(stream_error_event(str(e))) + formats.DONE


def merged(deltas: list[tuple[int, str]]) -> dict[int, str]:
    """One batch's text per choice, in the order the choices first appear (one chunk each)."""
    out: dict[int, str] = {}
    for i, text in deltas:
        out[i] = out.get(i, "") + text
    return out


class OpenAIChoices:
    """The n choices of a chat or completions request: `final()` for a JSON answer, `events(...)`
    for a stream. `shapes`: a ChatShape per choice (chat) or None each; `logprobs`: a
    router/http/logprobs.py Logprobs per choice, or None each when not asked for."""

    def __init__(self, run, chat: bool, shapes, logprobs, oid: str, created: int, model: str, echo: str = ""):
        """`echo`: completions' echoed prompt text, leading each choice's text."""
        self.run, self.chat, self.shapes, self.lps, self.echo = run, chat, shapes, logprobs, echo
        self.oid, self.created, self.model = oid, created, model
        self.total = Total(run.choices)

    def final(self) -> dict:
        items = []
        for i, (p, shape, lp) in enumerate(zip(self.run.choices, self.shapes, self.lps)):
            if self.chat:
                message, finish = shape.message(p.text, p.finish_reason)
                body = formats.chat_final(p, self.oid, self.created, self.model, message, finish,
                                          logprobs=lp and lp.chat(p.output_ids, p.logprobs))
            else:
                body = formats.completion_final(p, self.oid, self.created, self.model,
                                                lp and lp.completion(p.output_ids, p.logprobs, 0), self.echo)
            items.append({**body["choices"][0], "index": i})
        return {**body, "choices": items, "usage": self.total.usage()}

    def events(self, include_usage: bool, continuous: bool):
        chunks = [self._chunk_fn(i, continuous) for i in range(len(self.run.choices))]
        started = [False] * len(chunks)

        def out(deltas) -> bytes:
            parts = []
            for i, delta in merged(deltas).items():
                lead = "" if started[i] else self.echo
                parts.append(chunks[i](self.run.choices[i], self.oid, self.created, self.model, lead + delta,
                                       not started[i], include_usage, **self._logprobs(i, delta)))
                started[i] = True
            return b"".join(parts)

        def tail() -> bytes:
            usage = formats.usage_chunk(self.total, self.oid, self.created, self.model, self.chat)
            return (usage if include_usage else b"") + formats.DONE

        return stream(self.run, self.total, out, tail)

    def _chunk_fn(self, i: int, continuous: bool):
        shape = self.shapes[i]
        if shape is None or shape.plain:
            fn = formats.chat_chunk if self.chat else formats.completion_chunk
            return functools.partial(fn, continuous_usage=continuous, index=i)
        step = shape.stream()

        def chunk(p, oid, created, model, _text, _first, include_usage, logprobs=None) -> bytes:
            out = step(p, logprobs)
            return b"" if out is None else formats.chat_delta_chunk(p, oid, created, model, out[0], out[1],
                                                                    include_usage, continuous, out[2], index=i)
        return chunk

    def _logprobs(self, i: int, delta: str) -> dict:
        """The chunk's tokens' logprobs (a shaped chat's stream holds them while it holds their text)."""
        lp = self.lps[i]
        if lp is None:
            return {}
        p = self.run.choices[i]
        return {"logprobs": lp.take_chat() if self.chat else lp.take_completion(len(p.text) - len(delta))}


class GenerateChoices:
    """SGLang /generate with n > 1: a list of bodies, or a stream of bodies each with its `index`."""

    def __init__(self, run, body_of):
        self.run, self.body_of = run, body_of  # body_of(progress, i) -> dict
        self.total = Total(run.choices)

    def final(self) -> list[dict]:
        return [self.body_of(p, i) for i, p in enumerate(self.run.choices)]

    def events(self):
        def out(deltas) -> bytes:
            return b"".join(formats.sse({**self.body_of(self.run.choices[i], i), "index": i})
                            for i in merged(deltas))

        return stream(self.run, self.total, out, lambda: formats.DONE)
