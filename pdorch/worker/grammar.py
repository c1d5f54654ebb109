"""A request's grammar matcher, made on the worker's RPC thread (P's and D's), with worker errors."""

from __future__ import annotations

from collections.abc import Sequence

from engine.grammar import GrammarError, OutputGrammar
from engine.sampling_params import SamplingParams
from pdorch.worker.errors import DeadlineExceeded, InvalidRequest


def request_grammar(rt, request_id: str, params: SamplingParams, token_ids: Sequence[int],
                    timeout_s: float) -> OutputGrammar | None:
    """None without a grammar; waits here (never on the scheduler) for the compile, within timeout_s."""
    if params.grammar is None:
        return None
    if rt.grammars is None:
        raise InvalidRequest(f"request {request_id}: this worker serves no structured outputs")
    k = params.resumed_tokens
    if k > len(token_ids):
        raise InvalidRequest(f"request {request_id}: resumed_tokens {k} exceeds the prompt's {len(token_ids)} tokens")
    try:
        return rt.grammars.start(params.grammar, list(token_ids)[len(token_ids) - k:], timeout_s)
    except GrammarError as e:
        raise InvalidRequest(f"request {request_id}: grammar: {e}") from None
    except TimeoutError as e:
        raise DeadlineExceeded(f"request {request_id}: {e}") from None
