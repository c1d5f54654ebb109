"""Incremental detokenization + stop conditions for one request. Torch-free.

Text is produced by decoding a small window of tokens and taking the difference, so a token
that ends inside a multi-byte UTF-8 character yields nothing until the character completes
(the decoder shows such a tail as U+FFFD). Text that might be the start of a stop string is
held back until it is clearly not one, so a client never sees part of a stop string.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.sampling_params import SamplingParams

_WINDOW = 6  # tokens of left context re-decoded with each step (byte-level BPE merges are local)


@dataclass
class StepOutput:
    text: str                  # new text to emit (may be "")
    finish_reason: str | None  # None, "stop" or "length"


class StopChecker:
    def __init__(self, tokenizer, params: SamplingParams, eos_token_ids=()):
        self.tok = tokenizer
        self.params = params
        self.eos = set() if params.ignore_eos else set(eos_token_ids)
        self.stop_ids = set(params.stop_token_ids)
        self.ids: list[int] = []
        self.text = ""           # all decoded text so far (before stop trimming)
        self._emitted = 0        # chars of self.text already returned
        self._read = 0           # tokens already turned into text
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        self.finish_reason: str | None = None
        self.matched_stop: str | int | None = None

    def append(self, token_id: int) -> StepOutput:
        """Account one generated token; returns the text it releases and whether to finish."""
        if self.finish_reason is not None:
            raise RuntimeError("append() after the request finished")
        self.ids.append(token_id)
        early = len(self.ids) < self.params.min_tokens  # nothing stops the request before min_tokens (vLLM)
        if not early and (token_id in self.stop_ids or token_id in self.eos):
            # NOTE: stop tokens and eos count as output tokens but add no text.
            self.matched_stop = token_id
            return self._finish("stop", len(self.text))
        self._decode_new()
        if self.params.stop and not early:
            start = max(0, self._emitted - self._hold)
            hits = [(i, s) for s in self.params.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                cut, self.matched_stop = min(hits)
                return self._finish("stop", cut)
        if len(self.ids) >= self.params.max_tokens:
            return self._finish("length", len(self.text))
        safe = len(self.text) - self._hold if self.params.stop else len(self.text)
        return StepOutput(self._release(safe), None)

    def _decode_new(self) -> None:
        skip = self.params.skip_special_tokens
        prefix_at = max(0, self._read - _WINDOW)
        before = self.tok.decode(self.ids[prefix_at:self._read], skip_special_tokens=skip)
        after = self.tok.decode(self.ids[prefix_at:], skip_special_tokens=skip)
        if after.endswith("\ufffd"):
            return  # an incomplete UTF-8 character: wait for its remaining bytes
        if not after.startswith(before):
            # NOTE: the window boundary split a merge differently; re-decode the whole output.
            full = self.tok.decode(self.ids, skip_special_tokens=skip)
            self.text, self._read = full, len(self.ids)
            return
        self.text += after[len(before):]
        self._read = len(self.ids)

    def _release(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        out = self.text[self._emitted:upto]
        self._emitted = upto
        return out

    def _finish(self, reason: str, cut: int) -> StepOutput:
        self.finish_reason = reason
        if reason == "length" and self._read < len(self.ids):
            # flush a trailing partial character as U+FFFD rather than dropping it
            self.text += self.tok.decode(self.ids[self._read:], skip_special_tokens=self.params.skip_special_tokens)
            cut = len(self.text)
        self.text = self.text[:cut]
        return StepOutput(self._release(cut), reason)

    @property
    def output_text(self) -> str:
        return self.text if self.finish_reason else self.text[:self._emitted]
