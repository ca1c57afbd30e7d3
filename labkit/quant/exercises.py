"""Notebook 03's exercises, defined once: the reference, fixed cases, random cases and tolerance of each.
The notebook's check cells and tests/quant/test_exercises.py both use them:

    ASYM_QUANTIZE     asym_quantize(w, bits, group_size) -> (codes, scale, zero) and
                      asym_dequantize(codes, scale, zero) -> w_hat, checked together through
                      asym_round_trip(asym_quantize, asym_dequantize)        (section 1)
    PACK              pack(codes) -> bytes and unpack(bytes) -> codes, checked together through
                      pack_round_trip(pack, unpack)                           (section 4)
    QUANTIZED_LINEAR  quantized_linear(x, q) = x @ w_hat.T, tile by tile      (section 8)
"""

from __future__ import annotations

from typing import Callable

import torch

from ..course import Exercise
from ..rng import Rng
from .linear import QuantLinear
from .packing import pack_int4, unpack_int4
from .qtensor import QTensor, quantize

# notebook 03's worked example: one row of eight positive weights
BY_HAND = torch.tensor([[0.05, 0.2, 0.3, 0.45, 0.6, 0.8, 1.1, 1.6]])


def _seeded(rng: Rng) -> torch.Generator:
    return torch.Generator().manual_seed(rng.below(2**31))


def _named(fn: Callable, name: str) -> Callable:
    fn.__name__ = fn.__qualname__ = name
    return fn


# --- exercise 1: asymmetric quantize and dequantize ---------------------------------------------------

def asym_reference(w: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, dequantized weights) of labkit.quant.quantize(w, bits, "asym", group_size)."""
    q = quantize(w, bits, "asym", group_size)
    return q.codes, q.dequantize()


def asym_round_trip(asym_quantize: Callable, asym_dequantize: Callable) -> Callable:
    """The learner's two functions as one (w, bits, group_size) -> (codes, dequantized), as checked."""
    def round_trip(w, bits, group_size):
        codes, scale, zero = asym_quantize(w, bits, group_size)
        return codes, asym_dequantize(codes, scale, zero)
    return _named(round_trip, "asym_quantize + asym_dequantize")


def random_weight(rng: Rng) -> tuple[torch.Tensor, int, int]:
    """A random [out, groups * size] matrix, shifted by -2..2, with random bits and group size."""
    gen = _seeded(rng)
    out, groups, size = 1 + rng.below(8), 1 + rng.below(4), rng.choice([8, 16, 32])
    return torch.randn(out, groups * size, generator=gen) + rng.below(5) - 2, rng.choice([2, 3, 4, 8]), size


ASYM_QUANTIZE = Exercise("asym_quantize + asym_dequantize", asym_reference, cases=[(BY_HAND, 4, 8)],
                         random_case=random_weight, rtol=1e-5, atol=1e-6)


# --- exercise 2: pack and unpack ------------------------------------------------------------------------

def pack_reference(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed bytes, unpacked codes) with labkit.quant.pack_int4 / unpack_int4, adjacent pairs."""
    packed = pack_int4(codes)
    return packed, unpack_int4(packed, codes.numel())


def pack_round_trip(pack: Callable, unpack: Callable) -> Callable:
    """The learner's two functions as one codes -> (pack(codes), unpack(pack(codes))), as checked."""
    def round_trip(codes):
        return pack(codes), unpack(pack(codes))
    return _named(round_trip, "pack + unpack")


def random_codes(rng: Rng) -> tuple[torch.Tensor]:
    """An even number (2 to 80) of random codes in [-8, 7]."""
    return (torch.randint(-8, 8, (2 * (1 + rng.below(40)),), generator=_seeded(rng), dtype=torch.int8),)


PACK = Exercise("pack + unpack", pack_reference,
                cases=[(torch.arange(32, dtype=torch.int8) % 16 - 8,),
                       (torch.tensor([[-8, 7], [0, -1]], dtype=torch.int8),)],
                random_case=random_codes, rtol=0.0, atol=0.0)


# --- exercise 3: a quantized linear layer ---------------------------------------------------------------

def quantized_linear_reference(x: torch.Tensor, q: QTensor) -> torch.Tensor:
    """x @ w_hat.T by QuantLinear's reference path (tiles of 256 columns)."""
    return QuantLinear(q, backend="reference")(x)


def random_layer(rng: Rng) -> tuple[torch.Tensor, QTensor]:
    """Random activations [1..3, in] and an asymmetric INT4 QTensor [1..24, in] with groups of 8, 16 or 32."""
    gen = _seeded(rng)
    out, group, groups = 1 + rng.below(24), rng.choice([8, 16, 32]), 1 + rng.below(4)
    w = torch.randn(out, group * groups, generator=gen)
    return torch.randn(1 + rng.below(3), group * groups, generator=gen), quantize(w, 4, "asym", group)


_LAYER = quantize(torch.randn(16, 64, generator=torch.Generator().manual_seed(3)), 4, "asym", 32)
QUANTIZED_LINEAR = Exercise("quantized_linear", quantized_linear_reference, cases=[(torch.ones(2, 64), _LAYER)],
                            random_case=random_layer, rtol=1e-5, atol=1e-5)
