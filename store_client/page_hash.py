"""Chained page hashes and store keys (docs/design.md section 3). Pure functions, no torch.

    page i covers token_ids[i*S : (i+1)*S]            (S = page_size; full pages only)
    h_0 = sha256(bytes.fromhex(parent) || le32(page 0))    parent = "" for a prompt's first page
    h_i = sha256(bytes.fromhex(h_{i-1}) || le32(page i))
    key_i = f"{fingerprint}/{h_i}"

The hash of page i therefore names the whole prefix up to its end: equal hashes mean equal
prefixes, so a lookup can stop at the first absent page. Hex strings travel everywhere (router,
proto, store keys); the chain feeds the raw 32 digest bytes, not the hex text.

NOTE: never Python's `hash()`: it is salted per process (PYTHONHASHSEED) and would give every
worker different keys.
"""

from __future__ import annotations

import hashlib
import operator
import sys
from array import array
from collections.abc import Sequence

# Bumped whenever the byte layout of a page (engine/kv_pool.py) changes (pool axes order, K/V
# interleaving, padding): it is part of every store key, so old pages are never read as the new layout.
# v1 = page-first [num_layers, 2 (K,V), num_kv_heads, page_size, head_dim], C-contiguous.
# v2 = page-first, head-major [num_kv_heads, num_layers, 2 (K,V), page_size, head_dim]: each KV head
#      one contiguous span of the page (a store object per head group, TP-independent).
KV_LAYOUT_VERSION = 2
# The name of this hashing scheme, as KV event subscribers give it (WatchKVRequest.hash_scheme).
HASH_SCHEME = "sha256-chain"

_KV_DTYPES = ("float32", "bfloat16", "float16")
_MAX_TOKEN_ID = 2**32 - 1
# NOTE: the pages' bytes from one C conversion of the whole prompt (an array of uint32, its machine
# order made little-endian), not a struct.pack(*page) per page: 1.2-1.4x faster (docs/benchmarks.md).
_U32 = next(code for code in ("I", "L") if array(code).itemsize == 4)
_BIG_ENDIAN = sys.byteorder == "big"


def _check_parent(parent_hash: str) -> bytes:
    if parent_hash == "":
        return b""
    try:
        raw = bytes.fromhex(parent_hash)
    except ValueError:
        raise ValueError(f"parent_hash must be a hex sha256 digest, got {parent_hash!r}") from None
    if len(raw) != 32:
        raise ValueError(f"parent_hash must be 64 hex chars (sha256), got {len(parent_hash)} chars")
    return raw


def _is_token_id(t) -> bool:
    try:
        return 0 <= operator.index(t) <= _MAX_TOKEN_ID
    except TypeError:
        return False


def page_hashes(token_ids: Sequence[int], page_size: int, parent_hash: str = "") -> list[str]:
    """Hex hashes of the full pages of `token_ids`; the trailing partial page is not hashed.

    `parent_hash` continues an existing chain: the hashes of `prompt + output` equal
    `page_hashes(prompt_full_pages) + page_hashes(rest, parent_hash=<last prompt page hash>)`
    as long as the split falls on a page boundary.
    """
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    prev = _check_parent(parent_hash)
    n_full = len(token_ids) // page_size
    if n_full == 0:
        return []
    try:
        words = array(_U32, token_ids[:n_full * page_size])
    except (OverflowError, TypeError):
        i, bad = next(((i, t) for i, t in enumerate(token_ids) if not _is_token_id(t)), (0, token_ids[0]))
        raise ValueError(f"token ids must be ints in [0, 2**32), got {bad!r} in page {i // page_size}") from None
    if _BIG_ENDIAN:
        words.byteswap()
    data, step, sha256 = words.tobytes(), 4 * page_size, hashlib.sha256
    out: list[str] = []
    for start in range(0, len(data), step):
        prev = sha256(prev + data[start:start + step]).digest()
        out.append(prev.hex())
    return out


def model_fingerprint(weights_digest: str, kv_dtype: str, page_size: int,
                      layout_version: int = KV_LAYOUT_VERSION) -> str:
    """A short stable id of everything that changes a page's bytes for the same tokens.

    Two workers share store pages only when all of these agree; anything else gets a different
    key prefix and can never read the other's bytes. No TP rank: a page is stored as one object per
    group of KV heads (page_objects.py), so workers of every TP size share the same keys.
    """
    if not weights_digest:
        raise ValueError("weights_digest must be a non-empty string")
    if kv_dtype not in _KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {_KV_DTYPES}, got {kv_dtype!r}")
    for name, value, low in (("page_size", page_size, 1), ("layout_version", layout_version, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    text = f"w={weights_digest};dtype={kv_dtype};page={page_size};layout={layout_version}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def store_key(fingerprint: str, page_hash: str) -> str:
    """The Mooncake object key of one page: `{fingerprint}/{page_hash}`."""
    if not fingerprint or "/" in fingerprint:
        raise ValueError(f"fingerprint must be non-empty and contain no '/', got {fingerprint!r}")
    if not page_hash:
        raise ValueError("page_hash must be non-empty")
    return f"{fingerprint}/{page_hash}"


def store_keys(fingerprint: str, hashes: Sequence[str]) -> list[str]:
    """`store_key` for each hash, in order."""
    return [store_key(fingerprint, h) for h in hashes]
