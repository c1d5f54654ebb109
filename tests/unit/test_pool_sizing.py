"""num_pages auto: the pool-sizing arithmetic (pure; the CUDA measurements feed it on a GPU)."""

import pytest

from engine.pool_sizing import MARGIN_BYTES, PoolSizeError, pages_for_memory, size_pool

GIB = 1 << 30


def test_pages_fill_the_share_left_after_weights_and_activations():
    # 140 GiB card, 0.9 of it ours, 16 GiB of weights held, 2 GiB activation peak, 1 MiB pages
    pages = pages_for_memory(140 * GIB, 124 * GIB, 16 * GIB, 2 * GIB, 0.9, 1 << 20, margin=0)
    assert pages == (int(140 * GIB * 0.9) - 16 * GIB - 2 * GIB) // (1 << 20) == 110592


def test_free_memory_caps_the_share_when_another_process_holds_some():
    # another worker on the same GPU holds 60 GiB: only 64 GiB are free although our share is larger
    pages = pages_for_memory(140 * GIB, 64 * GIB, 16 * GIB, 2 * GIB, 0.9, 1 << 20, margin=0)
    assert pages == (64 - 2) * 1024


def test_margin_and_never_negative():
    assert pages_for_memory(8 * GIB, 8 * GIB, 0, 0, 1.0, GIB) == (8 * GIB - MARGIN_BYTES) // GIB == 7
    assert pages_for_memory(8 * GIB, 1 * GIB, 7 * GIB, 2 * GIB, 0.5, 1 << 20) == 0


def test_fixed_count_is_kept_and_auto_needs_a_gpu():
    s = size_pool(300, 4096, 16, "cpu", 0.9, lambda: pytest.fail("no profiling for a fixed count"))
    assert (s.num_pages, s.tokens, s.nbytes, s.how) == (300, 4800, 300 * 4096, "fixed")
    assert "4800 tokens of KV capacity" in s.describe()
    with pytest.raises(PoolSizeError, match="decode.num_pages: auto sizes the pool from GPU memory, but model.device "
                                            "is 'cpu'"):
        size_pool(0, 4096, 16, "cpu", 0.9, lambda: 0, key="decode.num_pages")
