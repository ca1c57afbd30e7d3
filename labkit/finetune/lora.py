"""LoRA and QLoRA on TinyLM's table of linear layers (notebook 09, section 3).

LoRA (Hu et al., 2021, arXiv:2106.09685) freezes a weight W [out, in] and learns a low-rank change to it:

    y = x W^T + (alpha / r) * (x A^T) B^T        A [r, in] (random, small), B [out, r] (zeros at the start)

              x [.., in] ──> W (frozen, FP32 / BF16 / NF4 / INT4) ──────────────┐
                   └─────> A [r, in] ──> B [out, r] ──> * alpha / r ───────────(+)──> y [.., out]

so training touches r * (in + out) numbers per layer instead of in * out, and the model starts exactly where
the base was (B = 0). merge() folds the change into the weight, W' = W + (alpha / r) B A, and unmerge() takes
it out again; both are exact for an FP32 base (the same sums in float64, rounded once).

QLoRA (Dettmers et al., 2023, arXiv:2305.14314) keeps the frozen base in 4 bits (NF4, lab 03) and
dequantizes it inside the matmul, forward and backward, so the full-precision weight never stays in memory:
FrozenBase below saves only the codes for the backward pass.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from .._checks import check_choice, check_number, check_positive_int, check_type, fail
from ..quant import nf4, quantize
from ..tinylm import LAYER_TYPES, check_tinylm, linear_layers

BASE_DTYPES = ("fp32", "bf16", "nf4", "int4")
_NF4_LEVELS = torch.from_numpy(nf4.nf4_levels().astype(np.float32))
_NF4_PAIRS = torch.stack([_NF4_LEVELS[torch.arange(256) & 15], _NF4_LEVELS[torch.arange(256) >> 4]], dim=1)
"""[256, 2]: the two levels a packed byte holds (low nibble first), so one lookup per byte rebuilds two weights."""


class _Dequantized(torch.autograd.Function):
    """y = x W^T with W rebuilt from the frozen base in forward and again in backward; only the base (codes or a
    low-precision copy) is kept for backward, never the FP32 W (QLoRA's trick: the base needs no gradient)."""

    @staticmethod
    def forward(ctx, x, base):
        ctx.base = base
        return x @ base.weight(x.dtype).T

    @staticmethod
    def backward(ctx, grad):
        return grad @ ctx.base.weight(grad.dtype), None


class FrozenBase(nn.Module):
    """A frozen weight [out, in] stored as `dtype`: "fp32" (as it is), "bf16", "nf4" (blocks of 64 with an
    FP32 absmax, 4.5 bits per weight, codes two per byte) or "int4" (lab 03's asymmetric INT4, groups of 32)."""

    def __init__(self, weight: torch.Tensor, dtype: str = "fp32"):
        super().__init__()
        check_choice("dtype", dtype, BASE_DTYPES)
        check_type("weight", weight, torch.Tensor)
        if weight.dim() != 2 or not weight.is_floating_point() or weight.numel() == 0:
            fail("weight", f"{weight.dtype} {tuple(weight.shape)}", "a 2-D float tensor [out, in], out, in >= 1")
        bad = int((~torch.isfinite(weight.detach())).sum())
        if bad:
            fail("weight", f"{bad} NaN or inf of {weight.numel()} values", "finite values")
        self.dtype, self.shape = dtype, tuple(weight.shape)
        w = weight.detach().float()
        if dtype == "fp32":
            self.register_buffer("w", w.clone())
        elif dtype == "bf16":
            self.register_buffer("w", w.to(torch.bfloat16))
        elif dtype == "nf4":
            if w.numel() % (2 * nf4.NF4_BLOCK):
                fail("weight", f"{w.numel()} elements", f"a multiple of {2 * nf4.NF4_BLOCK} elements for NF4")
            codes, absmax = nf4.quantize_nf4(w.reshape(-1).numpy(), nf4.NF4_BLOCK)
            codes = torch.from_numpy(codes.astype(np.uint8))
            self.register_buffer("packed", codes[0::2] | (codes[1::2] << 4))  # two codes a byte, low nibble first
            self.register_buffer("absmax", torch.from_numpy(np.asarray(absmax, np.float32)))
        else:
            q = quantize(w, bits=4, scheme="asym", group_size=32)
            self.qtensor = q  # codes int8 [out, in], scale/zero per group (labkit.quant.QTensor)
            self.register_buffer("codes", q.codes.to(torch.int8))

    def weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight [out, in] as `dtype`, rebuilt from what is stored."""
        if self.dtype in ("fp32", "bf16"):
            return self.w.to(dtype)
        if self.dtype == "nf4":  # in torch, so the profiler sees the transient: 2 + 4 bytes per weight at most
            w = _NF4_PAIRS.index_select(0, self.packed.int()).reshape(-1, nf4.NF4_BLOCK)  # [blocks, 64]
            return w.mul_(self.absmax[:, None]).reshape(self.shape).to(dtype)
        return self.qtensor.dequantize().to(dtype)

    def nbytes(self) -> int:
        """Bytes stored: the buffers (codes, absmaxes) plus INT4's scales and zero points at 2 bytes each."""
        if self.dtype == "int4":
            return self.qtensor.nbytes()
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dtype == "fp32":
            return x @ self.w.T
        return _Dequantized.apply(x, self)


class LoRALinear(nn.Module):
    """A frozen base W plus a trainable low-rank change (module docstring): y = base(x) + (alpha/r) x A^T B^T."""

    def __init__(self, linear: nn.Linear, rank: int, alpha: float, base_dtype: str = "fp32", seed: int = 0):
        super().__init__()
        check_type("linear", linear, nn.Linear, "an nn.Linear")
        if linear.bias is not None:
            fail("linear", linear, "an nn.Linear without bias (TinyLM's have none)")
        out_f, in_f = linear.weight.shape
        self.rank = check_positive_int("rank", rank)
        if rank > min(out_f, in_f):
            fail("rank", rank, f"at most min(out, in) = {min(out_f, in_f)} for a [{out_f}, {in_f}] weight")
        self.alpha = check_number("alpha", alpha, low=0.0, low_open=True)
        self.base = FrozenBase(linear.weight, base_dtype)
        g = torch.Generator().manual_seed(seed)
        bound = 1 / math.sqrt(in_f)  # A as nn.Linear initializes a weight; B = 0: the model starts unchanged
        self.A = nn.Parameter((torch.rand(rank, in_f, generator=g) * 2 - 1) * bound)
        self.B = nn.Parameter(torch.zeros(out_f, rank))
        self.merged = False

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def delta(self) -> torch.Tensor:
        """(alpha / r) B A [out, in], computed in float64."""
        return (self.B.detach().double() @ self.A.detach().double()) * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_type("x", x, torch.Tensor)
        if x.dtype != self.A.dtype or x.dim() < 1 or x.shape[-1] != self.A.shape[1]:
            fail("x", f"{x.dtype} {tuple(x.shape)}", f"a {self.A.dtype} tensor [..., {self.A.shape[1]}] (the "
                 f"adapted layer's input width)")
        y = self.base(x)
        if self.merged:
            return y
        x2 = x.reshape(-1, x.shape[-1])  # [tokens, in]
        xa = (x2 @ self.A.T) * self.scale  # [tokens, r]: the scale on the narrow side
        return torch.addmm(y.reshape(-1, y.shape[-1]), xa, self.B.T).reshape(y.shape)  # y + xa B^T, one op

    def merge(self) -> None:
        """W <- W + (alpha / r) B A (FP32 base only); forward then skips the adapter."""
        self._check_fp32("merge")
        if not self.merged:
            self.base.w.copy_((self.base.w.double() + self.delta()).float())
            self.merged = True

    def unmerge(self) -> None:
        """W <- W - (alpha / r) B A: the base as it was (to float32 rounding of the sum)."""
        self._check_fp32("unmerge")
        if self.merged:
            self.base.w.copy_((self.base.w.double() - self.delta()).float())
            self.merged = False

    def _check_fp32(self, what: str) -> None:
        if self.base.dtype != "fp32":
            raise ValueError(f"{what} needs an FP32 base, got base_dtype {self.base.dtype!r}: a 4-bit or BF16 "
                             "base cannot hold W + BA exactly (dequantize it into a new model instead)")

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}, base={self.base.dtype}, merged={self.merged}"


def lora_targets(model, targets=("attention", "mlp")) -> list[str]:
    """The paths of the linears `targets` names: layer types (LAYER_TYPES minus the embedding) or exact paths
    from labkit.tinylm.linear_layers (e.g. "layers.0.attn.wq")."""
    cfg = check_tinylm(model).cfg
    if isinstance(targets, str) or not isinstance(targets, (list, tuple)) or not targets:
        fail("targets", targets, "a non-empty tuple of layer types or linear-layer paths")
    table = [e for e in linear_layers(cfg) if e.layer_type != "embedding" and
             not (e.path == "lm_head" and cfg.tie_embeddings)]
    paths = []
    for t in targets:
        if t in LAYER_TYPES:
            found = [e.path for e in table if e.layer_type == t]
            if not found:
                fail("targets", t, "a layer type with a linear to adapt in this model (a tied lm_head is the "
                     "embedding's matrix, not a linear of its own; the embedding takes no adapter)")
            paths += found
        elif any(e.path == t for e in table):
            paths.append(t)
        else:
            fail("targets", t, f"a layer type of {tuple(x for x in LAYER_TYPES if x != 'embedding')} or a linear "
                 f"of labkit.tinylm.linear_layers (e.g. 'layers.0.attn.wq'; a tied lm_head is not one)")
    return list(dict.fromkeys(paths))


def add_lora(model, rank: int = 8, alpha: float = 16.0, targets=("attention", "mlp"), base_dtype: str = "fp32",
             seed: int = 0):
    """Replace the chosen linears of `model` (in place) by LoRALinear(rank, alpha, base_dtype); freeze every
    other parameter; return the model. Every argument is checked before the model is touched."""
    check_tinylm(model)
    paths = lora_targets(model, targets)
    check_positive_int("rank", rank)
    check_number("alpha", alpha, low=0.0, low_open=True)
    check_choice("base_dtype", base_dtype, BASE_DTYPES)
    for path in paths:
        lin = model.get_submodule(path)
        if not isinstance(lin, nn.Linear):
            fail("targets", path, "linears that are plain nn.Linear (this one already has an adapter or is quantized)")
        if rank > min(lin.weight.shape):
            fail("rank", rank, f"at most {min(lin.weight.shape)} (the smallest side of {path})")
    for p in model.parameters():
        p.requires_grad_(False)
    for i, path in enumerate(paths):
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name,
                LoRALinear(model.get_submodule(path), rank, alpha, base_dtype, seed=seed + i))
    return model


def lora_layers(model) -> dict[str, LoRALinear]:
    """{path: LoRALinear} of a model with adapters."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def trainable_params(model) -> int:
    """Parameters that require a gradient."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merge(model) -> None:
    """Merge every adapter of `model` into its FP32 base (LoRALinear.merge)."""
    for m in lora_layers(model).values():
        m.merge()


def unmerge(model) -> None:
    """Take every merged adapter back out (LoRALinear.unmerge)."""
    for m in lora_layers(model).values():
        m.unmerge()
