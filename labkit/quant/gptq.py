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
choice of codes differs, so any gain is free at inference time. The layers come from TinyLM's one table of
linear layers (labkit.tinylm.iter_linears), keyed by their module path.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from .._checks import check_number, check_type, fail
from ..tinylm import LAYER_TYPES, iter_linears
from .qtensor import QTensor, check_bits, check_group_size, check_scheme, check_weight, quantize
from .threads import torch_threads

GPTQ_TYPES = tuple(t for t in LAYER_TYPES if t != "embedding")  # the matmuls (the embedding is a lookup)


def _check_types(types) -> tuple[str, ...]:
    if isinstance(types, str) or not isinstance(types, (tuple, list)):
        fail("types", types, f"a tuple of layer types from {GPTQ_TYPES}", TypeError)
    if not types:
        fail("types", types, f"a non-empty tuple of layer types from {GPTQ_TYPES}")
    for t in types:
        if not isinstance(t, str):
            fail("types", tuple(types), f"a tuple of layer types (str) from {GPTQ_TYPES}", TypeError)
        if t not in GPTQ_TYPES:
            fail("types", tuple(types), f"some of {GPTQ_TYPES} (GPTQ needs a matmul's inputs)")
    return tuple(types)


def _layers(model: nn.Module, types: tuple[str, ...]) -> list:
    """The (entry, module) pairs of the model's linear layers of `types`; refuses a selection with none
    (a tied lm_head is the embedding's matrix, a lookup: GPTQ has no inputs to calibrate it on)."""
    layers = list(iter_linears(model, types))  # TypeError unless model is a TinyLM
    if not layers:
        fail("types", types, "layer types this model has as matmuls (its lm_head is tied to the embedding, "
             "which GPTQ does not calibrate)")
    return layers


def _check_tokens(tokens) -> torch.Tensor:
    check_type("tokens", tokens, torch.Tensor, "a 2-D int64 torch.Tensor [batch, time]")
    if tokens.dtype != torch.long:
        fail("tokens", tokens.dtype, "a 2-D int64 tensor [batch, time]", TypeError)
    if tokens.dim() != 2 or tokens.numel() == 0:
        raise ValueError(f"tokens must be a non-empty 2-D int64 tensor [batch, time], got shape {tuple(tokens.shape)}")
    return tokens


def _check_settings(bits, group_size, scheme, damp) -> tuple[int, int | str, str]:
    bits, group_size, scheme = check_bits(bits), check_group_size(group_size), check_scheme(scheme)
    check_number("damp", damp, 0.0, 1.0, low_open=True, high_open=True)
    if group_size == "tensor":
        fail("group_size", group_size, "an int or 'channel' (GPTQ needs per-channel or per-group scales, "
             "not group_size='tensor')")
    return bits, group_size, scheme


@torch.no_grad()
def collect_inputs(model: nn.Module, tokens: torch.Tensor, types: tuple[str, ...] = ("attention", "mlp")
                   ) -> dict[str, torch.Tensor]:
    """{layer path: the inputs [n_tokens, in] (in the model's dtype) that it sees when the model reads `tokens`
    [batch, time] (int64)}, for every linear layer of TinyLM's table whose type is in `types`
    (attention, mlp, head; a tied lm_head is the embedding's matrix: ("head",) alone is refused there)."""
    types, tokens = _check_types(types), _check_tokens(tokens)
    layers = _layers(model, types)
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for entry, module in layers:
        def hook(mod, args, out, path=entry.path):
            seen.setdefault(path, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).clone())
        hooks.append(module.register_forward_hook(hook))
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return {entry.path: torch.cat(seen[entry.path]) for entry, _ in layers}


@torch.no_grad()
def gptq_quantize(weight: torch.Tensor, x: torch.Tensor, bits: int = 4, group_size: int | str = 32,
                  scheme: str = "asym", damp: float = 0.01) -> QTensor:
    """GPTQ (Frantar et al., 2022, arXiv:2210.17323) for one layer: weight [out, in], calibration inputs
    x [n, in]. Quantizes one input column at a time, in order, and spreads each column's rounding error
    over the columns not yet quantized, weighted by the inverse Hessian H = x.T @ x of the layer's squared
    output error. Returns a QTensor in exactly the format of quantize() (same bits, same scales)."""
    check_weight(weight, "weight")
    bits, group_size, scheme = _check_settings(bits, group_size, scheme, damp)
    out, inp = weight.shape
    check_weight(x, "x")
    if x.shape[1] != inp:
        raise ValueError(f"x must be [n, {inp}], got {tuple(x.shape)}")
    g = inp if group_size == "channel" else group_size
    if inp % g:
        raise ValueError(f"group_size {g} must divide the input dimension {inp} (weight is [{out}, {inp}])")
    # float64 throughout: a float32 loop rounds differently on each CPU's kernels (AVX2, AVX-512, AMX), and a
    # code one step away from a tie then flips, so each learner's machine would get other codes.
    w = weight.detach().double().clone()
    h = x.double().T @ x.double() / x.shape[0]
    dead = h.diagonal() == 0  # inputs that are always 0: their weights do not matter
    h[dead, dead] = 1.0
    h += damp * h.diagonal().mean() * torch.eye(inp, dtype=h.dtype)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
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
         scheme: str = "asym", types: tuple[str, ...] = ("attention", "mlp"), damp: float = 0.01,
         threads: int | None = 1) -> dict[str, QTensor]:
    """{layer path: QTensor} for every linear layer of the given types, quantized by GPTQ from the
    activations of the unquantized model on calibration `tokens` [batch, time]. Pass them to
    labkit.quant.quantize_model(..., qtensors=...). Runs on `threads` torch threads (None: as many as
    torch uses now): its column loop is many tiny operations, which a second thread only slows when
    another program shares the cores (labkit.quant.threads); the codes are the same on any count."""
    _check_settings(bits, group_size, scheme, damp)
    layers = _layers(model, _check_types(types))
    for entry, module in layers:
        if not isinstance(module, nn.Linear):
            raise TypeError(f"model's {entry.path} must be an nn.Linear, got {type(module).__name__}: "
                            f"GPTQ starts from the floating-point model")
    with torch_threads(threads, "threads"):
        # the calibration forward in float64 too, for the same reason as gptq_quantize's loop
        inputs = collect_inputs(copy.deepcopy(model).double(), tokens, types)
        return {entry.path: gptq_quantize(module.weight, inputs[entry.path], bits, group_size, scheme, damp)
                for entry, module in layers}
