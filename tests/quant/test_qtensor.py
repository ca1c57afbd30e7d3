"""labkit.quant.qtensor against a per-group loop in numpy float32 (written independently), plus invariants
and the argument checks every module of labkit.quant shares."""
import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from labkit.quant import qtensor as quant
from labkit.quant.packing import pack_int4

from ..refusals import assert_refused


def brute_quantize(w: np.ndarray, bits: int, scheme: str, group: int):
    """Codes, scales, zero points and the dequantized matrix, one group at a time (float32 arithmetic)."""
    qmin, qmax = -2 ** (bits - 1), 2 ** (bits - 1) - 1
    out, inp = w.shape
    codes = np.zeros((out, inp), np.int64)
    deq = np.zeros((out, inp), np.float32)
    scales, zeros = np.zeros((out, inp // group), np.float32), np.zeros((out, inp // group), np.int64)
    for r in range(out):
        for gi in range(inp // group):
            x = w[r, gi * group:(gi + 1) * group].astype(np.float32)
            if scheme == "sym":
                a = np.float32(np.abs(x).max())
                s = a / np.float32(qmax) if a > 0 else np.float32(1)
                z = 0
            else:
                lo, hi = np.float32(x.min()), np.float32(x.max())
                s = (hi - lo) / np.float32(2 ** bits - 1)
                if s == 0:
                    s = np.float32(abs(lo)) if lo != 0 else np.float32(1)
                z = int(qmin - np.round(lo / s))
            for k in range(group):
                c = int(min(max(np.round(x[k] / s) + z, qmin), qmax))
                codes[r, gi * group + k] = c
                deq[r, gi * group + k] = np.float32(c - z) * s
            scales[r, gi], zeros[r, gi] = s, z
    return codes, scales, zeros, deq


@pytest.mark.parametrize("bits, scheme, group", [(4, "asym", 32), (4, "sym", 32), (8, "asym", 16),
                                                 (3, "sym", 64), (2, "asym", 8), (4, "asym", 64)])
def test_matches_the_per_group_loop(bits, scheme, group):
    g = torch.Generator().manual_seed(bits * 100 + group)
    w = torch.randn(6, 64, generator=g) * 0.05 + torch.linspace(-0.1, 0.2, 64)  # shifted columns
    q = quant.quantize(w, bits, scheme, group)
    codes, scales, zeros, deq = brute_quantize(w.numpy(), bits, scheme, group)
    assert q.codes.dtype == torch.int8 and q.codes.shape == w.shape
    assert np.array_equal(q.codes.numpy(), codes)
    assert np.array_equal(q.scale.numpy(), scales)
    assert (q.zero is None) == (scheme == "sym")
    if q.zero is not None:
        assert q.zero.dtype == torch.int32 and np.array_equal(q.zero.numpy(), zeros)
    assert np.array_equal(q.dequantize().numpy(), deq)
    assert (q.bits, q.group_size, q.scheme, q.shape) == (bits, group, scheme, (6, 64))


def test_channel_and_tensor_are_groups_of_a_row_and_of_everything():
    w = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    for scheme in quant.SCHEMES:
        ch = quant.quantize(w, 4, scheme, "channel")
        assert ch.scale.shape == (8, 1) and ch.group_len == 32
        assert torch.equal(ch.dequantize(), quant.quantize(w, 4, scheme, 32).dequantize())
        t = quant.quantize(w, 4, scheme, "tensor")
        assert t.scale.shape == (1, 1) and t.group_len == 256
        flat = quant.quantize(w.reshape(1, -1), 4, scheme, 256)
        assert torch.equal(t.dequantize(), flat.dequantize().reshape(8, 32))


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from(quant.BITS), scheme=st.sampled_from(quant.SCHEMES),
       group=st.sampled_from([1, 2, 4, 8, "channel", "tensor"]),
       values=st.lists(st.floats(-100, 100, width=32), min_size=16, max_size=16),
       shift=st.sampled_from([0.0, 3.0, -50.0]))
def test_round_trip_error_is_at_most_half_a_step(bits, scheme, group, values, shift):
    w = torch.tensor(values, dtype=torch.float32).reshape(2, 8) + shift
    q = quant.quantize(w, bits, scheme, group)
    qmin, qmax = -2 ** (bits - 1), 2 ** (bits - 1) - 1
    assert int(q.codes.min()) >= qmin and int(q.codes.max()) <= qmax
    assert (q.scale > 0).all()
    step = q.scale.reshape(-1)
    err = (q.dequantize() - w).abs()
    per_group = err.reshape(1, -1) if group == "tensor" else err.reshape(2, -1, q.group_len)
    worst = per_group.amax(-1).reshape(-1)
    assert (worst <= step / 2 * (1 + 1e-4) + 1e-5 * w.abs().max()).all()


def test_constant_and_zero_groups_round_trip_exactly():
    w = torch.tensor([[0.0] * 4 + [1.5] * 4 + [-2.0] * 4 + [7e-30] * 4])
    for scheme in quant.SCHEMES:
        q = quant.quantize(w, 4, scheme, 4)
        assert torch.equal(q.dequantize(), w), scheme


def test_asymmetric_wins_on_shifted_weights_and_is_close_on_centred_ones():
    g = torch.Generator().manual_seed(0)
    centred = torch.randn(64, 256, generator=g)
    shifted = torch.rand(64, 256, generator=g)  # all positive: half of the symmetric grid is wasted
    mse = {name: {s: quant.quant_error(w, quant.quantize(w, 4, s, 32).dequantize())["mse"] for s in quant.SCHEMES}
           for name, w in (("centred", centred), ("shifted", shifted))}
    assert mse["shifted"]["asym"] < 0.35 * mse["shifted"]["sym"]
    assert 0.6 * mse["centred"]["sym"] < mse["centred"]["asym"] < mse["centred"]["sym"]


def test_finer_groups_and_more_bits_lower_the_error():
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(2))
    w[3, 5] = 12.0  # one outlier hurts its whole group
    mse = [quant.quant_error(w, quant.quantize(w, 4, "asym", g).dequantize())["mse"]
           for g in (32, 64, 128, "tensor")]
    assert mse == sorted(mse)
    assert quant.quant_error(w, quant.quantize(w, 8).dequantize())["mse"] < mse[0] / 100


def test_quant_error_refuses_what_it_cannot_measure():
    w = torch.ones(2, 2)
    with pytest.raises(TypeError, match="w_hat must be a torch.Tensor, got list"):
        quant.quant_error(w, [[1.0, 1.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="w must be non-empty and finite, got shape \\(2, 2\\) with 1 non-finite"):
        quant.quant_error(torch.tensor([[1.0, float("inf")], [0.0, 0.0]]), w)
    with pytest.raises(ValueError, match="w_hat must be non-empty"):
        quant.quant_error(torch.ones(2), torch.zeros(0))


def test_quant_error_against_the_formulas():
    w = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    w_hat = torch.tensor([[1.0, -2.5, 3.0, 0.0]])
    e = quant.quant_error(w, w_hat)
    assert e["mse"] == pytest.approx((0.25 + 0.25) / 4)
    assert e["sqnr_db"] == pytest.approx(10 * math.log10((1 + 4 + 9 + 0.25) / 0.5))
    assert e["max_abs"] == 0.5
    assert quant.quant_error(w, w.clone())["sqnr_db"] == math.inf
    with pytest.raises(ValueError, match=r"w_hat must have w's shape \(1, 4\), got \(4,\)"):
        quant.quant_error(w, w_hat[0])


@pytest.mark.parametrize("kwargs, error, message", [
    ({"bits": 5}, ValueError, r"bits must be one of \(2, 3, 4, 8\) \(an int\), got 5"),
    ({"bits": 4.0}, TypeError, r"\(an int\), got 4.0"),
    ({"bits": "4"}, TypeError, r"\(an int\), got '4'"),
    ({"bits": True}, TypeError, r"\(an int\), got True"),
    ({"scheme": "affine"}, ValueError, r"scheme must be one of \('asym', 'sym'\), got 'affine'"),
    ({"scheme": None}, TypeError, r"scheme must be one of \('asym', 'sym'\), got None"),
    ({"group_size": 48}, ValueError, "group_size 48 must divide the input dimension 64"),
    ({"group_size": 0}, ValueError, "group_size must be a positive int, 'channel' or 'tensor', got 0"),
    ({"group_size": "row"}, ValueError, "got 'row'"),
    ({"group_size": 32.0}, TypeError, "group_size must be a positive int, 'channel' or 'tensor', got 32.0"),
    ({"group_size": True}, TypeError, "got True"),
])
def test_bad_arguments_are_named(kwargs, error, message):
    w = torch.randn(4, 64)
    before = w.clone()
    with pytest.raises(error, match=message):
        quant.quantize(w, **kwargs)
    assert torch.equal(w, before)  # the input is untouched, and still quantizes
    assert quant.quantize(w).shape == (4, 64)


@pytest.mark.parametrize("w, error, message", [
    (torch.tensor([[1.0, float("nan")]]), ValueError,
     r"w must be finite \(no NaN or inf; the first one is at index \(0, 1\)\), got nan"),
    (torch.tensor([[float("inf"), 1.0]]), ValueError, "got inf"),
    (torch.zeros(0, 4), ValueError, "non-empty 2-D"),
    (torch.zeros(8), ValueError, r"got shape \(8,\)"),
    (torch.zeros(2, 4, dtype=torch.int32), TypeError, "floating-point"),
    (np.zeros((2, 4)), TypeError, "torch.Tensor, got ndarray"),
])
def test_bad_weights_are_refused(w, error, message):
    with pytest.raises(error, match=message):
        quant.quantize(w, group_size=2)


def test_storage_accounting():
    assert quant.quantized_bytes(32, 4, 32, "sym") * 8 / 32 == 4.5        # Q4_0's size
    assert quant.quantized_bytes(32, 4, 32, "asym") * 8 / 32 == 5.0       # Q4_1's size
    assert quant.quantized_bytes(128, 4, 128, "asym") * 8 / 128 == 4.25
    w = torch.randn(16, 128)
    q = quant.quantize(w, 4, "asym", 32)
    assert q.nbytes() == 16 * 128 // 2 + 16 * 4 * 4 and q.bits_per_weight() == 5.0
    assert quant.quantize(w, 8, "sym", "tensor").nbytes() == 16 * 128 + 2
    with pytest.raises(ValueError, match="group_len must be a positive int, got 0"):
        quant.quantized_bytes(8, 4, 0)
    with pytest.raises(TypeError, match="numel must be a positive int, got 8.0"):
        quant.quantized_bytes(8.0, 4, 8)
    with pytest.raises(ValueError, match="scheme must be one of"):
        quant.quantized_bytes(8, 4, 8, "nf4")
    with pytest.raises(TypeError, match="scale_bytes must be a positive int"):
        q.nbytes(scale_bytes="2")


def test_range_overflow_raises_instead_of_nan():
    w = torch.tensor([[3e38, -3e38, 1.0, 0.0]])
    with pytest.raises(ValueError, match=r"range max - min in group \(0, 0\) .* overflows float32"):
        quant.quantize(w, 4, "asym", "channel")
    q = quant.quantize(w, 4, "sym", "channel")  # symmetric needs only max|w|: finite
    assert torch.isfinite(q.dequantize()).all()
    big = torch.tensor([[1.7e38, -1.7e38, 1.0, 0.0]])  # the widest range that still fits
    assert torch.isfinite(quant.quantize(big, 4, "asym", "channel").dequantize()).all()


@settings(max_examples=40, deadline=None)
@given(centre=st.floats(-1e6, 1e6), spread=st.floats(0, 1e-2), bits=st.sampled_from(quant.BITS))
@example(centre=7.545197780695276e-41, spread=0.0, bits=2)   # subnormal: float32 rounds the step below the floor
@example(centre=3e-39, spread=1e-40, bits=8)
def test_zero_points_are_bounded_and_near_constant_groups_stay_accurate(centre, spread, bits):
    g = torch.Generator().manual_seed(0)
    w = (centre + spread * torch.rand(3, 32, generator=g)).float()
    q = quant.quantize(w, bits, "asym", 32)
    assert int(q.zero.abs().max()) <= 2 ** 14 + 2 ** (bits - 1) + 1  # fits in int16, as counted
    err = (q.dequantize() - w).abs()
    # half a step, and the step is at most the larger of the range's and |w| / 2**14
    bound = torch.maximum((w.amax(1) - w.amin(1)) / (2 ** bits - 1), w.abs().amax(1) / 2 ** 14) / 2
    # plus float32's absolute resolution, which only matters for subnormal weights (below 1.2e-38): there the
    # stored step itself is off by up to 1.5 units of 2**-149, times |code - zero| <= 2**14 + 2**bits
    subnormal = (2 ** 14 + 2 ** bits) * 1.5 * 2.0 ** -149
    assert (err.amax(1) <= bound * (1 + 1e-3) + 1e-6 * w.abs().amax(1) + subnormal).all()


def test_storage_of_zero_points_is_counted_at_16_bits():
    w = torch.tensor([[1000.0, 1000.0001, 1000.0002, 1000.0] * 8])
    q = quant.quantize(w, 4, "asym", 32)
    assert -2 ** 15 <= int(q.zero.min()) and int(q.zero.max()) < 2 ** 15
    assert q.nbytes() == 16 + 2 + 2
    with pytest.raises(ValueError, match="zero_bytes must be at least 2 to hold zero points up to .*, got 1"):
        q.nbytes(zero_bytes=1)


def test_a_qtensor_checks_its_own_consistency():
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    q = quant.quantize(w, 4, "asym", 32)
    fields = dict(codes=q.codes, scale=q.scale, zero=q.zero, bits=4, group_size=32, scheme="asym", shape=(4, 64))
    assert quant.QTensor(**fields).group_len == 32
    bad = [({"codes": q.codes.int()}, TypeError, "codes must be an int8 tensor, got torch.int32"),
           ({"codes": q.codes[:, :32]}, ValueError, r"codes must have shape \(4, 64\), got \(4, 32\)"),
           ({"codes": q.codes.clone().fill_(8)}, ValueError,
            r"codes must be in \[-8, 7\] for 4 bits, got values in \[8, 8\]"),
           ({"scale": q.scale[:, :1]}, ValueError, r"scale must have shape \(4, 2\), got \(4, 1\)"),
           ({"scale": q.zero}, TypeError, "scale must be a float tensor"),
           ({"zero": None}, TypeError, "zero must be an integer torch.Tensor, got NoneType"),
           ({"zero": q.scale}, TypeError, "zero must be an integer tensor, got torch.float32"),
           ({"scheme": "sym"}, TypeError, "zero must be None for scheme 'sym', got Tensor"),
           ({"bits": 3.0}, TypeError, r"bits must be one of \(2, 3, 4, 8\) \(an int\), got 3.0"),
           ({"group_size": 48}, ValueError, "group_size must be a divisor of the input dimension 64, got 48"),
           ({"shape": [4, 64]}, ValueError, r"shape must be a tuple \(out, in\) of positive ints, got \[4, 64\]")]
    for change, error, message in bad:
        with pytest.raises(error, match=message):
            quant.QTensor(**{**fields, **change})


def test_dequantizing_rows_is_an_embedding_lookup():
    w = torch.randn(10, 32, generator=torch.Generator().manual_seed(6))
    for group in (8, "channel", "tensor"):
        q = quant.quantize(w, 4, "asym", group)
        rows = torch.tensor([[3, 0], [9, 3]])
        assert torch.equal(q.dequantize(rows), q.dequantize()[rows])
    with pytest.raises(ValueError, match=r"rows must be in \[0, 9\], got values in \[0, 10\]"):
        q.dequantize(torch.tensor([0, 10]))
    with pytest.raises(TypeError, match="rows must be an integer tensor, got torch.float32"):
        q.dequantize(torch.tensor([0.0]))
    with pytest.raises(TypeError, match="rows must be an integer torch.Tensor or None, got list"):
        q.dequantize([0, 1])


@pytest.mark.parametrize("check, good, bad_type, bad_value", [
    (quant.check_bits, 8, 8.0, 16),
    (quant.check_scheme, "sym", b"sym", "symmetric"),
    (quant.check_group_size, "channel", [32], -32),
])
def test_the_shared_setting_checks_follow_the_rule(check, good, bad_type, bad_value):
    assert check(good) == good
    with pytest.raises(TypeError):
        check(bad_type)
    with pytest.raises(ValueError):
        check(bad_value)


def test_repr_names_settings_shapes_and_dtypes_never_values():
    q = quant.quantize(torch.randn(16, 64, generator=torch.Generator().manual_seed(0)), 4, "asym", 32)
    assert repr(q) == ("QTensor(4-bit asym, group_size=32, codes [16, 64] int8, scale [16, 2] float32, "
                       "zero [16, 2] int32)")
    assert repr(quant.quantize(torch.ones(4, 8), 8, "sym", "channel")) == (
        "QTensor(8-bit sym, group_size='channel', codes [4, 8] int8, scale [4, 1] float32, no zero point)")


def test_exact_ties_round_half_to_even():
    # steps of exactly 1, so w / scale lands on .5: Python's round (halves to even) is the reference
    sym = [7.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5]  # max|w| = 7 = qmax: scale 1
    q = quant.quantize(torch.tensor([sym]), 4, "sym", "channel")
    assert float(q.scale) == 1.0 and q.codes[0].tolist() == [round(v) for v in sym]
    asym = [-1.5, 13.5, 0.5, 2.5, 4.5, -0.5, 11.5, 6.5]  # range 15 over 15 steps: scale 1; min / scale = -1.5
    q = quant.quantize(torch.tensor([asym]), 4, "asym", "channel")
    zero = -8 - round(-1.5)
    assert float(q.scale) == 1.0 and int(q.zero) == zero == -6
    assert q.codes[0].tolist() == [min(max(round(v) + zero, -8), 7) for v in asym]


def test_the_zero_point_floor_is_max_abs_over_2_to_the_14():
    # a near-constant group: its range / 15 is far below max|w| / 2**14, so the floor sets the step
    top = 1.0 + 2.0 ** -20  # exact in float32
    w = torch.tensor([[1.0, 1.0, 1.0, top] * 8])
    q = quant.quantize(w, 4, "asym", 32)
    step = top / 2 ** 14
    assert float(q.scale) == step
    assert int(q.zero) == -8 - round(1.0 / step) == -16392
    assert (q.dequantize() - w).abs().max() <= step / 2


@pytest.mark.parametrize("shape, bits, group, scheme, code_bytes", [
    ((3, 5), 4, 5, "sym", 8), ((1, 3), 4, 3, "asym", 2), ((3, 3), 3, 3, "sym", 4), ((1, 1), 2, 1, "sym", 1),
    ((1, 5), 8, 5, "asym", 5), ((5, 7), 4, "channel", "asym", 18)])
def test_bytes_of_odd_sizes_round_up(shape, bits, group, scheme, code_bytes):
    # code bytes worked out by hand: ceil(numel * bits / 8); 4-bit codes also against the packer's own bytes
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    q = quant.quantize(w, bits, scheme, group)
    groups = q.scale.numel()
    assert q.nbytes() == code_bytes + groups * (2 + (2 if scheme == "asym" else 0))
    if bits == 4:
        assert pack_int4(q.codes).numel() == code_bytes


def test_subnormal_symmetric_weights_keep_a_positive_step():
    for v in (1e-45, 3e-45, 1e-40):
        w = torch.tensor([[v, 0.0]])
        q = quant.quantize(w, 4, "sym", "channel")
        assert float(q.scale) > 0 and (q.dequantize() - w).abs().max() <= float(q.scale) / 2


def test_bad_input_of_every_function_is_refused_by_name():
    w = torch.randn(4, 32)
    q = quant.quantize(w)
    meta = torch.empty(4, 32, device="meta")
    assert_refused(lambda: quant.quantize(meta), ValueError, "w", torch.device("meta"), "a tensor with data")
    assert_refused(lambda: quant.quant_error(meta, meta), ValueError, "w", torch.device("meta"), "a tensor with data")
    assert_refused(lambda: quant.quant_error(torch.ones(2, dtype=torch.long), torch.ones(2)), TypeError, "w",
                   torch.long, "a floating-point tensor")
    assert_refused(lambda: quant.quant_error(w, torch.ones(4, 32, dtype=torch.cfloat)), TypeError, "w_hat",
                   torch.cfloat, "a floating-point tensor")
    assert_refused(lambda: quant.quantized_bytes(100, 4, 32, scale_bytes=1.5), TypeError, "scale_bytes", 1.5,
                   "a positive int")
    assert_refused(lambda: quant.quantized_bytes(100, 4, 32, zero_bytes=-1), ValueError, "zero_bytes", -1,
                   "a non-negative int")
    assert_refused(lambda: q.nbytes(scale_bytes=-2), ValueError, "scale_bytes", -2, "a positive int")
    assert_refused(lambda: q.bits_per_weight(zero_bytes=0), ValueError, "zero_bytes", 0, "a positive int")
    fields = dict(codes=q.codes, zero=q.zero, bits=4, group_size=32, scheme="asym", shape=(4, 32))
    for bad in (float("nan"), float("inf"), 0.0, -1.0):
        scale = q.scale.clone()
        scale[1, 0] = bad
        assert_refused(lambda: quant.QTensor(scale=scale, **fields), ValueError, "scale", bad, "finite and > 0")
    assert_refused(lambda: quant.QTensor(scale=torch.empty(4, 1, device="meta"), **fields), ValueError, "scale",
                   torch.device("meta"), "a tensor with data")
