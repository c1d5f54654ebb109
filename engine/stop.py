"""Incremental detokenization + stop conditions for one request. Torch-free.

Text is produced by decoding a small window of tokens and taking the difference, so a token
that ends inside a multi-byte UTF-8 character yields nothing until the character completes
(the decoder shows such a tail as U+FFFD). Text that might be the start of a stop string is
held back until it is clearly not one, so a client never sees part of a stop string; with
include_stop_str_in_output (vLLM) nothing is held back and the output ends after the stop string
(or with the stop token's text). The same checker runs on the decode worker and, for a stream
resumed by failover, in the router (router/dispatch/failover.py).
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
        # text that may be the start of a stop string is held back, unless the stop string stays in the output
        self._hold = 0 if params.include_stop_str_in_output else max((len(s) for s in params.stop), default=1) - 1
        self.finish_reason: str | None = None
        self.matched_stop: str | int | None = None
        # vLLM: with special tokens in the text and spaces_between_special_tokens=False, a special
        # token right after another is its own text, without a space a decoder may put before it
        self._raw_specials = None if params.skip_special_tokens or params.spaces_between_special_tokens \
            else tokenizer.added_token_texts()

    def append(self, token_id: int) -> StepOutput:
        """Account one generated token; returns the text it releases and whether to finish."""
        if self.finish_reason is not None:
            raise RuntimeError("append() after the request finished")
        self.ids.append(token_id)
        if token_id in self.stop_ids or token_id in self.eos:
            # NOTE: stop tokens and eos count as output tokens; their text is output only with
            # include_stop_str_in_output. Before min_tokens too: the sampler masks them until then
            # unless nothing else was left to sample (a grammar that may only end: engine/token_masks.py)
            self.matched_stop = token_id
            if self.params.include_stop_str_in_output:
                self._decode_new(flush=True)
            return self._finish("stop", len(self.text))
        before = len(self.text)
        self._decode_new()
        if self.params.stop and len(self.ids) >= self.params.min_tokens:  # no stop string before min_tokens (vLLM)
            hit = self._find_stop(before)
            if hit is not None:
                cut, self.matched_stop = hit
                return self._finish("stop", cut)
        if len(self.ids) >= self.params.max_tokens:
            return self._finish("length", len(self.text))
        return StepOutput(self._release(len(self.text) - self._hold), None)

    def _find_stop(self, before: int) -> tuple[int, str] | None:
        """(where the output ends, the stop string) for the first stop string that ends in the text
        after `before` (each searched from where it could start); None when none does."""
        hits = [(i, s) for s in self.params.stop if (i := self.text.find(s, max(0, before - len(s) + 1))) >= 0]
        if not hits:
            return None
        at, stop = min(hits)
        return (at + len(stop) if self.params.include_stop_str_in_output else at), stop

    def _decode_new(self, flush: bool = False) -> None:
        """The text of the tokens not read yet; `flush`: a trailing partial character too (as U+FFFD)."""
        skip = self.params.skip_special_tokens
        prefix_at = max(0, self._read - _WINDOW)
        before = self.tok.decode(self.ids[prefix_at:self._read], skip_special_tokens=skip)
        after = self.tok.decode(self.ids[prefix_at:], skip_special_tokens=skip)
        if after.endswith("\ufffd") and not flush:
            return  # an incomplete UTF-8 character: wait for its remaining bytes
        if not after.startswith(before):
            # NOTE: the window boundary split a merge differently; re-decode the whole output.
            full = self.tok.decode(self.ids, skip_special_tokens=skip)
            self.text, self._read = full, len(self.ids)
            return
        new = after[len(before):]
        if self._raw_specials is not None and len(self.ids) - self._read == 1 and len(self.ids) > 1:
            last, prev = self.ids[-1], self.ids[-2]
            if last in self._raw_specials and prev in self._raw_specials:
                new = self._raw_specials[last]
        self.text += new
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
            self._decode_new(flush=True)
            cut = len(self.text)
        self.text = self.text[:cut]
        return StepOutput(self._release(cut), reason)

    @property
    def output_text(self) -> str:
        return self.text if self.finish_reason else self.text[:self._emitted]
