"""Notebook 09's exercises, defined once (the notebook's check cells and tests/finetune/test_exercises.py use them):

    SIXTEEN_BYTES  mixed_precision_adam_bytes(n_params) -> {"weights", "gradients", "master", "adam m", "adam v",
                   "total"}: bytes to train n_params parameters with mixed-precision Adam          (section 1)
    LORA_FORWARD   lora_forward(x, W, A, B, alpha) -> y [.., out]: the frozen layer plus its low-rank change
                   (r = A's rows)                                                                (section 3)
    BLOCK_QUANT    quantize_blockwise(x, code, block) -> (codes uint8 [n], absmax float32 [blocks]): each value
                   the index of the nearest level of `code` to value / its block's absmax        (section 4)
"""

from __future__ import annotations

import torch

from ..course import Exercise
from ..rng import Rng
from .memory import ADAM_BYTES
from .optim8bit import CODEBOOKS, quantize_blockwise


def mixed_precision_adam_bytes(n_params: int) -> dict[str, int]:
    """Bytes by part, and their total, for n_params parameters under mixed-precision Adam (ZeRO's 16 per parameter)."""
    out = {part: b * n_params for part, b in ADAM_BYTES.items()}
    out["total"] = sum(out.values())
    return out


SIXTEEN_BYTES = Exercise("mixed_precision_adam_bytes", mixed_precision_adam_bytes,
                         cases=[(1,), (820_352,), (6_738_415_616,)],
                         random_case=lambda rng: (1 + rng.below(10**12),))


def lora_forward(x: torch.Tensor, W: torch.Tensor, A: torch.Tensor, B: torch.Tensor, alpha: float) -> torch.Tensor:
    """y = x W^T + (alpha / r) (x A^T) B^T with r = A.shape[0] (labkit.finetune.lora.LoRALinear's forward)."""
    return x @ W.T + (x @ A.T) @ B.T * (alpha / A.shape[0])


def random_lora_case(rng: Rng) -> tuple:
    """Float64 x [b, in], W [out, in], A [r, in], B [out, r] (B not zero: the change shows), alpha 1..32."""
    g = torch.Generator().manual_seed(rng.below(2**31))
    b, i, o = 1 + rng.below(4), 1 + rng.below(16), 1 + rng.below(16)
    r = 1 + rng.below(min(i, o))
    t = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return t(b, i), t(o, i), t(r, i), t(o, r), float(1 + rng.below(32))


_g = torch.Generator().manual_seed(0)
LORA_FORWARD = Exercise("lora_forward", lora_forward, cases=[
    (torch.ones(1, 2, dtype=torch.float64), torch.eye(2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64),
     torch.ones(2, 1, dtype=torch.float64), 2.0),
    (torch.randn(3, 8, generator=_g, dtype=torch.float64), torch.randn(4, 8, generator=_g, dtype=torch.float64),
     torch.randn(2, 8, generator=_g, dtype=torch.float64), torch.zeros(4, 2, dtype=torch.float64), 16.0)],
    random_case=random_lora_case)


def random_block_case(rng: Rng) -> tuple:
    """x float32 [n] (n 1..700, values spread over several decades, some zeros), the signed or unsigned
    codebook, a block of 16, 64 or 256."""
    g = torch.Generator().manual_seed(rng.below(2**31))
    n = 1 + rng.below(700)
    signed = bool(rng.below(2))
    x = torch.randn(n, generator=g) * 10.0 ** torch.randint(-6, 2, (n,), generator=g).float()
    x[torch.rand(n, generator=g) < 0.05] = 0.0
    if not signed:
        x = x.abs()
    return x, CODEBOOKS[signed], (16, 64, 256)[rng.below(3)]


BLOCK_QUANT = Exercise("quantize_blockwise", quantize_blockwise, cases=[
    (torch.tensor([0.5, -1.0, 0.0, 0.25]), CODEBOOKS[True], 2),
    (torch.zeros(5), CODEBOOKS[True], 4),
    (torch.tensor([3.0, 3e-4, 0.0]), CODEBOOKS[False], 256)],
    random_case=random_block_case)
