"""The compiled loops of the INT4 GEMV ladder (notebook 03, section 8; labkit.quant.kernels calls them).

Every loop reads lab 03's packed codes as kernels.py prepares them ("adjacent" nibbles, one row after another,
n = code + 8 in 0..15) and an x split into its even and odd columns, so that the low and high nibble of byte i
meet x[2i] and x[2i+1] at the same index i of two contiguous arrays:

    packed[n, i] = n[2i] | n[2i+1] << 4          x_even[m, i] = x[m, 2i]     x_odd[m, i] = x[m, 2i+1]
    y[m, n] = sum_i (lo_i - 8 - z) s x_even[m, i] + (hi_i - 8 - z) s x_odd[m, i]     (z, s: i's group)

Compiled with numba by labkit.jit, the course's one switch (LABKIT_JIT=0, or no numba, runs the same functions
as plain Python: slow, but the same results; the tests call `.py_func` to check both). fastmath lets LLVM
reorder the float sums so that they use SIMD registers: results differ from the reference in the last digits,
never more (the tests' tolerance). The parallel loops' thread count is labkit.jit's (max_threads, get_threads,
set_threads; kernels.threads sets it for a block).
"""

from __future__ import annotations

import numpy as np

from ..jit import ENABLED, get_threads, max_threads, njit, prange, set_threads

__all__ = ["EIGHT", "ENABLED", "blocked", "compiled", "fused", "get_threads", "integer", "max_threads", "set_threads"]

EIGHT = np.float32(8.0)  # the nibble's offset (code = nibble - 8), as float32 so that sums stay in float32


def compiled(parallel: bool = False, fastmath: bool = True):
    """labkit.jit.njit(parallel=parallel, fastmath=fastmath), cached by numba beside this file: compiled when
    labkit.jit.ENABLED, else the function itself with .py_func = itself."""
    return njit(parallel=parallel, fastmath=fastmath)


@compiled()
def fused(x_even, x_odd, packed, scale, zero, y):
    """Rung 3: row by row, group by group, unpack each byte's two codes, dequantize them, multiply and
    accumulate in a register. x_even, x_odd float32 [M, K/2]; packed uint8 [N, K/2]; scale, zero float32
    [N, G]; y float32 [M, N] (written)."""
    m_rows, half = x_even.shape
    n_rows, groups = scale.shape
    pairs = half // groups  # byte pairs per group: group_len / 2
    for m in range(m_rows):
        for n in range(n_rows):
            row, xe, xo = packed[n], x_even[m], x_odd[m]
            acc = np.float32(0.0)
            for g in range(groups):
                s, offset = scale[n, g], EIGHT + zero[n, g]  # code = nibble - 8
                for i in range(g * pairs, (g + 1) * pairs):
                    byte = np.int32(row[i])  # widened once: bit operations on uint8 kept numba from SIMD
                    w_lo = (np.float32(byte & 15) - offset) * s  # dequantize: (code - zero point) * scale
                    w_hi = (np.float32(byte >> 4) - offset) * s
                    acc += w_lo * xe[i] + w_hi * xo[i]
            y[m, n] = acc


@compiled(parallel=True)
def blocked(x_even, x_odd, x_sums, packed, scale, zero, rows_per_task, y):
    """Rung 4: tasks of `rows_per_task` output rows spread over the threads (prange); per group the sums of
    nibble * x (low and high nibbles apart), then scale * (sums - (8 + zero) * sum of x over the group): two
    float operations per weight instead of four. x_sums float32 [M, G] (x summed over each group).
    Measured here (4096 x 4096, 1 thread): one sum for both nibbles, or the inner loop written as
    range(g * pairs, (g + 1) * pairs), ran 4-5x slower: numba's LLVM then left the loop scalar."""
    m_rows, half = x_even.shape
    n_rows, groups = scale.shape
    pairs = half // groups
    tasks = (n_rows + rows_per_task - 1) // rows_per_task
    for t in prange(tasks):
        for n in range(t * rows_per_task, min((t + 1) * rows_per_task, n_rows)):
            row = packed[n]
            for m in range(m_rows):
                xe, xo = x_even[m], x_odd[m]
                acc = np.float32(0.0)
                for g in range(groups):
                    base = g * pairs
                    low, high = np.float32(0.0), np.float32(0.0)  # two sums: each stays in a SIMD register
                    for j in range(pairs):  # 0..pairs with an offset: a loop numba's LLVM turns into SIMD
                        byte = np.int32(row[base + j])
                        low += np.float32(byte & 15) * xe[base + j]
                        high += np.float32(byte >> 4) * xo[base + j]
                    acc += scale[n, g] * (low + high - (EIGHT + zero[n, g]) * x_sums[m, g])
                y[m, n] = acc


@compiled(parallel=True)
def integer(xq_even, xq_odd, x_scale, xq_sums, packed, scale, zero, rows_per_task, y):
    """Rung 5: activations as int8 codes in blocks (x ~ xq * x_scale[block]); per block an int32 sum of
    nibble * xq, then one float step per block: x_scale * scale * (sum - (8 + zero) * sum of xq).
    xq_even, xq_odd int8 [M, K/2]; x_scale float32 [M, B]; xq_sums float32 [M, B] (integer-valued);
    B blocks, each inside one weight group."""
    m_rows, half = xq_even.shape
    n_rows, groups = scale.shape
    blocks = x_scale.shape[1]
    pairs = half // blocks  # byte pairs per activation block
    per_group = blocks // groups
    tasks = (n_rows + rows_per_task - 1) // rows_per_task
    for t in prange(tasks):
        for n in range(t * rows_per_task, min((t + 1) * rows_per_task, n_rows)):
            row = packed[n]
            for m in range(m_rows):
                qe, qo = xq_even[m], xq_odd[m]
                acc = np.float32(0.0)
                for b in range(blocks):
                    g = b // per_group
                    base = b * pairs
                    low, high = np.int32(0), np.int32(0)
                    for j in range(pairs):
                        byte = np.int32(row[base + j])
                        low += (byte & 15) * np.int32(qe[base + j])
                        high += (byte >> 4) * np.int32(qo[base + j])
                    isum = np.float32(low + high)  # exact: |sum| <= 15 * 127 * 32 < 2**24
                    acc += x_scale[m, b] * scale[n, g] * (isum - (EIGHT + zero[n, g]) * xq_sums[m, b])
                y[m, n] = acc
