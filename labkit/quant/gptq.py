"""Calibration-based INT4: GPTQ (Frantar et al., 2022, arXiv:2210.17323) for notebook 03.

Round-to-nearest (RTN) rounds every weight on its own. GPTQ looks at what the layer computes: it
quantizes the input columns of W one after another and, after each, corrects the columns not yet
quantized so that the layer's output on calibration inputs x changes as little as possible:

    minimise || x @ W.T - x @ W_hat.T ||^2      H = x.T @ x / n  (+ a small damping on its diagonal)

    for column j = 0 .. in-1:
        (at the start of each group: scale and zero point from the current, already corrected weights)
        w_hat[:, j] = dequantize(quantize(W[:, j]))
        e = (W[:, j] - w_hat[:, j]) / U[j, j]             U = upper Cholesky factor of H^-1
        W[:, j+1:] -= e * U[j, j+1:]                      push the error onto the columns to come

The result has exactly the format of round-to-nearest (same codes, scales, zero points, bits): only the
choice of codes differs, so any gain is free at inference time.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..tinylm import layer_type
from .qtensor import QTensor, quantize


@torch.no_grad()
def collect_inputs(model: nn.Module, tokens: torch.Tensor, types: tuple[str, ...] = ("attention", "mlp")
                   ) -> dict[str, torch.Tensor]:
    """The inputs [n_tokens, in] that each nn.Linear of the given layer types sees when the model reads
    `tokens` [batch, time] (int64)."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"tokens must be a 2-D int64 tensor [batch, time], got "
                         f"{getattr(tokens, 'shape', type(tokens).__name__)}")
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name != "lm_head" and layer_type(name + ".weight") in types:
            def hook(mod, args, out, name=name):
                seen.setdefault(name, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).float())
            hooks.append(module.register_forward_hook(hook))
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return {name: torch.cat(parts) for name, parts in seen.items()}


@torch.no_grad()
def gptq_quantize(weight: torch.Tensor, x: torch.Tensor, bits: int = 4, group_size: int | str = 32,
                  scheme: str = "asym", damp: float = 0.01) -> QTensor:
    """GPTQ (Frantar et al., 2022, arXiv:2210.17323) for one layer: weight [out, in], calibration inputs
    x [n, in]. Quantizes one input column at a time, in order, and spreads each column's rounding error
    over the columns not yet quantized, weighted by the inverse Hessian H = x.T @ x of the layer's squared
    output error. Returns a QTensor in exactly the format of quantize() (same bits, same scales)."""
    w = weight.detach().float().clone()
    out, inp = w.shape
    if x.dim() != 2 or x.shape[1] != inp:
        raise ValueError(f"x must be [n, {inp}], got {tuple(x.shape)}")
    if not 0 < damp < 1:
        raise ValueError(f"damp must be in (0, 1), got {damp!r}")
    g = {"channel": inp, "tensor": None}.get(group_size, group_size)
    if g is None:
        raise ValueError("GPTQ needs per-channel or per-group scales, not group_size='tensor'")
    quantize(w, bits, scheme, group_size)  # validates bits, scheme, group_size and w
    h = x.double().T @ x.double() / x.shape[0]
    dead = h.diagonal() == 0  # inputs that are always 0: their weights do not matter
    h[dead, dead] = 1.0
    h += damp * h.diagonal().mean() * torch.eye(inp, dtype=h.dtype)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).float()
    codes = torch.empty(out, inp, dtype=torch.int8)
    scales, zeros = [], []
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    for j in range(inp):
        if j % g == 0:  # a new group: its scale comes from the weights as updated so far
            q = quantize(w[:, j:j + g], bits, scheme, "channel")
            s, z = q.scale[:, 0], (q.zero[:, 0] if q.zero is not None else torch.zeros(out, dtype=torch.int32))
            scales.append(s)
            zeros.append(z)
        c = (torch.round(w[:, j] / s) + z).clamp(qmin, qmax)
        codes[:, j] = c.to(torch.int8)
        err = (w[:, j] - (c - z) * s) / hinv[j, j]
        w[:, j + 1:] -= err[:, None] * hinv[j, j + 1:][None, :]
    zero = torch.stack(zeros, 1) if scheme == "asym" else None
    return QTensor(codes, torch.stack(scales, 1), zero, bits, group_size, scheme, (out, inp))


def gptq(model: nn.Module, tokens: torch.Tensor, bits: int = 4, group_size: int | str = 32,
         scheme: str = "asym", types: tuple[str, ...] = ("attention", "mlp"), damp: float = 0.01
         ) -> dict[str, QTensor]:
    """{linear name: QTensor} for every linear of the given types, quantized by GPTQ from the activations
    of the unquantized model on calibration `tokens` [batch, time]. Pass them to
    labkit.quant.quantize_model(..., qtensors=...)."""
    inputs = collect_inputs(model, tokens, types)
    modules = dict(model.named_modules())
    return {name: gptq_quantize(modules[name].weight, x, bits, group_size, scheme, damp)
            for name, x in inputs.items()}
