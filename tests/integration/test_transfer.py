"""KVTransfer between two real processes over TCP (P2P handshake): bytes land exactly, runs merge,
a dead or absent peer fails fast with TransferError."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pdorch.local_stack.processes import free_port
from pdorch.local_stack.store import digest, page_pattern
from store_client.transfer import KVTransfer, TransferError, merge_runs

PAGE = 64 * 1024
PAGES = 8


def test_merge_runs_merges_only_runs_contiguous_on_both_sides():
    local = [1000, 1100, 1200, 5000, 5100]
    remote = [0, 100, 200, 300, 900]
    assert merge_runs(local, remote, 100) == ([1000, 5000, 5100], [0, 300, 900], [300, 100, 100])
    with pytest.raises(ValueError, match="remote_addrs"):
        merge_runs([1, 2], [1], 100)


@pytest.fixture
def local_transfer():
    src = page_pattern(7, PAGES, PAGE)
    t = KVTransfer("127.0.0.1", "tcp", "")
    t.start()
    t.register(src.ctypes.data, src.nbytes)
    yield t, src
    t.close()


def test_write_and_read_between_processes_then_dead_peer_fails_fast(peers, local_transfer):
    transfer, src = local_transfer
    target = peers("transfer-target", nbytes=PAGES * PAGE)
    seg, base = target.ready["segment"], target.ready["ptr"]

    # Local pages 0,1,2 -> remote pages 5,6,7 (one merged run); local 4 -> remote 0.
    local = [src.ctypes.data + i * PAGE for i in (0, 1, 2, 4)]
    remote = [base + i * PAGE for i in (5, 6, 7, 0)]
    assert transfer.write(seg, local, remote, PAGE) == 4 * PAGE
    assert target.ask(f"digest {5 * PAGE} {3 * PAGE}")["digest"] == digest(src[0:3])
    assert target.ask(f"digest 0 {PAGE}")["digest"] == digest(src[4])
    assert target.ask(f"digest {PAGE} {PAGE}")["digest"] == digest(np.zeros(PAGE, np.uint8))  # untouched

    # And back: the peer's pages 5,6,7 (= our 0,1,2) read into our pages 5,6,7 (a prefill worker
    # reading prefix pages a decode worker holds).
    want = digest(src[0:3])
    assert digest(src[5:8]) != want
    back = [src.ctypes.data + i * PAGE for i in (5, 6, 7)]
    assert transfer.read(seg, back, remote[:3], PAGE) == 3 * PAGE
    assert digest(src[5:8]) == want
    with pytest.raises(TransferError, match="read of 1 pages"):
        transfer.read(seg, back[:1], [base + PAGES * PAGE], PAGE)

    # Outside the peer's registered memory: refused, not silently written.
    with pytest.raises(TransferError, match="failed"):
        transfer.write(seg, local[:1], [base + PAGES * PAGE], PAGE)

    target.kill()
    t0 = time.monotonic()
    with pytest.raises(TransferError, match=seg):
        transfer.write(seg, local, remote, PAGE)
    assert time.monotonic() - t0 < 5.0, "a write to a dead peer must fail fast"


def test_write_to_absent_peer_fails_fast(local_transfer):
    transfer, src = local_transfer
    seg = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(TransferError):
        transfer.write(seg, [src.ctypes.data], [0x10000], PAGE)
    assert time.monotonic() - t0 < 5.0


def test_clear_errors_before_start_and_on_bad_input():
    t = KVTransfer()
    with pytest.raises(TransferError, match="start"):
        t.write("127.0.0.1:1", [1], [1], 10)
    with pytest.raises(ValueError, match="protocol"):
        KVTransfer(protocol="udp")
    with pytest.raises(ValueError, match="local_hostname"):
        KVTransfer(local_hostname="127.0.0.1:5000")
