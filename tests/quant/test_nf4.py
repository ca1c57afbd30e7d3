"""NF4 against bitsandbytes' published table, its tie rule at the exact midpoints, and a brute-force
nearest-level search."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.quant import nf4

from ..refusals import assert_refused

# bitsandbytes' NF4 table as published (csrc/kernels.cu; the QLoRA paper's appendix lists the same values)
NF4_PUBLISHED = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                 -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                 0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                 0.7229568362236023, 1.0]


def test_nf4_levels_match_the_published_table():
    np.testing.assert_allclose(nf4.nf4_levels(), NF4_PUBLISHED, atol=2e-6)
    assert nf4.nf4_levels()[7] == 0.0


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.floats(-100, 100, width=32), min_size=64, max_size=64))
def test_nf4_picks_the_nearest_level(values):
    x = np.array(values, dtype=np.float32)
    codes, absmax = nf4.quantize_nf4(x)
    assert codes.shape == (64,) and absmax.shape == (1,) and absmax[0] == np.abs(x).max()
    scaled = x / (absmax[0] if absmax[0] > 0 else 1)
    dist = np.abs(scaled[:, None] - nf4.nf4_levels()[None, :])  # brute force: distance to every level
    np.testing.assert_allclose(dist[np.arange(64), codes], dist.min(axis=1), atol=1e-6)
    back = nf4.dequantize_nf4(codes, absmax)
    half_gap = 0.5 * np.diff(NF4_PUBLISHED).max()  # half the widest gap
    assert back.dtype == np.float32 and np.abs(back - x).max() <= half_gap * absmax[0] * (1 + 1e-5)


def test_nf4_bad_input():
    assert_refused(lambda: nf4.quantize_nf4(np.zeros(32, np.float32)), ValueError, "x", (32,), "multiple of 64")
    for empty in (np.zeros(0, np.float32), np.zeros((3, 0), np.float32), np.zeros((0, 64), np.float32)):
        assert_refused(lambda: nf4.quantize_nf4(empty), ValueError, "x", empty.shape, "a non-empty float32 array")
    x = np.ones(64, np.float32)
    x[[3, 9]] = [np.nan, np.inf]
    assert_refused(lambda: nf4.quantize_nf4(x), ValueError, "x", "2 NaN or inf of 64 values", "finite")
    with pytest.raises(TypeError, match="float32"):
        nf4.quantize_nf4(np.zeros(64))
    with pytest.raises(ValueError, match="block must be a positive int"):
        nf4.quantize_nf4(np.zeros(64, np.float32), block=0)
    with pytest.raises(ValueError, match="absmax must have shape"):
        nf4.dequantize_nf4(np.zeros(64, np.uint8), np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="block must be a positive int, got 64.0"):
        nf4.quantize_nf4(np.zeros(64, np.float32), block=64.0)
    with pytest.raises(ValueError, match="codes must be in 0..15, got values up to 16"):
        nf4.dequantize_nf4(np.full(64, 16, np.uint8), np.zeros(1, np.float32))
    with pytest.raises(TypeError, match="codes must be a uint8 numpy array, got dtype"):
        nf4.dequantize_nf4(np.zeros(64, np.int64), np.zeros(1, np.float32))
    with pytest.raises(TypeError, match="absmax must be a float numpy array, got list"):
        nf4.dequantize_nf4(np.zeros(64, np.uint8), [1.0])
    with pytest.raises(ValueError, match=r"codes' last dimension must be a positive multiple of 64, got shape \(32,\)"):
        nf4.dequantize_nf4(np.zeros(32, np.uint8), np.zeros(1, np.float32))


def test_nf4_storage_is_four_and_a_half_bits_per_weight():
    x = np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)
    codes, absmax = nf4.quantize_nf4(x)
    assert codes.shape == x.shape and absmax.shape == (4, 256 // nf4.NF4_BLOCK) and absmax.dtype == np.float32
    assert (4 * codes.size + 32 * absmax.size) / x.size == 4.5


def bnb_code(x: float) -> int:
    """bitsandbytes' rule (dQuantizeNF4 in csrc/kernels.cu, a tree of `x > threshold` tests whose thresholds
    are the midpoints of neighbouring levels): the code is the number of midpoints strictly below x."""
    levels = nf4.nf4_levels()
    mids = [np.float32((float(levels[i]) + float(levels[i + 1])) / 2) for i in range(15)]
    return sum(x > m for m in mids)


def test_a_value_exactly_between_two_levels_goes_down_as_in_bitsandbytes():
    levels = nf4.nf4_levels()
    mids = ((levels[1:] + levels[:-1]) / 2).astype(np.float32)  # float32 midpoints: exact ties once scaled by 1
    up = np.nextafter(mids, np.float32(2))
    down = np.nextafter(mids, np.float32(-2))
    x = np.concatenate([[1.0], mids, up, down, np.zeros(64 - 1 - 45)]).astype(np.float32)  # absmax 1: x / 1 = x
    codes, absmax = nf4.quantize_nf4(x)
    assert absmax[0] == 1.0
    assert codes[1:16].tolist() == list(range(15))            # each midpoint: the lower of its two levels
    assert codes[16:31].tolist() == list(range(1, 16))        # one float32 step above: the upper one
    assert codes[31:46].tolist() == list(range(15))
    assert codes.tolist() == [bnb_code(float(v)) for v in x]


@pytest.mark.parametrize("absmax", [np.nan, np.inf, -1.0])
def test_dequantize_refuses_an_absmax_that_is_not_a_block_maximum(absmax):
    assert_refused(lambda: nf4.dequantize_nf4(np.zeros(64, np.uint8), np.array([absmax], np.float32)), ValueError,
                   "absmax", float(np.float32(absmax)), "finite and >= 0")


def test_dequantize_refuses_bad_blocks_by_name():
    codes, absmax = np.zeros(64, np.uint8), np.ones(1, np.float32)
    assert_refused(lambda: nf4.dequantize_nf4(codes, absmax, block=0), ValueError, "block", 0, "a positive int")
    assert_refused(lambda: nf4.dequantize_nf4(codes, absmax, block=True), TypeError, "block", True, "a positive int")
    with pytest.raises(ValueError, match=r"codes' last dimension must be a positive multiple of 64, got shape \(65,\)"):
        nf4.dequantize_nf4(np.zeros(65, np.uint8), absmax)
