"""pdorch.worker.restore_backlog: lost pages written again a few chunks at a time, never all at once."""

from pdorch.worker.restore_backlog import RestoreBacklog


def test_chunks_go_out_as_earlier_ones_land_in_order_each_hash_once():
    backlog = RestoreBacklog(chunk_pages=2, in_flight=2)
    sent = []

    def submit(hashes):
        sent.append(hashes)
        return True

    backlog.add(["a", "b", "c", "d", "e"])
    backlog.add(["b", "f"])  # b is waiting already
    backlog.pump(submit)
    assert sent == [["a", "b"], ["c", "d"]] and backlog.in_flight == 2 and len(backlog) == 2
    backlog.pump(submit)  # nothing landed: nothing more goes out
    assert len(sent) == 2
    backlog.landed()
    backlog.pump(submit)
    assert sent[2:] == [["e", "f"]] and len(backlog) == 0


def test_a_chunk_with_nothing_left_to_write_does_not_hold_a_slot():
    backlog = RestoreBacklog(chunk_pages=1, in_flight=1)
    sent = []
    backlog.add(["gone", "held"])
    backlog.pump(lambda hashes: sent.append(hashes) or hashes != ["gone"])  # "gone" left L1 meanwhile
    assert sent == [["gone"], ["held"]] and backlog.in_flight == 1
