"""Serving metrics with vLLM's benchmark definitions (notebook 06, section 4).

From one request's arrival and the times its output tokens appeared (seconds, any one clock):

    TTFT  time to first token    = first token time - arrival
    E2EL  end-to-end latency     = last token time - arrival
    TPOT  time per output token  = (E2EL - TTFT) / (output tokens - 1)   (excludes the first token)
    ITL   inter-token latencies  = every gap between consecutive tokens   (output tokens - 1 of them)

as vLLM's vllm/benchmarks/serve.py `calculate_metrics` computes them from what its client records
(vllm/benchmarks/lib/endpoint_request_func.py). A one-token request has no TPOT and no ITL: vLLM leaves it out
of the TPOT statistics and counts its TPOT as 0 against a TPOT SLO; so does this module. Statistics pool
requests (ITL pools every gap of every request) and are reported in milliseconds, as vLLM prints them; a
statistic of nothing (TPOT when every request made one token) is nan here, where vLLM prints 0.

Throughput divides by the duration: from `start` (default: the first arrival) to the last token of any
request. vLLM's benchmark duration runs from the benchmark's start to the last response; with arrivals
counted from the trace's start (workload.arrival_times puts the first at 0) pass start=0 to get it exactly.
Goodput is vLLM's --goodput: completed requests per second whose every named metric is within its SLO
(milliseconds; keys "ttft", "tpot", "e2el"; a metric equal to its SLO meets it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .._checks import check_number, check_positive_int, fail

SLO_KEYS = ("ttft", "tpot", "e2el")
METRICS = ("ttft", "tpot", "itl", "e2el")
FAILED = ("abort", "refused")  # Sequence finish reasons that make a request failed (vLLM: success False)


def _times(name: str, times) -> tuple[float, ...]:
    if isinstance(times, (str, bytes)) or not hasattr(times, "__iter__"):
        fail(name, times, "a list of token times (s)", TypeError)
    times = tuple(times)
    for i, t in enumerate(times):
        check_number(f"{name}[{i}]", t, unit="s")
    return tuple(float(t) for t in times)


@dataclass(frozen=True)
class RequestTimes:
    """What the metrics need of a request, for code that has no Sequence: `arrival` and `token_times` (one
    per output token) in seconds on one clock, and the prompt's length."""
    request_id: str
    arrival: float
    token_times: tuple[float, ...]
    num_prompt_tokens: int

    def __post_init__(self):
        if not isinstance(self.request_id, str) or not self.request_id:
            fail("request_id", self.request_id, "a non-empty str", TypeError)
        object.__setattr__(self, "arrival", check_number("arrival", self.arrival, unit="s"))
        object.__setattr__(self, "token_times", _times("token_times", self.token_times))
        check_positive_int("num_prompt_tokens", self.num_prompt_tokens, "tokens")


@dataclass(frozen=True)
class RequestMetrics:
    """One request's metrics, in seconds. tpot is None for a one-token request; itl then is empty."""
    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    ttft: float
    tpot: float | None
    itl: tuple[float, ...]
    e2el: float


def _read(record, name: str) -> tuple[float, tuple[float, ...], int]:
    """(arrival, token_times, num_prompt_tokens) of any object that has them (a RequestTimes, a Sequence), checked:
    at least one token, none before arrival, in order, as many as the record says it produced."""
    if not all(hasattr(record, a) for a in ("arrival", "token_times", "num_prompt_tokens")):
        fail(name, record, "an object with arrival, token_times and num_prompt_tokens (a RequestTimes or a Sequence)",
             TypeError)
    arrival = check_number(f"{name}.arrival", record.arrival, unit="s")
    times = _times(f"{name}.token_times", record.token_times)
    prompt = check_positive_int(f"{name}.num_prompt_tokens", record.num_prompt_tokens, "tokens")
    if not times:
        fail(f"{name}.token_times", list(times), "at least one token time (a request with no token has no TTFT)")
    if times[0] < arrival:
        fail(f"{name}.token_times", list(times[:3]), f"no earlier than the arrival, {arrival!r} s")
    for i in range(1, len(times)):
        if times[i] < times[i - 1]:
            fail(f"{name}.token_times", list(times[i - 1:i + 1]), f"in order (token_times[{i}] < [{i - 1}])")
    n_out = getattr(record, "num_output_tokens", len(times))
    if n_out != len(times):
        fail(f"{name}.num_output_tokens", n_out, f"len(token_times) = {len(times)} (one time per token)")
    return arrival, times, prompt


def _metrics(arrival: float, times: tuple[float, ...], prompt: int, request_id: str) -> RequestMetrics:
    ttft, e2el = times[0] - arrival, times[-1] - arrival
    n = len(times)
    tpot = (e2el - ttft) / (n - 1) if n > 1 else None
    itl = tuple(b - a for a, b in zip(times, times[1:]))
    return RequestMetrics(request_id, prompt, n, ttft, tpot, itl, e2el)


def request_metrics(record) -> RequestMetrics:
    """TTFT, TPOT, ITL and E2EL (seconds) of one request: a RequestTimes, a finished Sequence, or anything with
    arrival, token_times and num_prompt_tokens."""
    return _metrics(*_read(record, "record"), str(getattr(record, "request_id", "")))


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) of `values`, interpolated linearly between order statistics: numpy's
    default (method="linear"), which vLLM's np.percentile uses."""
    q = check_number("q", q, 0.0, 100.0, unit="percent")
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        fail("values", values, "a list of numbers", TypeError)
    xs = sorted(check_number(f"values[{i}]", v) for i, v in enumerate(values))
    if not xs:
        fail("values", [], "at least one number")
    h = (len(xs) - 1) * q / 100
    lo = math.floor(h)
    return xs[lo] if lo + 1 >= len(xs) else xs[lo] + (h - lo) * (xs[lo + 1] - xs[lo])


@dataclass(frozen=True)
class Stats:
    """mean, median, std (population, as np.std) and chosen percentiles of one metric, in milliseconds."""
    mean: float
    median: float
    std: float
    percentiles: dict[float, float]

    @staticmethod
    def of(seconds: list[float], qs: tuple[float, ...]) -> "Stats":
        if not seconds:
            return Stats(math.nan, math.nan, math.nan, {q: math.nan for q in qs})
        ms = [1000 * s for s in seconds]
        mean = sum(ms) / len(ms)
        std = math.sqrt(sum((x - mean) ** 2 for x in ms) / len(ms))
        return Stats(mean, percentile(ms, 50), std, {q: percentile(ms, q) for q in qs})


def _pname(q: float) -> str:
    return f"p{int(q) if float(q).is_integer() else q}"


@dataclass(frozen=True)
class Summary:
    """A run's aggregates (vLLM's names): counts, duration (s), throughputs (per s), goodput (req/s; None
    without SLOs) and `stats[metric]` for metric in METRICS (ms)."""
    completed: int
    failed: int
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    request_goodput: float | None
    slo: dict | None
    stats: dict[str, Stats] = field(repr=False)
    requests: tuple[RequestMetrics, ...] = field(repr=False)

    def as_dict(self) -> dict:
        """Flat, with the keys vLLM's benchmark writes to its result JSON (mean_ttft_ms, p99_itl_ms, ...)."""
        out = {k: getattr(self, k) for k in ("duration", "completed", "failed", "total_input_tokens",
                                             "total_output_tokens", "request_throughput", "request_goodput",
                                             "output_throughput", "total_token_throughput")}
        for m, s in self.stats.items():
            out.update({f"mean_{m}_ms": s.mean, f"median_{m}_ms": s.median, f"std_{m}_ms": s.std})
            out.update({f"{_pname(q)}_{m}_ms": v for q, v in s.percentiles.items()})
        return out

    def table_rows(self) -> list[dict]:
        """One row per latency metric (ms) for labkit.course.display.table."""
        return [{"metric": m.upper(), "mean ms": s.mean, "median ms": s.median, "std ms": s.std,
                 **{f"{_pname(q)} ms": v for q, v in s.percentiles.items()}} for m, s in self.stats.items()]

    def throughput_rows(self) -> list[dict]:
        """The run's totals and rates as (quantity, value, unit) rows for labkit.course.display.table."""
        rows = [("completed requests", self.completed, "req"), ("failed requests", self.failed, "req"),
                ("duration", self.duration, "s"), ("request throughput", self.request_throughput, "req/s"),
                ("output token throughput", self.output_throughput, "tok/s"),
                ("total token throughput", self.total_token_throughput, "tok/s")]
        if self.request_goodput is not None:
            slo = ", ".join(f"{k} <= {v:g} ms" for k, v in self.slo.items())
            rows.append((f"goodput ({slo})", self.request_goodput, "req/s"))
        return [{"quantity": q, "value": v, "unit": u} for q, v, u in rows]


def check_slo(slo) -> dict[str, float] | None:
    """None, or {"ttft" | "tpot" | "e2el": milliseconds >= 0} with at least one key (vLLM's --goodput)."""
    if slo is None:
        return None
    if not isinstance(slo, dict):
        fail("slo", slo, f"a dict of milliseconds keyed by {SLO_KEYS}, or None", TypeError)
    if not slo:
        fail("slo", slo, f"at least one of {SLO_KEYS} (or None for no goodput)")
    for key, value in slo.items():
        if key not in SLO_KEYS:
            fail("slo", key, f"keyed by {SLO_KEYS} (vLLM's --goodput names)")
        check_number(f"slo[{key!r}]", value, low=0.0, unit="ms")
    return {k: float(v) for k, v in slo.items()}


def _good(r: RequestMetrics, slo: dict[str, float]) -> bool:
    """vLLM's test: every SLO (ms, converted to s) >= the request's metric; a one-token TPOT counts as 0."""
    got = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2el}
    return all(value / 1000 >= got[key] for key, value in slo.items())


def summarize(records, slo: dict | None = None, percentiles=(90, 99), start: float | None = None) -> Summary:
    """Aggregate finished requests (Records, Sequences, ...). A request whose finish_reason is "abort" or
    "refused" counts as failed and is left out of every metric, as vLLM leaves out failed requests; an
    unfinished Sequence is refused. Duration = last token time - `start` (default: the first arrival)."""
    if isinstance(records, (str, bytes, dict)) or not hasattr(records, "__iter__"):
        fail("records", records, "a list of Records or finished Sequences", TypeError)
    records = list(records)
    slo = check_slo(slo)
    if isinstance(percentiles, (str, bytes)) or not hasattr(percentiles, "__iter__"):
        fail("percentiles", percentiles, "a tuple of numbers in [0, 100]", TypeError)
    qs = tuple(check_number(f"percentiles[{i}]", q, 0.0, 100.0) for i, q in enumerate(percentiles))
    done, failed, arrivals, ends = [], 0, [], []
    for i, rec in enumerate(records):
        if getattr(rec, "finished", True) is not True:
            fail(f"records[{i}]", rec, "a finished request (run the engine until it finishes)")
        if getattr(rec, "finish_reason", None) in FAILED:
            failed += 1
            continue
        arrival, times, prompt = _read(rec, f"records[{i}]")
        done.append(_metrics(arrival, times, prompt, str(getattr(rec, "request_id", "") or f"records[{i}]")))
        arrivals.append(arrival)
        ends.append(times[-1])
    if not done:
        fail("records", f"{len(records)} records, {failed} failed", "at least one completed request")
    begin = min(arrivals) if start is None else check_number("start", start, unit="s")
    end = max(ends)
    if begin > min(arrivals):
        fail("start", start, f"no later than the first arrival, {min(arrivals)!r} s")
    if end <= begin:
        fail("records", f"every token at {end!r} s", f"tokens after the start, {begin!r} s (a duration > 0)")
    duration = end - begin
    tin, tout = sum(r.num_prompt_tokens for r in done), sum(r.num_output_tokens for r in done)
    pooled = {"ttft": [r.ttft for r in done], "tpot": [r.tpot for r in done if r.tpot is not None],
              "itl": [g for r in done for g in r.itl], "e2el": [r.e2el for r in done]}
    goodput = None if slo is None else sum(_good(r, slo) for r in done) / duration
    return Summary(len(done), failed, duration, tin, tout, len(done) / duration, tout / duration,
                   (tin + tout) / duration, goodput, slo, {m: Stats.of(pooled[m], qs) for m in METRICS},
                   tuple(done))
