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


def quantized_linear(x, q, tile=32):
    out, inp = q.shape
    y = torch.zeros(*x.shape[:-1], out)
    for k0 in range(0, inp, tile):
        cols = torch.arange(k0, min(k0 + tile, inp))
        group = cols // q.group_size
        y += x[..., cols] @ ((q.codes[:, cols].to(torch.int32) - q.zero[:, group]).float() * q.scale[:, group]).T
    return y


def test_the_notebook_solutions_pass(capsys):
    checks = [(ex.asym_round_trip(asym_quantize, asym_dequantize), ex.ASYM_QUANTIZE),
              (ex.pack_round_trip(pack, unpack), ex.PACK), (quantized_linear, ex.QUANTIZED_LINEAR)]
    for fn, exercise in checks:
        assert exercise.check(fn) is fn
    out = capsys.readouterr().out.splitlines()
    assert out == ["[PASS] asym_quantize + asym_dequantize matches the reference on 1 fixed and 20 random cases.",
                   "[PASS] pack + unpack matches the reference on 3 fixed and 20 random cases.",
                   "[PASS] quantized_linear matches the reference on 2 fixed and 20 random cases."]


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


def ignores_the_zero(x, q, tile=32):
    out, inp = q.shape
    y = torch.zeros(*x.shape[:-1], out)
    for k0 in range(0, inp, tile):
        cols = torch.arange(k0, min(k0 + tile, inp))
        y += x[..., cols] @ (q.codes[:, cols].float() * q.scale[:, cols // q.group_size]).T
    return y


def one_group_per_tile(x, q, tile=32):
    out, inp = q.shape
    y = torch.zeros(*x.shape[:-1], out)
    for k0 in range(0, inp, tile):
        cols, g = torch.arange(k0, min(k0 + tile, inp)), k0 // q.group_size
        y += x[..., cols] @ ((q.codes[:, cols].to(torch.int32) - q.zero[:, g:g + 1]).float() * q.scale[:, g:g + 1]).T
    return y


def test_quantized_linear_mistakes_name_the_learner_the_case_and_the_element(capsys):
    for fn in (ignores_the_zero, one_group_per_tile):
        assert ex.QUANTIZED_LINEAR.check(fn) is ex.QUANTIZED_LINEAR.reference
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith("[FAIL] ignores_the_zero(tensor(shape [2, 64], float32), QTensor(4-bit asym, "
                            "group_size=32, codes [16, 64] int8, scale [16, 2] float32, zero [16, 2] int32)) "
                            "returned a [2, 16] float32 result whose first difference is at index (0, 0): ")
    # groups of 32 in tiles of 32 hide this mistake: the second fixed case (groups of 16) shows it
    assert second.startswith("[FAIL] one_group_per_tile(tensor(shape [3, 48], float32), QTensor(4-bit asym, "
                             "group_size=16, codes [8, 48] int8, scale [8, 3] float32, zero [8, 3] int32)) returned "
                             "a [3, 8] float32 result whose first difference is at index (0, 0): ")
    assert len(first) < 400 and "reference" not in first.split(" returned ")[0]  # was ~700 characters of tensor text


def test_common_mistakes_fail(capsys):
    sym_instead = lambda w, bits, group_size: asym_quantize(w, bits, group_size)[:2] + (torch.zeros(1),)  # noqa: E731
    swapped = lambda codes: pack(codes.reshape(-1, 2).flip(1))  # noqa: E731  high nibble first
    for fn, exercise in [(ex.asym_round_trip(sym_instead, asym_dequantize), ex.ASYM_QUANTIZE),
                         (ex.pack_round_trip(swapped, unpack), ex.PACK),
                         (lambda x, q: quantized_linear(x, q) * 1.001, ex.QUANTIZED_LINEAR)]:
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
        x, q = ex.random_layer(rng)
        assert x.shape[-1] == q.shape[1] and q.scheme == "asym" and q.bits == 4


def test_what_is_not_a_function_is_refused_before_any_check():
    assert_refused(lambda: ex.asym_round_trip(1, lambda *a: a), TypeError, "asym_quantize", 1, "a function")
    assert_refused(lambda: ex.pack_round_trip(lambda c: c, "unpack"), TypeError, "unpack", "unpack", "a function")
