"""Notebook 03's exercises: each reference passes its own check, a wrong answer fails it, and the
notebook's solutions (written out here independently, as a learner would) pass through the wrappers."""
import pytest
import torch

from labkit.quant import exercises as ex
from labkit.rng import Rng

EXERCISES = [ex.ASYM_QUANTIZE, ex.PACK, ex.QUANTIZED_LINEAR]


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_each_reference_passes_its_own_check(exercise, capsys):
    learner = lambda *a: exercise.reference(*a)  # noqa: E731
    assert exercise.check(learner) is learner
    assert capsys.readouterr().out.startswith("[PASS]")


def off_by_a_little(value):
    if isinstance(value, tuple):
        return (value[0],) + tuple(off_by_a_little(v) for v in value[1:])
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

def asym_quantize(w, bits, group_size):
    qmin, qmax = -2 ** (bits - 1), 2 ** (bits - 1) - 1
    groups = w.reshape(w.shape[0], -1, group_size)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scale = (hi - lo) / (qmax - qmin)
    zero = qmin - torch.round(lo / scale)
    codes = torch.clamp(torch.round(groups / scale[..., None]) + zero[..., None], qmin, qmax)
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
                   "[PASS] pack + unpack matches the reference on 2 fixed and 20 random cases.",
                   "[PASS] quantized_linear matches the reference on 1 fixed and 20 random cases."]


def test_common_mistakes_fail(capsys):
    sym_instead = lambda w, bits, group_size: asym_quantize(w, bits, group_size)[:2] + (torch.zeros(1),)  # noqa: E731
    swapped = lambda codes: pack(codes.reshape(-1, 2).flip(1))  # noqa: E731  high nibble first
    for fn, exercise in [(ex.asym_round_trip(sym_instead, asym_dequantize), ex.ASYM_QUANTIZE),
                         (ex.pack_round_trip(swapped, unpack), ex.PACK),
                         (lambda x, q: quantized_linear(x, q) * 1.001, ex.QUANTIZED_LINEAR)]:
        assert exercise.check(fn) is exercise.reference
    out = capsys.readouterr().out
    assert out.count("[FAIL]") == 3 and "[PASS]" not in out


def test_random_cases_are_valid_inputs():
    rng = Rng(1)
    for _ in range(20):
        w, bits, group = ex.random_weight(rng)
        assert w.shape[1] % group == 0 and bits in (2, 3, 4, 8)
        (codes,) = ex.random_codes(rng)
        assert codes.numel() % 2 == 0 and int(codes.min()) >= -8 and int(codes.max()) <= 7
        x, q = ex.random_layer(rng)
        assert x.shape[-1] == q.shape[1] and q.scheme == "asym" and q.bits == 4
