"""One request validation for both workers: what a prompt must be before any page is touched.

D (Generate) and P (Prefill) check the same things of the prompt; they differ only in how many
tokens fit: D must leave room for at least one generated token, P only needs the prompt itself.
Role-specific fields (D's prefill_address, P's destination pages and fingerprint) are checked by
`require` and the worker's own few lines.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdorch.worker.errors import InvalidRequest


def check_prompt(request_id: str, token_ids: Sequence[int], vocab_size: int, max_prompt_tokens: int,
                 limit: str) -> None:
    """Raise InvalidRequest naming the request and the first problem; `limit` says where
    `max_prompt_tokens` comes from (for the message)."""
    if not request_id:
        raise InvalidRequest("request_id is empty")
    require(request_id, token_ids, "token_ids")
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequest(f"request {request_id}: token id {bad} outside [0, {vocab_size})")
    if len(token_ids) > max_prompt_tokens:
        raise InvalidRequest(f"request {request_id}: {len(token_ids)} prompt tokens > {max_prompt_tokens} ({limit})")


def require(request_id: str, value, name: str) -> None:
    """A field the request cannot do without."""
    if not value:
        raise InvalidRequest(f"request {request_id}: {name} is empty")
