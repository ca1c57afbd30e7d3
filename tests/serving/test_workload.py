"""Workload: the gamma gaps' mean and coefficient of variation on a large fixed-seed sample, the Poisson case
against an exponential's distribution (Kolmogorov-Smirnov), vLLM's rate/burstiness conventions; traces that
are deterministic, made of the course's prompts (parsed and answered here independently), and fit the
context; bad input."""
import math
import re

import numpy as np
import pytest

from labkit.serving.workload import TEXT_TOKENS, SHORT_EXTRA, TraceRequest, arrival_times, make_trace, summary
from tests.refusals import assert_refused

N = 200_001  # arrivals, so 200,000 gaps


def gaps(rate, burstiness, seed=0):
    t = arrival_times(N, rate, burstiness, seed)
    assert t[0] == 0.0 and all(b >= a for a, b in zip(t, t[1:]))
    return np.diff(t)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 4.0])
def test_gamma_gaps_have_mean_one_over_rate_and_cv_one_over_sqrt_burstiness(burstiness):
    """Tolerances are 5 standard errors of a sample of n iid Gamma(k) gaps: the mean's relative SE is
    CV / sqrt(n) = 1 / sqrt(k n); the sample std's relative SE is sqrt((kurtosis - 1) / (4 n)) with
    kurtosis 3 + 6 / k, and the CV's is at most the sum of the two (about 0.4% to 1.3% here)."""
    rate, k, n = 5.0, burstiness, N - 1
    g = gaps(rate, k)
    se_mean = 1 / math.sqrt(k * n)
    se_cv = se_mean + math.sqrt((2 + 6 / k) / (4 * n))
    assert abs(g.mean() * rate - 1) < 5 * se_mean
    assert abs(g.std() / g.mean() * math.sqrt(k) - 1) < 5 * se_cv


def ks_exponential(g, rate):
    """Kolmogorov-Smirnov distance between the sample and Exponential(rate)'s CDF, 1 - exp(-rate x)."""
    x = np.sort(g)
    cdf = 1 - np.exp(-rate * x)
    i = np.arange(1, len(x) + 1)
    return max((i / len(x) - cdf).max(), (cdf - (i - 1) / len(x)).max())


def test_poisson_gaps_are_exponential_and_bursty_ones_are_not():
    critical = 1.95 / math.sqrt(N - 1)  # KS at significance 0.001
    assert ks_exponential(gaps(3.0, 1.0), 3.0) < critical
    assert ks_exponential(gaps(3.0, 0.5), 3.0) > critical  # the test can fail: gamma(0.5) is no exponential
    assert ks_exponential(gaps(3.0, 1.0), 2.9) > critical  # nor the wrong rate's


def test_rate_and_burstiness_conventions():
    assert arrival_times(5, math.inf) == [0.0] * 5
    assert arrival_times(4, 2.0, math.inf) == [0.0, 0.5, 1.0, 1.5]
    assert arrival_times(1, 2.0) == [0.0]
    t = arrival_times(1000, 4.0, 0.5, seed=3, normalize=True)  # vllm/benchmarks/serve.py: last at n / rate
    assert len(t) == 1000 and t[0] > 0 and t[-1] == pytest.approx(250.0)
    assert arrival_times(50, 2.0, seed=7) == arrival_times(50, 2.0, seed=7) != arrival_times(50, 2.0, seed=8)


def answer_of(text):
    """The exact answer a task prompt asks for, worked out from the prompt alone."""
    if m := re.fullmatch(r"(\d{1,2})\+(\d{1,2})=", text):
        return str(int(m[1]) + int(m[2]))
    if m := re.fullmatch(r"copy ([a-z0-9]{4,20}) -> ", text):
        return m[1]
    m = re.fullmatch(r"kv: ((?:[a-z]{3}=\d\d ?)+)(?: \? [a-z]{3}=\d\d)* \? ([a-z]{3})=", text)
    assert m, text
    return dict(p.split("=") for p in m[1].split())[m[2]]


def kind_of(text):
    return ("arithmetic" if text[0].isdigit() else "copy" if text.startswith("copy ")
            else "recall" if text.startswith("kv: ") else "text")


def test_trace_prompts_are_course_prompts_with_short_answers():
    trace = make_trace(600, 10.0, seed=2, long_tail=0.0)
    for r in trace:
        text = bytes(r.prompt).decode("ascii")
        assert kind_of(text) == r.kind
        if r.kind == "text":
            assert re.fullmatch(r"[A-Z][a-z ]+\. ", text), text
            assert TEXT_TOKENS[0] <= r.max_tokens <= TEXT_TOKENS[1]
        else:
            need = len(answer_of(text)) + 1  # the answer and its "\n"
            assert need <= r.max_tokens <= need + SHORT_EXTRA, (text, r.max_tokens)
    assert {r.kind for r in trace} == {"arithmetic", "recall", "copy", "text"}
    assert len({r.request_id for r in trace}) == 600
    assert [r.arrival for r in trace] == arrival_times(600, 10.0, 1.0, 2)


def test_long_tail_and_text_fractions_and_the_context():
    n, frac = 3000, 0.3
    trace = make_trace(n, 50.0, seed=1, long_tail=frac)
    assert all(len(r.prompt) + r.max_tokens <= 256 for r in trace)
    short_max = {"text": TEXT_TOKENS[1]}
    long = sum(r.max_tokens > short_max.get(r.kind, 20 + 1 + SHORT_EXTRA) for r in trace)
    tol = 4 * math.sqrt(frac * (1 - frac) / n)  # 4 binomial standard errors
    assert abs(long / n - frac) < tol
    assert abs(sum(r.kind == "text" for r in trace) / n - 0.25) < 4 * math.sqrt(0.25 * 0.75 / n)
    assert max(r.max_tokens for r in trace) > 150
    small = make_trace(300, 5.0, seed=1, long_tail=1.0, context=64)
    assert all(len(r.prompt) + r.max_tokens <= 64 for r in small) and any(r.kind == "recall" for r in small)
    assert {r.kind for r in make_trace(50, 5.0, text_fraction=1.0)} == {"text"}
    assert "text" not in {r.kind for r in make_trace(50, 5.0, text_fraction=0.0)}


def test_traces_are_deterministic_and_summarised():
    a, b = make_trace(100, 4.0, 0.5, seed=9), make_trace(100, 4.0, 0.5, seed=9)
    assert a == b != make_trace(100, 4.0, 0.5, seed=10)
    s = summary(a)
    assert (s["n"], s["duration_s"]) == (100, a[-1].arrival)
    assert s["mean_prompt_tokens"] == pytest.approx(np.mean([len(r.prompt) for r in a]))
    assert s["max_output_tokens"] == max(r.max_tokens for r in a)
    assert sum(s[f"n_{k}"] for k in ("arithmetic", "recall", "copy", "text")) == 100
    p = a[0].params()
    assert (p.max_tokens, p.greedy) == (a[0].max_tokens, True)


def test_bad_input_is_refused():
    assert_refused(lambda: arrival_times(0, 1.0), ValueError, "n", 0, "a positive int")
    assert_refused(lambda: arrival_times(5, 0), ValueError, "rate", 0, "a positive number (requests/s) or")
    assert_refused(lambda: arrival_times(5, "5"), TypeError, "rate", "5", "a positive number")
    assert_refused(lambda: arrival_times(5, math.nan), ValueError, "rate", math.nan, "a positive number")
    assert_refused(lambda: arrival_times(5, 1.0, -1), ValueError, "burstiness", -1, "a positive number")
    assert_refused(lambda: arrival_times(5, 1.0, seed=-1), ValueError, "seed", -1, "an int >= 0")
    assert_refused(lambda: arrival_times(5, 1.0, normalize=1), TypeError, "normalize", 1, "True or False")
    assert_refused(lambda: make_trace(5, 1.0, long_tail=1.5), ValueError, "long_tail", 1.5, "in [0, 1]")
    assert_refused(lambda: make_trace(5, 1.0, context=5), ValueError, "context", 5, "long enough")
    assert_refused(lambda: make_trace(5, 1.0, tail_median=0), ValueError, "tail_median", 0, "positive")
    assert_refused(lambda: TraceRequest("r", 0.0, (), 4), ValueError, "prompt", (), "at least one token")
    assert_refused(lambda: TraceRequest("r", 0.0, "hi", 4), TypeError, "prompt", "hi", "a tuple of token ids")
    assert_refused(lambda: TraceRequest("r", -1.0, (1,), 4), ValueError, "arrival", -1.0, ">= 0")
    assert_refused(lambda: TraceRequest("r", 0.0, (1,), 0), ValueError, "max_tokens", 0, "a positive int")
    assert_refused(lambda: TraceRequest("r", 0.0, (1,), 4, kind="chat"), ValueError, "kind", "chat", "one of")
    assert_refused(lambda: summary([]), TypeError, "trace", [], "a non-empty list of TraceRequest")
