"""NF4, the 4-bit format of QLoRA (Dettmers et al., 2023, arXiv:2305.14314; bitsandbytes), notebook 03.

16 levels at quantiles of N(0, 1), scaled by each block's absmax. 8 positive levels from quantiles between
0.5 and NF4_OFFSET, 7 negative ones, and an exact 0; then divided by the largest, so the levels run from
-1 to 1:

    -1 ........ -0.09  0  0.08 ............. 1        (denser near 0, where normal weights are)

Storage: 4 bits per weight plus one float32 absmax per block of 64 = 4.5 bits per weight; "double
quantization" stores the absmaxes in 8 bits (one float32 per 256 of them): 4 + 8/64 + 32/(64*256) = 4.127.
"""

from __future__ import annotations

import numpy as np
import torch

from .._checks import check_positive_int, check_type, fail
from .formats import F32, float32_blocks

NF4_OFFSET = 0.9677083  # bitsandbytes' create_normal_map: about (1 - 1/(2*15) + 1 - 1/(2*16)) / 2
NF4_BLOCK = 64


def nf4_levels() -> np.ndarray:
    """The 16 NF4 levels (float32, ascending, from -1 to 1, level 7 is exactly 0)."""
    icdf = torch.distributions.Normal(0.0, 1.0).icdf  # the normal quantile function, in float64
    pos = icdf(torch.linspace(NF4_OFFSET, 0.5, 9, dtype=torch.float64)[:-1])
    neg = -icdf(torch.linspace(NF4_OFFSET, 0.5, 8, dtype=torch.float64)[:-1])
    v = torch.cat([pos, torch.zeros(1, dtype=torch.float64), neg]).sort().values
    return (v / v.abs().max()).numpy().astype(F32)


def quantize_nf4(x: np.ndarray, block: int = NF4_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """float32 [..., n] (n % block == 0) -> (codes uint8 [..., n] in 0..15, absmax float32 [..., n / block]).
    Each value goes to the nearest level of x / absmax. A value exactly halfway between two levels (the
    float32 midpoint) goes to the LOWER one, as in bitsandbytes: its quantizer (dQuantizeNF4 in
    csrc/kernels.cu) walks a tree of `x > midpoint` tests, so code = the number of midpoints strictly below x.
    (Our levels, computed from the normal quantile, match bitsandbytes' table to 2e-6: a value closer than
    that to a midpoint can still fall on the other side than in bitsandbytes.)"""
    check_positive_int("block", block)
    xb, _ = float32_blocks(x, block)
    absmax = np.abs(xb).max(axis=1)
    scaled = xb / np.where(absmax > 0, absmax, F32(1))[:, None]
    levels = nf4_levels()
    codes = np.searchsorted((levels[1:] + levels[:-1]) / 2, scaled, side="left").astype(np.uint8)
    return codes.reshape(x.shape), absmax.reshape(*x.shape[:-1], -1)


def dequantize_nf4(codes: np.ndarray, absmax: np.ndarray, block: int = NF4_BLOCK) -> np.ndarray:
    """(codes uint8 [..., n] in 0..15, absmax float32 [..., n / block]) -> float32 [..., n]."""
    check_positive_int("block", block)
    check_type("codes", codes, np.ndarray, "a uint8 numpy array")
    if codes.dtype != np.uint8:
        fail("codes", codes.dtype, "a uint8 numpy array", TypeError)
    if codes.ndim < 1 or codes.shape[-1] == 0 or codes.shape[-1] % block:
        raise ValueError(f"codes' last dimension must be a positive multiple of {block}, got shape {codes.shape}")
    if int(codes.max()) > 15:
        raise ValueError(f"codes must be in 0..15, got values up to {int(codes.max())}")
    check_type("absmax", absmax, np.ndarray, "a float numpy array")
    if not np.issubdtype(absmax.dtype, np.floating):
        fail("absmax", absmax.dtype, "a float numpy array", TypeError)
    expected = codes.shape[:-1] + (codes.shape[-1] // block,)
    if absmax.shape != expected:
        raise ValueError(f"absmax must have shape {expected}, got {absmax.shape}")
    bad = ~(np.isfinite(absmax) & (absmax >= 0))
    if bad.any():
        fail("absmax", float(absmax[bad][0]), "finite and >= 0 in every block (the block's largest |x|)")
    vals = nf4_levels()[codes].reshape(-1, block) * absmax.reshape(-1, 1).astype(F32)
    return vals.reshape(codes.shape)
