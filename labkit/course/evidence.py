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
The same rule, applied to repeats of a ratio against its goal (`against_goal`, the sign test):

    the repeats meet the goal when every one of them is >= goal, miss it when every one is < goal, and
    they are enough when a ratio whose median sits exactly on the goal (each repeat above or below it
    with chance 1/2) would rarely put all n on one side: 2 / 2**n <= FALSE_DIRECTION, so n >= 6.
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


def sign_chance(n: int) -> float:
    """The chance that n repeats of a measurement whose median is exactly the goal all fall on one side of it:
    2 / 2**n (the sign test, two-sided). The rule asks for at most FALSE_DIRECTION."""
    check_int("n", n, 1)
    return min(1.0, 2 / 2**n)


MIN_GOAL_REPEATS = next(n for n in range(1, 100) if sign_chance(n) <= FALSE_DIRECTION)
"""The fewest repeats that can say a goal is met or missed (6)."""


@dataclass(frozen=True)
class GoalCheck:
    """Repeats of one figure (a ratio, a share) against a goal line under the rule of this module. `met` is
    True or False only when `reliable`; `reason` says why not ("" when reliable)."""
    name: str
    goal: float
    median: float
    reliable: bool
    reason: str

    @property
    def met(self) -> bool | None:
        """True: every repeat >= goal; False: every repeat < goal; None: unreliable."""
        return None if not self.reliable else self.median >= self.goal

    def verdict(self) -> str:
        """'goal met', 'goal NOT met', or 'unreliable on this run (<reason>)'."""
        if not self.reliable:
            return f"{UNRELIABLE} ({self.reason})"
        return f"goal {'met' if self.met else 'NOT met'} (every repeat {'>=' if self.met else '<'} {self.goal:g})"


def against_goal(name: str, values, goal: float) -> GoalCheck:
    """Check the repeats `values` of `name` (a list of numbers, e.g. per-repeat ratios; benchmarks/serving_http.py,
    serving_batching.py, cluster_router.py) against the line `goal` by the rule of this module."""
    check_type("name", name, str)
    if isinstance(goal, bool) or not isinstance(goal, (int, float)) or not math.isfinite(goal):
        fail("goal", goal, "a finite number")
    x = _samples("values", values)
    above = sum(v >= goal for v in x)
    risk = sign_chance(len(x))
    if risk > FALSE_DIRECTION:
        reason = (f"{len(x)} repeats of {name}: a figure sitting on the goal puts them all on one side "
                  f"{risk:.0%} of the time, the rule allows {FALSE_DIRECTION:.0%} ({MIN_GOAL_REPEATS} repeats)")
    elif 0 < above < len(x):
        reason = (f"{above} of {len(x)} repeats of {name} ({_span(x, '')}) reach {goal:g}: "
                  "the goal is within this run's noise")
    else:
        reason = ""
    return GoalCheck(name, float(goal), statistics.median(x), not reason, reason)
