"""Activation checkpointing on TinyLM's blocks (notebook 09, section 2): torch.utils.checkpoint keeps only a
checkpointed block's input and runs its forward again during backward. TinyLM's own loop (labkit.tinylm.model
run_blocks) calls it around the blocks model.checkpoint_every picks, as transformers calls it around each layer.

    every = 1   [ckpt][ckpt][ckpt][ckpt]     least memory: one block's inputs kept, every block recomputed
    every = 2   [ckpt][ -- ][ckpt][ -- ]     blocks 0 and 2 recomputed, 1 and 3 keep their activations
    every = 0   [ -- ][ -- ][ -- ][ -- ]     plain training

The sqrt(n) rule (Chen et al. 2016, arXiv:1604.06174): n layers cut into segments of about sqrt(n) layers,
keeping only segment boundaries, hold O(sqrt(n)) activations for one extra forward pass.
"""

from __future__ import annotations

import math

import torch

from .._checks import check_int, check_positive_int, check_type
from ..tinylm import TinyLM
from .memory import lm_loss


def checkpointed_loss(every: int):
    """A forward(model, tokens, mask=None) -> loss (memory.lm_loss's) that runs TinyLM's own forward with
    model.checkpoint_every = every (block i checkpointed when every > 0 and i % every == 0; 0: none), then
    gives the model back its own setting."""
    check_int("every", every, 0)

    def forward(model, tokens: torch.Tensor, mask=None) -> torch.Tensor:
        check_type("model", model, TinyLM, "a TinyLM (its forward runs the blocks through run_blocks)")
        kept = model.checkpoint_every
        model.checkpoint_every = every
        try:
            return lm_loss(model, tokens, mask)
        finally:
            model.checkpoint_every = kept

    return forward


def sqrt_rule(n_layers: int) -> int:
    """Segment length of the sqrt(n) rule: round(sqrt(n_layers)), at least 1."""
    check_positive_int("n_layers", n_layers)
    return max(1, round(math.sqrt(n_layers)))


def checkpoint_sweep(model, tokens: torch.Tensor, everies=(0, 4, 2, 1), repeats: int = 4) -> list[dict]:
    """For each `every`: peak bytes of one step (memory.measure_step) and seconds per step timed in turns
    (labkit.course.timing.interleave, `repeats` rounds). Rows: every, checkpointed blocks, peak, activations,
    times (the repeats)."""
    from ..course import interleave
    from .memory import measure_step

    check_type("model", model, TinyLM, "a TinyLM (its forward runs the blocks through run_blocks)")
    check_positive_int("repeats", repeats)
    n = model.cfg.n_layers
    rows, fns = [], {}
    for every in everies:
        fwd = checkpointed_loss(every)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        mem = measure_step(model, tokens, opt, forward=fwd)

        def step(fwd=fwd, opt=opt):
            opt.zero_grad(set_to_none=True)
            fwd(model, tokens).backward()
            opt.step()
        fns[every] = step
        rows.append({"every": every, "checkpointed": 0 if every == 0 else len(range(0, n, every)),
                     "peak": mem.peak, "activations": mem.activations})
    times = interleave(fns, repeats=repeats, warmup=1)
    for row in rows:
        row["times"] = times[row["every"]].times
    return rows
