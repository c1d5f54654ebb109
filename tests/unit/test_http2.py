"""router/grpc/http2.py: the remembering HPACK decoder decodes exactly like a plain hpack Decoder."""

from __future__ import annotations

import pytest
from hpack import Decoder, Encoder

from router.grpc.http2 import HeaderDecoder


def test_remembered_blocks_decode_like_a_fresh_decoder_as_the_table_changes():
    enc = Encoder()
    ours, plain = HeaderDecoder(), Decoder()
    response = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    blocks = [enc.encode(response), enc.encode(response), enc.encode(response),  # warm: all indexed
              enc.encode([(b"grpc-status", b"0")]), enc.encode([(b"grpc-status", b"0")])]
    assert blocks[1] == blocks[2]  # the repeated block that gets remembered
    # NOTE: the same bytes mean another header once a new entry shifts the dynamic table:
    # 0xbe is dynamic entry 62, the newest one.
    blocks += [b"\xbe", enc.encode([(b"x-new", b"1")]), b"\xbe", b"\xbe", enc.encode(response)]
    for block in blocks:
        assert ours.decode(block) == plain.decode(block, raw=True)
    assert ours.decode(b"\xbe") == [(b"x-new", b"1")]


def test_bad_block_is_a_value_error():
    with pytest.raises(ValueError, match="bad header block"):
        HeaderDecoder().decode(b"\xff\xff\xff\xff\xff\xff")
