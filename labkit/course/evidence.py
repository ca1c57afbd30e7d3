"""The course's one rule for stating a direction from measurements ("faster", "saves memory", "ranks first").
Every lab's verdicts use it (labkit.memory_wall.verdicts, labkit.kv_cache.speed, labkit.cluster.compiled,
notebooks 04 and 07), and so do the benchmarks.

A timing on a shared 2-core laptop moves by 20% between runs and by far more while another program runs.
Two medians that differ by less than that noise say nothing about which thing is faster, so:

    a and b, two sets of repeats of one measurement (seconds, bytes, tokens/s), separate when
      1. they do not overlap: max(a) < min(b) or max(b) < min(a), and
      2. they have enough repeats that two *equal* things would rarely fail to overlap by chance:
         with n and m repeats of one distribution, the chance that all of one set lies below all of the
         other, in either order, is 2 / C(n + m, n) (every ordering of the n + m values is equally likely);
         the rule allows at most FALSE_DIRECTION = 5%.

    repeats (n = m)        3       4       5       7
    false-direction risk   10%     2.9%    0.79%   0.058%

So 3 repeats each never suffice, 4 each are the least that do. Only a separated pair states its direction;
anything else reads "unreliable on this run" with the reason, and a later verdict or report never takes a
figure from an unreliable comparison (check `reliable`).

A goal ("continuous at least 2x static", the benchmarks' goals) is a fixed line, not a second set of repeats.
The same bound, applied to n repeats of a ratio against its goal (`against_goal`, the two-sided sign test):

    a ratio whose median sits exactly on the goal puts each repeat above or below it with chance 1/2, so
    k or more of its n repeats land on one side with chance 2 P(Binomial(n, 1/2) >= k) (`sign_chance`).
    The repeats meet the goal when at least k of them are >= goal and miss it when at least k are < goal,
    k the least count whose chance is <= FALSE_DIRECTION (`sign_needed`); fewer than 6 repeats never do.
    (A repeat exactly on the goal counts as reaching it: right for ratios and timings, which land exactly on
    a line with chance 0; a count that often equals its goal would need the ties set aside.)

    repeats n           6     7     8     9    10    12    15    20
    needed on a side    6     7     8     8     9    10    12    15
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .._checks import check_int, check_type, fail
from .timing import Timing

UNRELIABLE = "unreliable on this run"
FALSE_DIRECTION = 0.05  # the largest chance, for two equal things, of repeats that do not overlap


def false_direction_chance(n: int, m: int) -> float:
    """The chance that n and m repeats of one and the same distribution do not overlap (either order):
    2 / C(n + m, n). The rule asks for at most FALSE_DIRECTION."""
    check_int("n", n, 1)
    check_int("m", m, 1)
    return min(1.0, 2 / math.comb(n + m, n))


MIN_REPEATS = next(n for n in range(1, 100) if false_direction_chance(n, n) <= FALSE_DIRECTION)
"""The fewest repeats per side that can state a direction (4)."""


def _samples(name: str, values) -> tuple[float, ...]:
    """The repeats of a Timing (its seconds) or of a sequence of finite numbers, as a tuple of floats."""
    if isinstance(values, Timing):
        values = values.times
    check_type(name, values, (list, tuple), "a Timing or a list of repeated measurements")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            fail(name, values, "repeated measurements that are all finite numbers")
        out.append(float(v))
    if not out:
        fail(name, values, "at least one repeated measurement")
    return tuple(out)


@dataclass(frozen=True)
class Comparison:
    """Two named sets of repeats under the rule of this module. `ratio` = median(b) / median(a);
    `reliable` says whether the sets separate; `reason` says why not ("" when they do)."""
    a: str
    b: str
    ratio: float
    reliable: bool
    reason: str

    @property
    def higher(self) -> str | None:
        """The name whose repeats all lie above the other's, None when unreliable."""
        if not self.reliable:
            return None
        return self.b if self.ratio > 1 else self.a

    @property
    def lower(self) -> str | None:
        """The name whose repeats all lie below the other's, None when unreliable."""
        if not self.reliable:
            return None
        return self.a if self.ratio > 1 else self.b

    def unreliable(self) -> str:
        """'unreliable on this run (<reason>)'."""
        return f"{UNRELIABLE} ({self.reason})"


def _span(x: tuple[float, ...], unit: str) -> str:
    lo, hi = min(x), max(x)
    return f"{lo:.3g}-{hi:.3g}{unit}" if lo != hi else f"{lo:.3g}{unit}"


def compare(a_name: str, a, b_name: str, b, unit: str = "") -> Comparison:
    """Compare the repeats `a` and `b` (Timings or lists of numbers, e.g. seconds or bytes) by the rule of this
    module. `unit` ("s", " B") only labels the ranges in the reason."""
    check_type("a_name", a_name, str)
    check_type("b_name", b_name, str)
    check_type("unit", unit, str)
    if a_name == b_name:
        fail("b_name", b_name, f"a name other than a_name ({a_name!r})")
    xa, xb = _samples("a", a), _samples("b", b)
    ma, mb = statistics.median(xa), statistics.median(xb)
    ratio = mb / ma if ma else (math.inf if mb else 1.0)
    risk = false_direction_chance(len(xa), len(xb))
    if risk > FALSE_DIRECTION:
        reason = (f"{len(xa)} and {len(xb)} repeats: two equal things fail to overlap {risk:.0%} of the time, "
                  f"the rule allows {FALSE_DIRECTION:.0%}")
    elif max(xa) >= min(xb) and max(xb) >= min(xa):
        reason = (f"the repeats of {a_name} ({_span(xa, unit)}) and {b_name} ({_span(xb, unit)}) overlap: "
                  "the difference is within this run's noise")
    else:
        reason = ""
    return Comparison(a_name, b_name, ratio, not reason, reason)


def sign_chance(n: int, k: int | None = None) -> float:
    """The chance that at least k (n by default) of n repeats of a measurement whose median is exactly the goal
    fall on one side of it, either side: 2 P(Binomial(n, 1/2) >= k), at most 1 (the sign test, two-sided)."""
    check_int("n", n, 1)
    k = n if k is None else check_int("k", k, 1, n, "repeats on one side, of n")
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n)


def sign_needed(n: int) -> int | None:
    """The fewest of n repeats that must lie on one side of a goal to decide it (sign_chance <= FALSE_DIRECTION),
    None when even all n would not (n < MIN_GOAL_REPEATS)."""
    check_int("n", n, 1)
    return next((k for k in range(n // 2 + 1, n + 1) if sign_chance(n, k) <= FALSE_DIRECTION), None)


MIN_GOAL_REPEATS = next(n for n in range(1, 100) if sign_needed(n) is not None)
"""The fewest repeats that can say a goal is met or missed (6)."""


@dataclass(frozen=True)
class GoalCheck:
    """Repeats of one figure (a ratio, a share) against a goal line under the rule of this module: `above` of
    `repeats` reach the goal. `met` is True or False only when `reliable`; `reason` says why not ("" when
    reliable)."""
    name: str
    goal: float
    median: float
    above: int
    repeats: int
    reliable: bool
    reason: str

    @property
    def met(self) -> bool | None:
        """True: enough repeats >= goal; False: enough repeats < goal; None: unreliable."""
        return None if not self.reliable else 2 * self.above > self.repeats

    def verdict(self) -> str:
        """'goal met (12 of 15 repeats >= 0.7)', 'goal NOT met (...)' or 'unreliable on this run (<reason>)'."""
        if not self.reliable:
            return f"{UNRELIABLE} ({self.reason})"
        side = self.above if self.met else self.repeats - self.above
        count = "every repeat" if side == self.repeats else f"{side} of {self.repeats} repeats"
        return f"goal {'met' if self.met else 'NOT met'} ({count} {'>=' if self.met else '<'} {self.goal:g})"


def against_goal(name: str, values, goal: float) -> GoalCheck:
    """Check the repeats `values` of `name` (a list of numbers, e.g. per-repeat ratios; benchmarks/serving_http.py,
    serving_batching.py, cluster_router.py, int4_matmul.py) against the line `goal` by the rule of this module."""
    check_type("name", name, str)
    if isinstance(goal, bool) or not isinstance(goal, (int, float)) or not math.isfinite(goal):
        fail("goal", goal, "a finite number")
    x = _samples("values", values)
    above, n = sum(v >= goal for v in x), len(x)
    need = sign_needed(n)
    if need is None:
        reason = (f"{n} repeats of {name}: a figure sitting on the goal puts them all on one side "
                  f"{sign_chance(n):.0%} of the time, the rule allows {FALSE_DIRECTION:.0%} ({MIN_GOAL_REPEATS} "
                  "repeats)")
    elif above < need and n - above < need:
        reason = (f"{above} of {n} repeats of {name} ({_span(x, '')}) reach {goal:g}, the sign test needs {need} "
                  "on one side: the goal is within this run's noise")
    else:
        reason = ""
    return GoalCheck(name, float(goal), statistics.median(x), above, n, not reason, reason)
