"""Notebook 06's exercises, defined once (the notebook's check cells and tests/serving/test_exercises.py use
them):

    TOP_P    top_p_filter(probs, p) -> probs after top-p, renormalised         (section 1)
    ADMIT    admitted(running, waiting, budget, free_blocks, block_size, max_num_seqs) -> int: how many
             waiting requests join this step under continuous batching         (section 2)
    TPOT     tpot(arrival, token_times) -> seconds per output token after the first, None for one token
                                                                              (section 4)

TPOT's reference is labkit.serving.metrics' definition; top-p's rule and the admission rule are written out here
as the package applies them (tests/serving/test_exercises.py checks them against labkit.serving.sampling and
labkit.serving.scheduler.Scheduler themselves).
"""

from __future__ import annotations

import torch

from .._checks import check_number, check_type, fail
from ..course import Exercise
from ..kv_cache import blocks_needed
from ..rng import Rng
from .metrics import RequestTimes, request_metrics


def top_p_filter(probs: torch.Tensor, p: float) -> torch.Tensor:
    """probs [V] (float64, summing to 1) after top-p with threshold p in (0, 1]: the smallest set of most likely
    tokens whose mass reaches p (the token that crosses p included), and with it every token tied with the least
    likely one kept, so that the answer depends on the values, never on the order of the vocabulary; then
    renormalised. A token is kept iff the tokens strictly more likely than it hold less than p: the rule of
    labkit.serving.sampling's top-p (tests/serving/test_exercises.py checks that they agree)."""
    check_type("probs", probs, torch.Tensor, "a 1-D float64 tensor of probabilities")
    if probs.dim() != 1 or probs.dtype != torch.float64 or not len(probs) or (probs < 0).any():
        fail("probs", probs, "a 1-D float64 tensor of probabilities (non-negative, summing to 1)")
    if check_number("p", p, low=0.0, high=1.0) == 0:
        fail("p", p, "a number in (0, 1] (1 keeps every token)")
    ahead = torch.where(probs[None, :] > probs[:, None], probs[None, :], 0.0).sum(1)  # [V]: mass more likely
    kept = torch.where(ahead < p, probs, 0.0)
    return kept / kept.sum()


def _random_probs(rng: Rng, vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rng.below(2**31))
    return torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64) * (0.5 + rng.below(4)), 0)


def _tied_probs(rng: Rng) -> tuple[torch.Tensor, float]:
    """Probabilities in 64ths (exact in float64, so every sum is exact in any order) made of runs of equal values,
    in shuffled order, and a p that lands on a tie: inside a run of equal values, or exactly on a cumulative sum."""
    counts, left = [], 64
    while left:
        value = 1 + rng.below(12)
        for _ in range(1 + rng.below(3)):
            take = min(value, left)
            counts.append(take)
            left -= take
            if not left:
                break
    order = sorted(counts, reverse=True)
    at = rng.below(len(order))  # p lands inside (or at the end of) sorted value number `at`
    p = (sum(order[:at]) + (order[at] if rng.below(2) else 1)) / 64
    shuffled = [counts.pop(rng.below(len(counts))) for _ in range(len(counts))]
    return torch.tensor(shuffled, dtype=torch.float64) / 64, p


def random_top_p_case(rng: Rng) -> tuple[torch.Tensor, float]:
    """Half the cases softmax probabilities (no ties), half probabilities with ties at the threshold."""
    if rng.below(2):
        return _tied_probs(rng)
    return _random_probs(rng, 2 + rng.below(40)), (1 + rng.below(99)) / 100


TOP_P = Exercise("top_p_filter", top_p_filter, cases=[
    (torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15], dtype=torch.float64), 0.75),          # not sorted
    (torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64), 0.75),            # a sum lands exactly on p
    (torch.tensor([0.25, 0.5, 0.125, 0.125], dtype=torch.float64), 0.8),             # a tie crosses p
    (torch.tensor([0.125, 0.375, 0.125, 0.375], dtype=torch.float64), 0.1),          # a tie at the top
    (torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), 0.05),
    (torch.tensor([0.25, 0.35, 0.4], dtype=torch.float64), 0.999)],
    random_case=random_top_p_case)


def admitted(running: list[int], waiting: list[int], budget: int, free_blocks: int, block_size: int,
             max_num_seqs: int) -> int:
    """How many requests at the head of `waiting` (prompt lengths, in queue order) join this step under
    continuous batching. `running`: the context lengths (tokens in the KV cache) of the running requests;
    each decodes one token this step, which takes one token of the `budget` and, when its new token starts a
    block (length % block_size == 0), one of the `free_blocks`. Then waiting requests join in order while
    fewer than max_num_seqs run, their whole prompt fits what is left of the budget (a prompt larger than
    the budget runs alone when nothing else does) and their blocks fit the free blocks; the first one that
    does not fit stops the queue (first come, first served: nobody overtakes it)."""
    budget -= len(running)
    free_blocks -= sum(1 for n in running if n % block_size == 0)
    joined = 0
    for n in waiting:
        need = blocks_needed(n, block_size)
        if len(running) + joined >= max_num_seqs or need > free_blocks:
            break
        if n > budget and (running or joined):
            break
        budget, free_blocks, joined = budget - n, free_blocks - need, joined + 1
    return joined


def random_admit_case(rng: Rng) -> tuple[list[int], list[int], int, int, int, int]:
    block_size, max_num_seqs = 2 ** (1 + rng.below(4)), 1 + rng.below(8)
    running = [1 + rng.below(60) for _ in range(rng.below(max_num_seqs + 1))]
    waiting = [1 + rng.below(80) for _ in range(rng.below(7))]
    decode_blocks = sum(1 for n in running if n % block_size == 0)
    budget = max(max_num_seqs, 8 * (1 + rng.below(16)))
    return running, waiting, budget, decode_blocks + rng.below(20), block_size, max_num_seqs


ADMIT = Exercise("admitted", admitted, cases=[
    ([30, 12], [20, 50, 5], 64, 10, 16, 8),   # 62 tokens left: 20 joins, 50 does not fit, so 5 waits behind it
    ([16], [10], 64, 1, 16, 8),                # the running request's decode takes the only free block
    ([], [300, 4], 256, 40, 16, 8),            # nothing runs: the long prompt runs alone
    ([5, 9, 7], [3, 3], 512, 10, 16, 4),       # max_num_seqs: one place left
    ([], [], 64, 4, 16, 8)],
    random_case=random_admit_case)


def tpot(arrival: float, token_times: list[float]) -> float | None:
    """Time per output token after the first, seconds: (E2E latency - TTFT) / (output tokens - 1), None for a
    one-token request. labkit.serving.metrics' definition (vLLM's)."""
    return request_metrics(RequestTimes("request", arrival, tuple(token_times), 1)).tpot


def random_tpot_case(rng: Rng) -> tuple[float, list[float]]:
    arrival = rng.below(1000) / 100
    t, times = arrival, []
    for _ in range(1 + rng.below(12)):
        t += rng.below(500) / 1000
        times.append(t)
    return arrival, times


TPOT = Exercise("tpot", tpot, cases=[(0.0, [0.5, 0.6, 0.8]), (1.0, [1.25]), (2.0, [2.5, 2.5, 2.5, 2.75])],
                random_case=random_tpot_case)
