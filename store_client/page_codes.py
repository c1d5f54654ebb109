"""How a page's result comes from its store objects' codes (a page is `objects.groups` objects,
page_objects.py), and how KVStore cuts key lists into the batches Mooncake accepts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from store_client.results import _EXISTS, _LEASED, _NOT_FOUND


def _chunks(values: Sequence, n: int) -> list:
    return [values[i:i + n] for i in range(0, len(values), n)]


def _first_not(good: int, whole: int | None = None) -> Callable[[Sequence[int]], int]:
    """A page's code from its objects': the first that is not `good`, else `whole` (default good)."""
    return lambda codes: next((c for c in codes if c != good), good if whole is None else whole)


def _page_save(codes: Sequence[int]) -> int:
    """A page's save from its objects': an error if any failed, else 0 if any was written, else 1."""
    bad = [c for c in codes if c not in (0, 1, _EXISTS)]
    return bad[0] if bad else 0 if 0 in codes else 1


def _page_remove(codes: Sequence[int]) -> int:
    """A page's removal from its objects': a failure, else leased, else removed, else absent."""
    for c in codes:
        if c not in (0, _NOT_FOUND, _LEASED):
            return c
    return _LEASED if _LEASED in codes else 0 if 0 in codes else _NOT_FOUND


def _leading(codes: Sequence[int], ok) -> int:
    n = 0
    for c in codes:
        if not ok(c):
            break
        n += 1
    return n


def _distinct_key_batches(keys: Sequence[str]) -> list[list[int]]:
    """Indexes of `keys` split so that no batch names a key twice (usually one batch).

    NOTE: Mooncake's batch_get_into given one key twice reports success for both entries but writes
    only the last one's buffer (seen on mooncake-transfer-engine 0.3.13 over TCP): two requests
    reading the same page in one coalesced load would leave one of them with stale bytes.
    """
    seen: dict[str, int] = {}
    batches: list[list[int]] = []
    for i, key in enumerate(keys):
        n = seen.get(key, 0)
        seen[key] = n + 1
        if n == len(batches):
            batches.append([])
        batches[n].append(i)
    return batches
