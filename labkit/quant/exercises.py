"""Notebook 03's exercises, defined once: the reference, fixed cases, random cases and tolerance of each.
The notebook's check cells and tests/quant/test_exercises.py both use them:

    ASYM_QUANTIZE     asym_quantize(w, bits, group_size) -> (codes, scale, zero) and
                      asym_dequantize(codes, scale, zero) -> w_hat, checked together through
                      asym_round_trip(asym_quantize, asym_dequantize)        (section 1)
    PACK              pack(codes) -> bytes and unpack(bytes) -> codes, checked together through
                      pack_round_trip(pack, unpack)                           (section 4)
    QUANTIZED_LINEAR  quantized_linear(x, q, tile) = x @ w_hat.T for any QTensor, building at most `tile`
                      columns of w_hat at a time (q is a TiledOnly: its dequantize() refuses) (section 8)
    FUSED_LOOP        fused_matvec(x, w) = x @ w_hat.T in one loop over the packed bytes of an
                      Int4Weight (rung 3 of labkit.quant.kernels, in plain Python) (section 8)

The two-function exercises compare a dict of named values, so that a [FAIL] line names the one that
differs ("['zero'] = dtype float32, expected int32"); integer answers must come in the dtype the prompt
asks for (int8 codes, int32 zero points, uint8 bytes: labkit.course.check.same).
"""

from __future__ import annotations

from typing import Callable

import torch

from .._checks import fail
from ..course import Exercise
from ..rng import Rng
from .kernels import Int4Weight, dequantize_then_matmul, pack_weight
from .packing import pack_int4, unpack_int4
from .qtensor import QTensor, quantize

# notebook 03's worked example: one row of eight positive weights
BY_HAND = torch.tensor([[0.05, 0.2, 0.3, 0.45, 0.6, 0.8, 1.1, 1.6]])


def _seeded(rng: Rng) -> torch.Generator:
    return torch.Generator().manual_seed(rng.below(2**31))


def _callables(**fns) -> None:
    """Each of the learner's functions is callable (a TypeError naming it otherwise, before any check runs)."""
    for name, fn in fns.items():
        if not callable(fn):
            fail(name, fn, "a function", TypeError)


def _named(fn: Callable, name: str) -> Callable:
    fn.__name__ = fn.__qualname__ = name
    return fn


# --- exercise 1: asymmetric quantize and dequantize ---------------------------------------------------

DEQUANTIZED = "asym_dequantize(codes, scale, zero)"


def asym_reference(w: torch.Tensor, bits: int, group_size: int) -> dict[str, torch.Tensor]:
    """What the check compares: labkit.quant.quantize(w, bits, "asym", group_size)'s codes (int8), scale
    and zero point (int32), and its dequantized weights."""
    q = quantize(w, bits, "asym", group_size)
    return {"codes": q.codes, "scale": q.scale, "zero": q.zero, DEQUANTIZED: q.dequantize()}


def _kind(value) -> str:
    return f"a tuple of {len(value)}" if isinstance(value, tuple) else type(value).__name__


def asym_round_trip(asym_quantize: Callable, asym_dequantize: Callable) -> Callable:
    """The learner's two functions as one (w, bits, group_size) -> {codes, scale, zero, dequantized}, as
    checked. asym_dequantize gets the reference's codes, scale and zero, so that each function is judged
    on its own."""
    _callables(asym_quantize=asym_quantize, asym_dequantize=asym_dequantize)

    def round_trip(w, bits, group_size):
        out = asym_quantize(w, bits, group_size)
        if not isinstance(out, tuple) or len(out) != 3:
            raise TypeError(f"asym_quantize must return a tuple (codes, scale, zero), got {_kind(out)}")
        q = quantize(w, bits, "asym", group_size)
        return {"codes": out[0], "scale": out[1], "zero": out[2],
                DEQUANTIZED: asym_dequantize(q.codes, q.scale, q.zero)}
    return _named(round_trip, "asym_quantize + asym_dequantize")


def random_weight(rng: Rng) -> tuple[torch.Tensor, int, int]:
    """A random [out, groups * size] matrix, shifted by -2..2, with random bits and group size."""
    gen = _seeded(rng)
    out, groups, size = 1 + rng.below(8), 1 + rng.below(4), rng.choice([8, 16, 32])
    return torch.randn(out, groups * size, generator=gen) + rng.below(5) - 2, rng.choice([2, 3, 4, 8]), size


ASYM_QUANTIZE = Exercise("asym_quantize + asym_dequantize", asym_reference, cases=[(BY_HAND, 4, 8)],
                         random_case=random_weight, rtol=1e-5, atol=1e-6)


# --- exercise 2: pack and unpack ------------------------------------------------------------------------

def pack_reference(codes: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the check compares: labkit.quant.pack_int4(codes) (uint8, adjacent pairs, low nibble first)
    and unpack_int4 of those bytes (int8, 1-D)."""
    packed = pack_int4(codes)
    return {"pack(codes)": packed, "unpack(bytes)": unpack_int4(packed, codes.numel())}


def pack_round_trip(pack: Callable, unpack: Callable) -> Callable:
    """The learner's two functions as one codes -> {pack(codes), unpack(bytes)}, as checked; unpack gets the
    reference's bytes, so that each function is judged on its own."""
    _callables(pack=pack, unpack=unpack)

    def round_trip(codes):
        return {"pack(codes)": pack(codes), "unpack(bytes)": unpack(pack_int4(codes))}
    return _named(round_trip, "pack + unpack")


def random_codes(rng: Rng) -> tuple[torch.Tensor]:
    """An even number (2 to 80) of random codes in [-8, 7]."""
    return (torch.randint(-8, 8, (2 * (1 + rng.below(40)),), generator=_seeded(rng), dtype=torch.int8),)


# short cases first, so that a [FAIL] line shows their values: the first tells the nibble order apart
PACK = Exercise("pack + unpack", pack_reference,
                cases=[(torch.tensor([-8, 7, 0, -1], dtype=torch.int8),),
                       (torch.tensor([[-8, 7], [0, -1]], dtype=torch.int8),),
                       (torch.arange(32, dtype=torch.int8) % 16 - 8,)],
                random_case=random_codes, rtol=0.0, atol=0.0)


# --- exercise 3: a quantized linear layer, one tile at a time ------------------------------------------

class TiledOnly(QTensor):
    """A QTensor whose dequantize() refuses: exercise 3 builds w_hat one tile of columns at a time, never whole.
    Every other attribute (codes, scale, zero, group_size, group_len, ...) is the QTensor's."""

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        raise RuntimeError("q.dequantize() builds the whole float weight at once; this exercise builds at most "
                           "`tile` columns of it at a time")


def tiled_only(q: QTensor) -> TiledOnly:
    """The same quantized weight as a TiledOnly (what the check hands the learner's function)."""
    return TiledOnly(q.codes, q.scale, q.zero, q.bits, q.group_size, q.scheme, q.shape)


def quantized_linear_reference(x: torch.Tensor, q: QTensor, tile: int) -> torch.Tensor:
    """x @ w_hat.T (float32 [m, out]) from the whole dequantized weight, in float64 (QTensor.dequantize: the
    tile does not change the product)."""
    return (x.double() @ QTensor.dequantize(q).double().T).float()


def random_layer(rng: Rng) -> tuple[torch.Tensor, TiledOnly, int]:
    """Random activations [1..3, in], a quantized weight [1..12, in] (4 or 8 bits, sym or asym; groups of 8, 16 or
    32, per channel or per tensor; weights shifted by -2..2) and a tile of 1 to in + 7 columns."""
    gen = _seeded(rng)
    out, group, groups = 1 + rng.below(12), rng.choice([8, 16, 32]), 1 + rng.below(4)
    inp = group * groups
    w = torch.randn(out, inp, generator=gen) + rng.below(5) - 2
    q = quantize(w, rng.choice([4, 8]), rng.choice(["asym", "sym"]), rng.choice([group, "channel", "tensor"]))
    return torch.randn(1 + rng.below(3), inp, generator=gen), tiled_only(q), 1 + rng.below(inp + 8)


_GEN = torch.Generator().manual_seed(3)


def _layer(inp: int, out: int, bits: int, scheme: str, group_size, tile: int, shift: float = 0.0):
    """A fixed case: x [2, inp] and a TiledOnly [out, inp] quantized from seeded weights (+ shift), and the tile."""
    w = (torch.rand if shift else torch.randn)(out, inp, generator=_GEN) + shift
    return torch.randn(2, inp, generator=_GEN), tiled_only(quantize(w, bits, scheme, group_size)), tile


# Each fixed case is a place where a first version goes wrong; the [FAIL] line shows its arguments (shapes, the
# QTensor's settings, the tile), never how to handle it:
#   tiles and groups of 32 (they line up); groups of 16 in tiles of 32 and 48 inputs (a tile holds two groups,
#   the last tile is shorter); groups of 32 in tiles of 24 (tiles straddle groups); symmetric per channel (no
#   zero point, one scale per row); 8-bit asymmetric per tensor on all-positive weights (one scale and zero for
#   every row, a zero point below int8's range)
QUANTIZED_LINEAR = Exercise("quantized_linear", quantized_linear_reference,
                            cases=[_layer(64, 16, 4, "asym", 32, 32), _layer(48, 8, 4, "asym", 16, 32),
                                   _layer(64, 8, 4, "asym", 32, 24), _layer(40, 6, 4, "sym", "channel", 16),
                                   _layer(24, 4, 8, "asym", "tensor", 10, shift=2.0)],
                            random_case=random_layer, rtol=1e-5, atol=1e-5)


# --- exercise 4: the fused unpack-dequantize-accumulate loop (rung 3 of labkit.quant.kernels) -------------

def fused_reference(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """y = x @ w_hat.T for x float32 [K], by rung 1 (the whole matrix dequantized in torch ops)."""
    return dequantize_then_matmul(x, w)


def random_packed(rng: Rng) -> tuple[torch.Tensor, Int4Weight]:
    """Random x [K] and a packed INT4 weight [1..12, K], asymmetric or symmetric, groups of 4, 8 or 16."""
    gen = _seeded(rng)
    out, group, groups = 1 + rng.below(12), rng.choice([4, 8, 16]), 1 + rng.below(4)
    w = torch.randn(out, group * groups, generator=gen) + rng.below(3) - 1
    return torch.randn(group * groups, generator=gen), pack_weight(quantize(w, 4, rng.choice(["asym", "sym"]), group))


_GEN4 = torch.Generator().manual_seed(4)
# one row of one group first (a [FAIL] line then shows the values; x = 1..8 tells the nibble order apart),
# then two groups of 8 over 4 rows
FUSED_LOOP = Exercise("fused_matvec", fused_reference,
                      cases=[(torch.arange(1.0, 9.0), pack_weight(quantize(BY_HAND, 4, "asym", 8))),
                             (torch.randn(16, generator=_GEN4),
                              pack_weight(quantize(torch.randn(4, 16, generator=_GEN4), 4, "asym", 8)))],
                      random_case=random_packed, rtol=1e-5, atol=1e-5)
