"""Integer weight quantization: symmetric and asymmetric, per tensor / channel / group (notebook 03).
Nibble packing lives in packing.py, the quantized layers in linear.py, whole-model policies in policy.py.

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

The checks of the quantization settings (check_bits, check_scheme, check_group_size, check_weight) are
shared by every module of labkit.quant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._checks import check_positive_int, check_type, fail, is_int

BITS = (2, 3, 4, 8)
SCHEMES = ("asym", "sym")
GROUP_WORDS = ("channel", "tensor")


def check_bits(bits, options: tuple[int, ...] = BITS) -> int:
    """bits as an int of `options`: TypeError for a non-int (4.0, "4", True), ValueError for another int."""
    if not is_int(bits):
        fail("bits", bits, f"one of {options} (an int)", TypeError)
    if bits not in options:
        fail("bits", bits, f"one of {options} (an int)")
    return int(bits)


def check_word(name: str, value, options: tuple[str, ...]) -> str:
    """One of the strings `options`: TypeError for a non-str, ValueError for another str."""
    if not isinstance(value, str):
        fail(name, value, f"one of {options}", TypeError)
    if value not in options:
        fail(name, value, f"one of {options}")
    return value


def check_scheme(scheme) -> str:
    return check_word("scheme", scheme, SCHEMES)


def check_group_size(group_size) -> int | str:
    """A positive int, "channel" or "tensor" (TypeError for other types, ValueError for other values)."""
    expected = "a positive int, 'channel' or 'tensor'"
    if isinstance(group_size, str):
        if group_size not in GROUP_WORDS:
            fail("group_size", group_size, expected)
        return group_size
    if not is_int(group_size):
        fail("group_size", group_size, expected, TypeError)
    if group_size < 1:
        fail("group_size", group_size, expected)
    return int(group_size)


def check_has_data(name: str, t: torch.Tensor) -> torch.Tensor:
    """t holds values (a meta tensor has a shape and a dtype but no data to quantize or measure)."""
    if t.is_meta:
        fail(name, t.device, "a tensor with data (not on the meta device)")
    return t


def check_weight(w, name: str = "w") -> torch.Tensor:
    """A finite, non-empty, floating-point 2-D torch.Tensor [out, in]."""
    check_type(name, w, torch.Tensor, "a torch.Tensor")
    if not w.is_floating_point():
        fail(name, w.dtype, "a floating-point tensor", TypeError)
    check_has_data(name, w)
    if w.dim() != 2 or w.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 2-D tensor [out, in], got shape {tuple(w.shape)}")
    if not torch.isfinite(w).all():
        bad = tuple((~torch.isfinite(w)).nonzero()[0].tolist())
        fail(name, w[bad].item(), f"finite (no NaN or inf; the first one is at index {bad})")
    return w


def _check_tensor(name: str, t, kind: str, dtype_ok, shape: tuple[int, ...]) -> None:
    """t is a torch.Tensor whose dtype passes dtype_ok (TypeError) and whose shape is `shape` (ValueError)."""
    check_type(name, t, torch.Tensor, f"{kind} torch.Tensor")
    if not dtype_ok(t):
        fail(name, t.dtype, f"{kind} tensor", TypeError)
    check_has_data(name, t)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")


@dataclass
class QTensor:
    """A quantized 2-D weight. codes int8 [out, in]; scale (float) and zero (integer; None when symmetric),
    each [rows, groups] with rows = out (1 for group_size="tensor") and groups = in / group_size
    (1 for "channel" and "tensor"). Checks its own consistency when built."""
    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    bits: int
    group_size: int | str
    scheme: str
    shape: tuple[int, int]

    def __post_init__(self):
        self.bits, self.scheme = check_bits(self.bits), check_scheme(self.scheme)
        self.group_size = check_group_size(self.group_size)
        shape = self.shape
        if not (isinstance(shape, tuple) and len(shape) == 2 and all(is_int(s) and s > 0 for s in shape)):
            fail("shape", self.shape, "a tuple (out, in) of positive ints")
        out, inp = self.shape
        if isinstance(self.group_size, int) and inp % self.group_size:
            fail("group_size", self.group_size, f"a divisor of the input dimension {inp}")
        rows = 1 if self.group_size == "tensor" else out
        groups = inp // self.group_size if isinstance(self.group_size, int) else 1
        _check_tensor("codes", self.codes, "an int8", lambda t: t.dtype == torch.int8, self.shape)
        qmin, qmax = -(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1
        lo, hi = int(self.codes.min()), int(self.codes.max())
        if lo < qmin or hi > qmax:
            raise ValueError(f"codes must be in [{qmin}, {qmax}] for {self.bits} bits, got values in [{lo}, {hi}]")
        _check_tensor("scale", self.scale, "a float", torch.Tensor.is_floating_point, (rows, groups))
        if not (torch.isfinite(self.scale) & (self.scale > 0)).all():
            bad = float(self.scale[~(torch.isfinite(self.scale) & (self.scale > 0))][0])
            fail("scale", bad, "finite and > 0 in every group (a step between levels)")
        if self.scheme == "sym":
            if self.zero is not None:
                raise TypeError(f"zero must be None for scheme 'sym', got {type(self.zero).__name__}")
        else:
            _check_tensor("zero", self.zero, "an integer", lambda t: not t.is_floating_point(), (rows, groups))

    def __repr__(self) -> str:
        """Settings, shapes and dtypes, never the tensors' values (notebook 03's [FAIL] lines show it)."""
        def kind(t: torch.Tensor) -> str:
            return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
        zero = "no zero point" if self.zero is None else f"zero {kind(self.zero)}"
        return (f"QTensor({self.bits}-bit {self.scheme}, group_size={self.group_size!r}, codes {kind(self.codes)}, "
                f"scale {kind(self.scale)}, {zero})")

    @property
    def group_len(self) -> int:
        """Number of weights that share one scale."""
        out, inp = self.shape
        return {"tensor": out * inp, "channel": inp}.get(self.group_size, self.group_size)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 weights [out, in] (or only the output rows `rows`, an integer tensor of any shape, as an
        embedding lookup does: the result is then [*rows.shape, in])."""
        if rows is not None:
            check_type("rows", rows, torch.Tensor, "an integer torch.Tensor or None")
            if rows.is_floating_point() or rows.is_complex() or rows.dtype == torch.bool:
                fail("rows", rows.dtype, "an integer tensor", TypeError)
            check_has_data("rows", rows)
            if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self.shape[0]):
                raise ValueError(f"rows must be in [0, {self.shape[0] - 1}], "
                                 f"got values in [{int(rows.min())}, {int(rows.max())}]")
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
        check_positive_int("scale_bytes", scale_bytes)
        check_positive_int("zero_bytes", zero_bytes)
        if self.zero is not None and zero_bytes < 2 and int(self.zero.abs().max()) > 127:
            fail("zero_bytes", zero_bytes, f"at least 2 to hold zero points up to {int(self.zero.abs().max())}")
        return quantized_bytes(self.codes.numel(), self.bits, self.group_len, self.scheme, scale_bytes, zero_bytes)

    def bits_per_weight(self, scale_bytes: int = 2, zero_bytes: int = 2) -> float:
        """Storage bits per weight, scales and zero points included (see nbytes)."""
        return 8 * self.nbytes(scale_bytes, zero_bytes) / self.codes.numel()


def quantized_bytes(numel: int, bits: int, group_len: int, scheme: str = "asym",
                    scale_bytes: int = 2, zero_bytes: int = 2) -> int:
    """Bytes for `numel` weights at `bits` per code with one scale (and, if asymmetric, one zero point)
    per `group_len` weights. bits per weight = bits + 8 * (scale_bytes + zero_bytes) / group_len:
    4.5 for 4-bit groups of 32 with an fp16 scale (Q4_0), 5.0 with an fp16 min too (Q4_1), 4.25 for
    groups of 128 with fp16 scale and zero."""
    for name, v in (("numel", numel), ("bits", bits), ("group_len", group_len), ("scale_bytes", scale_bytes)):
        check_positive_int(name, v)
    check_positive_int("zero_bytes", zero_bytes, allow_zero=True)
    check_scheme(scheme)
    groups = math.ceil(numel / group_len)
    extra = scale_bytes + (zero_bytes if scheme == "asym" else 0)
    return math.ceil(numel * bits / 8) + groups * extra


def _group_view(w: torch.Tensor, group_size) -> torch.Tensor:
    """w [out, in] as [rows, groups, group_len] (group_size already checked)."""
    out, inp = w.shape
    if group_size == "tensor":
        return w.reshape(1, 1, -1)
    if group_size == "channel":
        return w.reshape(out, 1, inp)
    if inp % group_size:
        raise ValueError(f"group_size {group_size} must divide the input dimension {inp} (w is [{out}, {inp}]); "
                         f"pad the weight or pick a divisor of {inp}")
    return w.reshape(out, inp // group_size, group_size)


def quantize(w: torch.Tensor, bits: int = 4, scheme: str = "asym", group_size: int | str = 32) -> QTensor:
    """Quantize a 2-D float weight w [out, in] to `bits`-bit integer codes (see the module docstring).
    group_size: an int (groups along the input dimension; must divide it), "channel" (one group per output
    row) or "tensor" (one group for the whole matrix)."""
    check_weight(w)
    bits, scheme, group_size = check_bits(bits), check_scheme(scheme), check_group_size(group_size)
    x = _group_view(w.detach().float(), group_size)
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if scheme == "sym":
        amax = x.abs().amax(-1)
        # amax / qmax can underflow to 0 for subnormal weights: the step is then float32's smallest, 2**-149
        scale = torch.where(amax > 0, (amax / qmax).clamp_min(2.0 ** -149), torch.ones_like(amax))
        codes = torch.round(x / scale[..., None]).clamp_(qmin, qmax)
        zero = None
    else:
        lo, hi = x.amin(-1), x.amax(-1)
        scale = (hi - lo) / (qmax - qmin)
        if not torch.isfinite(scale).all():
            bad = tuple((~torch.isfinite(scale)).nonzero()[0].tolist())
            raise ValueError(f"w's range max - min in group {bad} ({float(lo[bad]):.4g} .. {float(hi[bad]):.4g}) "
                             f"overflows float32; expected a range below 3.4e38 (scale the weights down)")
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
        check_type(name, t, torch.Tensor, "a torch.Tensor")
        if not t.is_floating_point():
            fail(name, t.dtype, "a floating-point tensor", TypeError)
        check_has_data(name, t)
        if t.numel() == 0 or not torch.isfinite(t).all():
            raise ValueError(f"{name} must be non-empty and finite, got shape {tuple(t.shape)} with "
                             f"{int((~torch.isfinite(t)).sum())} non-finite values")
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

