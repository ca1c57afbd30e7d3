"""NF4 against bitsandbytes' published table and a brute-force nearest-level search."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.quant import nf4

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
    assert back.dtype == np.float32 and np.abs(back - x).max() <= 0.5 * np.diff(NF4_PUBLISHED).max() * absmax[0] * (1 + 1e-5)  # half the widest gap


def test_nf4_bad_input():
    with pytest.raises(ValueError, match="multiple of 64, got shape"):
        nf4.quantize_nf4(np.zeros(32, np.float32))
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
