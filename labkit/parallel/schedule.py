"""Pipeline schedules and their bubbles, no processes (notebook 04, section 4; labkit.parallel.pipeline runs
them on real ranks).

A batch is cut into m micro-batches that flow through p stages. Each stage runs a list of operations,
("F", i) forward or ("B", i) backward of micro-batch i:

    GPipe (Huang et al. 2019): every forward, then every backward       -> m activations kept per stage
    1F1B  (PipeDream-Flush, Narayanan et al. 2021): stage s runs p-s-1 warm-up forwards, then alternates
          one forward and one backward, then drains the backwards        -> at most p-s activations kept

    p = 3, m = 4, F = B = one slot (GPipe):     s0  F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3
                                                s1  .  F0 F1 F2 F3 .  .  B0 B1 B2 B3 .
                                                s2  .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .

With equal stages both schedules take (m + p - 1) slots of forward + backward, of which m are busy: the
bubble is (p-1)/(m+p-1) of the total time. Megatron-LM's paper quotes (p-1)/m: the same idle time, as a
fraction of the ideal (bubble-free) time instead of the total.
"""

from __future__ import annotations

from .._checks import check_choice, check_positive, check_positive_int, fail

SCHEDULES = ("gpipe", "1f1b")


def bubble_fraction(stages: int, microbatches: int) -> float:
    """(p-1)/(m+p-1): the share of a pipeline's total time each stage sits idle, for GPipe and 1F1B alike
    with equal stages (p = stages, m = microbatches)."""
    p, m = check_positive_int("stages", stages), check_positive_int("microbatches", microbatches)
    return (p - 1) / (m + p - 1)


def megatron_bubble(stages: int, microbatches: int) -> float:
    """(p-1)/m: the same idle time as a fraction of the ideal time m (Narayanan et al. 2021, eq. 1)."""
    p, m = check_positive_int("stages", stages), check_positive_int("microbatches", microbatches)
    return (p - 1) / m


def operations(schedule: str, stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """For each stage, its ("F" | "B", micro-batch) operations in the order it runs them."""
    check_choice("schedule", schedule, SCHEDULES)
    p, m = check_positive_int("stages", stages), check_positive_int("microbatches", microbatches)
    out = []
    for s in range(p):
        if schedule == "gpipe":
            out.append([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            continue
        warm = min(p - s - 1, m)
        ops = [("F", i) for i in range(warm)]
        for i in range(warm, m):
            ops += [("F", i), ("B", i - warm)]
        out.append(ops + [("B", i) for i in range(m - warm, m)])
    return out


def peak_in_flight(ops: list[tuple[str, int]]) -> int:
    """The most micro-batches whose activations a stage holds at once (forwarded, not yet backwarded)."""
    live = peak = 0
    for kind, _ in ops:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def simulate(schedule: str, stages: int, microbatches: int, forward: float = 1.0,
             backward: float = 2.0) -> list[list[tuple[str, int, float, float]]]:
    """Start and end times of every operation when each forward takes `forward` and each backward
    `backward` seconds on every stage and messages are free: for each stage, (kind, micro-batch, start,
    end). An operation starts when its stage is free and its input has arrived."""
    check_positive("forward", forward, unit="seconds")
    check_positive("backward", backward, unit="seconds")
    ops = operations(schedule, stages, microbatches)
    done: dict[tuple[str, int, int], float] = {}
    clock, pos, out = [0.0] * stages, [0] * stages, [[] for _ in range(stages)]
    while any(pos[s] < len(ops[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            if pos[s] == len(ops[s]):
                continue
            kind, i = ops[s][pos[s]]
            dep = ("F", s - 1, i) if kind == "F" and s > 0 else ("B", s + 1, i) if kind == "B" and s < stages - 1 \
                else ("F", s, i) if kind == "B" else None
            if dep is not None and dep not in done:
                continue
            start = max(clock[s], done.get(dep, 0.0))
            end = start + (forward if kind == "F" else backward)
            done[(kind, s, i)], clock[s] = end, end
            out[s].append((kind, i, start, end))
            pos[s], moved = pos[s] + 1, True
        if not moved:
            raise RuntimeError("the schedule deadlocks")  # never for the two schedules above
    return out


def measured_bubble(events: list[list[tuple[str, int, float, float]]]) -> float:
    """Idle share of the total time, averaged over stages, from each stage's (kind, mb, start, end) events:
    1 - busy / (last end - first start)."""
    if not isinstance(events, (list, tuple)) or not events or not all(events):
        fail("events", events, "one non-empty list of (kind, micro-batch, start, end) per stage (a run of "
             "torch.distributed.pipelining records none: library=True runs have no measured bubble)")
    t0 = min(e[2] for stage in events for e in stage)
    t1 = max(e[3] for stage in events for e in stage)
    busy = [sum(e[3] - e[2] for e in stage) for stage in events]
    return sum(1 - b / (t1 - t0) for b in busy) / len(events)
