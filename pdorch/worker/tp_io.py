"""The store and transfer I/O of a tensor-parallel worker: each rank reads, writes and sends the KV of
its own pool shard; rank 0 decides what, asks its followers over gRPC (proto/pdorch/v1/tp.proto) and
combines their answers with its own.

    GroupStore      rank 0's KVStore: a load or save is done by every rank at once; a page counts as
                    loaded (or stored) only when EVERY rank's objects of it are. So all ranks agree
                    on which pages the scheduler computes instead: the ones any rank lacks.
    GroupTransfer   rank 0's KV transfers to / from another worker of any TP size (tp_transfer.py),
                    its own share and every follower's together; one failing fails the transfer.
    FollowerIO      a follower's gRPC service doing its share.

Presence checks and removals need no followers: rank 0's KVStore asks for every group object of a
page (page_objects.py), its own and the others'.

NOTE: rank 0's store metrics count what rank 0 read and wrote; a page a follower failed shows as a
miss of the request (recomputed) but not in rank 0's per-op counters.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc

from pdorch.worker.convert import rank_from_proto, rank_to_proto
from pdorch.worker.tp_transfer import PoolRank, move_heads, single_rank
from proto.pdorch.v1 import tp_pb2, tp_pb2_grpc
from store_client.results import OK, TRANSFER_FAILED, LoadResult, SaveResult
from store_client.store import KVStore
from store_client.transfer import TransferError

log = logging.getLogger(__name__)

TRANSFER_TIMEOUT_S = 60.0  # a follower's share of one P -> D transfer (the engine fails a dead peer in ms)


class Followers:
    """Rank 0's gRPC stubs of its followers (their FollowerIO, on loopback)."""

    def __init__(self, addresses: Sequence[str]):
        self._channels = [grpc.insecure_channel(a) for a in addresses]
        self._stubs = [tp_pb2_grpc.TPFollowerStub(c) for c in self._channels]

    def call(self, method: str, msg, timeout_s: float) -> list:
        """The call started on every follower: their futures, in rank order (rank 1 first)."""
        return [getattr(s, method).future(msg, timeout=timeout_s) for s in self._stubs]

    def close(self) -> None:
        for c in self._channels:
            c.close()


def _answers(futures, n: int, what: str) -> list[tuple[bool, ...]]:
    """Each follower's page_ok; all False for one that failed or gave a short answer."""
    out = []
    for rank, f in enumerate(futures, 1):
        try:
            ok = tuple(f.result().page_ok)
        except grpc.RpcError as e:
            log.warning("TP rank %d: %s failed: %s", rank, what, e.details() if hasattr(e, "details") else e)
            ok = ()
        out.append(ok if len(ok) == n else (False,) * n)
    return out


class GroupStore(KVStore):
    """KVStore of rank 0 whose loads and saves every rank does at once on its own pool."""

    def __init__(self, *args, pool_base: int, followers: Followers, **kwargs):
        super().__init__(*args, **kwargs)
        self._base, self._followers = pool_base, followers

    def _page_ids(self, addrs: Sequence[int]) -> list[int]:
        return [(a - self._base) // self.page_nbytes for a in addrs]

    def load_many(self, requests):
        keys = [k for ks, _ in requests for k in ks]
        msg = tp_pb2.StorePages(keys=keys, page_ids=[p for _, a in requests for p in self._page_ids(a)],
                                request_pages=[len(ks) for ks, _ in requests])
        futures = self._followers.call("StoreLoad", msg, self.cfg.op_timeout_s + 1.0) if keys else []
        mine = super().load_many(requests)
        if not keys:
            return mine
        theirs = _answers(futures, len(keys), "store load")
        out, at = [], 0
        for (ks, _), res in zip(requests, mine):
            others = [t[at:at + len(ks)] for t in theirs]
            at += len(ks)
            out.append(_combine_load(res, others, len(ks)))
        return out

    def save(self, keys, addrs) -> SaveResult:
        msg = tp_pb2.StorePages(keys=list(keys), page_ids=self._page_ids(addrs))
        futures = self._followers.call("StoreSave", msg, self.cfg.op_timeout_s + 1.0) if keys else []
        mine = super().save(keys, addrs)
        if not keys:
            return mine
        ok = _page_ok(mine.page_ok, mine.reason, len(keys))
        for theirs in _answers(futures, len(keys), "store save"):
            ok = tuple(a and b for a, b in zip(ok, theirs))
        if ok == mine.page_ok:
            return mine
        failed = ok.count(False)
        return SaveResult(mine.pages_written, mine.pages_skipped, failed,
                          mine.reason if mine.reason != OK else TRANSFER_FAILED, ok)


def _page_ok(ok: tuple[bool, ...], reason: str, n: int) -> tuple[bool, ...]:
    return ok if len(ok) == n else (reason == OK,) * n


def _combine_load(mine: LoadResult, others: list[tuple[bool, ...]], n: int) -> LoadResult:
    ok = _page_ok(mine.page_ok, mine.reason, n)
    for theirs in others:
        ok = tuple(a and b for a, b in zip(ok, theirs))
    if ok == mine.page_ok:
        return mine
    ssd = tuple(a and b for a, b in zip(mine.page_ssd, ok)) if mine.page_ssd else ()
    return LoadResult(sum(ok), mine.reason if mine.reason != OK else TRANSFER_FAILED, ok, ssd)


class GroupTransfer:
    """Rank 0's KV transfers to / from another worker, its followers' shares included. With the
    signature of KVTransfer.write / read plus the peer's ranks (PrefillRequest.decode_ranks)."""

    def __init__(self, transfer, ranks: Sequence[PoolRank], num_kv_heads: int, followers: Followers | None = None):
        self.transfer, self.ranks, self.num_kv_heads = transfer, list(ranks), num_kv_heads
        self._followers = followers

    def write(self, segment: str, local_addrs, remote_addrs, page_nbytes: int, peer_ranks=()) -> int:
        return self._move(False, segment, local_addrs, remote_addrs, peer_ranks)

    def read(self, segment: str, local_addrs, remote_addrs, page_nbytes: int, peer_ranks=()) -> int:
        return self._move(True, segment, local_addrs, remote_addrs, peer_ranks)

    def _move(self, read: bool, segment: str, local_addrs, remote_addrs, peer_ranks) -> int:
        if not local_addrs:
            return 0
        me = self.ranks[0]
        local_ids = me.page_ids(local_addrs)
        if peer_ranks:
            peers = list(peer_ranks)
            ids = peers[0].page_ids(remote_addrs)
            peer_addrs = [p.page_addrs(ids) for p in peers]
        else:  # a single-rank peer: every head, at the addresses given
            peers, peer_addrs = [single_rank(segment, self.num_kv_heads, me.head_nbytes)], [list(remote_addrs)]
        futures = []
        if self._followers is not None:
            msg = tp_pb2.TransferPages(read=read, local_page_ids=local_ids, peers=[rank_to_proto(p) for p in peers],
                                       peer_page_addrs=[a for addrs in peer_addrs for a in addrs])
            futures = self._followers.call("Transfer", msg, TRANSFER_TIMEOUT_S)
        moved = move_heads(self.transfer, read, 0, self.ranks, local_ids, peers, peer_addrs)
        for rank, f in enumerate(futures, 1):
            try:
                moved += f.result().nbytes
            except grpc.RpcError as e:
                raise TransferError(f"TP rank {rank}: {e.details() if hasattr(e, 'details') else e}") from None
        return moved


class FollowerIO(tp_pb2_grpc.TPFollowerServicer):
    """A follower's share of rank 0's store and transfer I/O, on its own pool."""

    def __init__(self, rank: int, ranks: Sequence[PoolRank], pool, store: KVStore | None, transfer):
        self.rank, self.ranks, self.pool, self.store, self.transfer = rank, list(ranks), pool, store, transfer

    def StoreLoad(self, request, context):
        n = len(request.keys)
        if self.store is None:
            return tp_pb2.PagesDone(page_ok=[False] * n)
        addrs = self.pool.page_addrs(request.page_ids)
        reqs, at = [], 0
        for size in request.request_pages:
            reqs.append((list(request.keys[at:at + size]), addrs[at:at + size]))
            at += size
        ok = [o for (ks, _), r in zip(reqs, self.store.load_many(reqs)) for o in _page_ok(r.page_ok, r.reason, len(ks))]
        return tp_pb2.PagesDone(page_ok=ok)

    def StoreSave(self, request, context):
        n = len(request.keys)
        if self.store is None:
            return tp_pb2.PagesDone(page_ok=[False] * n)
        res = self.store.save(list(request.keys), self.pool.page_addrs(request.page_ids))
        return tp_pb2.PagesDone(page_ok=_page_ok(res.page_ok, res.reason, n))

    def Transfer(self, request, context):
        peers = [rank_from_proto(p) for p in request.peers]
        n = len(request.local_page_ids)
        flat = list(request.peer_page_addrs)
        peer_addrs = [flat[i * n:(i + 1) * n] for i in range(len(peers))]
        try:
            moved = move_heads(self.transfer, request.read, self.rank, self.ranks, list(request.local_page_ids),
                               peers, peer_addrs)
        except Exception as e:  # noqa: BLE001 - the caller's transfer fails, naming this rank's cause
            context.abort(grpc.StatusCode.INTERNAL, str(e))
        return tp_pb2.TransferDone(nbytes=moved)
