"""The Response object of `/v1/responses` (the `openai` SDK's `Response`): what the request asked for,
echoed once (`base`), and what it came to (`finished`: status, output items, usage).

    status       "completed"; "incomplete" with incomplete_details {"reason": "max_output_tokens"} when
                 the output was cut by max_output_tokens or the context; "failed" with `error` when
                 the worker stream broke after the first token
    usage        input_tokens, input_tokens_details.cached_tokens (+ cached_tokens_details per tier, as
                 the chat usage has), output_tokens, output_tokens_details.reasoning_tokens (the
                 thinking text re-encoded), total_tokens
"""

from __future__ import annotations

import time

from router.http.formats import Progress
from router.http.responses_request import ResponsesRequest


def base(req: ResponsesRequest, response_id: str, created: int, model: str) -> dict:
    choice = req.tool_choice
    text = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else None
    return {
        "id": response_id, "object": "response", "created_at": created, "model": model, "status": "in_progress",
        "output": [], "error": None, "incomplete_details": None, "usage": None,
        "instructions": req.instructions, "metadata": req.metadata or {},
        "previous_response_id": req.previous_response_id, "store": req.store,
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
        "tool_choice": "auto" if choice is None else choice if isinstance(choice, str) else choice.model_dump(),
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_output_tokens,
        "text": {"format": text or {"type": "text"}}, "reasoning": {"effort": None, "summary": None},
        "truncation": "disabled", "user": req.user, "prompt_cache_key": req.prompt_cache_key,
        "safety_identifier": req.safety_identifier,
    }


def usage(p: Progress, reasoning_tokens: int) -> dict:
    # NOTE: cache_write_tokens is for OpenAI's explicit cache writes, which pdorch does not serve (every
    # full page is cached implicitly): 0. cached_tokens_details is ours, as in the chat usage.
    n = len(p.output_ids)
    return {"input_tokens": p.prompt_tokens,
            "input_tokens_details": {"cached_tokens": p.cached_tokens, "cache_write_tokens": 0,
                                     "cached_tokens_details": p.cached_by_tier()},
            "output_tokens": n, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": p.prompt_tokens + n}


def status_of(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def finished(head: dict, status: str, output: list[dict], use: dict | None, error: str = "") -> dict:
    out = {**head, "status": status, "output": output, "usage": use}
    if status == "incomplete":
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    elif status == "completed":
        out["completed_at"] = int(time.time())
    elif error:
        out["error"] = {"code": "server_error", "message": error}
    return out
