"""Generated-KV offload: pages filled during decode go to the store, continuing the prompt's hash chain.

Positions and pages (S = page_size, prompt of n tokens, generated tokens g0 g1 ...):

    token_ids = prompt[0..n-1] g0 g1 g2 ...      g0 comes from the prefill worker; D feeds g0 at position n, g1 at n+1 ...
    feeding position p writes its K/V into page p // S; when (p + 1) % S == 0 that page is full.
    page k's hash = sha256(hash(page k-1) || token_ids[kS:(k+1)S])  (store_client.page_hash chain)

So page k's key is exactly the key a later prompt whose first (k+1)S token ids equal
token_ids[:(k+1)S] computes for its own page k: the next turn's prefill finds these pages in the
store as long as the tokenization condition holds:

    turn-2 prompt ids must START WITH turn-1 prompt ids + the generated ids, exactly.

That is, the chat template must re-render the assistant answer to the same token ids the model
generated (ChatML models such as SmolLM2: "<|im_start|>assistant\\n" + answer + "<|im_end|>"; the
generated ids end with <|im_end|> itself). It breaks when the client edits or trims the answer, when
the template rewrites earlier turns (e.g. drops a system prompt or reasoning), or when re-tokenizing
the answer text merges tokens differently at a boundary than generation did. Hits then stop at the
first differing page; correctness is unaffected (a mismatch only means a miss).

NOTE: the last generated token is never fed (generation stops after sampling it), so its page
can only fill on the next turn; pages are written only once every position in them has been fed.
"""

from __future__ import annotations

from store_client.page_hash import page_hashes


def filled_page(position: int, page_size: int) -> int | None:
    """Index of the page that feeding `position` completed, or None when it is not full yet."""
    return position // page_size if (position + 1) % page_size == 0 else None


def extend_hash_chain(chain: list[str], token_ids: list[int], page_index: int, page_size: int) -> str:
    """Append the hash of full page `page_index` to `chain` (which must hold pages 0..page_index-1)."""
    if len(chain) != page_index:
        raise ValueError(f"hash chain has {len(chain)} pages; cannot append page {page_index}")
    start = page_index * page_size
    tokens = token_ids[start:start + page_size]
    if len(tokens) != page_size:
        raise ValueError(f"page {page_index} holds {len(tokens)} tokens, not a full page of {page_size}")
    h = page_hashes(tokens, page_size, parent_hash=chain[-1] if chain else "")[0]
    chain.append(h)
    return h
