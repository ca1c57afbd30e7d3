"""Quantized layers (notebook 03, section 8): QuantLinear, the 4-bit matmul, and QuantEmbedding.
Whole-model policies that build them are in policy.py.

QuantLinear keeps its weight as codes + scales and has two paths:

    reference  for each tile of `tile` input columns: unpack the codes, dequantize the tile, multiply,
               accumulate  (y += x[:, k0:k1] @ w_hat[:, k0:k1].T). The full FP32 weight never exists.
    int4pack   torch's INT4 weight-only CPU kernel (torch.ops.aten._weight_int4pack_mm_for_cpu) on BF16
               activations: it dequantizes w = (q - 8) * scale + zero with q in 0..15 and a float zero.
               Our codes map to it exactly: q = code + 8, zero = -zero_point * scale (0 when symmetric).

Storage: packed codes, scales and zero points are buffers (so .to(device) moves them); when the kernel
is used, its own tiled copy of the codes and BF16-ready scales is kept next to them (a deployment would keep
only that one). "auto" takes the kernel when it exists, the input is on the CPU and the shapes fit (4 bits,
out % 16 == 0, group length a multiple of 32), and falls back to the reference path otherwise.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .._checks import check_int, check_type, fail
from .packing import pack_int4, unpack_int4
from .qtensor import QTensor, check_word, quantize

BACKENDS = ("auto", "reference", "int4pack")
_KERNEL_GROUPS = (256, 128, 64, 32)


def int4_kernel_available() -> bool:
    """Does this torch build have the INT4 weight-only CPU kernel?"""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and \
        hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")


def to_int4pack(q: QTensor, inner_k_tiles: int = 2) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """(packed weight, scales_and_zeros [in / g, out, 2] float32, g) for torch's INT4 CPU kernel, or None
    when the kernel is missing or the shapes do not fit. Exact conversion of our convention:
        (code - zero_point) * scale  ==  (q - 8) * scale + zero   with q = code + 8, zero = -zero_point * scale
    """
    check_type("q", q, QTensor, "a labkit.quant.QTensor")
    if check_int("inner_k_tiles", inner_k_tiles) not in (2, 4, 8):
        fail("inner_k_tiles", inner_k_tiles, "one of (2, 4, 8)")
    out, inp = q.shape
    if q.bits != 4 or out % 16 or q.codes.device.type != "cpu" or not int4_kernel_available():
        return None
    g = next((k for k in _KERNEL_GROUPS if q.group_len % k == 0 and inp % k == 0), None)
    if g is None:
        return None
    # per-weight scale and zero, sampled once per kernel group of g inputs
    cols = torch.arange(0, inp, g)
    scale = q.scale.expand(out, -1) if q.scale.shape[0] == 1 else q.scale
    group_of_col = cols // q.group_len if q.group_size != "tensor" else torch.zeros_like(cols)
    s = scale[:, group_of_col]
    z = torch.zeros_like(s) if q.zero is None else \
        -(q.zero.expand(out, -1) if q.zero.shape[0] == 1 else q.zero)[:, group_of_col].float() * s
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.codes.to(torch.int32) + 8, inner_k_tiles)
    except RuntimeError:
        return None
    return packed, torch.stack([s.T, z.T], dim=-1).contiguous(), g


class QuantLinear(nn.Module):
    """A linear layer y = x @ w_hat.T (+ bias) whose weight is stored quantized (see the module docstring)."""

    def __init__(self, qweight: QTensor, bias: torch.Tensor | None = None, backend: str = "auto",
                 tile: int = 256):
        super().__init__()
        check_type("qweight", qweight, QTensor, "a labkit.quant.QTensor")
        if check_int("tile", tile, low=2) % 2:
            fail("tile", tile, "an even int >= 2")
        if bias is not None:
            check_type("bias", bias, torch.Tensor, "a torch.Tensor or None")
            if not bias.is_floating_point():
                fail("bias", bias.dtype, "a floating-point tensor or None", TypeError)
            if tuple(bias.shape) != (qweight.shape[0],):
                raise ValueError(f"bias must have shape ({qweight.shape[0]},), got {tuple(bias.shape)}")
        self.out_features, self.in_features = qweight.shape
        self.bits, self.group_size, self.scheme, self.tile = qweight.bits, qweight.group_size, qweight.scheme, tile
        self.group_len = qweight.group_len
        self.packed_codes = qweight.bits == 4 and self.in_features % 2 == 0
        # storage (buffers, so .to(device) moves them): 4-bit codes packed two per byte, one row after
        # another; other widths as int8; the scales and zero points as they are
        self.register_buffer("codes", pack_int4(qweight.codes).reshape(self.out_features, -1) if self.packed_codes
                             else qweight.codes)
        self.register_buffer("scale", qweight.scale)
        self.register_buffer("zero", qweight.zero)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        kernel = to_int4pack(qweight)
        self.register_buffer("int4pack", None if kernel is None else kernel[0])
        self.register_buffer("scales_and_zeros", None if kernel is None else kernel[1].to(torch.bfloat16))
        self.kernel_group = None if kernel is None else kernel[2]
        self.backend = backend

    @property
    def qweight(self) -> QTensor:
        """The weight as a QTensor (codes unpacked from storage)."""
        codes = self.codes
        if self.packed_codes:
            codes = unpack_int4(codes.reshape(-1), self.out_features * self.in_features).reshape(codes.shape[0], -1)
        return QTensor(codes, self.scale, self.zero, self.bits, self.group_size, self.scheme,
                       (self.out_features, self.in_features))

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        check_word("backend", value, BACKENDS)
        if value == "int4pack" and self.int4pack is None:
            raise ValueError(f"backend 'int4pack' is not available for this layer ({self.bits} bits, "
                             f"[{self.out_features}, {self.in_features}], group {self.group_size!r}, "
                             f"kernel present: {int4_kernel_available()})")
        self._backend = value

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4, group_size: int | str = 32, scheme: str = "asym",
                    backend: str = "auto") -> "QuantLinear":
        """Quantize an nn.Linear's weight by round-to-nearest (labkit.quant.quantize)."""
        check_type("linear", linear, nn.Linear, "a torch.nn.Linear")
        return cls(quantize(linear.weight.detach().float(), bits, scheme, group_size), linear.bias, backend)

    def path(self, x: torch.Tensor) -> str:
        """Which path forward(x) takes: "int4pack" or "reference"."""
        check_type("x", x, torch.Tensor, "a torch.Tensor")
        fast = self.int4pack is not None and x.device.type == "cpu"
        return "int4pack" if self.backend == "int4pack" or (self.backend == "auto" and fast) else "reference"

    def check_input(self, x) -> torch.Tensor:
        """x is a floating-point tensor [..., in_features]: an integer x would be multiplied in integers
        (truncating the weights), so it is refused, as nn.Linear refuses it; cast it with .float()."""
        check_type("x", x, torch.Tensor, "a torch.Tensor")
        if not x.is_floating_point():
            fail("x", x.dtype, "a floating-point tensor (cast integer inputs with .float())", TypeError)
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must end in {self.in_features} features, got shape {tuple(x.shape)}")
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        y = self.forward_int4pack(x) if self.path(x) == "int4pack" else self.forward_reference(x)
        return y if self.bias is None else y + self.bias

    def forward_int4pack(self, x: torch.Tensor) -> torch.Tensor:
        """torch's INT4 kernel on BF16 activations (the result is cast back to x's dtype)."""
        self.check_input(x)
        if self.int4pack is None:
            raise ValueError("forward_int4pack needs torch's INT4 kernel, which this layer cannot use ("
                             f"{self.bits} bits, [{self.out_features}, {self.in_features}], group {self.group_size!r})")
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.int4pack, self.kernel_group, self.scales_and_zeros)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def weight_tile(self, k0: int, k1: int) -> torch.Tensor:
        """Dequantized columns k0:k1 of the weight, float32 [out, k1 - k0] (k0, k1 even when packed)."""
        check_int("k0", k0, 0, self.in_features - 1)
        check_int("k1", k1, k0 + 1, self.in_features)
        if self.packed_codes and (k0 % 2 or k1 % 2):
            raise ValueError(f"k0 and k1 must be even for packed 4-bit codes, got k0={k0}, k1={k1}")
        if self.packed_codes:
            codes = unpack_int4(self.codes[:, k0 // 2:k1 // 2].reshape(-1), self.out_features * (k1 - k0))
            codes = codes.reshape(self.out_features, k1 - k0)
        else:
            codes = self.codes[:, k0:k1]
        codes = codes.to(torch.int32)
        g, n = self.group_len, k1 - k0
        if self.group_size == "tensor" or k0 // g == (k1 - 1) // g:  # the tile lies in one group: broadcast
            col = 0 if self.group_size == "tensor" else k0 // g
            zero = None if self.zero is None else self.zero[:, col:col + 1]
            scale = self.scale[:, col:col + 1]
        elif k0 % g == 0 and n % g == 0:  # whole groups: a view [out, groups, g], no gather
            codes = codes.reshape(self.out_features, n // g, g)
            zero = None if self.zero is None else self.zero[:, k0 // g:k1 // g, None]
            scale = self.scale[:, k0 // g:k1 // g, None]
        else:  # any other tile: each column's group by index
            group = torch.arange(k0, k1, device=codes.device) // g
            zero = None if self.zero is None else self.zero[:, group]
            scale = self.scale[:, group]
        if zero is not None:
            codes = codes - zero
        return (codes.float() * scale).reshape(self.out_features, n)

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantize a tile, multiply, accumulate: y = sum over tiles of x[..., tile] @ w_hat[:, tile].T."""
        self.check_input(x)
        y = None
        for k0 in range(0, self.in_features, self.tile):
            k1 = min(k0 + self.tile, self.in_features)
            part = x[..., k0:k1] @ self.weight_tile(k0, k1).to(x.dtype).T
            y = part if y is None else y + part
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size!r}, scheme={self.scheme!r}, backend={self.backend!r}")


class QuantEmbedding(nn.Module):
    """An embedding table stored quantized (int8 codes, scales, zero points); a lookup dequantizes only the
    rows it reads."""

    def __init__(self, qweight: QTensor):
        super().__init__()
        check_type("qweight", qweight, QTensor, "a labkit.quant.QTensor")
        self.register_buffer("codes", qweight.codes)
        self.register_buffer("scale", qweight.scale)
        self.register_buffer("zero", qweight.zero)
        self.meta = (qweight.bits, qweight.group_size, qweight.scheme, qweight.shape)

    @property
    def qweight(self) -> QTensor:
        """The table as a QTensor [vocab, d_model]."""
        return QTensor(self.codes, self.scale, self.zero, *self.meta)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Float32 embeddings [*tokens.shape, d_model] of integer token ids."""
        return self.qweight.dequantize(rows=tokens)
