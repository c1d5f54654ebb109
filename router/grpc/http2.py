"""HTTP/2 framing and HPACK, as much as the router's lean gRPC client needs (router/grpc/stream.py).

Frames are built by hand (RFC 7540 section 4); request headers are HPACK literals without
indexing (RFC 7541 6.2.2), so the client keeps no encoder state; response headers are decoded
with the `hpack` package.
"""

from __future__ import annotations

from typing import cast

from hpack import Decoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0x0, 0x1, 0x3, 0x4, 0x5, 0x6, 0x7, 0x8, 0x9)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM = 0x7, 0x8, 0xB
# HTTP/2 error codes (RFC 9113 section 7), as RST_STREAM and GOAWAY carry them.
ERROR_NAMES = {0x0: "NO_ERROR", 0x1: "PROTOCOL_ERROR", 0x2: "INTERNAL_ERROR", 0x3: "FLOW_CONTROL_ERROR",
               0x4: "SETTINGS_TIMEOUT", 0x5: "STREAM_CLOSED", 0x6: "FRAME_SIZE_ERROR", 0x7: "REFUSED_STREAM",
               0x8: "CANCEL", 0x9: "COMPRESSION_ERROR", 0xA: "CONNECT_ERROR", 0xB: "ENHANCE_YOUR_CALM",
               0xC: "INADEQUATE_SECURITY", 0xD: "HTTP_1_1_REQUIRED"}


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def literal(name: bytes, value: bytes) -> bytes:
    """HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def literal_indexed_name(index: int, value: bytes) -> bytes:
    """Literal without indexing whose name is static-table entry `index` (RFC 7541 6.2.2)."""
    return hpack_int(index, 4) + hpack_int(len(value), 7) + value


def hpack_int(value: int, prefix_bits: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((value,))
    out, value = [limit], value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class HeaderDecoder:
    """One connection's HPACK decoder. Decoding is pure Python (~20 us a block), and a worker sends
    the same few blocks on every call once its dynamic table is warm (`88c0bf`: :status 200 and
    two table entries). A block that left the table unchanged decodes the same until the table
    changes, so it is remembered until then."""

    def __init__(self):
        self._decoder = Decoder()
        self._known: dict[bytes, list[tuple[bytes, bytes]]] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The block's (name, value) pairs; ValueError if it is not valid HPACK. Callers must not
        modify the returned list (it may be shared)."""
        known = self._known.get(block)
        if known is not None:
            return known
        table = self._decoder.header_table.dynamic_entries
        before = tuple(table)
        try:
            # hpack's raw=True: a list of (name, value) bytes pairs (typed as its HeaderTuples)
            headers = cast(list[tuple[bytes, bytes]], self._decoder.decode(block, raw=True))
        except Exception as e:  # noqa: BLE001 - hpack raises several error types
            raise ValueError(f"bad header block: {e}") from None
        if tuple(table) != before:
            self._known.clear()
        elif len(self._known) < 64:
            self._known[block] = headers
        return headers
