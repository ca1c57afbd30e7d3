"""llama.cpp's Q4_0, Q4_1 and Q8_0 blocks, byte for byte (notebook 03, section 5; NF4 is in nf4.py).

Each format cuts a row into blocks of 32 values. Layouts (ggml-common.h), little-endian fp16:

    Q4_0  18 bytes = 4.5 bits/weight   | d: fp16 | qs: 16 bytes |            w = (q - 8) * d,  q in 0..15
    Q4_1  20 bytes = 5.0 bits/weight   | d: fp16 | m: fp16 | qs: 16 bytes |  w = q * d + m,    q in 0..15
    Q8_0  34 bytes = 8.5 bits/weight   | d: fp16 | qs: 32 x int8 |          w = q * d,        q in -128..127

4-bit nibble order: element j and element j + 16 share byte j (not neighbours 2j, 2j+1):

    qs[j] = q[j] | q[j + 16] << 4        j = 0..15

Rounding follows llama.cpp's reference quantizers (quantize_row_q4_0_ref, quantize_row_q4_1_ref,
quantize_row_q8_0_ref in ggml/src/ggml-quants.c), in float32 arithmetic like the C code:

    Q4_0  max = the value of largest |x| (first one on ties); d = max / -8; id = 1/d (0 if d == 0)
          q = min(15, trunc(x * id + 8.5))            (the value max itself maps to q = 0, i.e. -8 * d)
    Q4_1  d = (max - min) / 15; id = 1/d (0 if d == 0); q = min(15, trunc((x - min) * id + 0.5)); m = min
    Q8_0  d = max|x| / 127; id = 1/d (0 if d == 0); q = roundf(x * id)   (halves away from zero)

id is computed from the float32 d before d is rounded to fp16, as in the C code. Dequantization computes
q * d + m with two float32 roundings; a llama.cpp build that fuses it into one FMA can differ by one ulp.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_type, fail
from .qtensor import check_word

BLOCK = 32
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}
F32 = np.float32


def bits_per_weight(fmt: str) -> float:
    """Storage bits per weight of a llama.cpp block format, scales included."""
    check_word("fmt", fmt, tuple(BLOCK_BYTES))
    return 8 * BLOCK_BYTES[fmt] / BLOCK


def float32_blocks(x, block: int = BLOCK) -> tuple[np.ndarray, tuple[int, ...]]:
    """x (float32, finite, not empty, last dimension a multiple of `block`) as rows of `block` values, and its shape.
    The input check of every block format here and in nf4.py."""
    check_type("x", x, np.ndarray, "a float32 numpy array")
    if x.dtype != np.float32:
        fail("x", x.dtype, "a float32 numpy array", TypeError)
    if x.ndim < 1 or x.size == 0 or x.shape[-1] % block:
        fail("x", x.shape, f"a non-empty float32 array whose last dimension is a positive multiple of {block} (its "
             "shape)")
    bad = int((~np.isfinite(x)).sum())
    if bad:
        fail("x", f"{bad} NaN or inf of {x.size} values", "finite (no NaN or inf)")
    return x.reshape(-1, block), x.shape


def _fp16(v: np.ndarray, what: str) -> np.ndarray:
    """float32 -> fp16 bytes (little-endian), round to nearest even like GGML_FP32_TO_FP16."""
    with np.errstate(over="ignore"):
        h = v.astype("<f2")
    if not np.isfinite(h).all():
        raise ValueError(f"a block {what} of {float(np.abs(v).max()):.4g} overflows fp16 (max 65504)")
    return h.view(np.uint8).reshape(-1, 2)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """q [blocks, 32] in 0..15 -> qs [blocks, 16] with q[j] low and q[j + 16] high."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _out(parts: list[np.ndarray], shape: tuple[int, ...], fmt: str) -> np.ndarray:
    return np.concatenate(parts, axis=1).reshape(*shape[:-1], shape[-1] // BLOCK * BLOCK_BYTES[fmt])


def _inverse(d: np.ndarray) -> np.ndarray:
    safe = np.where(d != 0, d, F32(1))
    return np.where(d != 0, F32(1) / safe, F32(0)).astype(F32)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """float32 [..., n] (n % 32 == 0) -> uint8 [..., n / 32 * 18] Q4_0 blocks."""
    xb, shape = float32_blocks(x)
    amax = np.abs(xb).max(axis=1)
    first = np.abs(xb).argmax(axis=1)  # argmax returns the first of equal values, like the C loop
    vmax = np.where(amax > 0, xb[np.arange(len(xb)), first], F32(0))  # all zeros: max stays +0.0
    d = (vmax / F32(-8)).astype(F32)
    q = np.minimum(15, np.trunc(xb * _inverse(d)[:, None] + F32(8.5)).astype(np.int8))
    return _out([_fp16(d, "scale"), _nibbles(q)], shape, "q4_0")


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    """float32 [..., n] (n % 32 == 0) -> uint8 [..., n / 32 * 20] Q4_1 blocks."""
    xb, shape = float32_blocks(x)
    rows = np.arange(len(xb))  # the first of equal values, like the C loop (it matters for -0.0 vs +0.0)
    lo, hi = xb[rows, xb.argmin(axis=1)], xb[rows, xb.argmax(axis=1)]
    d = ((hi - lo) / F32(15)).astype(F32)
    q = np.minimum(15, np.trunc((xb - lo[:, None]) * _inverse(d)[:, None] + F32(0.5)).astype(np.int8))
    return _out([_fp16(d, "scale"), _fp16(lo, "min"), _nibbles(q)], shape, "q4_1")


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 [..., n] (n % 32 == 0) -> uint8 [..., n / 32 * 34] Q8_0 blocks."""
    xb, shape = float32_blocks(x)
    d = (np.abs(xb).max(axis=1) / F32(127)).astype(F32)
    v = (xb * _inverse(d)[:, None]).astype(np.float64)  # float64: |v| + 0.5 is exact, as roundf needs
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    return _out([_fp16(d, "scale"), q.view(np.uint8)], shape, "q8_0")


def _split(blocks, fmt: str) -> tuple[np.ndarray, tuple[int, ...]]:
    check_type("blocks", blocks, np.ndarray, "a uint8 numpy array")
    if blocks.dtype != np.uint8:
        fail("blocks", blocks.dtype, "a uint8 numpy array", TypeError)
    size = BLOCK_BYTES[fmt]
    if blocks.ndim < 1 or blocks.shape[-1] == 0 or blocks.shape[-1] % size:
        raise ValueError(f"blocks' last dimension must be a positive multiple of {size} ({fmt} block bytes), "
                         f"got shape {blocks.shape}")
    return np.ascontiguousarray(blocks).reshape(-1, size), blocks.shape[:-1] + (blocks.shape[-1] // size * BLOCK,)


def _half(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2")[:, 0].astype(F32)


def _unnibble(qs: np.ndarray) -> np.ndarray:
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(F32)


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """uint8 [..., k * 18] Q4_0 blocks -> float32 [..., k * 32]."""
    b, shape = _split(blocks, "q4_0")
    return ((_unnibble(b[:, 2:]) - F32(8)) * _half(b[:, :2])[:, None]).reshape(shape)


def dequantize_q4_1(blocks: np.ndarray) -> np.ndarray:
    """uint8 [..., k * 20] Q4_1 blocks -> float32 [..., k * 32]."""
    b, shape = _split(blocks, "q4_1")
    return (_unnibble(b[:, 4:]) * _half(b[:, :2])[:, None] + _half(b[:, 2:4])[:, None]).reshape(shape)


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """uint8 [..., k * 34] Q8_0 blocks -> float32 [..., k * 32]."""
    b, shape = _split(blocks, "q8_0")
    return (b[:, 2:].view(np.int8).astype(F32) * _half(b[:, :2])[:, None]).reshape(shape)
