"""A tensor-parallel group forms under its own bound, not the collectives' (engine/tensor_parallel.py
init_tp_group): a rank that starts later than model.tp_timeout_s still joins, a rank that never comes fails
the join naming it, and rank 0's check (a follower exited) ends the wait at once."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch

from engine.tensor_parallel import init_tp_group
from tests.fixtures.ranks import run_ranks

COLLECTIVE_TIMEOUT_S = 2.0
LATE_S = 4.0  # the second rank's start, past the collectives' bound


def rank_main(rank: int, init: str, results: mp.Queue) -> None:
    try:
        if rank == 1:
            time.sleep(LATE_S)  # as a follower importing torch on a loaded machine
        group = init_tp_group(rank, 2, init, "gloo", COLLECTIVE_TIMEOUT_S, join_timeout_s=60.0)
        t = torch.tensor([rank + 1.0])
        group.all_reduce(t)
        group.close()
        results.put((rank, t.item()))
    except Exception as e:  # noqa: BLE001 - the parent shows it
        results.put((rank, repr(e)))


def test_a_rank_later_than_the_collective_timeout_still_joins(tmp_path):
    got = run_ranks(rank_main, lambda r: (r, f"file://{tmp_path / 'rendezvous'}"), 2, 120)
    assert got == {0: 3.0, 1: 3.0}  # both joined and summed 1 + 2


def test_a_rank_that_never_comes_fails_the_join_by_its_bound_naming_it(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[1\] did not join within 1 s"):
        init_tp_group(0, 2, f"file://{tmp_path / 'rendezvous'}", "gloo", timeout_s=1.0, join_timeout_s=1.0)
    assert time.monotonic() - t0 < 10


def test_a_failing_check_ends_the_wait_before_the_bound(tmp_path):
    calls = []

    def follower_gone() -> None:
        calls.append(1)
        raise RuntimeError("tensor-parallel follower ranks [1] exited before the group formed")

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited before the group formed"):
        init_tp_group(0, 2, f"file://{tmp_path / 'rendezvous'}", "gloo", COLLECTIVE_TIMEOUT_S, join_timeout_s=60.0,
                      check=follower_gone)
    assert calls == [1]
    assert time.monotonic() - t0 < 10  # not the 60 s bound
