"""llama.cpp blocks against gguf-py (llama.cpp's own numpy reference, `gguf.quants`, which llama.cpp tests
against its C quantizers), against a per-element re-implementation of the C loops (struct layout, Python
floats rounded to float32 after every operation, as the C code does) and against bytes worked out by hand."""
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from labkit.quant import formats as qf

from ..refusals import assert_refused


def f32(v: float) -> float:
    """Round a Python float to float32 (the C code computes in float)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def brute_q4_0(values) -> bytes:
    out = b""
    for b in range(0, len(values), 32):
        x = [f32(float(v)) for v in values[b:b + 32]]
        amax, vmax = 0.0, 0.0
        for v in x:
            if amax < abs(v):
                amax, vmax = abs(v), v
        d = f32(vmax / -8.0)
        inv = f32(1.0 / d) if d != 0 else 0.0
        q = [min(15, int(f32(f32(v * inv) + 8.5))) for v in x]
        out += struct.pack("<e", d) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    return out


def brute_q4_1(values) -> bytes:
    out = b""
    for b in range(0, len(values), 32):
        x = [f32(float(v)) for v in values[b:b + 32]]
        lo, hi = min(x), max(x)
        d = f32(f32(hi - lo) / 15.0)
        inv = f32(1.0 / d) if d != 0 else 0.0
        q = [min(15, int(f32(f32(f32(v - lo) * inv) + 0.5))) for v in x]
        out += struct.pack("<ee", d, lo) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    return out


def brute_q8_0(values) -> bytes:
    out = b""
    for b in range(0, len(values), 32):
        x = [f32(float(v)) for v in values[b:b + 32]]
        d = f32(max(abs(v) for v in x) / 127.0)
        inv = f32(1.0 / d) if d != 0 else 0.0
        q = []
        for v in x:
            t = f32(v * inv)
            q.append(int(math.copysign(math.floor(abs(t) + 0.5), t)))  # C roundf: halves away from zero
        out += struct.pack("<e", d) + struct.pack("<32b", *q)
    return out


def brute_dequant(blocks: bytes, fmt: str) -> list[float]:
    size, out = qf.BLOCK_BYTES[fmt], []
    for b in range(0, len(blocks), size):
        blk = blocks[b:b + size]
        d = struct.unpack("<e", blk[:2])[0]
        if fmt == "q8_0":
            out += [f32(q * d) for q in struct.unpack("<32b", blk[2:])]
            continue
        m = struct.unpack("<e", blk[2:4])[0] if fmt == "q4_1" else 0.0
        qs = blk[4:] if fmt == "q4_1" else blk[2:]
        q = [qs[j] & 15 for j in range(16)] + [qs[j] >> 4 for j in range(16)]
        out += [f32(f32(v * d) + m) if fmt == "q4_1" else f32((v - 8) * d) for v in q]
    return out


FORMATS = {"q4_0": (qf.quantize_q4_0, qf.dequantize_q4_0, brute_q4_0),
           "q4_1": (qf.quantize_q4_1, qf.dequantize_q4_1, brute_q4_1),
           "q8_0": (qf.quantize_q8_0, qf.dequantize_q8_0, brute_q8_0)}


def tricky_rows() -> np.ndarray:
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(64), rng.standard_normal(64) * 1e-3 + 5, np.zeros(64), -np.zeros(64),
            np.full(64, 0.37), np.tile([0.0, -0.0], 32), np.tile([-0.0, 0.0], 32),
            np.round(rng.standard_normal(64) * 4) / 2,  # many exact halves: ties
            rng.standard_cauchy(64), np.where(np.arange(64) % 2, -1.0, 1.0)]  # equal |max|, both signs
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_bytes_match_the_independent_implementation(fmt):
    quantize, dequantize, brute = FORMATS[fmt]
    x = tricky_rows()
    blocks = quantize(x)
    assert blocks.dtype == np.uint8 and blocks.shape == (10, 2 * qf.BLOCK_BYTES[fmt])
    for row, got in zip(x, blocks):
        assert got.tobytes() == brute(row)
    deq = dequantize(blocks)
    assert deq.dtype == np.float32 and deq.shape == x.shape
    assert deq.reshape(-1).tolist() == brute_dequant(blocks.tobytes(), fmt)


@settings(max_examples=40, deadline=None)
@given(fmt=st.sampled_from(sorted(FORMATS)),
       values=st.lists(st.floats(-9000, 9000, width=32), min_size=32, max_size=32),
       scale=st.sampled_from([1.0, 1e-3, 7.0]))
def test_bytes_match_on_random_blocks(fmt, values, scale):
    quantize, _, brute = FORMATS[fmt]
    x = (np.array(values, dtype=np.float32) * np.float32(scale)).astype(np.float32)
    assert quantize(x).tobytes() == brute(x)


def test_golden_bytes_worked_out_by_hand():
    # Q4_0, x[j] = j - 16: largest |x| is x[0] = -16, so d = -16 / -8 = 2 (fp16 0x4000) and id = 0.5;
    # q[j] = trunc((j - 16) / 2 + 8.5) = floor((j + 1) / 2), capped at 15; byte j = q[j] | q[j + 16] << 4.
    x = np.arange(32, dtype=np.float32) - 16
    expected = bytes.fromhex("0040" "8091 91a2 a2b3 b3c4 c4d5 d5e6 e6f7 f7f8".replace(" ", ""))
    assert qf.quantize_q4_0(x).tobytes() == expected
    # Q4_1, x[j] = j / 2 - 4 (x[31] = 11): min -4 (fp16 0xc400), d = 15 / 15 = 1 (0x3c00), (x - min) = j / 2:
    # the same codes as above, q[31] = trunc(15 + 0.5) = 15.
    x = np.arange(32, dtype=np.float32) / 2 - 4
    x[31] = 11
    expected = bytes.fromhex("003c" "00c4" "8091 91a2 a2b3 b3c4 c4d5 d5e6 e6f7 f7f8".replace(" ", ""))
    assert qf.quantize_q4_1(x).tobytes() == expected
    # Q8_0, x = [-127, 2.5, -2.5, 3, 4, ..., 31]: d = 127 / 127 = 1, and roundf sends halves away from zero:
    # 2.5 -> 3 (0x03) and -2.5 -> -3 (0xfd), where numpy's round-half-even would give 2 and -2.
    x = np.arange(32, dtype=np.float32)
    x[:3] = [-127, 2.5, -2.5]
    expected = bytes.fromhex("003c" "81" "03" "fd") + bytes(range(3, 32))
    assert qf.quantize_q8_0(x).tobytes() == expected
    # An all-zero block: max stays +0.0, so d = 0 / -8 = -0.0 (fp16 0x8000), and every code is 8.
    assert qf.quantize_q4_0(np.zeros(32, np.float32)).tobytes() == bytes.fromhex("0080") + bytes([0x88]) * 16


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_error_is_within_one_step(fmt):
    quantize, dequantize, _ = FORMATS[fmt]
    x = np.random.default_rng(1).standard_normal((16, 256)).astype(np.float32)
    err = np.abs(dequantize(quantize(x)) - x).reshape(-1, 32).max(axis=1)
    xb = x.reshape(-1, 32)
    step = {"q4_0": np.abs(xb).max(1) / 8, "q4_1": (xb.max(1) - xb.min(1)) / 15, "q8_0": np.abs(xb).max(1) / 127}[fmt]
    bound = step * (1 if fmt == "q4_0" else 0.5) * 1.01 + 1e-3 * np.abs(xb).max(1)  # fp16 rounding of d and m
    assert (err <= bound).all()


def test_bits_per_weight():
    assert [qf.bits_per_weight(f) for f in ("q4_0", "q4_1", "q8_0")] == [4.5, 5.0, 8.5]
    with pytest.raises(ValueError, match=r"fmt must be one of \('q4_0', 'q4_1', 'q8_0'\), got 'q5_k'"):
        qf.bits_per_weight("q5_k")
    with pytest.raises(TypeError, match="fmt must be one of"):
        qf.bits_per_weight(4)
    for bad in (["q4_0"], None, b"q4_0"):
        assert_refused(lambda: qf.bits_per_weight(bad), TypeError, "fmt", bad, "one of ('q4_0', 'q4_1', 'q8_0')")


@pytest.mark.parametrize("fmt", FORMATS)
def test_bad_input_is_refused_clearly(fmt):
    quantize, dequantize, _ = FORMATS[fmt]
    with pytest.raises(TypeError, match="x must be a float32 numpy array, got dtype"):
        quantize(np.zeros(32))
    with pytest.raises(TypeError, match="x must be a float32 numpy array, got list"):
        quantize([0.0] * 32)
    assert_refused(lambda: quantize(np.zeros(33, np.float32)), ValueError, "x", (33,), "a positive multiple of 32")
    assert_refused(lambda: quantize(np.zeros(0, np.float32)), ValueError, "x", (0,), "a non-empty float32 array")
    with pytest.raises(ValueError, match="finite"):
        quantize(np.full(32, np.nan, np.float32))
    with pytest.raises(ValueError, match="overflows fp16"):
        quantize(np.full(32, 1e9, np.float32))
    with pytest.raises(ValueError, match=f"multiple of {qf.BLOCK_BYTES[fmt]}"):
        dequantize(np.zeros(qf.BLOCK_BYTES[fmt] + 1, np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        dequantize(np.zeros(qf.BLOCK_BYTES[fmt], np.int8))


GGUF_TYPES = {"q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1,
              "q8_0": GGMLQuantizationType.Q8_0}


def gguf_rows() -> np.ndarray:
    rng = np.random.default_rng(1)
    rows = [rng.standard_normal((64, 256)), rng.random((16, 256)), rng.standard_normal((16, 256)) * 1e-5,
            rng.standard_normal((16, 256)) * 3e3, np.round(rng.standard_normal((16, 256)) * 8) / 4,  # ties
            rng.integers(-8, 8, (16, 256)), rng.standard_cauchy((16, 256)) * 0.01]
    rows = [r.astype(np.float32).reshape(-1, 64) for r in rows] + [tricky_rows()]
    return np.concatenate(rows)


@pytest.mark.parametrize("fmt", FORMATS)
def test_bytes_match_gguf_py(fmt):
    quantize, dequantize, _ = FORMATS[fmt]
    x = gguf_rows()
    ours, theirs = quantize(x), gguf_quantize(x, GGUF_TYPES[fmt])
    assert ours.shape == theirs.shape
    # blocks made only of signed zeros (-0.0 and +0.0) may differ in the sign bit of a zero scale or min:
    # gguf-py takes them from np.max/np.min, we follow the C loop (see test_signed_zero_blocks_follow_the_c_loop)
    blocks = x.reshape(-1, 32)
    size = qf.BLOCK_BYTES[fmt]
    zero_only = (blocks == 0).all(axis=1)
    assert zero_only.sum() < len(blocks) // 10
    np.testing.assert_array_equal(ours.reshape(-1, size)[~zero_only], theirs.reshape(-1, size)[~zero_only])
    np.testing.assert_array_equal(dequantize(ours), gguf_dequantize(ours, GGUF_TYPES[fmt]))
    np.testing.assert_array_equal(dequantize(theirs), gguf_dequantize(theirs, GGUF_TYPES[fmt]))


def test_signed_zero_blocks_follow_the_c_loop():
    # quantize_row_q4_0_ref keeps max = +0.0f when no |x| exceeds 0, so d = +0.0 / -8 = -0.0 (bytes 00 80);
    # gguf-py takes x[argmax |x|] = x[0], which gives d = +0.0 when x[0] is -0.0. Values are equal either way.
    x = np.tile(np.array([-0.0, 0.0], dtype=np.float32), 16)
    assert qf.quantize_q4_0(x)[:2].tobytes() == bytes([0x00, 0x80]) == brute_q4_0(x)[:2]
    assert gguf_quantize(x, GGUF_TYPES["q4_0"])[:2].tobytes() == bytes([0x00, 0x00])
    # quantize_row_q4_1_ref's loop keeps the first of equal values: min = x[0] = -0.0
    assert qf.quantize_q4_1(x)[2:4].tobytes() == bytes([0x00, 0x80]) == brute_q4_1(x)[2:4]
    for fmt in FORMATS:
        np.testing.assert_array_equal(FORMATS[fmt][1](FORMATS[fmt][0](x)), np.zeros(32, np.float32))
