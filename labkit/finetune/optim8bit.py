"""Blockwise 8-bit optimizer states (notebook 09, section 4), after bitsandbytes' 8-bit optimizers (Dettmers et
al. 2022, "8-bit Optimizers via Block-wise Quantization", arXiv:2110.02861).

Adam keeps two FP32 numbers per parameter, m and v: 8 of the 16 bytes. Here each is stored as one byte per
value plus one FP32 absmax per block of 256 values (8.125 bits):

    state [n]  ->  blocks of 256 |b0: 256 values|b1: 256 values| ...     absmax[b] = max |state in block b|
    code[i]    =   the index of the level of CODEBOOK nearest to state[i] / absmax[block of i]

The levels are *dynamic*: dense near 0 and spread over seven decades, so a block holding both 0.3 and 3e-6
keeps both (a linear 8-bit grid would flush the small one to 0; dividing by a v flushed to 0 blows an update
up). Our map: each decade [10^-(k+1), 10^-k] gets its own evenly spaced levels, more for the upper decades
(64, 32, 16, 8, 4, 2, 1 positive levels for m, which is signed; 128 ... 1 over eight decades for v, which is
not), plus an exact 0. The update itself runs in FP32: dequantize, Adam step, quantize again.
"""

from __future__ import annotations


import torch

from .._checks import check_choice, check_number, check_positive_int, check_type, fail

BLOCK = 256
STATE_DTYPES = ("fp32", "int8")


def dynamic_codebook(signed: bool) -> torch.Tensor:
    """The sorted levels in [-1, 1] (signed: 255 levels, symmetric, 0 included) or [0, 1] (256 levels), float32."""
    counts = (64, 32, 16, 8, 4, 2, 1) if signed else (128, 64, 32, 16, 8, 4, 2, 1)
    pos = []
    for k, n in enumerate(counts):  # decade k: n levels evenly spaced in (10^-(k+1), 10^-k], its top included
        top, bottom = 10.0 ** -k, 10.0 ** -(k + 1)
        pos += [bottom + (top - bottom) * (j + 1) / n for j in range(n)]
    pos = sorted(pos)
    levels = [-x for x in reversed(pos)] + [0.0] + pos if signed else [0.0] + pos
    return torch.tensor(levels, dtype=torch.float64).float()


CODEBOOKS = {True: dynamic_codebook(True), False: dynamic_codebook(False)}


def quantize_blockwise(x: torch.Tensor, code: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x (float, any shape, flattened) -> (codes uint8 [n]: the index of the nearest level of `code` to
    x / absmax of its block, absmax float32 [ceil(n / block)]). `code`: sorted levels in [-1, 1]. Ties go to
    the lower level. An all-zero block gets absmax 0 and the code of 0."""
    check_type("x", x, torch.Tensor)
    if not x.is_floating_point():
        fail("x", x.dtype, "a float tensor")
    check_positive_int("block", block)
    x = x.detach().reshape(-1).float()
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
    """(codes uint8 [n], absmax [n_blocks]) -> float32 [n]: code[codes] * absmax of each block."""
    n = codes.numel()
    values = code[codes.long()]
    pad = (-n) % block
    values = torch.cat([values, values.new_zeros(pad)]).view(-1, block) * absmax[:, None]
    return values.reshape(-1)[:n]


class AdamW8bit(torch.optim.Optimizer):
    """AdamW whose m and v are stored blockwise in 8 bits (state_dtype="int8") or in FP32 ("fp32", the same
    arithmetic as torch.optim.AdamW): bias-corrected Adam, decoupled weight decay."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, state_dtype: str = "int8", block: int = BLOCK):
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
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.state_dtype, self.block = state_dtype, block
        self.order: list[int] = []  # the order the last step touched the parameters (their index in the groups)

    def _load(self, state: dict, name: str, signed: bool) -> torch.Tensor:
        if self.state_dtype == "fp32":
            return state[name]
        return dequantize_blockwise(state[name], state[name + "_absmax"], CODEBOOKS[signed], self.block)

    def _store(self, state: dict, name: str, value: torch.Tensor, signed: bool) -> None:
        if self.state_dtype == "fp32":
            state[name] = value
        else:
            state[name], state[name + "_absmax"] = quantize_blockwise(value, CODEBOOKS[signed], self.block)

    @torch.no_grad()
    def step(self, closure=None):
        self.order = []
        index = 0
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                self.order.append(index - 1)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    zeros = torch.zeros(p.numel())
                    self._store(state, "m", zeros, True)
                    self._store(state, "v", zeros, False)
                state["step"] += 1
                t = state["step"]
                g = p.grad.reshape(-1).float()
                m = self._load(state, "m", True).view(-1) * beta1 + (1 - beta1) * g
                v = self._load(state, "v", False).view(-1) * beta2 + (1 - beta2) * g * g
                self._store(state, "m", m, True)
                self._store(state, "v", v, False)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                denom = (v / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
                p.add_((m / (1 - beta1 ** t) / denom).view_as(p), alpha=-group["lr"])
        return None

    def state_bytes(self) -> int:
        """Bytes of every state tensor (codes and absmaxes, or FP32 m and v)."""
        return sum(t.numel() * t.element_size() for st in self.state.values() for t in st.values()
                   if isinstance(t, torch.Tensor))


def state_bytes_per_param(state_dtype: str, block: int = BLOCK) -> float:
    """Bytes of Adam's m and v per parameter: 8 in FP32, 2 + 8 / block in blockwise 8 bits."""
    check_choice("state_dtype", state_dtype, STATE_DTYPES)
    check_positive_int("block", block)
    return 8.0 if state_dtype == "fp32" else 2 + 2 * 4 / block


__all__ = ["BLOCK", "STATE_DTYPES", "dynamic_codebook", "quantize_blockwise", "dequantize_blockwise", "AdamW8bit",
           "state_bytes_per_param"]
