"""Load for the serving engine (notebook 06, section 4): when requests arrive and what they ask for.

Arrivals follow vLLM's benchmark client (benchmarks/benchmark_serving.py, `get_request`): the gaps between
requests are independent Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) draws, so their mean is
1 / rate and their coefficient of variation is 1 / sqrt(burstiness). burstiness 1 is an exponential gap, a
Poisson process; below 1 requests come in bursts, above 1 they come more evenly; rate = inf sends everything
at once. Prompts are the course's own tasks (arithmetic, recall, copy) and plain text from the corpus,
byte-encoded; most answers are short (the task's answer plus a few tokens), a `long_tail` fraction asks for
many more (lognormal), and every request fits the model's context.

Outputs run to max_tokens (no stop token), as vLLM's benchmarks run with --ignore-eos: the lengths a trace
asks for are the lengths it gets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._checks import (check_fraction, check_int, check_number, check_positive, check_positive_int, fail, is_int,
                       is_number)
from ..tinylm import TASK_KINDS, ByteTokenizer, corpus, make_tasks
from .sampling import SamplingParams

SHORT_EXTRA = 4          # a short request asks for its answer, "\n", and 0..SHORT_EXTRA more tokens
TEXT_TOKENS = (8, 32)    # a short plain-text request asks for this many tokens (inclusive range)
KINDS = TASK_KINDS + ("text",)
POOL = 256               # prompts of each kind to draw from (repeats are what a prefix cache is for)


def _check_rate(name: str, value, unit: str) -> float:
    """A positive number, or float('inf')."""
    what = f"a positive number ({unit}) or float('inf')"
    if not is_number(value):
        fail(name, value, what, TypeError)
    if not value > 0:  # also refuses nan
        fail(name, value, what)
    return float(value)


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0,
                  normalize: bool = False) -> list[float]:
    """`n` arrival times in seconds: the first at 0, then n - 1 gaps drawn from Gamma(burstiness,
    1 / (rate * burstiness)) (mean 1 / rate, coefficient of variation 1 / sqrt(burstiness)), as vLLM's
    benchmarks/benchmark_serving.py draws them. rate = inf: all at 0 (vLLM's convention); burstiness = inf:
    evenly spaced. Fixed by `seed` (numpy's RandomState, whose stream numpy keeps stable).

    normalize=True follows the newer vllm/benchmarks/serve.py instead: n gaps (the first request also waits
    one), summed, then all scaled so the last arrival is exactly n / rate; that steadies throughput across
    seeds but the gaps are then not exactly gamma-distributed."""
    n = check_positive_int("n", n, "requests")
    rate = _check_rate("rate", rate, "requests/s")
    burstiness = _check_rate("burstiness", burstiness, "gamma shape; 1 = Poisson")
    check_int("seed", seed, 0)
    if not isinstance(normalize, bool):
        fail("normalize", normalize, "True or False", TypeError)
    if rate == math.inf:
        return [0.0] * n
    count = n if normalize else n - 1
    if burstiness == math.inf:
        gaps = np.full(count, 1.0 / rate)
    else:
        gaps = np.random.RandomState(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    times = np.cumsum(gaps)                                   # [count]
    if normalize:
        return (times * (n / rate / times[-1])).tolist() if times[-1] > 0 else times.tolist()
    return [0.0] + times.tolist()


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: `prompt` token ids (a tuple), `arrival` in seconds from the trace's start,
    `max_tokens` new tokens, `priority` (lower runs first) and the `kind` of prompt ("arithmetic", "recall",
    "copy" or "text")."""
    request_id: str
    arrival: float
    prompt: tuple[int, ...]
    max_tokens: int
    priority: int = 0
    kind: str = "text"

    def __post_init__(self):
        if not isinstance(self.request_id, str) or not self.request_id:
            fail("request_id", self.request_id, "a non-empty str", TypeError)
        check_number("arrival", self.arrival, low=0.0, unit="s")
        p = self.prompt
        if isinstance(p, (str, bytes)) or not isinstance(p, (list, tuple)) or not all(is_int(t) and t >= 0 for t in p):
            fail("prompt", p, "a tuple of token ids (non-negative ints)", TypeError)
        if not p:
            fail("prompt", p, "at least one token")
        object.__setattr__(self, "prompt", tuple(int(t) for t in p))
        object.__setattr__(self, "arrival", float(self.arrival))
        check_positive_int("max_tokens", self.max_tokens, "tokens")
        check_int("priority", self.priority)
        if self.kind not in KINDS:
            fail("kind", self.kind, f"one of {KINDS}")

    def params(self, temperature: float = 0.0, **kwargs) -> SamplingParams:
        """The request's SamplingParams: max_tokens from the trace, greedy unless told otherwise."""
        return SamplingParams(max_tokens=self.max_tokens, temperature=temperature, **kwargs)


def _text_prompts(n: int, seed: int) -> list[str]:
    """`n` plain-text prompts: the first sentence of the test split's text documents, plus a space."""
    out = []
    for doc in corpus.documents("test", seed):
        if corpus.kind_of(doc) == "text":
            out.append(doc.split(". ")[0].rstrip(".\n") + ". ")
            if len(out) == n:
                return out


def _pool(n: int, seed: int, context: int) -> dict[str, list[tuple[str, int]]]:
    """(prompt, short output length) candidates of each kind that fit `context`."""
    pool = {kind: [(t.prompt, len(t.answer) + 1) for t in make_tasks(kind, n, "test", seed)] for kind in TASK_KINDS}
    pool["text"] = [(p, 0) for p in _text_prompts(n, seed)]
    return {kind: [c for c in cands if len(c[0]) < context] for kind, cands in pool.items()}


def make_trace(n: int, rate: float, burstiness: float = 1.0, seed: int = 0, long_tail: float = 0.2,
               context: int = 256, text_fraction: float = 0.25, tail_median: float = 96.0,
               tail_sigma: float = 0.5) -> list[TraceRequest]:
    """`n` requests arriving at `arrival_times(n, rate, burstiness, seed)`, fixed by `seed`.

    Each prompt is plain text with probability `text_fraction`, else a test-split task of a kind drawn
    uniformly from TASK_KINDS, byte-encoded (ByteTokenizer). A short request asks for max_tokens = the
    answer's length + 1 (its "\\n") + 0..SHORT_EXTRA (text: TEXT_TOKENS); a `long_tail` fraction asks for that
    plus a lognormal draw (median `tail_median`, log-sd `tail_sigma`). prompt + max_tokens <= `context`
    (TinyLM's is 256): long requests are clipped there."""
    arrivals = arrival_times(n, rate, burstiness, seed)
    long_tail = check_fraction("long_tail", long_tail, allow_zero=True)
    context = check_positive_int("context", context, "tokens")
    text_fraction = check_fraction("text_fraction", text_fraction, allow_zero=True)
    tail_median = check_positive("tail_median", tail_median, "tokens")
    tail_sigma = check_positive("tail_sigma", tail_sigma, allow_zero=True)
    pool = _pool(min(n, POOL), seed, context)
    kinds = [k for k in TASK_KINDS if pool[k]]
    if (text_fraction < 1 and not kinds) or (text_fraction > 0 and not pool["text"]):
        fail("context", context, "long enough for the course's prompts (TinyLM's is 256)")
    rs = np.random.RandomState([seed, 1])
    tok = ByteTokenizer()
    trace = []
    for i, arrival in enumerate(arrivals):
        kind = "text" if rs.random_sample() < text_fraction else kinds[rs.randint(len(kinds))]
        prompt, short = pool[kind][rs.randint(len(pool[kind]))]
        lo, hi = (short, short + SHORT_EXTRA) if kind != "text" else TEXT_TOKENS
        max_tokens = lo + rs.randint(hi - lo + 1)
        if rs.random_sample() < long_tail:
            max_tokens += int(round(rs.lognormal(math.log(tail_median), tail_sigma)))
        ids = tok.encode(prompt)
        trace.append(TraceRequest(f"req-{i}", arrival, tuple(ids), min(max_tokens, context - len(ids)), 0, kind))
    return trace


def summary(trace: list[TraceRequest]) -> dict:
    """The numbers a notebook prints about a trace: n, duration (last arrival, s), offered rate (req/s), mean and
    max prompt tokens, mean and max max_tokens, and how many requests of each kind."""
    if not isinstance(trace, (list, tuple)) or not trace or not all(isinstance(r, TraceRequest) for r in trace):
        fail("trace", trace, "a non-empty list of TraceRequest", TypeError)
    prompts = [len(r.prompt) for r in trace]
    outputs = [r.max_tokens for r in trace]
    duration = max(r.arrival for r in trace) - min(r.arrival for r in trace)
    out = {"n": len(trace), "duration_s": duration,
           "rate_req_s": (len(trace) - 1) / duration if duration > 0 else math.inf,
           "mean_prompt_tokens": sum(prompts) / len(trace), "max_prompt_tokens": max(prompts),
           "mean_output_tokens": sum(outputs) / len(trace), "max_output_tokens": max(outputs)}
    out.update({f"n_{kind}": sum(r.kind == kind for r in trace) for kind in KINDS})
    return out
