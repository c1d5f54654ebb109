"""Token logprobs in the three wire formats (OpenAI chat, OpenAI completions, SGLang /generate).

The workers send one TokenLogprob per generated token (worker.proto: the sampled token's
log-probability and the top alternatives, ids only); the router names the tokens with its
tokenizer, one decode per distinct id (cached: the vocabulary bounds it).
"""

from __future__ import annotations

import functools

from router.errors import bad_request

MAX_TOP_LOGPROBS = 20  # as OpenAI's top_logprobs and vLLM's default max_logprobs


def check_top(n: int | None, param: str) -> None:
    if n is not None and not 0 <= n <= MAX_TOP_LOGPROBS:
        raise bad_request(f"{param} must be in [0, {MAX_TOP_LOGPROBS}], got {n}", param=param)


def openai_logprobs(req, chat: bool) -> int | None:
    """The number of alternatives a chat / completions request asks for (None: no logprobs)."""
    if chat:
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs requires logprobs: true", param="top_logprobs")
        if not req.logprobs:
            return None
        check_top(req.top_logprobs, "top_logprobs")
        return req.top_logprobs or 0
    check_top(req.logprobs, "logprobs")
    return req.logprobs


class Logprobs:
    """One request's logprobs: formats the ones not sent yet (`take_*`) or all of them (`*_all`)."""

    def __init__(self, tokenizer, progress, echo: tuple[list[int], str] | None = None, top: int = MAX_TOP_LOGPROBS):
        """`echo`: (prompt ids, prompt text) of a completions request with echo: its tokens lead the
        first completion() (their logprobs from P, `progress.prompt_logprobs`; the first has none),
        with `top` alternatives each (P may have computed more, for prompt_logprobs)."""
        self._text = _token_text_fn(tokenizer)
        self.p = progress
        self.sent = 0
        self.echo = echo
        self.top = top

    def _new(self) -> tuple[list[int], list]:
        p, start = self.p, self.sent
        self.sent = len(p.logprobs)
        return p.output_ids[start:self.sent], p.logprobs[start:self.sent]

    def _entry(self, token_id: int, logprob: float) -> dict:
        text = self._text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}

    def chat(self, ids: list[int], lps: list) -> dict:
        return {"content": [{**self._entry(t, lp.logprob),
                             "top_logprobs": [self._entry(i, v) for i, v in zip(lp.top_ids, lp.top_logprobs)]}
                            for t, lp in zip(ids, lps)], "refusal": None}

    def completion(self, ids: list[int], lps: list, offset: int) -> dict:
        """`offset`: where the first of `ids` starts in the output text."""
        echo, self.echo = self.echo, None
        if echo is not None:  # once: the prompt's tokens first, the output after the echoed text
            prompt = self._completion(echo[0], [None, *self.p.prompt_logprobs], 0, self.top)
            output = self._completion(ids, lps, offset + len(echo[1]))
            return {key: prompt[key] + output[key] for key in output}
        return self._completion(ids, lps, offset)

    def _completion(self, ids: list[int], lps: list, offset: int, top: int = MAX_TOP_LOGPROBS) -> dict:
        texts = [self._text(t) for t in ids]
        offsets = []
        for text in texts:
            offsets.append(offset)
            offset += len(text)
        lps = list(lps) + [None] * (len(ids) - len(lps))  # NOTE: a prompt token without one: null, as vLLM
        return {"tokens": texts, "token_logprobs": [lp and lp.logprob for lp in lps],
                "top_logprobs": [lp and {self._text(i): v for i, v in zip(lp.top_ids[:top], lp.top_logprobs[:top])}
                                 for lp in lps],
                "text_offset": offsets}

    def take_chat(self) -> dict:
        return self.chat(*self._new())

    def take_completion(self, offset: int) -> dict:
        return self.completion(*self._new(), offset)

    def sglang(self, with_text: bool, prompt_ids: list[int] | None = None, start: int = 0) -> dict:
        """meta_info's output_token_logprobs / output_top_logprobs: [logprob, id, text or None]; with
        `prompt_ids` (logprob_start_len >= 0) input_* from prompt position `start` (position 0: null)."""
        name = self._text if with_text else (lambda _: None)
        p = self.p
        out = {"output_token_logprobs": [[lp.logprob, t, name(t)] for t, lp in zip(p.output_ids, p.logprobs)],
               "output_top_logprobs": [self._sglang_top(lp, name) for lp in p.logprobs],
               "input_token_logprobs": [], "input_top_logprobs": []}
        if prompt_ids is not None:
            lps = [None, *p.prompt_logprobs][start:]
            out["input_token_logprobs"] = [[lp and lp.logprob, t, name(t)] for t, lp in zip(prompt_ids[start:], lps)]
            out["input_top_logprobs"] = [lp and self._sglang_top(lp, name) for lp in lps]
        return out

    @staticmethod
    def _sglang_top(lp, name) -> list:
        return [[v, i, name(i)] for i, v in zip(lp.top_ids, lp.top_logprobs)]


def with_prompt_logprobs(body: dict, chat: bool, tokenizer, prompt_ids: list[int], lps: list, top: int) -> dict:
    """`body` with vLLM's prompt_logprobs: per prompt position, {token id: {logprob, rank, decoded_token}}
    of the prompt's token, then of the `top` most likely (ranks 1 .. top); position 0 null. A chat answer
    has them at the top level, each completion choice its own (vLLM's places)."""
    text = _token_text_fn(tokenizer)
    out: list[dict | None] = [None]
    for t, lp in zip(prompt_ids[1:], lps):
        entry = {str(t): {"logprob": lp.logprob, "rank": lp.rank if lp.HasField("rank") else None,
                          "decoded_token": text(t)}}
        for rank, (i, v) in enumerate(zip(lp.top_ids[:top], lp.top_logprobs[:top]), 1):
            entry[str(i)] = {"logprob": v, "rank": rank, "decoded_token": text(i)}
        out.append(entry)
    if chat:
        return {**body, "prompt_logprobs": out}
    return {**body, "choices": [{**c, "prompt_logprobs": out} for c in body["choices"]]}


@functools.lru_cache(maxsize=8)
def _token_text_fn(tokenizer):
    @functools.lru_cache(maxsize=1 << 18)
    def text(token_id: int) -> str:
        return tokenizer.decode([token_id])
    return text
