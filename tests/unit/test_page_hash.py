"""Chained page hashes and store keys: exact values, chaining, process independence, bad input."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys

import pytest

from store_client.page_hash import KV_LAYOUT_VERSION, model_fingerprint, page_hashes, store_key, store_keys


def _expected(tokens, page_size, parent=b""):
    out, prev = [], parent
    for i in range(len(tokens) // page_size):
        page = tokens[i * page_size:(i + 1) * page_size]
        prev = hashlib.sha256(prev + struct.pack(f"<{page_size}I", *page)).digest()
        out.append(prev.hex())
    return out


def test_matches_sha256_chain_over_le32_tokens():
    tokens = list(range(40))
    hashes = page_hashes(tokens, 16)
    assert hashes == _expected(tokens, 16)
    assert len(hashes) == 2  # the partial third page (8 tokens) is never hashed
    # First page by hand: no parent, 16 little-endian uint32s.
    assert hashes[0] == hashlib.sha256(b"".join(t.to_bytes(4, "little") for t in range(16))).hexdigest()


def test_partial_pages_and_empty_input_hash_to_nothing():
    assert page_hashes([], 16) == []
    assert page_hashes(list(range(15)), 16) == []


def test_chain_continues_from_parent():
    tokens = list(range(100, 164))
    whole = page_hashes(tokens, 16)
    head = page_hashes(tokens[:32], 16)
    tail = page_hashes(tokens[32:], 16, parent_hash=head[-1])
    assert head + tail == whole


def test_same_page_different_prefix_differs():
    a = page_hashes([1] * 16 + [7] * 16, 16)
    b = page_hashes([2] * 16 + [7] * 16, 16)
    assert a[1] != b[1]


def test_large_token_ids_and_numpy_ints():
    np = pytest.importorskip("numpy")
    tokens = [2**32 - 1, 0] * 8
    assert page_hashes(np.array(tokens, dtype=np.int64), 16) == page_hashes(tokens, 16)


@pytest.mark.parametrize("bad", [[-1] + [0] * 15, [2**32] + [0] * 15, ["a"] + [0] * 15])
def test_bad_token_ids_are_named(bad):
    with pytest.raises(ValueError, match="token ids"):
        page_hashes(bad, 16)


@pytest.mark.parametrize("page_size", [0, -4, 1.5, True])
def test_bad_page_size(page_size):
    with pytest.raises(ValueError, match="page_size"):
        page_hashes(list(range(32)), page_size)


def test_bad_parent_hash():
    with pytest.raises(ValueError, match="parent_hash"):
        page_hashes(list(range(16)), 16, parent_hash="zz")
    with pytest.raises(ValueError, match="parent_hash"):
        page_hashes(list(range(16)), 16, parent_hash="ab")


def test_page_size_changes_keys():
    tokens = list(range(64))
    fp16 = model_fingerprint("w1", "float32", 16)
    fp32 = model_fingerprint("w1", "float32", 32)
    assert fp16 != fp32
    keys16 = set(store_keys(fp16, page_hashes(tokens, 16)))
    keys32 = set(store_keys(fp32, page_hashes(tokens, 32)))
    assert keys16.isdisjoint(keys32)


@pytest.mark.parametrize("change", [
    {"weights_digest": "w2"}, {"kv_dtype": "bfloat16"}, {"page_size": 32},
    {"layout_version": KV_LAYOUT_VERSION + 1},
])
def test_every_fingerprint_field_changes_the_key(change):
    base = {"weights_digest": "w1", "kv_dtype": "float32", "page_size": 16, "layout_version": KV_LAYOUT_VERSION}
    h = page_hashes(list(range(16)), 16)[0]
    assert store_key(model_fingerprint(**base), h) != store_key(model_fingerprint(**{**base, **change}), h)


def test_store_key_format():
    fp = model_fingerprint("digest", "float16", 16, 1)
    h = page_hashes(list(range(16)), 16)[0]
    assert store_key(fp, h) == f"{fp}/{h}"
    assert "/" not in fp and len(fp) == 16
    with pytest.raises(ValueError, match="fingerprint"):
        store_key("a/b", h)
    with pytest.raises(ValueError, match="page_hash"):
        store_key(fp, "")


@pytest.mark.parametrize("kwargs, name", [
    ({"weights_digest": "", "kv_dtype": "float32", "page_size": 16}, "weights_digest"),
    ({"weights_digest": "w", "kv_dtype": "int8", "page_size": 16}, "kv_dtype"),
    ({"weights_digest": "w", "kv_dtype": "float32", "page_size": 0}, "page_size"),
    ({"weights_digest": "w", "kv_dtype": "float32", "page_size": 16, "layout_version": -1}, "layout_version"),
])
def test_fingerprint_rejects_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        model_fingerprint(**kwargs)


_CHILD = """
import json
from store_client.page_hash import model_fingerprint, page_hashes, store_keys
fp = model_fingerprint("weights-abc", "float32", 16, 1)
print(json.dumps(store_keys(fp, page_hashes(list(range(1000, 1100)), 16))))
"""


def test_same_keys_in_two_processes_with_different_hash_seeds():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    results = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root}
        out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                             timeout=60, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert results[0] == results[1]
    assert len(results[0]) == 6
    fp = model_fingerprint("weights-abc", "float32", 16, 1)
    assert results[0] == store_keys(fp, page_hashes(list(range(1000, 1100)), 16))
