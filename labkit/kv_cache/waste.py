"""Memory waste (notebook 05, section 4): reserving the maximum length per request against paging, on a
request trace, and the block-size sweep. The figure it reproduces is Fig. 2 of vLLM (Kwon et al., SOSP 2023):
earlier systems kept real token states in 20.4% (Orca, max), 26.8% (pow2) and 38.2% (oracle) of their KV
memory, vLLM in 96.3%.

A request has a prompt of P tokens and an output of O tokens. While it decodes its t-th token (t = 1 .. O) it
holds P + t token states; what it has reserved depends on the scheme:

    max      the model's context, whatever the request (Orca with a max-length reservation)
    pow2     the next power of two >= P + O (Orca with a better guess of the final length)
    oracle   exactly P + O (the final length known in advance: only the not-yet-generated part is wasted)
    paged    ceil((P + t) / block_size) blocks (vLLM: only the last block is partly empty)

Utilization = (sum over requests and decode steps of the states held) / (sum of the slots reserved), i.e. the
share of KV memory holding real token states, averaged over time with every request decoding one token per
step. Not modelled: external fragmentation of a contiguous allocator (the gaps between reservations), which
vLLM's Orca figures include, and queueing (requests in a real batch start and end at different times).

Traces (fixed seeds): "tinylm": prompts are the corpus's task prompts, outputs long-tailed (lognormal, median
48 tokens, sigma 0.9), P + O clipped to TinyLM's 256-token context; "sharegpt-like": lognormal prompts and
outputs with the means vLLM reports for ShareGPT (161 and 338 tokens), clipped to OPT-13B's 2048.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .._checks import check_choice, check_int, check_positive_int, fail
from ..tinylm import TASK_KINDS, ByteTokenizer, make_tasks
from .blocks import check_block_size

SCHEMES = ("max", "pow2", "oracle", "paged")
TRACES = {"tinylm": 256, "sharegpt-like": 2048}  # trace -> the context it is clipped to (tokens)
VLLM_FIG2 = {"max": 0.204, "pow2": 0.268, "oracle": 0.382, "paged": 0.963}  # share of KV memory holding tokens


@dataclass(frozen=True)
class Request:
    """One request of a trace: prompt and output lengths (tokens)."""
    prompt: int
    output: int

    def __post_init__(self):
        check_positive_int("prompt", self.prompt, "tokens")
        check_positive_int("output", self.output, "tokens")

    @property
    def total(self) -> int:
        return self.prompt + self.output


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    """Lognormal samples with the given mean (the median is mean * exp(-sigma^2 / 2))."""
    return rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, n)


def request_trace(kind: str = "tinylm", n: int = 600, seed: int = 0) -> list[Request]:
    """`n` requests of trace `kind` (see the module docstring), fixed by `seed`."""
    check_choice("kind", kind, tuple(TRACES))
    check_positive_int("n", n)
    check_int("seed", seed, 0)
    rng, context = np.random.default_rng(seed), TRACES[kind]
    if kind == "tinylm":
        tok = ByteTokenizer()
        tasks = [t for k in TASK_KINDS for t in make_tasks(k, -(-n // len(TASK_KINDS)), seed=seed)]
        prompts = np.array([len(tok.encode(t.prompt)) for t in tasks])[rng.permutation(len(tasks))[:n]]
        outputs = np.exp(math.log(48) + 0.9 * rng.standard_normal(n))
    else:
        prompts, outputs = _lognormal(rng, 161, 1.0, n), _lognormal(rng, 338, 1.0, n)
    prompts = np.clip(np.round(prompts), 1, context - 1).astype(int)
    outputs = np.clip(np.round(outputs), 1, context - prompts).astype(int)
    return [Request(int(p), int(o)) for p, o in zip(prompts, outputs)]


def reserved_slots(request: Request, scheme: str, context: int, block_size: int = 16) -> np.ndarray:
    """Slots reserved at each decode step t = 1 .. output, [output] (int64)."""
    t = np.arange(1, request.output + 1)
    if scheme == "max":
        return np.full_like(t, context)
    if scheme == "pow2":
        return np.full_like(t, 1 << (request.total - 1).bit_length())
    if scheme == "oracle":
        return np.full_like(t, request.total)
    return -(-(request.prompt + t) // block_size) * block_size


def check_trace(trace, context: int | None = None) -> list[Request]:
    """A non-empty list of Requests (each of at most `context` tokens when given)."""
    if isinstance(trace, (str, bytes)) or not isinstance(trace, Sequence) \
            or not all(isinstance(r, Request) for r in trace):
        fail("trace", trace, "a list of Requests (waste.request_trace)", TypeError)
    if not trace:
        fail("trace", trace, "a non-empty list of Requests")
    if context is not None and any(r.total > context for r in trace):
        fail("trace", f"a request of {max(r.total for r in trace)} tokens",
             f"a list of Requests of at most context={context} tokens")
    return list(trace)


def utilization(trace: list[Request], scheme: str, context: int, block_size: int = 16) -> float:
    """Share of reserved KV slots that hold real token states, averaged over every decode step of `trace`."""
    check_choice("scheme", scheme, SCHEMES)
    check_positive_int("context", context)
    check_block_size(block_size)
    check_trace(trace, context)
    held = sum(r.output * r.prompt + r.output * (r.output + 1) // 2 for r in trace)
    reserved = sum(int(reserved_slots(r, scheme, context, block_size).sum()) for r in trace)
    return held / reserved


def waste_table(trace: list[Request], context: int, block_size: int = 16,
                memory_slots: int | None = None) -> list[dict]:
    """Per scheme: utilization (this trace), vLLM's Fig. 2 figure, mean reserved slots per request (time-averaged)
    and how many requests fit at once in `memory_slots` token slots (default: 32 contexts' worth)."""
    check_positive_int("context", context)
    check_trace(trace, context)
    memory_slots = 32 * context if memory_slots is None else check_positive_int("memory_slots", memory_slots)
    steps = sum(r.output for r in trace)
    rows = []
    for s in SCHEMES:
        mean_reserved = sum(int(reserved_slots(r, s, context, block_size).sum()) for r in trace) / steps
        rows.append({"scheme": s, "utilization": utilization(trace, s, context, block_size),
                     "vLLM Fig. 2": VLLM_FIG2[s], "slots/request": mean_reserved,
                     "requests that fit": int(memory_slots // mean_reserved)})
    return rows


def block_size_sweep(trace: list[Request], sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256)) -> list[dict]:
    """Per block size: utilization under paging, mean empty slots in a sequence's last block (internal
    fragmentation) and mean block-table entries per sequence (what the attention kernel must look up), both
    averaged over decode steps."""
    check_trace(trace)
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or not sizes:
        fail("sizes", sizes, "a non-empty list of block sizes (powers of two)", TypeError if not
             isinstance(sizes, Sequence) else ValueError)
    steps = sum(r.output for r in trace)
    context = max(r.total for r in trace)
    rows = []
    for bs in sizes:
        check_block_size(bs)
        held = np.concatenate([r.prompt + np.arange(1, r.output + 1) for r in trace])
        reserved = -(-held // bs) * bs
        rows.append({"block_size": bs, "utilization": utilization(trace, "paged", context, bs),
                     "empty slots/seq": float((reserved - held).sum() / steps),
                     "table entries/seq": float((reserved // bs).sum() / steps)})
    return rows
