"""Nibble packing against a byte-by-byte loop written independently, both layouts, and its bad input."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.quant import packing

from ..refusals import assert_refused


def brute_pack(codes: list[int], layout: str) -> bytes:
    n = [c + 8 for c in codes]
    if layout == "adjacent":
        n += [8] * (len(n) % 2)
        return bytes(n[i] | n[i + 1] << 4 for i in range(0, len(n), 2))
    return bytes(n[b + j] | n[b + j + 16] << 4 for b in range(0, len(n), 32) for j in range(16))


@settings(max_examples=60, deadline=None)
@given(codes=st.lists(st.integers(-8, 7), min_size=1, max_size=96), layout=st.sampled_from(["adjacent", "llama"]))
def test_pack_matches_byte_loop_and_unpacks(codes, layout):
    if layout == "llama":
        codes = (codes * 32)[:32 * max(1, len(codes) // 32)]
    t = torch.tensor(codes, dtype=torch.int8)
    packed = packing.pack_int4(t, layout)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(len(codes) / 2)
    assert bytes(packed.tolist()) == brute_pack(codes, layout)
    assert packing.unpack_int4(packed, len(codes), layout).tolist() == codes


def test_llama_order_puts_code_j_and_j_plus_16_in_byte_j():
    codes = torch.arange(32, dtype=torch.int8) % 16 - 8  # -8 .. 7, twice: byte j holds n = j twice
    assert packing.pack_int4(codes, "llama").tolist() == [j | j << 4 for j in range(16)]
    assert packing.pack_int4(codes).tolist()[:2] == [0 | 1 << 4, 2 | 3 << 4]


def test_pack_reads_any_shape_row_major():
    codes = torch.tensor([[-8, 7], [0, -1]], dtype=torch.int8)
    assert packing.pack_int4(codes).tolist() == [0 | 15 << 4, 8 | 7 << 4]
    assert packing.pack_int4(codes.to(torch.int64)).tolist() == [0 | 15 << 4, 8 | 7 << 4]


@pytest.mark.parametrize("call, error, message", [
    (lambda: packing.pack_int4(torch.tensor([-9, 7])), ValueError,
     r"codes must be in \[-8, 7\], got values in \[-9, 7\]"),
    (lambda: packing.pack_int4(torch.tensor([0.5, 1.0])), TypeError,
     "codes must be an integer tensor, got torch.float32"),
    (lambda: packing.pack_int4([1, 2]), TypeError, "codes must be an integer torch.Tensor, got list"),
    (lambda: packing.pack_int4(torch.zeros(0, dtype=torch.int8)), ValueError,
     r"non-empty integer tensor, got shape \(0,\)"),
    (lambda: packing.pack_int4(torch.zeros(30, dtype=torch.int8), "llama"), ValueError, "multiple of 32 codes, got 30"),
    (lambda: packing.pack_int4(torch.zeros(2, dtype=torch.int8), "ggml"), ValueError,
     r"layout must be one of \('adjacent', 'llama'\), got 'ggml'"),
    (lambda: packing.pack_int4(torch.zeros(2, dtype=torch.int8), 0), TypeError, "layout must be one of"),
    (lambda: packing.unpack_int4(torch.zeros(2, dtype=torch.uint8), 5), ValueError,
     "numel must be 3 or 4 for 2 packed bytes, got 5"),
    (lambda: packing.unpack_int4(torch.zeros(2, dtype=torch.uint8), 4.0), TypeError, "numel must be an int, 3 or 4"),
    (lambda: packing.unpack_int4(torch.zeros(2, dtype=torch.int8), 4), TypeError, "packed must be a uint8"),
    (lambda: packing.unpack_int4(torch.zeros(4, dtype=torch.uint8), 8, "llama"), ValueError,
     "layout 'llama' needs a multiple of 32 codes, got numel=8"),
])
def test_bad_input_is_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("value, dtype", [(65539, torch.int32), (-65536, torch.int32), (2 ** 40, torch.int64),
                                          (8, torch.int8), (200, torch.uint8), (-9, torch.int16)])
def test_out_of_range_codes_are_refused_before_any_cast(value, dtype):
    # 65539 = 65536 + 3 would wrap to code 3 if the codes were cast to int16 first
    codes = torch.tensor([0, value], dtype=dtype)
    with pytest.raises(ValueError, match=r"^codes must be in \[-8, 7\], "
                                         rf"got values in \[{min(0, value)}, {max(0, value)}\]$"):
        packing.pack_int4(codes)


def test_tensors_without_data_or_bytes_are_refused_by_name():
    assert_refused(lambda: packing.pack_int4(torch.empty(2, dtype=torch.int8, device="meta")), ValueError, "codes",
                   torch.device("meta"), "a tensor with data")
    empty = torch.empty(0, dtype=torch.uint8)
    assert_refused(lambda: packing.unpack_int4(empty, 0), ValueError, "packed", empty, "a non-empty uint8 tensor")
    assert_refused(lambda: packing.unpack_int4(torch.zeros(1, dtype=torch.uint8), True), TypeError, "numel", True,
                   "an int, 1 or 2")
