"""Blockwise 8-bit optimizer states (notebook 09, section 4), after bitsandbytes' 8-bit optimizers (Dettmers et
al. 2022, "8-bit Optimizers via Block-wise Quantization", arXiv:2110.02861).

Adam keeps two FP32 numbers per parameter, m and v: 8 of the 16 bytes. Here each is stored as one byte per
value plus one FP32 absmax per block of 256 values (8.125 bits):

    state [n]  ->  blocks of 256 |b0: 256 values|b1: 256 values| ...     absmax[b] = max |state in block b|
    code[i]    =   the index of the level of CODEBOOK nearest to state[i] / absmax[block of i]

The levels are *dynamic*: dense near 0 and spread over several decades, so a block holding both 0.3 and 3e-6
keeps both (a linear 8-bit grid would flush the small one to 0). Our map: each decade [10^-(k+1), 10^-k] gets
its own evenly spaced levels, more for the upper decades. m, which is signed: 64, 32, 16, 8, 4, 2, 1 positive
levels over seven decades, their negatives and an exact 0 (255 levels). v, which is not: 128, 64, ..., 1, 1 levels
over nine decades and no 0 (256 levels, the smallest 1e-8 of the block's absmax), as Li et al. 2023 ("Memory
Efficient Optimizers with 4-bit States", arXiv:2309.01507) exclude the zero point from the second moment's map:
an element whose v rounds to 0 while its m does not would step by m / eps, thousands of times Adam's step. Here
the smallest v an element can hold is 1e-8 of its block's largest, so its step stays within about
sqrt(1e8) = 1e4 of the block's; in practice within a few times torch's (tests/finetune/test_optim8bit.py).
The update itself runs in FP32: dequantize, Adam step, quantize again. As bitsandbytes does, a tensor of fewer
than min_8bit_size values (4096 by default, bitsandbytes' default) keeps FP32 states: norms and biases, whose
bytes are few.
"""

from __future__ import annotations

import torch

from .._checks import check_bool, check_choice, check_number, check_positive_int, check_type, fail
from .memory import optimizer_state_bytes

BLOCK = 256
STATE_DTYPES = ("fp32", "int8")


def dynamic_codebook(signed: bool) -> torch.Tensor:
    """The increasing levels in [-1, 1] (signed: 255 levels, symmetric, 0 included) or in [1e-8, 1] (unsigned:
    256 levels, no 0), float32."""
    check_bool("signed", signed)
    counts = (64, 32, 16, 8, 4, 2, 1) if signed else (128, 64, 32, 16, 8, 4, 2, 1, 1)
    pos = []
    for k, n in enumerate(counts):  # decade k: n levels evenly spaced in (10^-(k+1), 10^-k], its top included
        top, bottom = 10.0 ** -k, 10.0 ** -(k + 1)
        pos += [bottom + (top - bottom) * (j + 1) / n for j in range(n)]
    pos = sorted(pos)
    levels = [-x for x in reversed(pos)] + [0.0] + pos if signed else pos
    return torch.tensor(levels, dtype=torch.float64).float()


CODEBOOKS = {True: dynamic_codebook(True), False: dynamic_codebook(False)}


def _check_code(code) -> torch.Tensor:
    check_type("code", code, torch.Tensor)
    if code.dim() != 1 or not code.is_floating_point() or not 2 <= code.numel() <= 256:
        fail("code", f"{code.dtype} {tuple(code.shape)}", "a 1-D float tensor of 2 to 256 levels")
    outside = (~torch.isfinite(code) | (code.abs() > 1)).nonzero()
    if outside.numel():
        i = int(outside[0])
        fail("code", f"level {i} = {float(code[i])}", "strictly increasing levels in [-1, 1]")
    down = (code[1:] <= code[:-1]).nonzero()
    if down.numel():
        i = int(down[0])
        fail("code", f"level {i + 1} = {float(code[i + 1])} after {float(code[i])}", "strictly increasing levels "
             "in [-1, 1]")
    return code.float()


def quantize_blockwise(x: torch.Tensor, code: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x (float, finite, any shape, flattened) -> (codes uint8 [n]: the index of the nearest level of `code` to
    x / absmax of its block, absmax float32 [ceil(n / block)]), both on x's device. `code`: strictly increasing
    levels in [-1, 1]. Ties go to the lower level. An all-zero block gets absmax 0 (it dequantizes to 0 whatever
    its codes)."""
    check_type("x", x, torch.Tensor)
    if not x.is_floating_point():
        fail("x", x.dtype, "a float tensor")
    code = _check_code(code).to(x.device)
    check_positive_int("block", block)
    x = x.detach().reshape(-1).float()
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        fail("x", f"{bad} NaN or inf of {x.numel()} values", "finite values")
    n = x.numel()
    pad = (-n) % block
    blocks = torch.cat([x, x.new_zeros(pad)]).view(-1, block)  # [n_blocks, block]
    absmax = blocks.abs().amax(dim=1)
    scaled = blocks / torch.where(absmax > 0, absmax, torch.ones_like(absmax))[:, None]
    mids = (code[1:] + code[:-1]) / 2
    codes = torch.searchsorted(mids, scaled.contiguous(), right=False)  # the number of midpoints below
    return codes.reshape(-1)[:n].to(torch.uint8), absmax


def dequantize_blockwise(codes: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                         block: int = BLOCK) -> torch.Tensor:
    """(codes uint8 [n], absmax float [ceil(n / block)]) -> float32 [n] on codes' device: code[codes] * absmax of
    each block."""
    check_type("codes", codes, torch.Tensor)
    if codes.dtype != torch.uint8:
        fail("codes", codes.dtype, "a uint8 tensor", TypeError)
    code = _check_code(code).to(codes.device)
    block = check_positive_int("block", block)
    n = codes.numel()
    check_type("absmax", absmax, torch.Tensor)
    n_blocks = -(-n // block)
    if absmax.dim() != 1 or absmax.numel() != n_blocks or not absmax.is_floating_point():
        fail("absmax", f"{absmax.dtype} {tuple(absmax.shape)}", f"a 1-D float tensor of {n_blocks} values (one per "
             f"block of {block} of the {n} codes)")
    if n and int(codes.max()) >= code.numel():
        fail("codes", int(codes.max()), f"indices of the {code.numel()} levels of code")
    values = code[codes.reshape(-1).long()]
    pad = (-n) % block
    values = torch.cat([values, values.new_zeros(pad)]).view(-1, block) * absmax.float()[:, None]
    return values.reshape(-1)[:n]


class AdamW8bit(torch.optim.Optimizer):
    """torch.optim.AdamW (bias-corrected Adam, decoupled weight decay, the same defaults) whose m and v are stored
    blockwise in 8 bits (state_dtype="int8") or in FP32 ("fp32", torch's arithmetic). As in bitsandbytes, a
    tensor of fewer than `min_8bit_size` values (default 4096, bitsandbytes' default: norms, biases) keeps FP32
    states whatever state_dtype says, and a parameter's states live on its device. step(closure) runs the closure
    with gradients enabled and returns its loss, as torch's optimizers do. Notebook 09, section 4."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, state_dtype: str = "int8", block: int = BLOCK,
                 min_8bit_size: int = 4096):
        check_number("lr", lr, low=0.0, low_open=True)
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            fail("betas", betas, "a pair of numbers in [0, 1)")
        for i, b in enumerate(betas):
            check_number(f"betas[{i}]", b, 0.0, 1.0, high_open=True)
        check_number("eps", eps, low=0.0, low_open=True)
        check_number("weight_decay", weight_decay, low=0.0)
        if state_dtype not in STATE_DTYPES:
            fail("state_dtype", state_dtype, f"one of {STATE_DTYPES} (an 8-bit state holds int8 codes; "
                 "fp16/bf16 states are not implemented)")
        check_positive_int("block", block)
        check_positive_int("min_8bit_size", min_8bit_size, "values", allow_zero=True)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.state_dtype, self.block, self.min_8bit_size = state_dtype, block, min_8bit_size

    def _init_state(self, p: torch.Tensor, state: dict) -> None:
        """step 0; m and v zero: FP32 tensors shaped like p, or 8-bit codes and absmaxes, on p's device."""
        state["step"] = 0
        for name, signed in (("m", True), ("v", False)):
            zeros = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
            if self.state_dtype == "int8" and p.numel() >= self.min_8bit_size:
                state[name], state[name + "_absmax"] = quantize_blockwise(zeros, CODEBOOKS[signed], self.block)
            else:
                state[name] = zeros

    def _load(self, state: dict, name: str, signed: bool) -> torch.Tensor:
        if name + "_absmax" not in state:
            return state[name].view(-1)
        return dequantize_blockwise(state[name], state[name + "_absmax"], CODEBOOKS[signed], self.block)

    def _store(self, state: dict, name: str, value: torch.Tensor, signed: bool) -> None:
        if name + "_absmax" not in state:
            state[name].view(-1).copy_(value)
        else:
            state[name], state[name + "_absmax"] = quantize_blockwise(value, CODEBOOKS[signed], self.block)

    def _check_gradients(self) -> None:
        """Refuse a gradient holding NaN or inf by name before any state or parameter changes."""
        for g, group in enumerate(self.param_groups):
            for j, p in enumerate(group["params"]):
                if p.grad is not None:
                    bad = int((~torch.isfinite(p.grad)).sum())
                    if bad:
                        fail(f"param_groups[{g}]['params'][{j}].grad", f"{bad} NaN or inf of {p.grad.numel()} values",
                             "finite (the states and parameters are left as they were)")

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step over every parameter with a gradient. `closure` (optional) re-evaluates the model and
        returns the loss: it runs first, with gradients enabled, and its loss is returned (None without it)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_gradients()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    self._init_state(p, state)
                state["step"] += 1
                t = state["step"]
                g = p.grad.reshape(-1).float()
                m = self._load(state, "m", True) * beta1 + (1 - beta1) * g
                v = self._load(state, "v", False) * beta2 + (1 - beta2) * g * g
                self._store(state, "m", m, True)
                self._store(state, "v", v, False)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                denom = (v / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
                p.add_((m / (1 - beta1 ** t) / denom).view_as(p), alpha=-group["lr"])
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict, then each state tensor as saved (on its parameter's device): torch casts
        floating states to the parameter's dtype, which would turn 8-bit codes into floats and a BF16
        parameter's FP32 m and v into BF16."""
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        saved = [i for group in state_dict["param_groups"] for i in group["params"]]
        for i, p in zip(saved, params):
            if i in state_dict["state"]:
                self.state[p] = {k: v.to(p.device, copy=True) if isinstance(v, torch.Tensor) else v
                                 for k, v in state_dict["state"][i].items()}

    def state_bytes(self) -> int:
        """Bytes of every state tensor (codes and absmaxes, or FP32 m and v): memory.optimizer_state_bytes."""
        return optimizer_state_bytes(self)


def state_bytes_per_param(state_dtype: str, block: int = BLOCK) -> float:
    """Bytes of Adam's m and v per parameter: 8 in FP32, 2 + 8 / block in blockwise 8 bits."""
    check_choice("state_dtype", state_dtype, STATE_DTYPES)
    check_positive_int("block", block)
    return 8.0 if state_dtype == "fp32" else 2 + 2 * 4 / block


__all__ = ["BLOCK", "STATE_DTYPES", "dynamic_codebook", "quantize_blockwise", "dequantize_blockwise", "AdamW8bit",
           "state_bytes_per_param"]
