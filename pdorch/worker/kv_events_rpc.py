"""WatchKV, the same for both workers: a KVEventJournal subscription as a server stream of KVEventBatch.

    refused (hash_scheme / page_size / layout_version)  -> FAILED_PRECONDITION naming the field
    initial batches (a snapshot, or the batches after the subscriber's after_seq), then the queue
    the journal dropped it (it fell behind: "slow")     -> RESOURCE_EXHAUSTED: resubscribe (resume)
    the worker stops (KVEventJournal.end_streams)       -> UNAVAILABLE
    MAX_SUBSCRIBERS open already                        -> RESOURCE_EXHAUSTED
    the client goes away                                -> the subscription is removed

The caller's token is checked by the server's interceptor, as for every RPC (pdorch/worker/tokens.py).

NOTE: a subscriber that stops reading blocks this handler in gRPC's send once the flow-control
window is full, and no wait of ours could see it. The journal keeps queueing until that queue is
full and drops the subscriber; the drop then cancels the RPC, which is what frees the blocked send
(and this thread). When the worker stops, only a send in progress for over STUCK_S is cancelled
(a send just under way ends by itself, and the stream then ends UNAVAILABLE, not CANCELLED).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc

from pdorch.worker.kv_events import KVEventJournal
from pdorch.worker.kv_subscription import EventBatch, StreamEnded
from proto.pdorch.v1 import worker_pb2 as pb

WAIT_S = 0.5  # every wait for the next batch is this long at most (then the RPC is checked again)
STUCK_S = 0.2  # a send in progress this long is blocked on the subscriber's window


def batch_to_proto(worker_id: str, page_size: int, b: EventBatch) -> pb.KVEventBatch:
    return pb.KVEventBatch(worker_id=worker_id, epoch=b.epoch, seq=b.seq, snapshot=b.snapshot,
                           l1_stored=b.l1_stored, l1_removed=b.l1_removed, store_written=b.store_written,
                           store_removed=b.store_removed, free_pages=b.free_pages, queued_requests=b.queued,
                           running_requests=b.running, page_size=page_size, inflight_claimed=b.inflight_claimed,
                           inflight_released=b.inflight_released)


def watch_kv(journal: KVEventJournal, request: pb.WatchKVRequest,
             context: grpc.ServicerContext) -> Iterator[pb.KVEventBatch]:
    """The WatchKV handler body (a generator of KVEventBatch); see the module docstring."""
    sub = journal.subscribe(request.hash_scheme, request.page_size, request.layout_version, request.epoch,
                            request.after_seq, request.subscriber or context.peer())
    if isinstance(sub, str):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, sub)
        return  # abort() raises; this tells the type checker `sub` is a Subscription below
    sending: float | None = None  # when the send in progress began

    def ended() -> None:  # from the journal's thread: a send blocked on a full window never returns else
        since = sending
        if since is not None and (sub.ended != "stopped" or time.monotonic() - since > STUCK_S):
            context.cancel()

    sub.on_end(ended)

    def to_proto(batch: EventBatch) -> pb.KVEventBatch:
        return batch_to_proto(journal.worker_id, journal.page_size, batch)
    try:
        for batch in sub.initial:
            sending = time.monotonic()
            yield to_proto(batch)
            sending = None
        while context.is_active():
            try:
                got = sub.get(WAIT_S)
            except StreamEnded as e:
                code = grpc.StatusCode.UNAVAILABLE if e.reason == "stopped" else grpc.StatusCode.RESOURCE_EXHAUSTED
                context.abort(code, f"WatchKV ended by worker {journal.worker_id}: {e.reason} "
                              "(resubscribe with epoch and after_seq)")
                return  # abort() raises (as above)
            if got is None:
                continue
            sending = time.monotonic()
            if sub.ended is not None:  # dropped between get() and here: ended() saw no send
                sending = None
                continue  # the next get() raises
            yield to_proto(got)
            sending = None
    finally:
        journal.unsubscribe(sub)

