"""Two 4-bit codes per byte (notebook 03, section 4; QuantLinear stores its codes this way).

Codes in [-8, 7] are stored as unsigned nibbles n = code + 8 (0..15: Q4_0's and torch's convention).

    layout="adjacent": byte i = n[2i] | n[2i+1] << 4        (most papers; an odd count pads the last high
                                                             nibble with code 0, which unpack_int4 drops)
    layout="llama":    per block of 32 codes, byte j = n[j] | n[j+16] << 4   (llama.cpp's Q4_0 / Q4_1)

            codes  0 1 2 ... 15 | 16 17 ... 31        byte j (j = 0..15):  high nibble n[j+16]
                                                                           low nibble  n[j]

llama.cpp's order lets one 16-byte SIMD load yield the first 16 codes (low nibbles) and the last 16 (high
nibbles) with one mask and one shift.
"""

from __future__ import annotations

import math

import torch

from .._checks import check_type, fail, is_int
from .qtensor import check_has_data, check_word

LAYOUTS = ("adjacent", "llama")


def pack_int4(codes: torch.Tensor, layout: str = "adjacent") -> torch.Tensor:
    """Pack 4-bit codes in [-8, 7] (an integer tensor of any shape, read row-major) two per byte.
    Returns uint8 [ceil(numel / 2)] (see the module docstring for the two layouts)."""
    check_type("codes", codes, torch.Tensor, "an integer torch.Tensor")
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        fail("codes", codes.dtype, "an integer tensor", TypeError)
    if codes.numel() == 0:
        raise ValueError(f"codes must be a non-empty integer tensor, got shape {tuple(codes.shape)}")
    check_has_data("codes", codes)
    check_word("layout", layout, LAYOUTS)
    c = codes.reshape(-1)
    lo, hi = int(c.min()), int(c.max())  # in the codes' own dtype: a cast first would wrap 65539 to 3
    if lo < -8 or hi > 7:
        raise ValueError(f"codes must be in [-8, 7], got values in [{lo}, {hi}]")
    n = (c.to(torch.int16) + 8).to(torch.uint8)
    if layout == "adjacent":
        if n.numel() % 2:
            n = torch.cat([n, torch.tensor([8], dtype=torch.uint8)])
        lo, hi = n[0::2], n[1::2]
    else:
        if n.numel() % 32:
            raise ValueError(f"layout 'llama' needs a multiple of 32 codes, got {n.numel()}")
        blocks = n.reshape(-1, 32)
        lo, hi = blocks[:, :16].reshape(-1), blocks[:, 16:].reshape(-1)
    return lo | (hi << 4)


def unpack_int4(packed: torch.Tensor, numel: int, layout: str = "adjacent") -> torch.Tensor:
    """The int8 codes [numel] that pack_int4 packed into `packed` (uint8, any shape, read row-major)."""
    check_type("packed", packed, torch.Tensor, "a uint8 torch.Tensor")
    if packed.dtype != torch.uint8:
        fail("packed", packed.dtype, "a uint8 torch.Tensor", TypeError)
    check_has_data("packed", packed)
    if packed.numel() == 0:
        fail("packed", packed, "a non-empty uint8 tensor (at least one packed byte)")
    expected = f"{2 * packed.numel() - 1} or {2 * packed.numel()} for {packed.numel()} packed bytes"
    if not is_int(numel):
        fail("numel", numel, f"an int, {expected}", TypeError)
    if numel < 1 or math.ceil(numel / 2) != packed.numel():
        fail("numel", numel, expected)
    check_word("layout", layout, LAYOUTS)
    if layout == "llama" and numel % 32:
        raise ValueError(f"layout 'llama' needs a multiple of 32 codes, got numel={numel}")
    p = packed.reshape(-1)
    lo, hi = (p & 0x0F).to(torch.int8) - 8, (p >> 4).to(torch.int8) - 8
    if layout == "adjacent":
        return torch.stack([lo, hi], dim=1).reshape(-1)[:numel]
    return torch.cat([lo.reshape(-1, 16), hi.reshape(-1, 16)], dim=1).reshape(-1)
