"""What a run of the INT4 matmul (labkit.quant.speed) lets one conclude, by the rules of
labkit.memory_wall.verdicts (notebook 03, section 8; benchmarks/int4_matmul.py):

  - one method, named (speed.py), each figure the median of its rounds, ratios from the same run;
  - "unreliable on this run: re-run when the machine is quiet" instead of a conclusion when the repeats of
    the two kernels do not separate (labkit.course.evidence), when a spread is wider than MAX_SPREAD (the
    memory verdict), when the FP32 reference reads outside ROOF_BAND of the roof measured with it on
    as many threads, or when a kernel ran more than CONTENTION times slower on all threads than on one
    (another program held a core).

The headline is the 1-thread ratio. A 1-thread kernel runs on whichever core is free; a kernel on 2
threads waits at every step for its slower thread, so a browser or another job on one core slows it
several times over, and its ratio to FP32 with it, while the 1-thread ratio moves far less
(benchmarks/RESULTS.md, lab 03, has runs of both on a quiet and a busy machine).

Whether INT4 is memory-bound is read on one thread too, from how much of its byte saving it turns into
speed: speed-up / byte ratio = INT4's read rate / FP32's, FP32 being the GEMV that streams its bytes. At
MEMORY_BOUND or more INT4 is limited by memory like FP32; below WORK_BOUND, by the work per byte
(unpacking nibbles, converting, applying scales and zeros); in between, by both. The wide middle keeps a
run that lands near one threshold from flipping the conclusion.
"""

from __future__ import annotations

from ..memory_wall import verdicts as wall
from .._checks import check_type
from .speed import FP32, FP32_1, INT4, INT4_1, ROOF_1, MatmulRun

UNRELIABLE, MAX_SPREAD, ROOF_BAND, Verdict = wall.UNRELIABLE, wall.MAX_SPREAD, wall.ROOF_BAND, wall.Verdict
CONTENTION = 1.25  # a kernel this many times slower on all threads than on one: a core was taken
MEMORY_BOUND, WORK_BOUND = 0.9, 0.5  # shares of the byte saving turned into speed


def _run(run) -> MatmulRun:
    return check_type("run", run, MatmulRun, "a labkit.quant.speed.MatmulRun")


def _threads(run: MatmulRun) -> str:
    return f"{run.threads} thread{'s' if run.threads > 1 else ''}"


def _unreliable(ratio: float, reasons: list[str]) -> Verdict:
    return Verdict(False, ratio, f"{UNRELIABLE} ({'; '.join(reasons)})")


def contention(run: MatmulRun) -> list[str]:
    """Reasons to distrust the all-thread figures: each kernel (FP32, INT4) that took more than CONTENTION
    times longer on all threads than on one. Empty when torch uses one thread or none did."""
    run = _run(run)
    if run.threads == 1:
        return []
    return [f"{case} took {run.seconds(case) * 1e3:.2f} ms on {run.threads} threads, "
            f"{run.seconds(case) / run.seconds(one):.1f}x its {run.seconds(one) * 1e3:.2f} ms on 1: another program "
            f"held a core, and a {run.threads}-thread kernel waits for its slowest thread"
            for case, one in ((FP32, FP32_1), (INT4, INT4_1)) if run.seconds(case) > CONTENTION * run.seconds(one)]


def one_thread(run: MatmulRun) -> Verdict:
    """The headline: how many times faster INT4 runs than FP32, both on one thread."""
    run = _run(run)
    return wall.speedup({INT4_1: run.timings[INT4_1], FP32_1: run.timings[FP32_1]}, INT4_1, FP32_1)


def all_threads(run: MatmulRun) -> Verdict:
    """INT4 against FP32 on all of torch's threads: unreliable also when contention() finds a reason."""
    run = _run(run)
    pair = {f"{c} on {_threads(run)}": run.timings[c] for c in (INT4, FP32)}
    v = wall.speedup(pair, *pair)
    reasons = contention(run)
    return _unreliable(v.ratio, reasons) if v.reliable and reasons else v


def memory_bound(run: MatmulRun) -> Verdict:
    """Whether INT4 on one thread is limited by memory: the share of its byte saving it turns into speed
    (the ratio), once the run passes the checks of the module docstring."""
    run = _run(run)
    reasons = wall.unsteady({c: run.timings[c] for c in (FP32_1, INT4_1, ROOF_1)})
    roof, fp32, int4 = run.bytes_per_s(ROOF_1), run.bytes_per_s(FP32_1), run.bytes_per_s(INT4_1)
    low, high = ROOF_BAND
    if not low <= fp32 / roof <= high:
        reasons.append(f"the FP32 reference read {fp32 / 1e9:.1f} GB/s, {fp32 / roof:.0%} of the {roof / 1e9:.1f} "
                       f"GB/s one thread reads, outside the {low:.0%}-{high:.0%} a memory-bound kernel reaches")
    ratio = int4 / fp32
    if reasons:
        return _unreliable(ratio, reasons)
    where = ("memory-bound, like FP32" if ratio >= MEMORY_BOUND else
             "not memory-bound: the work per byte (unpacking nibbles, converting, applying scales and zeros) "
             "limits it" if ratio < WORK_BOUND else "limited by memory and by the work per byte both")
    fewer, faster = run.weight_bytes[FP32_1] / run.weight_bytes[INT4_1], run.seconds(FP32_1) / run.seconds(INT4_1)
    return Verdict(True, ratio, f"on 1 thread INT4 reads {fewer:.1f}x fewer bytes than FP32 and runs {faster:.1f}x "
                                f"as fast: it turns {ratio:.0%} of its byte saving into speed (INT4 reads "
                                f"{int4 / 1e9:.1f} GB/s, FP32 {fp32 / 1e9:.1f} GB/s, {fp32 / roof:.0%} of the "
                                f"{roof / 1e9:.1f} GB/s one thread reads): {where}")


def speed_verdicts(run: MatmulRun) -> dict[str, Verdict]:
    """{"headline": one_thread, "all threads": all_threads, "memory": memory_bound} for one run."""
    run = _run(run)
    return {"headline": one_thread(run), "all threads": all_threads(run), "memory": memory_bound(run)}


def lines(run: MatmulRun) -> list[str]:
    """The verdict lines notebook 03 prints under its timing table."""
    v = speed_verdicts(run)
    return [f"headline, 1 thread (steady when another program uses a core): {v['headline']}",
            f"all {_threads(run)}: {v['all threads']}", f"memory: {v['memory']}"]
