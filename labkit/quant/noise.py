"""How far a difference measured on one text can be trusted: paired differences over pieces of the text,
with a Student t interval (notebook 03, sections 6 and 7; benchmarks/quant_quality.py).

Two models (or two layer types) are measured on the same n pieces of a text, a_i and b_i. Their paired
differences d_i = a_i - b_i cancel what the pieces have in common (one piece is simply harder than
another) and keep what differs between the two:

    mean   = sum(d_i) / n
    spread = sqrt(sum((d_i - mean)^2) / (n - 1))                 (the sample standard deviation)
    interval = mean +- t(0.975, n - 1) * spread / sqrt(n)         (95%, Student's t with n - 1 degrees)

"a above b" is concluded only when the whole interval is above 0, "a below b" only when it is all below,
otherwise "cannot tell". t(0.975, 3) = 3.18 for 4 pieces, 2.36 for 8: with few pieces the interval is wide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .._checks import check_number, check_positive_int, fail, is_number

ABOVE, BELOW, UNDECIDED = "above", "below", "cannot tell"


def _t_cdf_from_zero(x: float, df: int, steps: int = 4000) -> float:
    """P(0 <= T <= x) for Student's t with `df` degrees of freedom (Simpson's rule on the density)."""
    t = np.linspace(0.0, x, steps + 1)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    f = np.exp(log_c - (df + 1) / 2 * np.log1p(t * t / df))
    weights = np.ones(steps + 1)
    weights[1:-1:2], weights[2:-1:2] = 4, 2
    return float(x / steps / 3 * (weights * f).sum())


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t distribution with `df` degrees of freedom (p in (0.5, 1); 0.975 gives
    the half-width factor of a 95% interval: 12.71 for df 1, 3.18 for 3, 2.36 for 7, 1.96 as df grows)."""
    p = check_number("p", p, 0.5, 1.0, low_open=True, high_open=True)
    df = check_positive_int("df", df)
    lo, hi = 0.0, 1.0
    while _t_cdf_from_zero(hi, df) < p - 0.5:  # the tail of df = 1 is heavy: widen the bracket first
        lo, hi = hi, 2 * hi
    for _ in range(60):  # bisection on P(0 <= T <= x) = p - 1/2
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf_from_zero(mid, df) < p - 0.5 else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class PairedDifference:
    """The paired differences a_i - b_i over n pieces: their mean and its 95% interval (module docstring)."""
    differences: tuple[float, ...]
    mean: float
    low: float
    high: float

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def above(self) -> int:
        """On how many pieces a was above b."""
        return sum(d > 0 for d in self.differences)

    @property
    def decision(self) -> str:
        """ABOVE (the whole interval is above 0), BELOW (all of it below) or UNDECIDED."""
        return ABOVE if self.low > 0 else BELOW if self.high < 0 else UNDECIDED

    def describe(self, digits: int = 4) -> str:
        """'+0.0032 (95% interval +0.0005 to +0.0059, above on 7 of 8 pieces)'."""
        return (f"{self.mean:+.{digits}f} (95% interval {self.low:+.{digits}f} to {self.high:+.{digits}f}, "
                f"above on {self.above} of {self.n} pieces)")


def _values(name: str, values) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not all(is_number(v) for v in values):
        fail(name, values, "a sequence of numbers", TypeError)
    if not all(math.isfinite(v) for v in values):
        fail(name, tuple(values), "a sequence of finite numbers")
    return [float(v) for v in values]


def paired_difference(a: Sequence[float], b: Sequence[float]) -> PairedDifference:
    """The paired differences a_i - b_i (the same pieces, in the same order; at least 2) with the 95% t
    interval of their mean."""
    a, b = _values("a", a), _values("b", b)
    if len(a) != len(b):
        fail("b", tuple(b), f"as many values as a ({len(a)})")
    if len(a) < 2:
        fail("a", tuple(a), "at least 2 paired values (an interval needs a spread)")
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    spread = math.sqrt(sum((v - mean) ** 2 for v in d) / (len(d) - 1))
    half = t_quantile(0.975, len(d) - 1) * spread / math.sqrt(len(d))
    return PairedDifference(tuple(d), mean, mean - half, mean + half)
