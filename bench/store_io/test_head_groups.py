"""bench/store_io/head_groups.py: the slices of each KV-head group tile the page exactly once."""

import itertools

import pytest

from bench.store_io.head_groups import HEAD_NBYTES, KV_HEADS, LAYERS, PAGE_NBYTES, group_slices


@pytest.mark.parametrize("groups", [1, 2, 4, 8])
def test_group_slices_tile_the_page(groups):
    covered = []
    for g in range(groups):
        addrs, sizes = group_slices(1000, g, groups)
        assert len(addrs) == 2 * LAYERS and set(sizes) == {KV_HEADS // groups * HEAD_NBYTES}
        covered += [(a - 1000, a - 1000 + s) for a, s in zip(addrs, sizes)]
    covered.sort()
    assert covered[0][0] == 0 and covered[-1][1] == PAGE_NBYTES
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))  # no gap, no overlap
