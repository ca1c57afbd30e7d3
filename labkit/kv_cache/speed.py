"""Decoding speed with each cache (notebook 05, sections 3 and 6; benchmarks/kv_cache_decode.py): batch-1
decode steps of TinyLM at a given context, with the contiguous KVCache, the PagedKVCache (blocks shuffled)
and the simulated quantized caches. Each timed call rewinds the cache to the same prefilled prompt and
decodes `steps` tokens (teacher-forced from a fixed text, so every cache does the same work); time them with
labkit.course.timing.interleave so that ratios come from the same run. Seconds, tokens/s.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .._checks import check_int, check_positive_int, check_type, fail
from ..course import evidence
from ..tinylm import KVCache, corpus
from .blocks import BlockManager, blocks_needed
from .paged import PagedKVCache
from .quantized import QuantizedKVCache


def _runner(model, cache, tokens: torch.Tensor, prompt_len: int, steps: int) -> Callable[[], torch.Tensor]:
    with torch.no_grad():
        model(tokens[:, :prompt_len], cache)

    @torch.no_grad()
    def run() -> torch.Tensor:
        cache.rewind(prompt_len)
        for i in range(prompt_len, prompt_len + steps):
            logits = model(tokens[:, i:i + 1], cache)
        return logits[0, -1]
    return run


def decode_runs(model, context: int = 256, steps: int = 32, block_size: int = 16,
                quantized: tuple[str, ...] = ()) -> dict[str, Callable[[], torch.Tensor]]:
    """{cache name: a function that decodes `steps` tokens ending at position `context` and returns the last
    step's logits [vocab]} for "contiguous", "paged" and each quantized format in `quantized` (per token)."""
    check_int("context", context, 2, model.cfg.max_seq_len)
    check_int("steps", steps, 1, context - 1)
    check_positive_int("block_size", block_size)
    tokens = torch.tensor([list(corpus.corpus("test", context, seed=0))[:context]])  # [1, context]
    prompt_len = context - steps
    runs = {"contiguous": _runner(model, KVCache(model.cfg, max_len=context), tokens, prompt_len, steps)}
    bm = BlockManager(blocks_needed(context, block_size) + 8, block_size, enable_prefix_caching=False)
    bm.shuffle_free(seed=0)
    paged = PagedKVCache(model.cfg, bm)
    paged.start(0, tokens[0].tolist())  # reserves every slot up front; the forwards fill them
    runs["paged"] = _runner(model, paged.select([0]), tokens, prompt_len, steps)
    for fmt in quantized:
        runs[fmt] = _runner(model, QuantizedKVCache(model.cfg, fmt, max_len=context), tokens, prompt_len, steps)
    return runs


def timing_verdict(t: dict, conclusion: str, pairs: Sequence[tuple[str, str]]) -> str:
    """`conclusion` when, for every (a, b) in `pairs`, the repeats of t[a] and t[b] ({name: Timing}, from one
    timing.interleave) separate by the course's rule (labkit.course.evidence), else "unreliable on this run
    (<why>)" (notebook 05's timing cells print it)."""
    check_type("t", t, dict, "a {name: Timing} dict from timing.interleave")
    check_type("pairs", pairs, (list, tuple), "a list of (name, name) pairs of t's names")
    if not pairs:
        fail("pairs", pairs, "at least one (name, name) pair")
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2 or any(n not in t for n in pair):
            fail("pairs", pairs, f"(name, name) pairs of t's names {sorted(t)}")
    for a, b in pairs:
        c = evidence.compare(a, t[a], b, t[b], " s")
        if not c.reliable:
            return c.unreliable()
    return conclusion
