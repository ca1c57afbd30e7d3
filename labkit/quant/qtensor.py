"""Integer weight quantization: symmetric and asymmetric, per tensor / channel / group; INT4 packing
(notebook 03). The quantized linear layer and whole-model policies live in labkit/quant_linear.py and are
re-exported here (`labkit.quant.QuantLinear`, `labkit.quant.quantize_model`).

A weight matrix w [out, in] is cut into groups of `group_size` consecutive inputs of one output row:

    row 0: | g0: w[0, 0:32] | g1: w[0, 32:64] | ... |      one scale (and zero point) per group
    row 1: | g0: w[1, 0:32] | g1: w[1, 32:64] | ... |      scale, zero: [out, in / group_size]

Codes are signed: [-8, 7] for 4 bits, [-128, 127] for 8 bits (qmin = -2**(bits-1), qmax = 2**(bits-1)-1).

    symmetric   scale = max|w| / qmax               code = clamp(round(w / scale))         w ~ code * scale
    asymmetric  scale = (max w - min w) / (2**bits - 1)
                zero  = qmin - round(min w / scale)  (an integer zero point)
                                                    code = clamp(round(w / scale) + zero)  w ~ (code - zero) * scale

Rounding is round-half-to-even (torch.round). The asymmetric grid covers [min, max] to within half a step
(the zero point is an integer, so 0 is exactly representable and the grid can be shifted by up to half a step).

Zero points are bounded: the step is never below max(|min|, |max|) / 2**14, so |zero| <= 2**14 + 2**(bits-1)
and every zero point fits in 16 bits (int16), which is what the storage accounting counts (stored here as
int32). The floor only acts on near-constant groups (range below ~0.1% of their magnitude at 4 bits, ~1.6%
at 8 bits), where the error it allows, |w| / 2**15 at most, is below fp16's own rounding. When the group
straddles 0 (as on every TinyLM weight group), the zero point lies in [qmin, qmax] and would fit in `bits`
bits, as GPTQ checkpoints pack it. A constant group round-trips exactly (all-zero groups get scale 1).
Ranges max - min that overflow float32 (|w| near 3.4e38) raise a ValueError instead of giving inf/NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BITS = (2, 3, 4, 8)
SCHEMES = ("asym", "sym")


@dataclass
class QTensor:
    """A quantized 2-D weight. codes int8 [out, in]; scale float32 and zero int32 (None when symmetric),
    each [rows, groups] with rows = out (1 for group_size="tensor") and groups = in / group_size
    (1 for "channel" and "tensor")."""
    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    bits: int
    group_size: int | str
    scheme: str
    shape: tuple[int, int]

    @property
    def group_len(self) -> int:
        """Number of weights that share one scale."""
        out, inp = self.shape
        return {"tensor": out * inp, "channel": inp}.get(self.group_size, self.group_size)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 weights [out, in] (or only the output rows `rows`, as an embedding lookup does)."""
        codes = self.codes if rows is None else self.codes[rows]
        shape = codes.shape
        scale, zero = self.scale, self.zero
        if self.group_size == "tensor":
            scale, zero = scale.reshape(1), None if zero is None else zero.reshape(1)
            q = codes.to(torch.int32) - (0 if zero is None else zero)
            return (q.float() * scale).reshape(shape)
        if rows is not None:
            scale, zero = scale[rows], None if zero is None else zero[rows]
        g = scale.shape[-1]
        q = codes.reshape(*shape[:-1], g, -1).to(torch.int32)
        if zero is not None:
            q = q - zero[..., None]
        return (q.float() * scale[..., None]).reshape(shape)

    def nbytes(self, scale_bytes: int = 2, zero_bytes: int = 2) -> int:
        """Bytes to store it: codes at `bits` each (packed) plus one scale (and zero point) per group,
        counted at `scale_bytes` / `zero_bytes` each (fp16 in llama.cpp and torch; kept as fp32 / int32
        here). Zero points always fit in 2 bytes (see the module docstring); zero_bytes=1 is refused when
        one does not fit in int8."""
        if self.zero is not None and zero_bytes < 2 and int(self.zero.abs().max()) > 127:
            raise ValueError(f"zero_bytes={zero_bytes} cannot hold zero points up to {int(self.zero.abs().max())}")
        return quantized_bytes(self.codes.numel(), self.bits, self.group_len, self.scheme, scale_bytes, zero_bytes)

    def bits_per_weight(self, scale_bytes: int = 2, zero_bytes: int = 2) -> float:
        return 8 * self.nbytes(scale_bytes, zero_bytes) / self.codes.numel()


def quantized_bytes(numel: int, bits: int, group_len: int, scheme: str = "asym",
                    scale_bytes: int = 2, zero_bytes: int = 2) -> int:
    """Bytes for `numel` weights at `bits` per code with one scale (and, if asymmetric, one zero point)
    per `group_len` weights. bits per weight = bits + 8 * (scale_bytes + zero_bytes) / group_len:
    4.5 for 4-bit groups of 32 with an fp16 scale (Q4_0), 5.0 with an fp16 min too (Q4_1), 4.25 for
    groups of 128 with fp16 scale and zero."""
    for name, v in (("numel", numel), ("bits", bits), ("group_len", group_len)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    _check_scheme(scheme)
    groups = math.ceil(numel / group_len)
    extra = scale_bytes + (zero_bytes if scheme == "asym" else 0)
    return math.ceil(numel * bits / 8) + groups * extra


def _check_scheme(scheme) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def _check_weight(w, name: str = "w") -> None:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() != 2 or w.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 2-D tensor [out, in], got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {w.dtype}")
    if not torch.isfinite(w).all():
        bad = (~torch.isfinite(w)).nonzero()[0].tolist()
        raise ValueError(f"{name} must be finite; found {w[tuple(bad)].item()} at index {tuple(bad)}")


def _group_view(w: torch.Tensor, group_size) -> torch.Tensor:
    """w [out, in] as [rows, groups, group_len]; checks group_size."""
    out, inp = w.shape
    if group_size == "tensor":
        return w.reshape(1, 1, -1)
    if group_size == "channel":
        return w.reshape(out, 1, inp)
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, 'channel' or 'tensor', got {group_size!r}")
    if inp % group_size:
        raise ValueError(f"group_size {group_size} must divide the input dimension {inp} (w is [{out}, {inp}]); "
                         f"pad the weight or pick a divisor of {inp}")
    return w.reshape(out, inp // group_size, group_size)


def quantize(w: torch.Tensor, bits: int = 4, scheme: str = "asym", group_size: int | str = 32) -> QTensor:
    """Quantize a 2-D float weight w [out, in] to `bits`-bit integer codes (see the module docstring).
    group_size: an int (groups along the input dimension; must divide it), "channel" (one group per output
    row) or "tensor" (one group for the whole matrix)."""
    _check_weight(w)
    if type(bits) is not int or bits not in BITS:
        raise ValueError(f"bits must be one of {BITS} (an int), got {bits!r}")
    _check_scheme(scheme)
    x = _group_view(w.detach().float(), group_size)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if scheme == "sym":
        amax = x.abs().amax(-1)
        scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
        codes = torch.round(x / scale[..., None]).clamp_(qmin, qmax)
        zero = None
    else:
        lo, hi = x.amin(-1), x.amax(-1)
        scale = (hi - lo) / (qmax - qmin)
        if not torch.isfinite(scale).all():
            bad = (~torch.isfinite(scale)).nonzero()[0].tolist()
            raise ValueError(f"w's range max - min in group {tuple(bad)} ({float(lo[tuple(bad)]):.4g} .. "
                             f"{float(hi[tuple(bad)]):.4g}) overflows float32; expected a range below 3.4e38 "
                             f"(scale the weights down)")
        floor = torch.maximum(lo.abs(), hi.abs()).double() / 2 ** 14  # bounds |zero| by 2**14 + 2**(bits-1)
        wanted = torch.maximum(scale.double(), floor)
        scale = wanted.float()
        # float32 rounding (coarse for subnormal weights) must not shrink the step below the floor
        scale = torch.where(scale.double() < wanted, torch.nextafter(scale, torch.full_like(scale, math.inf)), scale)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # all-zero group
        zero = qmin - torch.round(lo / scale)
        codes = (torch.round(x / scale[..., None]) + zero[..., None]).clamp_(qmin, qmax)
        zero = zero.to(torch.int32)
    return QTensor(codes.to(torch.int8).reshape(w.shape), scale, zero, bits, group_size, scheme, tuple(w.shape))


def quant_error(w: torch.Tensor, w_hat: torch.Tensor) -> dict[str, float]:
    """Round-trip error of w_hat against w: mse (mean squared error, in squared weight units), sqnr_db
    (10 log10(sum w^2 / sum (w - w_hat)^2): signal-to-quantization-noise ratio, inf when exact) and
    max_abs (largest |w - w_hat|). Computed in float64."""
    for name, t in (("w", w), ("w_hat", w_hat)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.numel() == 0 or not torch.isfinite(t).all():
            raise ValueError(f"{name} must be non-empty and finite, got shape {tuple(t.shape)}")
    if w.shape != w_hat.shape:
        raise ValueError(f"w_hat must have w's shape {tuple(w.shape)}, got {tuple(w_hat.shape)}")
    w, w_hat = w.detach().double(), w_hat.detach().double()
    err = w - w_hat
    noise, signal = float(err.pow(2).sum()), float(w.pow(2).sum())
    if noise == 0:
        sqnr = math.inf
    elif signal == 0:
        sqnr = -math.inf
    else:
        sqnr = 10 * math.log10(signal / noise)
    return {"mse": noise / err.numel(), "sqnr_db": sqnr, "max_abs": float(err.abs().max())}


def pack_int4(codes: torch.Tensor, layout: str = "adjacent") -> torch.Tensor:
    """Pack 4-bit codes in [-8, 7] two per byte, as unsigned nibbles n = code + 8 (Q4_0's and torch's
    convention). Returns uint8 [ceil(numel / 2)]; codes are read flattened (row-major).

        layout="adjacent": byte i = n[2i] | n[2i+1] << 4        (odd numel: the last high nibble is
                                                                 code 0; unpack_int4 drops it)
        layout="llama":    per block of 32 codes, byte j = n[j] | n[j+16] << 4   (numel % 32 == 0)

            codes  0 1 2 ... 15 | 16 17 ... 31        byte j (j = 0..15):  high nibble n[j+16]
                                                                           low nibble  n[j]
    """
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.is_floating_point() or codes.dtype == torch.bool or codes.numel() == 0:
        raise ValueError(f"codes must be a non-empty integer tensor, got {codes.dtype} of shape {tuple(codes.shape)}")
    c = codes.reshape(-1).to(torch.int16)
    if c.min() < -8 or c.max() > 7:
        raise ValueError(f"codes must be in [-8, 7], got values in [{int(c.min())}, {int(c.max())}]")
    n = (c + 8).to(torch.uint8)
    if layout == "adjacent":
        if n.numel() % 2:
            n = torch.cat([n, torch.tensor([8], dtype=torch.uint8)])
        lo, hi = n[0::2], n[1::2]
    elif layout == "llama":
        if n.numel() % 32:
            raise ValueError(f"layout 'llama' needs a multiple of 32 codes, got {n.numel()}")
        blocks = n.reshape(-1, 32)
        lo, hi = blocks[:, :16].reshape(-1), blocks[:, 16:].reshape(-1)
    else:
        raise ValueError(f"layout must be 'adjacent' or 'llama', got {layout!r}")
    return lo | (hi << 4)


def unpack_int4(packed: torch.Tensor, numel: int, layout: str = "adjacent") -> torch.Tensor:
    """The int8 codes [numel] that pack_int4 packed into `packed` (uint8)."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError(f"packed must be a uint8 torch.Tensor, got {getattr(packed, 'dtype', type(packed).__name__)}")
    if not isinstance(numel, int) or isinstance(numel, bool) or math.ceil(numel / 2) != packed.numel() or numel < 1:
        raise ValueError(f"numel must be {2 * packed.numel() - 1} or {2 * packed.numel()} for {packed.numel()} "
                         f"packed bytes, got {numel!r}")
    p = packed.reshape(-1)
    lo, hi = (p & 0x0F).to(torch.int8) - 8, (p >> 4).to(torch.int8) - 8
    if layout == "adjacent":
        return torch.stack([lo, hi], dim=1).reshape(-1)[:numel]
    if layout == "llama":
        if numel % 32:
            raise ValueError(f"layout 'llama' needs a multiple of 32 codes, got numel={numel}")
        return torch.cat([lo.reshape(-1, 16), hi.reshape(-1, 16)], dim=1).reshape(-1)
    raise ValueError(f"layout must be 'adjacent' or 'llama', got {layout!r}")
