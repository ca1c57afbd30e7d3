"""Measured verdicts that a busy machine cannot turn upside down (notebooks 00 and 01; any lab may use them).

A timing on a shared laptop moves by 20% between runs, and by far more while another program wants the
cores. So a sentence that concludes something from a measurement follows three rules here:

  1. one method, named, repeated: each figure is the median of its repeats (labkit.course.timing), whose
     spread (slowest - fastest) / median says how steady the machine was while it measured;
  2. ratios from the same run: the things compared are timed in turns (timing.interleave), so a change
     in the machine's load hits all of them alike, and their ratio is the figure to headline;
  3. no conclusion from an unreliable measurement: a direction ("faster") only when the repeats separate
     by the course's rule (labkit.course.evidence); a bandwidth or ceiling figure only when each spread is
     below MAX_SPREAD and a reference kernel lands inside the band it must lie in; else UNRELIABLE, with
     the reason.

Each function returns a Verdict: `reliable`, the `ratio` it rests on, and the `text` to print (built from
the numbers, never typed). Units: seconds (Timing), bytes, bytes/s, tokens/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .._checks import check_number, check_positive, check_type, fail
from ..course import Timing, evidence

UNRELIABLE = f"{evidence.UNRELIABLE}: re-run when the machine is quiet"
MAX_SPREAD = 0.5  # (slowest - fastest) / median above this: something else used the machine meanwhile
ROOF_BAND = (0.4, 1.25)  # a memory-bound kernel reads at 40%-125% of the measured roof, or the roof is wrong
AT_ROOF = 0.8            # from 80% of the roof on, a kernel "runs at the memory bandwidth"


@dataclass(frozen=True)
class Verdict:
    """A conclusion from measurements: whether it can be trusted, the ratio it rests on, the sentence."""
    reliable: bool
    ratio: float
    text: str

    def __str__(self) -> str:
        return self.text


def _timings(timings) -> dict[str, Timing]:
    check_type("timings", timings, Mapping, "a dict of name -> Timing")
    if not timings:
        fail("timings", timings, "a non-empty dict of name -> Timing")
    for name, t in timings.items():
        check_type(f"timings[{name!r}]", t, Timing, "a labkit.course.Timing")
        if t.median <= 0:
            fail(f"timings[{name!r}]", t, "a Timing with a median > 0 seconds")
    return dict(timings)


def _spread_limit(max_spread) -> float:
    return check_number("max_spread", max_spread, low=0, low_open=True)


def unsteady(timings: Mapping[str, Timing], max_spread: float = MAX_SPREAD) -> list[str]:
    """The reasons not to trust `timings` ({name: Timing}): one per timing whose spread exceeds
    `max_spread`, e.g. "sum: spread 83% > 50%". Empty when every timing is steady."""
    timings, limit = _timings(timings), _spread_limit(max_spread)
    return [f"{name}: spread {t.spread:.0%} > {limit:.0%}" for name, t in timings.items() if t.spread > limit]


def _runs(timings: Mapping[str, Timing]) -> str:
    counts = "/".join(map(str, sorted({len(t.times) for t in timings.values()})))
    spreads = ", ".join(f"{t.spread:.0%}" for t in timings.values())
    if len(timings) == 1:
        return f"median of {counts} runs, spread {spreads}"
    return f"medians of {counts} runs taken in turns, spreads {spreads}"


def _unreliable(ratio: float, reasons: list[str]) -> Verdict:
    return Verdict(False, ratio, f"{UNRELIABLE} ({'; '.join(reasons)})")


def speedup(timings: Mapping[str, Timing], fast: str, slow: str) -> Verdict:
    """How many times faster `fast` runs than `slow`: the ratio of their medians (slow / fast), both from
    `timings`, which should come from one timing.interleave run. It states a direction only when the repeats
    separate by the course's rule (labkit.course.evidence: no overlap, enough repeats); otherwise UNRELIABLE
    with the reason. Notebook 00 compares generation with and without the KV cache this way."""
    timings = _timings(timings)
    for name, v in (("fast", fast), ("slow", slow)):
        if v not in timings:
            fail(name, v, f"one of the timed names {sorted(timings)}")
    if fast == slow:
        fail("slow", slow, f"a name other than fast ({fast!r})")
    pair = {fast: timings[fast], slow: timings[slow]}
    c = evidence.compare(fast, pair[fast], slow, pair[slow], " s")
    if not c.reliable:
        return _unreliable(c.ratio, [c.reason])
    how = f"{c.ratio:.1f}x as fast as" if c.ratio >= 1 else f"{1 / c.ratio:.1f}x slower than"
    return Verdict(True, c.ratio, f"{fast} runs {how} {slow} ({_runs(pair)}, no overlap)")


def against_roof(kernel: str, kernel_bytes: float, kernel_time: Timing, roof: str, roof_bytes: float,
                 roof_time: Timing, max_spread: float = MAX_SPREAD,
                 band: tuple[float, float] = ROOF_BAND) -> Verdict:
    """Whether `kernel`, which reads `kernel_bytes` per call in `kernel_time`, runs at the memory bandwidth
    that `roof` (reading `roof_bytes` per call in `roof_time`) measured alongside it, interleaved. The ratio
    is the kernel's bytes/s over the roof's. A memory-bound reference kernel (notebook 01's large
    matrix-vector product) lands inside `band`; outside it, or with a spread wider than `max_spread`, the
    verdict is UNRELIABLE: the roof or the kernel was disturbed."""
    check_type("kernel", kernel, str)
    check_type("roof", roof, str)
    k_bytes = check_positive("kernel_bytes", kernel_bytes, unit="bytes")
    r_bytes = check_positive("roof_bytes", roof_bytes, unit="bytes")
    pair = _timings({kernel: kernel_time, roof: roof_time})
    if not isinstance(band, (tuple, list)) or len(band) != 2:
        fail("band", band, "a (low, high) pair of ratios", TypeError)
    low, high = (check_positive("band", v) for v in band)
    if low >= high:
        fail("band", band, "(low, high) with low < high")
    k_rate, r_rate = k_bytes / kernel_time.median, r_bytes / roof_time.median
    ratio = k_rate / r_rate
    reasons = unsteady(pair, max_spread)
    if ratio < low:
        reasons.append(f"{kernel} read at {ratio:.0%} of the roof, below the {low:.0%} a memory-bound kernel "
                       "reaches")
    elif ratio > high:
        reasons.append(f"{kernel} read at {ratio:.0%} of the roof, above {high:.0%}: the roof was measured low")
    if reasons:
        return _unreliable(ratio, reasons)
    where = ("it runs at this machine's memory bandwidth" if ratio >= AT_ROOF else
             f"memory-bound, within {1 / ratio:.1f}x of this machine's memory bandwidth")
    return Verdict(True, ratio, f"{kernel} reads {k_rate / 1e9:.1f} GB/s, {ratio:.0%} of the {r_rate / 1e9:.1f} "
                                f"GB/s {roof} reads ({_runs(pair)}): {where}")


def against_ceiling(name: str, tokens_per_call: float, call_time: Timing, ceiling: float,
                    max_spread: float = MAX_SPREAD, overhead_below: float = 0.5) -> Verdict:
    """How close `name`, which makes `tokens_per_call` tokens per call in `call_time`, comes to its memory
    `ceiling` (tokens/s, from roofline.decode_ceiling with the measured roof). Below `overhead_below` of
    the ceiling the time goes to overheads (Python, kernel launches) rather than bytes; above 1.25x the
    weights come from a cache faster than main memory. UNRELIABLE when the spread exceeds `max_spread`."""
    check_type("name", name, str)
    per_call = check_positive("tokens_per_call", tokens_per_call, unit="tokens")
    cap = check_positive("ceiling", ceiling, unit="tokens/s")
    below = check_number("overhead_below", overhead_below, 0, 1, low_open=True)
    timings = _timings({name: call_time})
    rate = per_call / call_time.median
    ratio = rate / cap
    reasons = unsteady(timings, max_spread)
    if reasons:
        return _unreliable(ratio, reasons)
    where = (f"{ratio:.1%} of its memory ceiling: overhead-bound (Python and kernel launches, not bytes, take "
             "the time)" if ratio < below else
             f"{ratio:.0%} of its memory ceiling: bandwidth-bound" if ratio <= 1.25 else
             f"{ratio:.1f}x its memory ceiling: its weights come from a cache faster than main memory")
    return Verdict(True, ratio, f"{name} makes {rate:,.0f} tokens/s, {where} ({_runs(timings)})")
