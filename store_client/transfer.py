"""Prefill <-> decode KV transfer over the Mooncake transfer engine (P2P handshake, TCP here, RDMA in prod).

Each side registers its KV pool once. The prefill side writes a request's pages straight into the
decode side's pool pages: one `batch_transfer_sync_write` per request, with runs of pages that are
contiguous on both sides merged into one entry (page-first pool layout, so a page is one block).

    local  [p3][p4][p5]   [p9]        -> entries: (p3, d10, 3 pages), (p9, d20, 1 page)
    remote [d10][d11][d12] [d20]

`read` is the same in the other direction: a prefill worker reads prefix pages a decode worker
holds in its pool (its own prefix cache) into its pages. The batch call releases the GIL, so the scheduler thread keeps running while bytes move; callers
that must not wait run `write` on an I/O thread.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

log = logging.getLogger(__name__)

P2P_HANDSHAKE = "P2PHANDSHAKE"


class TransferError(RuntimeError):
    """A KV push failed (peer dead or unreachable, bad address, engine not started)."""


def merge_runs(local_addrs: Sequence[int], remote_addrs: Sequence[int],
               page_nbytes: int) -> tuple[list[int], list[int], list[int]]:
    """Merge pages contiguous on BOTH sides into (local_ptrs, remote_ptrs, lengths) entries."""
    if len(local_addrs) != len(remote_addrs):
        raise ValueError(f"local_addrs has {len(local_addrs)} pages but remote_addrs has {len(remote_addrs)}")
    if page_nbytes <= 0:
        raise ValueError(f"page_nbytes must be > 0, got {page_nbytes}")
    local_out: list[int] = []
    remote_out: list[int] = []
    lengths: list[int] = []
    for la, ra in zip(local_addrs, remote_addrs):
        if lengths and local_out[-1] + lengths[-1] == la and remote_out[-1] + lengths[-1] == ra:
            lengths[-1] += page_nbytes
        else:
            local_out.append(la)
            remote_out.append(ra)
            lengths.append(page_nbytes)
    return local_out, remote_out, lengths


class KVTransfer:
    """One transfer engine per worker process. `start()` returns the segment name peers write to."""

    def __init__(self, local_hostname: str = "127.0.0.1", protocol: str = "tcp", device_name: str = ""):
        if protocol not in ("tcp", "rdma"):
            raise ValueError(f"protocol must be 'tcp' or 'rdma', got {protocol!r}")
        if not local_hostname or ":" in local_hostname:
            raise ValueError(f"local_hostname must be a host without port, got {local_hostname!r}")
        self.local_hostname = local_hostname
        self.protocol = protocol
        self.device_name = device_name
        self._engine = None
        self._segment: str | None = None
        self._registered: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    @property
    def segment_name(self) -> str:
        if self._segment is None:
            raise TransferError("KVTransfer not started: call start() first")
        return self._segment

    def start(self) -> str:
        """Initialize the engine in P2P handshake mode (no metadata service); return `host:rpc_port`."""
        with self._lock:
            if self._segment is not None:
                return self._segment
            if self.protocol == "tcp":
                # NOTE: the engine auto-detects RDMA whenever HCAs exist, whatever the protocol
                # argument says; this env var is the only way to force TCP. Process-wide, set once.
                os.environ.setdefault("MC_FORCE_TCP", "1")
            from mooncake.engine import TransferEngine  # deferred: importing loads the native library

            engine = TransferEngine()
            rc = engine.initialize(self.local_hostname, P2P_HANDSHAKE, self.protocol, self.device_name)
            if rc != 0:
                raise TransferError(f"transfer engine initialize({self.local_hostname!r}, {self.protocol!r}, "
                                    f"device {self.device_name!r}) failed with {rc}")
            self._engine = engine
            self._segment = f"{self.local_hostname}:{engine.get_rpc_port()}"
            log.info("transfer engine started: segment %s protocol %s", self._segment, self.protocol)
            return self._segment

    def register(self, ptr: int, nbytes: int) -> None:
        """Register memory peers may write into (and we write from). Once per pool, at start-up."""
        if ptr <= 0 or nbytes <= 0:
            raise ValueError(f"register needs ptr > 0 and nbytes > 0, got ptr={ptr:#x} nbytes={nbytes}")
        engine = self._require_engine()
        rc = engine.register_memory(ptr, nbytes)
        if rc != 0:
            raise TransferError(f"register_memory(ptr={ptr:#x}, nbytes={nbytes}) failed with {rc}")
        with self._lock:
            self._registered.append((ptr, nbytes))

    def write(self, segment: str, local_addrs: Sequence[int], remote_addrs: Sequence[int],
              page_nbytes: int) -> int:
        """Write pages local_addrs[i] -> segment:remote_addrs[i]; returns bytes written.

        Raises TransferError when the peer is dead/unreachable (fails in about a millisecond once
        the connection is refused) or an address is outside the peer's registered memory.
        """
        return self._batch("write", segment, local_addrs, remote_addrs, page_nbytes)

    def read(self, segment: str, local_addrs: Sequence[int], remote_addrs: Sequence[int],
             page_nbytes: int) -> int:
        """Read pages segment:remote_addrs[i] -> local_addrs[i] (a prefill worker reading prefix pages
        a decode worker holds in its pool); returns bytes read. Raises TransferError as write() does."""
        return self._batch("read", segment, local_addrs, remote_addrs, page_nbytes)

    def _batch(self, op: str, segment: str, local_addrs: Sequence[int], remote_addrs: Sequence[int],
               page_nbytes: int) -> int:
        if not segment or ":" not in segment:
            raise ValueError(f"segment must be 'host:port' as returned by the peer's start(), got {segment!r}")
        engine = self._require_engine()
        if not local_addrs:
            return 0
        local, remote, lengths = merge_runs(local_addrs, remote_addrs, page_nbytes)
        call = engine.batch_transfer_sync_write if op == "write" else engine.batch_transfer_sync_read
        rc = call(segment, local, remote, lengths)
        if rc != 0:
            raise TransferError(f"{op} of {len(local_addrs)} pages ({len(lengths)} runs, "
                                f"{sum(lengths)} bytes) {'to' if op == 'write' else 'from'} {segment} failed "
                                f"with {rc}: peer dead, unreachable, or a remote address outside its "
                                "registered memory")
        return sum(lengths)

    def close(self) -> None:
        """Unregister memory. NOTE: the engine object has no explicit shutdown; it dies with us."""
        with self._lock:
            engine, regions, self._registered = self._engine, self._registered, []
        if engine is None:
            return
        for ptr, _ in regions:
            try:
                engine.unregister_memory(ptr)
            except Exception:
                log.warning("unregister_memory(%#x) failed", ptr, exc_info=True)

    def _require_engine(self):
        if self._engine is None:
            raise TransferError("KVTransfer not started: call start() first")
        return self._engine
