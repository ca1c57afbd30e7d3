"""The 4-bit matmul and whole-model quantization policies (notebook 03). Re-exported by labkit.quant.

QuantLinear keeps its weight as codes + scales and has two paths:

    reference  for each tile of `tile` input columns: unpack the codes, dequantize the tile, multiply,
               accumulate  (y += x[:, k0:k1] @ w_hat[:, k0:k1].T). The full FP32 weight never exists.
    int4pack   torch's INT4 weight-only CPU kernel (torch.ops.aten._weight_int4pack_mm_for_cpu) on BF16
               activations: it dequantizes w = (q - 8) * scale + zero with q in 0..15 and a float zero.
               Our codes map to it exactly: q = code + 8, zero = -zero_point * scale (0 when symmetric).

Storage: packed codes, scales and zero points are buffers (so .to(device) moves them); when the kernel
is used, its own tiled copy of the codes and BF16-ready scales is kept next to them (a deployment would keep
only that one). "auto" takes the kernel when it exists, the input is on the CPU and the shapes fit (4 bits, out % 16 == 0,
group length a multiple of 32), and falls back to the reference path otherwise.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..tinylm import layer_type
from .qtensor import QTensor, pack_int4, quantize, quantized_bytes, unpack_int4

BACKENDS = ("auto", "reference", "int4pack")
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int4")
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
        if not isinstance(qweight, QTensor):
            raise TypeError(f"qweight must be a labkit.quant.QTensor, got {type(qweight).__name__}")
        if not isinstance(tile, int) or tile < 2 or tile % 2:
            raise ValueError(f"tile must be an even int >= 2, got {tile!r}")
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
        if value not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {value!r}")
        if value == "int4pack" and self.int4pack is None:
            raise ValueError(f"backend 'int4pack' is not available for this layer ({self.bits} bits, "
                             f"[{self.out_features}, {self.in_features}], group {self.group_size!r}, "
                             f"kernel present: {int4_kernel_available()})")
        self._backend = value

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4, group_size: int | str = 32, scheme: str = "asym",
                    backend: str = "auto") -> "QuantLinear":
        """Quantize an nn.Linear's weight by round-to-nearest (labkit.quant.quantize)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        return cls(quantize(linear.weight.detach().float(), bits, scheme, group_size), linear.bias, backend)

    def path(self, x: torch.Tensor) -> str:
        """Which path forward(x) takes: "int4pack" or "reference"."""
        fast = self.int4pack is not None and x.device.type == "cpu"
        return "int4pack" if self.backend == "int4pack" or (self.backend == "auto" and fast) else "reference"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must end in {self.in_features} features, got shape {tuple(x.shape)}")
        y = self.forward_int4pack(x) if self.path(x) == "int4pack" else self.forward_reference(x)
        return y if self.bias is None else y + self.bias

    def forward_int4pack(self, x: torch.Tensor) -> torch.Tensor:
        """torch's INT4 kernel on BF16 activations (the result is cast back to x's dtype)."""
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.int4pack, self.kernel_group, self.scales_and_zeros)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def weight_tile(self, k0: int, k1: int) -> torch.Tensor:
        """Dequantized columns k0:k1 of the weight, float32 [out, k1 - k0] (k0, k1 even when packed)."""
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
        if not isinstance(qweight, QTensor):
            raise TypeError(f"qweight must be a labkit.quant.QTensor, got {type(qweight).__name__}")
        self.register_buffer("codes", qweight.codes)
        self.register_buffer("scale", qweight.scale)
        self.register_buffer("zero", qweight.zero)
        self.meta = (qweight.bits, qweight.group_size, qweight.scheme, qweight.shape)

    @property
    def qweight(self) -> QTensor:
        return QTensor(self.codes, self.scale, self.zero, *self.meta)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.qweight.dequantize(rows=tokens)


def _check_policy(policy) -> dict[str, str]:
    kinds = ("embedding", "attention", "mlp", "norm")
    if not isinstance(policy, dict):
        raise TypeError(f"policy must be a dict mapping layer type -> precision, got {type(policy).__name__}")
    for kind, prec in policy.items():
        if kind not in kinds:
            raise ValueError(f"policy key {kind!r} is not a layer type; expected some of {kinds}")
        if prec not in PRECISIONS:
            raise ValueError(f"policy[{kind!r}] = {prec!r}; expected one of {PRECISIONS}")
    if policy.get("norm", "fp32") not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"policy['norm'] = {policy['norm']!r}: norm weights stay floating point (fp32|fp16|bf16)")
    return {k: policy.get(k, "fp32") for k in kinds}


def quantize_model(model: nn.Module, policy: dict[str, str], group_size: int | str = 32, scheme: str = "asym",
                   backend: str = "reference", qtensors: dict[str, QTensor] | None = None) -> tuple[nn.Module, dict]:
    """A quantized copy of a TinyLM (the input model is left as it is) and a memory report.

    policy maps layer type ("embedding", "attention", "mlp", "norm") to "fp32" | "fp16" | "bf16" | "int8" |
    "int4"; missing types stay fp32. int8/int4 layers become QuantLinear (QuantEmbedding for the embedding,
    shared with the tied output layer) with `group_size` and `scheme`; fp16/bf16 weights are rounded to that
    format (kept as the FP32 values of the rounded weights for CPU compute; counted at 2 bytes).
    qtensors: optional {linear name: QTensor} from labkit.calibrate.gptq, used instead of round-to-nearest for those layers.
    report: {"layers": [{name, type, precision, params, bytes}], "bytes", "fp32_bytes", "compression",
    "bits_per_weight"}; bytes count scales and zero points at 2 bytes (fp16) each.
    """
    policy = _check_policy(policy)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if scheme not in ("asym", "sym"):
        raise ValueError(f"scheme must be 'asym' or 'sym', got {scheme!r}")
    if not isinstance(model, nn.Module) or not hasattr(model, "tok_emb"):
        raise TypeError(f"model must be a TinyLM, got {type(model).__name__}")
    qtensors = qtensors or {}
    model = copy.deepcopy(model)
    rows = []
    tied = getattr(model, "lm_head", None) is not None and model.lm_head.weight is model.tok_emb.weight

    def account(name, kind, prec, numel, group_len, scheme=scheme):
        nbytes = {"fp32": 4 * numel, "fp16": 2 * numel, "bf16": 2 * numel}.get(prec)
        if nbytes is None:
            nbytes = quantized_bytes(numel, 8 if prec == "int8" else 4, group_len, scheme)
        rows.append({"name": name, "type": kind, "precision": prec, "params": numel, "bytes": nbytes})

    def rounded(w, prec):
        return w.to({"fp16": torch.float16, "bf16": torch.bfloat16}[prec]).float()

    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and not (tied and name == "lm_head"):
            kind = layer_type(name + ".weight")
            prec = policy[kind]
            if prec in ("int8", "int4"):
                bits, be = (8, "reference") if prec == "int8" else (4, backend)
                if name in qtensors:
                    q = qtensors[name]
                    if not isinstance(q, QTensor) or q.shape != tuple(module.weight.shape) or q.bits != bits:
                        raise ValueError(f"qtensors[{name!r}] must be a {bits}-bit QTensor of shape "
                                         f"{tuple(module.weight.shape)}")
                    ql = QuantLinear(q, module.bias, backend=be)
                else:
                    ql = QuantLinear.from_linear(module, bits, group_size, scheme, be)
                model.set_submodule(name, ql)
                account(name, kind, prec, module.weight.numel(), ql.qweight.group_len, ql.scheme)
            else:
                if prec != "fp32":
                    module.weight.data = rounded(module.weight.data, prec)
                account(name, kind, prec, module.weight.numel(), 1)
        elif isinstance(module, nn.Embedding):
            prec = policy["embedding"]
            w = module.weight.data
            if prec in ("int8", "int4"):
                q = quantize(w, 8 if prec == "int8" else 4, scheme, group_size)
                model.set_submodule(name, QuantEmbedding(q))
                if tied:
                    model.lm_head = QuantLinear(q, backend=backend if prec == "int4" else "reference")
                account(name, "embedding", prec, w.numel(), q.group_len)
            else:
                if prec != "fp32":
                    module.weight.data = rounded(w, prec)
                account(name, "embedding", prec, w.numel(), 1)
        elif type(module).__name__ == "RMSNorm":
            if policy["norm"] != "fp32":
                module.weight.data = rounded(module.weight.data, policy["norm"])
            account(name, "norm", policy["norm"], module.weight.numel(), 1)
    total = sum(r["bytes"] for r in rows)
    params = sum(r["params"] for r in rows)
    report = {"layers": rows, "bytes": total, "fp32_bytes": 4 * params, "compression": 4 * params / total,
              "bits_per_weight": 8 * total / params}
    return model, report
