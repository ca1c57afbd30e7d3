"""Swap against recompute: the formulas written out by hand, the block-size trend, bad input."""
import pytest

from labkit.kv_cache import swap
from labkit.specs import device, model
from tests.refusals import assert_refused


def test_swap_is_one_transfer_per_block_each_way():
    s = model("llama-3-8b")
    got = swap.swap_seconds(s, 100, 16, bandwidth=1e10, latency=1e-5)
    assert got == pytest.approx(2 * 7 * (1e-5 + 131072 * 16 / 1e10))
    assert swap.swap_seconds(s, 100, 16, latency=0) == pytest.approx(2 * 7 * 16 * 131072 / 25e9)


def test_recompute_is_one_prefill_at_the_devices_peak():
    s = model("opt-13b")
    got = swap.recompute_seconds(s, 512, "h100-sxm", utilization=0.25)
    assert got == pytest.approx(2 * s.active_params * 512 / (device("h100-sxm").peak_flops["bf16"] * 0.25))


def test_small_blocks_swap_slower_and_recompute_does_not_care():
    rows = swap.preemption_table(model("opt-13b"), 1024)  # a multiple of every size: no padding swapped
    swaps = [r["swap ms"] for r in rows]
    assert swaps == sorted(swaps, reverse=True) and len({r["recompute ms"] for r in rows}) == 1


def test_bad_input_is_refused():
    assert_refused(lambda: swap.swap_seconds(model("opt-13b"), 10, 6), ValueError, "block_size", 6, "power of two")
    with pytest.raises(ValueError, match="BF16 peak"):
        swap.recompute_seconds(model("opt-13b"), 10, "pcie4-x16")
    assert_refused(lambda: swap.recompute_seconds(model("opt-13b"), 10, utilization=0), ValueError, "utilization", 0,
                   "in (0, 1]")
