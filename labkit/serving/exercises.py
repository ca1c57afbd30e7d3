"""Notebook 06's exercises, defined once (the notebook's check cells and tests/serving/test_exercises.py use
them):

    TOP_P    top_p_filter(probs, p) -> probs after top-p, renormalised         (section 1)
    ADMIT    admitted(running, waiting, budget, free_blocks, block_size, max_num_seqs) -> int: how many
             waiting requests join this step under continuous batching         (section 2)
    TPOT     tpot(arrival, token_times) -> seconds per output token after the first, None for one token
                                                                              (section 4)

The references are the package's own code: top-p is labkit.serving.sampling's chain (with only top_p on), TPOT
is labkit.serving.metrics' definition; the admission rule is written out here as the scheduler applies it
(tests/serving/test_exercises.py checks it against labkit.serving.scheduler.Scheduler itself).
"""

from __future__ import annotations

import torch

from ..course import Exercise
from ..kv_cache import blocks_needed
from ..rng import Rng
from .metrics import RequestTimes, request_metrics
from .sampling import SamplingParams, probabilities


def top_p_filter(probs: torch.Tensor, p: float) -> torch.Tensor:
    """probs [V] (float64, summing to 1) after top-p: keep the most likely tokens until their mass reaches p,
    the token that crosses p included, then renormalise. The sampling module's own chain, top_p alone."""
    return probabilities(torch.log(probs), SamplingParams(temperature=1.0, top_p=p))


def _random_probs(rng: Rng, vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rng.below(2**31))
    return torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64) * (0.5 + rng.below(4)), 0)


def random_top_p_case(rng: Rng) -> tuple[torch.Tensor, float]:
    return _random_probs(rng, 2 + rng.below(40)), (1 + rng.below(99)) / 100


TOP_P = Exercise("top_p_filter", top_p_filter, cases=[
    (torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64), 0.6),    # 0.5 < 0.6: 0.2 crosses, kept
    (torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15], dtype=torch.float64), 0.75),   # not sorted: 0.4, 0.3, 0.15 kept
    (torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), 0.05),               # the top token alone
    (torch.tensor([0.25, 0.35, 0.4], dtype=torch.float64), 0.999)],           # every token
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
