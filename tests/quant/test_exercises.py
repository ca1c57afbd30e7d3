"""Notebook 03's exercises: each reference passes its own check, a wrong answer fails it, the notebook's
solutions (written out here independently, as a learner would) pass through the wrappers, and deliberate
mistakes get a [FAIL] line that names the learner's function, the case, the value, shape or dtype that
differs and its first differing element."""
import pytest
import torch

from labkit.quant import exercises as ex
from labkit.rng import Rng

from ..refusals import assert_refused

EXERCISES = [ex.ASYM_QUANTIZE, ex.PACK, ex.QUANTIZED_LINEAR, ex.FUSED_LOOP]


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_each_reference_passes_its_own_check(exercise, capsys):
    learner = lambda *a: exercise.reference(*a)  # noqa: E731
    assert exercise.check(learner) is learner
    assert capsys.readouterr().out.startswith("[PASS]")


def off_by_a_little(value):
    if isinstance(value, dict):
        last = list(value)[-1]
        return {k: off_by_a_little(v) if k == last else v for k, v in value.items()}
    return value + (1 if not value.is_floating_point() else 1e-3)


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_a_wrong_answer_fails(exercise, capsys):
    wrong = lambda *a: off_by_a_little(exercise.reference(*a))  # noqa: E731
    assert exercise.check(wrong) is exercise.reference
    assert capsys.readouterr().out.startswith("[FAIL]")


def test_a_stub_gets_the_reference(capsys):
    def stub(*args):
        raise NotImplementedError
    assert ex.QUANTIZED_LINEAR.check(stub) is ex.QUANTIZED_LINEAR.reference
    assert capsys.readouterr().out.startswith("[TODO]")


# --- the notebook's solutions -------------------------------------------------------------------------

def asym_quantize(w, bits, group_size, round_codes=torch.round):
    qmin, qmax = -2 ** (bits - 1), 2 ** (bits - 1) - 1
    groups = w.reshape(w.shape[0], -1, group_size)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scale = (hi - lo) / (qmax - qmin)
    zero = qmin - torch.round(lo / scale)
    codes = torch.clamp(round_codes(groups / scale[..., None]) + zero[..., None], qmin, qmax)
    return codes.to(torch.int8).reshape(w.shape), scale, zero.to(torch.int32)


def asym_dequantize(codes, scale, zero):
    out, inp = codes.shape
    shifted = codes.reshape(out, scale.shape[1], -1).to(torch.int32) - zero[..., None]
    return (shifted.float() * scale[..., None]).reshape(out, inp)


def pack(codes):
    n = (codes.reshape(-1).to(torch.int16) + 8).to(torch.uint8)
    return n[0::2] | (n[1::2] << 4)


def unpack(packed):
    return torch.stack([(packed & 0x0F).to(torch.int8) - 8, (packed >> 4).to(torch.int8) - 8], dim=1).reshape(-1)


def quantized_linear(x, q, tile):
    out, inp = q.shape
    y = torch.zeros(x.shape[0], out)
    for k0 in range(0, inp, tile):
        cols = torch.arange(k0, min(k0 + tile, inp))
        group = cols // q.group_len
        codes = q.codes[:, cols].to(torch.int32)
        if q.zero is not None:
            codes = codes - q.zero[:, group]
        y += x[:, cols] @ (codes.float() * q.scale[:, group]).T
    return y


def test_the_notebook_solutions_pass(capsys):
    checks = [(ex.asym_round_trip(asym_quantize, asym_dequantize), ex.ASYM_QUANTIZE),
              (ex.pack_round_trip(pack, unpack), ex.PACK), (quantized_linear, ex.QUANTIZED_LINEAR)]
    for fn, exercise in checks:
        assert exercise.check(fn) is fn
    out = capsys.readouterr().out.splitlines()
    assert out == ["[PASS] asym_quantize + asym_dequantize matches the reference on 1 fixed and 20 random cases.",
                   "[PASS] pack + unpack matches the reference on 3 fixed and 20 random cases.",
                   "[PASS] quantized_linear matches the reference on 5 fixed and 20 random cases."]


def fused_matvec(x, w, swap_nibbles=False):
    n_rows, half = w.packed.shape
    y = torch.zeros(n_rows)
    xs = x.tolist()
    for n in range(n_rows):
        acc = 0.0
        for i in range(half):
            byte = int(w.packed[n, i])
            lo, hi = (byte >> 4, byte & 15) if swap_nibbles else (byte & 15, byte >> 4)
            g = 2 * i // w.group_len
            s, z = float(w.scale[n, g]), float(w.zero[n, g])
            acc += (lo - 8 - z) * s * xs[2 * i] + (hi - 8 - z) * s * xs[2 * i + 1]
        y[n] = acc
    return y


def test_the_fused_loop_solution_passes(capsys):
    assert ex.FUSED_LOOP.check(fused_matvec) is fused_matvec
    assert capsys.readouterr().out == "[PASS] fused_matvec matches the reference on 2 fixed and 20 random cases.\n"


def test_swapped_nibbles_fail_on_the_first_case(capsys):
    swapped = lambda x, w: fused_matvec(x, w, swap_nibbles=True)  # noqa: E731
    assert ex.FUSED_LOOP.check(swapped) is ex.FUSED_LOOP.reference
    out = capsys.readouterr().out
    assert out.startswith("[FAIL] fused_matvec(tensor(shape [8], float32) [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], "
                          "Int4Weight([1, 8], group_len=8, packed [1, 4] uint8, scale and zero [1, 1] float32)) "), out


# --- deliberate mistakes and the [FAIL] line each one gets ------------------------------------------

BY_HAND_CALL = ("[FAIL] asym_quantize + asym_dequantize(tensor(shape [1, 8], float32) [[0.05, 0.2, 0.3, 0.45, 0.6, "
                "0.8, 1.1, 1.6]], 4, 8) ")
GOES_ON = " The notebook goes on with the reference."


def with_codes(dtype):
    def wrong(w, bits, group_size):
        codes, scale, zero = asym_quantize(w, bits, group_size)
        return codes.to(dtype), scale, zero
    return wrong


def float_zero(w, bits, group_size):
    codes, scale, zero = asym_quantize(w, bits, group_size)
    return codes, scale, zero.float()


def floor_instead_of_round(w, bits, group_size):
    return asym_quantize(w, bits, group_size, round_codes=torch.floor)


@pytest.mark.parametrize("quantize_fn, dequantize_fn, says", [
    (with_codes(torch.int32), asym_dequantize, "returned ['codes'] = dtype int32, expected int8." + GOES_ON),
    (float_zero, asym_dequantize, "returned ['zero'] = dtype float32, expected int32." + GOES_ON),
    (floor_instead_of_round, asym_dequantize,
     "returned ['codes'] = a [1, 8] int8 result whose first difference is at index (0, 1): -7, expected -6 "
     "(largest difference 1, 5 of 8 elements differ)." + GOES_ON),
    (lambda w, bits, group_size: asym_quantize(w, bits, group_size)[:2], asym_dequantize,
     "raised TypeError: asym_quantize must return a tuple (codes, scale, zero), got a tuple of 2; the notebook "
     "goes on with the reference."),
    (asym_quantize, lambda codes, scale, zero: asym_dequantize(codes, scale, torch.zeros_like(zero)),
     "returned ['asym_dequantize(codes, scale, zero)'] = a [1, 8] float32 result whose first difference is at "
     "index (0, 0): -0.8266667127609253, expected 0.0 (largest difference 0.827, 8 of 8 elements differ)." + GOES_ON),
], ids=["int32 codes", "float zero", "floor", "two values", "zero ignored"])
def test_asym_mistakes_are_named(quantize_fn, dequantize_fn, says, capsys):
    assert ex.ASYM_QUANTIZE.check(ex.asym_round_trip(quantize_fn, dequantize_fn)) is ex.ASYM_QUANTIZE.reference
    assert capsys.readouterr().out == BY_HAND_CALL + says + "\n"


@pytest.mark.parametrize("pack_fn, unpack_fn, says", [
    (lambda codes: pack(codes).to(torch.int16), unpack, "['pack(codes)'] = dtype int16, expected uint8."),
    (lambda codes: pack(codes.reshape(-1, 2).flip(1)), unpack,  # high nibble first
     "['pack(codes)'] = a [2] uint8 result whose first difference is at index (0,): 15 (0x0f), expected 240 "
     "(0xf0) (largest difference 225, 2 of 2 elements differ)."),
    (pack, lambda packed: unpack(packed).to(torch.int16), "['unpack(bytes)'] = dtype int16, expected int8."),
    (pack, lambda packed: unpack(packed).reshape(-1, 2),
     "['unpack(bytes)'] = tensor(shape [2, 2], int8) [[-8, 7], [0, -1]], expected shape [4]."),
], ids=["int16 bytes", "nibble order", "int16 codes", "2-D codes"])
def test_pack_mistakes_are_named_with_bytes_in_hex(pack_fn, unpack_fn, says, capsys):
    assert ex.PACK.check(ex.pack_round_trip(pack_fn, unpack_fn)) is ex.PACK.reference
    call = "[FAIL] pack + unpack(tensor(shape [4], int8) [-8, 7, 0, -1]) returned "
    assert capsys.readouterr().out == f"{call}{says}{GOES_ON}\n"


def tiled(x, q, tile, group_of=lambda q, cols: cols // q.group_len, zero_dtype=torch.int32, need_zero=False):
    """The solution with one decision made otherwise: how a column finds its group, the zero point's dtype, or a
    zero point taken for granted."""
    out, inp = q.shape
    y = torch.zeros(x.shape[0], out)
    for k0 in range(0, inp, tile):
        cols = torch.arange(k0, min(k0 + tile, inp))
        group = group_of(q, cols)
        codes = q.codes[:, cols]
        if need_zero or q.zero is not None:
            codes = codes - q.zero[:, group].to(zero_dtype)
        y += x[:, cols] @ (codes.float() * q.scale[:, group]).T
    return y


def one_group_per_tile(x, q, tile):
    return tiled(x, q, tile, lambda q, cols: torch.full_like(cols, int(cols[0]) // q.group_len))


def by_group_size(x, q, tile):
    return tiled(x, q, tile, lambda q, cols: cols // q.group_size)


def every_q_has_a_zero(x, q, tile):
    return tiled(x, q, tile, need_zero=True)


def zero_as_int8(x, q, tile):
    return tiled(x, q, tile, zero_dtype=torch.int8)


def whole_weight(x, q, tile):
    return x @ q.dequantize().T


def row_by_row(x, q, tile):
    """Each row's own scale row: right for every layout but per tensor, whose scale has one row."""
    out, inp = q.shape
    y = torch.zeros(x.shape[0], out)
    for n in range(out):
        for k0 in range(0, inp, tile):
            cols = torch.arange(k0, min(k0 + tile, inp))
            group = cols // q.group_len
            codes = q.codes[n, cols].to(torch.int32) - (0 if q.zero is None else q.zero[n, group])
            y[:, n] += x[:, cols] @ (codes.float() * q.scale[n, group])
    return y


CASE = {2: "(tensor(shape [2, 48], float32), QTensor(4-bit asym, group_size=16, codes [8, 48] int8, scale [8, 3] "
           "float32, zero [8, 3] int32), 32)",
        4: "(tensor(shape [2, 40], float32), QTensor(4-bit sym, group_size='channel', codes [6, 40] int8, scale [6, 1] "
           "float32, no zero point), 16)",
        5: "(tensor(shape [2, 24], float32), QTensor(8-bit asym, group_size='tensor', codes [4, 24] int8, scale [1, 1] "
           "float32, zero [1, 1] int32), 10)",
        1: "(tensor(shape [2, 64], float32), QTensor(4-bit asym, group_size=32, codes [16, 64] int8, scale [16, 2] "
           "float32, zero [16, 2] int32), 32)"}


@pytest.mark.parametrize("fn, case, says", [
    (one_group_per_tile, 2, " returned a [2, 8] float32 result whose first difference is at index (0, 0): "),
    (by_group_size, 4, " raised TypeError: "),
    (every_q_has_a_zero, 4, " raised TypeError: 'NoneType' object is not subscriptable"),
    (row_by_row, 5, " raised IndexError: "),
    (zero_as_int8, 5, " returned a [2, 4] float32 result whose first difference is at index (0, 0): "),
    (whole_weight, 1, " raised RuntimeError: q.dequantize() builds the whole float weight at once; this exercise "
                      "builds at most `tile` columns of it at a time"),
], ids=["one group per tile", "group_size as a number", "a zero point taken for granted", "scale row by row",
        "int8 zero point", "the whole weight"])
def test_quantized_linear_mistakes_fail_on_the_case_that_shows_them(fn, case, says, capsys):
    """Each mistake passes the cases before the one that shows it, and its [FAIL] line names that case (shapes,
    settings, tile) without the reference's code."""
    assert ex.QUANTIZED_LINEAR.check(fn) is ex.QUANTIZED_LINEAR.reference
    out = capsys.readouterr().out
    assert out.startswith(f"[FAIL] {fn.__name__}{CASE[case]}{says}"), out
    assert len(out) < 500 and "dequantize(q)" not in out


def test_quantized_linear_reference_is_the_dequantized_product_and_quantlinear_agrees():
    """The reference (float64, the whole dequantized weight) against QuantLinear's reference path, an independent
    implementation (packed nibbles, its own tiles), on every 4-bit fixed case; and the learner's q refuses
    dequantize() while keeping every field."""
    from labkit.quant import QTensor, QuantLinear

    for x, q, tile in ex.QUANTIZED_LINEAR.cases:
        assert isinstance(q, ex.TiledOnly)
        with pytest.raises(RuntimeError, match="builds the whole float weight"):
            q.dequantize()
        y = ex.quantized_linear_reference(x, q, tile)
        assert y.dtype == torch.float32 and y.shape == (x.shape[0], q.shape[0])
        plain = QTensor(q.codes, q.scale, q.zero, q.bits, q.group_size, q.scheme, q.shape)
        assert torch.allclose(y, x @ plain.dequantize().T, rtol=1e-5, atol=1e-5)
        if q.bits == 4:
            assert torch.allclose(y, QuantLinear(plain, backend="reference", tile=2)(x), rtol=1e-5, atol=1e-5)


def test_common_mistakes_fail(capsys):
    sym_instead = lambda w, bits, group_size: asym_quantize(w, bits, group_size)[:2] + (torch.zeros(1),)  # noqa: E731
    swapped = lambda codes: pack(codes.reshape(-1, 2).flip(1))  # noqa: E731  high nibble first
    for fn, exercise in [(ex.asym_round_trip(sym_instead, asym_dequantize), ex.ASYM_QUANTIZE),
                         (ex.pack_round_trip(swapped, unpack), ex.PACK),
                         (lambda x, q, tile: quantized_linear(x, q, tile) * 1.001, ex.QUANTIZED_LINEAR)]:
        assert exercise.check(fn) is exercise.reference
    out = capsys.readouterr().out
    assert out.count("[FAIL]") == 3 and "[PASS]" not in out
    assert "[FAIL] quantized_linear(" in out  # a lambda is named after its exercise, never after the reference


def test_random_cases_are_valid_inputs():
    rng = Rng(1)
    for _ in range(20):
        w, bits, group = ex.random_weight(rng)
        assert w.shape[1] % group == 0 and bits in (2, 3, 4, 8)
        (codes,) = ex.random_codes(rng)
        assert codes.numel() % 2 == 0 and int(codes.min()) >= -8 and int(codes.max()) <= 7


def test_the_random_layers_reach_every_decision_of_exercise_3():
    """Over the check's 20 random cases (seed 0, after the fixed ones): both schemes, 4 and 8 bits, integer groups,
    per channel and per tensor, tiles that straddle a group and tiles that do not divide the width."""
    rng, seen = Rng(0), set()
    for _ in range(ex.QUANTIZED_LINEAR.n_random):
        x, q, tile = ex.random_layer(rng)
        assert isinstance(q, ex.TiledOnly) and x.shape[1] == q.shape[1] and tile >= 1
        inp = q.shape[1]
        seen |= {q.scheme, q.bits, q.group_size if isinstance(q.group_size, str) else "groups"}
        if inp % tile:
            seen.add("a shorter last tile")
        if isinstance(q.group_size, int) and (tile % q.group_size and q.group_size % tile):
            seen.add("tiles straddle groups")
    assert seen >= {"asym", "sym", 4, 8, "groups", "channel", "tensor", "a shorter last tile",
                    "tiles straddle groups"}, seen


def test_what_is_not_a_function_is_refused_before_any_check():
    assert_refused(lambda: ex.asym_round_trip(1, lambda *a: a), TypeError, "asym_quantize", 1, "a function")
    assert_refused(lambda: ex.pack_round_trip(lambda c: c, "unpack"), TypeError, "unpack", "unpack", "a function")
