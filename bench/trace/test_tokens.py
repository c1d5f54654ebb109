"""bench/trace/tokens.py: a hash block is always the same token ids, different blocks differ, no
special token is ever drawn, and a prompt's length follows the recorded block size."""

from __future__ import annotations

import json

from bench.trace.request import TraceRequest
from bench.trace.tokens import BlockTokens, ordinary_vocabulary

VOCAB = range(17, 49152)  # SmolLM2's ordinary ids (its added tokens are 0-16)


def test_same_id_same_tokens_on_fresh_instances():
    a, b = BlockTokens(16, VOCAB), BlockTokens(16, VOCAB)
    assert a.block(46) == b.block(46) and len(a.block(46)) == 16
    assert a.block(46) is a.block(46)  # cached


def test_different_ids_differ():
    bt = BlockTokens(16, VOCAB)
    blocks = [tuple(bt.block(i)) for i in range(200)]
    assert len(set(blocks)) == 200
    assert tuple(bt.block(0)) != tuple(bt.block("request-0:0"))


def test_only_ordinary_ids_and_never_an_avoided_one():
    bt = BlockTokens(64, range(10, 20), avoid=frozenset({12, 13}))
    ids = [t for i in range(50) for t in bt.block(i)]
    assert set(ids) <= set(range(10, 20)) - {12, 13}
    assert len(set(ids)) == 8  # every allowed id shows up in 3,200 draws


def test_ordinary_vocabulary_from_added_tokens():
    class Tok:
        vocab_size = 1000

        def __init__(self, added):
            self.added = added

        def to_json(self):
            return json.dumps({"added_tokens": [{"id": i, "special": True} for i in self.added]})

    assert ordinary_vocabulary(Tok([0, 1, 2])) == (range(3, 1000), frozenset())        # at the start
    assert ordinary_vocabulary(Tok([990, 999])) == (range(990), frozenset())        # at the end
    assert ordinary_vocabulary(Tok([0, 5, 995])) == (range(6, 995), frozenset())


def test_prompt_lengths_follow_the_recorded_block_size():
    bt = BlockTokens(16, VOCAB)
    # 6,955 tokens in 14 blocks of 512: the last holds 6955 - 13 x 512 = 299 -> ceil(299 x 16 / 512) = 10
    req = TraceRequest(index=0, session="s", arrival_s=0.0, output_tokens=1, blocks=tuple(range(46, 60)),
                       input_length=6955)
    ids = bt.prompt(req, 512)
    assert len(ids) == 13 * 16 + 10
    assert ids[:16] == bt.block(46) and ids[-10:] == bt.block(59)[:10]
    # a prompt of two full blocks, then the same two with one more: shares exactly the first 32 ids
    two = bt.prompt(TraceRequest(1, "s", 0.0, 1, blocks=(1, 2), input_length=1024), 512)
    three = bt.prompt(TraceRequest(2, "s", 0.0, 1, blocks=(1, 2, 3), input_length=1536), 512)
    assert len(two) == 32 and three[:32] == two and len(three) == 48
    # no hash ids: 1,000 recorded tokens -> ceil(1000 x 16 / 512) = 32 ids of the request's own
    own = bt.prompt(TraceRequest(3, "s", 0.0, 1, input_length=1000), 512)
    assert len(own) == 32 and own != bt.prompt(TraceRequest(4, "s", 0.0, 1, input_length=1000), 512)
    # Bailian's 16-token blocks at 16 tokens a block: the recorded length exactly
    assert len(bt.prompt(TraceRequest(5, "s", 0.0, 1, blocks=(7, 8, 9), input_length=37), 16)) == 37
