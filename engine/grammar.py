"""Structured outputs: a request's grammar as a mask on its logits row, with xgrammar.

    Grammars (one per worker, made on the first request that has a grammar: xgrammar's import and
    the vocabulary cost ~2 s that a worker serving no grammar never pays)
        the tokenizer's vocabulary as xgrammar reads it, a compiler whose cache is keyed by the
        grammar, ONE compile thread (owned: close() stops it)
        start(spec, generated, timeout_s) -> OutputGrammar
            called on the worker's RPC thread, never the scheduler's: it waits there for the
            compile (a running batch never waits on one), then advances the new matcher by the
            tokens already generated (a stream resumed by failover: the prompt's last ones)
    OutputGrammar (one per request, lives on the request: it survives a preemption)
        accept(token)  after each sampled token (P's first token: D accepts it too)
    mask_rows(logits, grammars)
        one bitmask for the constrained rows, filled on the host, applied in place on the logits'
        device; unconstrained rows are untouched (the sampler calls it)

Why xgrammar: vLLM and SGLang default to it; its per-grammar cache of precomputed token masks
makes the per-step fill cost microseconds for JSON schemas; the wheel needs nothing but torch.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from engine.sampling_params import GrammarSpec

log = logging.getLogger(__name__)

# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "; the client gets what follows.
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


class GrammarError(ValueError):
    """The grammar does not compile (an invalid schema, regex or EBNF): the client's mistake."""


class OutputGrammar:
    """One request's matcher. NOTE: used by one thread at a time (the RPC thread before the
    request reaches the scheduler, then the scheduler's)."""

    def __init__(self, matcher, kind: str):
        self._m, self.kind = matcher, kind
        self.rejected = 0  # sampled tokens the grammar refused (a bug if ever > 0: the mask forbids them)

    @property
    def terminated(self) -> bool:
        return self._m.is_terminated()

    def accept(self, token: int) -> None:
        if self._m.is_terminated():
            return  # past its end (ignore_eos): nothing left to constrain
        if not self._m.accept_token(int(token)):
            self.rejected += 1
            log.error("grammar (%s) refused token %d that was sampled under its mask", self.kind, token)

    def fork(self) -> OutputGrammar:
        """A matcher in this one's state that goes on alone (another output sequence of the prompt)."""
        return OutputGrammar(self._m.fork(), self.kind)

    def fill(self, bitmask, row: int) -> bool:
        """This row's allowed tokens into bitmask[row]; False when the grammar has ended (no mask)."""
        if self._m.is_terminated():
            return False
        self._m.fill_next_token_bitmask(bitmask, row)
        return True


def mask_rows(logits, grammars: Sequence[OutputGrammar | None]) -> None:
    """Disallowed tokens of every constrained row to -inf, in place, batched."""
    rows = [i for i, g in enumerate(grammars) if g is not None]
    if not rows:
        return
    import xgrammar as xgr

    vocab = logits.shape[-1]
    bitmask = xgr.allocate_token_bitmask(logits.shape[0], vocab)  # row i masks logits row i
    filled = [i for i in rows if grammars[i].fill(bitmask, i)]
    if filled:
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), vocab_size=vocab,
                                        indices=filled)


class Grammars:
    """A worker's grammar compiler (see the module docstring)."""

    def __init__(self, model_dir, vocab_size: int):
        """`model_dir`: a prepared model directory (its tokenizer); `vocab_size`: the width of the
        model's logits (may exceed the tokenizer's: the extra ids are never allowed)."""
        self._model_dir, self._vocab_size = model_dir, vocab_size
        self._compiler = None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def _ready(self):
        with self._lock:
            if self._closed:
                raise RuntimeError("grammar compiler closed")
            if self._compiler is None:
                import xgrammar as xgr

                from engine.tokenizer import Tokenizer

                tk = Tokenizer.from_dir(self._model_dir)
                info = xgr.TokenizerInfo.from_vocab_and_metadata(
                    _encoded_vocab(tk, self._vocab_size), _metadata(xgr, tk, self._vocab_size))
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
            return self._compiler, self._pool

    def start(self, spec: GrammarSpec, generated: Sequence[int], timeout_s: float) -> OutputGrammar:
        """A matcher for `spec`, advanced by the tokens already `generated`. Raises GrammarError (the
        grammar is invalid, or the tokens do not follow it) or TimeoutError (the compile took longer
        than timeout_s)."""
        import xgrammar as xgr

        compiler, pool = self._ready()
        future = pool.submit(_compile, compiler, spec)
        try:
            compiled = future.result(timeout=max(timeout_s, 0.0))
        except FutureTimeout:
            raise TimeoutError(f"the {spec.kind} grammar did not compile within {timeout_s:.1f} s") from None
        out = OutputGrammar(xgr.GrammarMatcher(compiled), spec.kind)
        for t in generated:
            out.accept(t)
        if out.rejected:
            raise GrammarError(f"{spec.kind}: the {len(generated)} tokens already generated do not follow it")
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _compile(compiler, spec: GrammarSpec):
    try:
        # NOTE: JSON in one layout (separators ", " and ": ", no free whitespace): with free
        # whitespace a model can emit blanks without end inside a valid JSON (vLLM's
        # disable_any_whitespace); random logits did so in every unit test run
        if spec.kind == "json_object":
            return compiler.compile_json_schema('{"type": "object"}', strict_mode=False, any_whitespace=False)
        if spec.kind == "json_schema":
            try:
                schema = json.loads(spec.spec)
            except ValueError as e:
                raise GrammarError(f"json_schema is not valid JSON: {e}") from None
            if not isinstance(schema, dict):
                raise GrammarError(f"json_schema must be a JSON object, got {type(schema).__name__}")
            return compiler.compile_json_schema(spec.spec, strict_mode=True, any_whitespace=False)
        if spec.kind == "structural_tag":  # tool calls in the model's format, thinking first (router/http/tool_grammar.py)
            return compiler.compile_structural_tag(spec.spec)
        if spec.kind == "regex":
            return compiler.compile_regex(spec.spec)
        return compiler.compile_grammar(spec.spec)
    except GrammarError:
        raise
    except (RuntimeError, ValueError, TypeError) as e:  # what xgrammar raises on a bad grammar
        raise GrammarError(f"invalid {spec.kind}: {_CPP_PREFIX.sub('', str(e)).strip()}") from None


def _encoded_vocab(tk, vocab_size: int) -> list[str]:
    vocab = [""] * vocab_size
    for token, i in tk.vocab().items():
        if i < vocab_size:
            vocab[i] = token
    return vocab


def _metadata(xgr, tk, vocab_size: int) -> str:
    """xgrammar's own detection of the vocabulary's encoding (byte-level, byte-fallback, raw) from
    the tokenizer.json it would read through transformers; the stop tokens are the model's EOS."""
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(tk.to_json())
    return json.dumps({"vocab_type": int(meta["vocab_type"].value), "vocab_size": vocab_size,
                       "add_prefix_space": bool(meta["add_prefix_space"]),
                       "stop_token_ids": list(tk.eos_token_ids)})
