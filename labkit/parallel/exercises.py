"""Notebook 04's exercises, defined once: the reference, fixed cases, random cases and tolerance of each.
The notebook's check cells and tests/parallel/test_exercises.py both use them:

    RING_ALL_REDUCE  ring_all_reduce(tensors) -> every rank's sum, chunk by chunk            (section 1)
    TP_MLP           tp_mlp(x, w_gate, w_up, w_down, tp) -> each rank's partial output       (section 3)
    BUBBLE           bubble_fraction(stages, microbatches) -> idle share of the total time  (section 4)
    MIN_CARDS        min_cards(n_params, bytes_per_param, card_bytes, usable) -> cards      (section 7)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..course import Exercise
from ..rng import Rng
from .collectives import ring_all_reduce
from .schedule import bubble_fraction


def _gen(rng: Rng) -> torch.Generator:
    return torch.Generator().manual_seed(rng.below(2**31))


def random_ranks(rng: Rng) -> tuple[list[torch.Tensor]]:
    """2 to 5 ranks, each a float64 tensor of 1 to 23 elements (not always a multiple of the rank count)."""
    n, numel, g = 2 + rng.below(4), 1 + rng.below(23), _gen(rng)
    return ([torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(n)],)


RING_ALL_REDUCE = Exercise(
    "ring_all_reduce", ring_all_reduce,
    cases=[([torch.tensor([1.0, 2, 3, 4, 5, 6]), torch.tensor([10.0, 20, 30, 40, 50, 60]),
             torch.tensor([100.0, 200, 300, 400, 500, 600])],)],
    random_case=random_ranks, rtol=1e-12, atol=1e-12)


def tp_mlp_reference(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                     tp: int) -> list[torch.Tensor]:
    """Rank r's partial output of a SwiGLU MLP split over tp ranks: gate and up by output rows (column
    parallel), down by input columns (row parallel); their sum (the all-reduce) is the full MLP."""
    gates, ups, downs = w_gate.chunk(tp, 0), w_up.chunk(tp, 0), w_down.chunk(tp, 1)
    return [(F.silu(x @ g.T) * (x @ u.T)) @ d.T for g, u, d in zip(gates, ups, downs)]


def random_mlp(rng: Rng) -> tuple:
    """x [tokens, d] and an MLP whose hidden width divides by tp (1, 2 or 4)."""
    tp, g = rng.choice([1, 2, 4]), _gen(rng)
    t, d, f = 1 + rng.below(4), 2 + rng.below(7), tp * (1 + rng.below(5))
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return r(t, d), r(f, d), r(f, d), r(d, f), tp


TP_MLP = Exercise("tp_mlp", tp_mlp_reference, cases=[random_mlp(Rng(7))], random_case=random_mlp,
                  rtol=1e-9, atol=1e-12)


def random_pipeline(rng: Rng) -> tuple[int, int]:
    return 1 + rng.below(16), 1 + rng.below(64)


BUBBLE = Exercise("bubble_fraction", bubble_fraction, cases=[(4, 8), (1, 5), (8, 1)],
                  random_case=random_pipeline, rtol=1e-12)


def min_cards_reference(n_params: float, bytes_per_param: float, card_bytes: float, usable: float) -> int:
    """Fewest cards whose usable memory (usable x card_bytes each) holds n_params weights."""
    return math.ceil(n_params * bytes_per_param / (card_bytes * usable))


def random_cards(rng: Rng) -> tuple:
    return (rng.choice([7e9, 70e9, 405e9, 671e9, 3e12]), rng.choice([0.5, 1, 2, 4]),
            rng.choice([24e9, 80e9, 141e9, 192e9]), rng.choice([1.0, 0.9, 0.8]))


MIN_CARDS = Exercise("min_cards", min_cards_reference, cases=[(3e12, 2, 80e9, 1.0), (3e12, 2, 141e9, 0.9)],
                     random_case=random_cards)
