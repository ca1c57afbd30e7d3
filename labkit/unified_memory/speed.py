"""How fast the paging loop replays on this machine (notebook 02, section 4), measured with one method:

  method   explore.replay_steps of the given per-token page arrays on a fresh pool (pool set-up included),
           every setting in turn (labkit.course.timing.interleave: round r replays each setting once), after
           one untimed round (numba's compile and the first page-table allocation stay out of it)
  figure   each setting's median seconds over `repeats` rounds, and its spread; rate = accesses / median
  verdict  when a spread is wider than labkit.memory_wall.verdicts.MAX_SPREAD, the sentence is "unreliable
           on this run: re-run when the machine is quiet" with the reasons, never a rate

The simulated seconds of the pool's stats do not depend on any of this: only the wall clock of replaying
does. Units: seconds, page accesses.
"""

from __future__ import annotations

from typing import Mapping

from .._checks import check_positive_int, check_type, fail
from ..course import Timing, interleave
from ..memory_wall import verdicts
from .explore import replay_steps


def time_replays(steps, n_pages: int, device_pages: int, settings: Mapping[str, dict],
                 repeats: int = 5) -> dict[str, Timing]:
    """{setting: Timing of one replay_steps(steps, n_pages, device_pages, **settings[setting])}, timed in
    turns. `settings`: {label: UMConfig keyword arguments}."""
    check_type("settings", settings, Mapping, "a dict of label -> settings")
    if not settings or not all(isinstance(v, Mapping) for v in settings.values()):
        fail("settings", settings, "a non-empty dict of label -> a dict of UMConfig settings")
    check_positive_int("repeats", repeats)
    calls = {label: (lambda kw=dict(kw): replay_steps(steps, n_pages, device_pages, **kw))
             for label, kw in settings.items()}
    return interleave(calls, repeats=repeats, warmup=1)


def _timings(timings) -> dict[str, Timing]:
    check_type("timings", timings, Mapping, "a dict of label -> Timing")
    if not timings or not all(isinstance(t, Timing) and t.median > 0 for t in timings.values()):
        fail("timings", timings, "a non-empty dict of label -> Timing with a median > 0 seconds")
    return dict(timings)


def rate_rows(timings: Mapping[str, Timing], accesses: int) -> list[dict]:
    """One row per setting: the median seconds of a replay of `accesses` page accesses, the spread of the
    repeats, and the rate in millions of accesses per second."""
    accesses = check_positive_int("accesses", accesses, unit="page accesses")
    return [{"setting": label, "median_s": t.median, "spread": t.spread, "M_accesses/s": accesses / t.median / 1e6}
            for label, t in _timings(timings).items()]


def speed_verdict(timings: Mapping[str, Timing], accesses: int, what: str,
                  max_spread: float = verdicts.MAX_SPREAD) -> verdicts.Verdict:
    """What the measured rates say: the slowest and the fastest setting's rate, and how long `what` (the
    replay timed, e.g. "replaying the two 7B tokens", `accesses` page accesses) takes at each; UNRELIABLE
    (with the reasons) when a spread exceeds `max_spread`. Verdict.ratio: fastest rate / slowest rate."""
    rows = rate_rows(timings, accesses)
    check_type("what", what, str)
    slow, fast = (min(rows, key=lambda r: r["M_accesses/s"]), max(rows, key=lambda r: r["M_accesses/s"]))
    ratio = fast["M_accesses/s"] / slow["M_accesses/s"]
    reasons = verdicts.unsteady(timings, max_spread)
    if reasons:
        return verdicts.Verdict(False, ratio, f"{verdicts.UNRELIABLE} ({'; '.join(reasons)})")
    n = sorted({len(t.times) for t in timings.values()})
    return verdicts.Verdict(True, ratio, (
        f"the loop replays {slow['M_accesses/s']:.0f} M page accesses/s ({slow['setting']}) to "
        f"{fast['M_accesses/s']:.0f} M/s ({fast['setting']}) on this machine (medians of {'/'.join(map(str, n))} "
        f"runs taken in turns, spreads up to {max(r['spread'] for r in rows):.0%}): {what} takes "
        f"{fast['median_s']:.2f} to {slow['median_s']:.2f} s, pool set-up included"))
