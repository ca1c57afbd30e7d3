"""TinyLM's decode step in one process against TP ranks, and the alpha-beta model's prediction of it
(notebook 04, section 3; benchmarks/parallel_decode.py). `measure` takes every timing once; each method of
the report it returns says one thing, so that a notebook cell reads as one step:

    measured()     one process (1 thread, like each rank), the TP step, the link's alpha measured two ways
    alphas()       alpha after compute against alpha back to back (the course's evidence rule)
    prediction()   the alpha-beta prediction against the measured TP step (within 2x or not)
    speed()        TP against one process (the evidence rule)

`step_timeline` takes the TP step apart from timestamps on every rank (StepTimeline, below): where each rank
spent each step, collective by collective.

alpha is timed on all-reduces of one decode message (d_model float32 values), `rounds` times each way, each
round the median of `repeats`: back to back, and after every rank computes for as long as it does between
two collectives of a TP step (the pattern decode has). The prediction is priced with the second. The
hypothesis that it is higher (gloo's threads idle during compute and slow to wake) was measured and refuted
on a quiet machine (benchmarks/RESULTS.md, lab 04); `alphas()` says what this run found.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .._checks import check_int, check_positive, check_positive_int, check_type, fail
from ..course import Timing, evidence, measure as measure_seconds
from ..tinylm import KVCache, TinyLM
from . import gloo
from .distributed import Pool
from .linkmodel import LinkModel, steps
from .tensor import (RowParallelLinear, ShardedTinyLM, predicted_step_seconds, rebuild_model, shard_config,
                     tensor_parallel_generate, tp_inputs)


@dataclass(frozen=True)
class DecodeReport:
    """Seconds of one decode step in one process (`single`, a Timing) and with TP (`tp`, one per step, the
    slowest rank's); alpha (seconds per message) per round, back to back and after `gap` seconds of compute;
    the link priced with the median after-compute alpha; the predicted TP step (seconds)."""
    tp_degree: int
    single: Timing
    tp: tuple[float, ...]
    back_to_back: tuple[float, ...]
    after: tuple[float, ...]
    gap: float
    link: LinkModel
    predicted: float
    collectives: int
    message_bytes: int

    @property
    def single_step(self) -> float:
        return self.single.median

    @property
    def tp_step(self) -> float:
        return statistics.median(self.tp)

    def measured(self) -> str:
        """The timings, in one line each."""
        med = statistics.median
        return (f"one process {self.single_step * 1e3:.2f} ms/token, TP={self.tp_degree} {self.tp_step * 1e3:.2f} "
                f"ms/token (medians of {len(self.single.times)} and {len(self.tp)} steps)\n"
                f"alpha of a {self.message_bytes}-byte all-reduce: back to back {med(self.back_to_back) * 1e6:.0f} us, "
                f"after {self.gap * 1e6:.0f} us of compute {med(self.after) * 1e6:.0f} us "
                f"(medians of {len(self.after)} rounds each)")

    def alpha_comparison(self) -> evidence.Comparison:
        return evidence.compare("back to back", self.back_to_back, "after compute", self.after, " s")

    def alphas(self) -> str:
        """Whether alpha after compute is higher, lower, or not told apart from back to back on this run."""
        c = self.alpha_comparison()
        if not c.reliable:
            return f"alpha after compute against back to back: {c.unreliable()}"
        return (f"alpha after compute is {c.ratio:.2f}x alpha back to back, "
                f"{'higher' if c.higher == 'after compute' else 'lower'} in every round")

    def prediction(self) -> str:
        """The prediction against the measurement, and the cost per collective the step really paid."""
        ratio = self.tp_step / self.predicted
        one = self.link.collective("all_reduce", self.message_bytes, self.tp_degree)
        paid = (self.tp_step - self.single_step / self.tp_degree) / self.collectives
        head = (f"alpha-beta prediction {self.predicted * 1e3:.2f} ms/token (compute / {self.tp_degree} + "
                f"{self.collectives - 1} all-reduces at about {one * 1e3:.2f} ms + the logits' all-gather), "
                f"measured {self.tp_step * 1e3:.2f} ms: ")
        if 0.5 <= ratio <= 2:
            return head + f"measured / predicted {ratio:.2f}, within 2x"
        return head + (f"measured / predicted {ratio:.2f}, outside 2x: the step paid {paid * 1e3:.2f} ms per "
                       "collective, a cost the alpha-beta model does not price")

    def speed_comparison(self) -> evidence.Comparison:
        return evidence.compare("one process", self.single, f"TP={self.tp_degree}", self.tp, " s")

    def speed(self) -> str:
        """TP against one process, by the evidence rule."""
        c, name = self.speed_comparison(), f"TP={self.tp_degree}"
        if not c.reliable:
            return f"{name} against one process: {c.unreliable()}"
        if c.higher == name:
            return f"{name} is {c.ratio:.1f}x slower than one process here (every step of each)"
        return f"{name} runs {1 / c.ratio:.1f}x as fast as one process here (every step of each)"


def single_step(model: TinyLM, prompt: list[int], repeats: int = 20) -> Timing:
    """One decode step of one sequence after `prompt` (KV cache, batch 1) on one torch thread, like each rank
    of a Pool; the thread count is restored after."""
    cache = KVCache(model.cfg, max_len=len(prompt) + 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            model(torch.tensor([prompt]), cache)

            def step():
                cache.rewind(len(prompt))
                model(torch.tensor([[7]]), cache)
            return measure_seconds(step, repeats=repeats, warmup=3)
    finally:
        torch.set_num_threads(threads)


def measure(model: TinyLM, prompt: list[int], pool: Pool, tokens: int = 24, rounds: int = 5, repeats: int = 10,
            beta: float = 1e9) -> DecodeReport:
    """Time TinyLM's decode step in one process and with TP = pool.world (greedy, `tokens` steps), and the
    link's alpha both ways (see the module docstring); `beta` (bytes/s, e.g. section 2's fit) prices the
    bytes, which matter little at decode's message size."""
    check_type("pool", pool, Pool)
    for name, v in (("tokens", tokens), ("rounds", rounds), ("repeats", repeats)):
        check_positive_int(name, v)
    check_positive("beta", beta, unit="bytes/s")
    cfg, n = model.cfg, pool.world
    single = single_step(model, prompt)
    tp = tuple(tensor_parallel_generate(model, prompt, tokens, n, pool=pool)["seconds"])
    collectives = 2 * cfg.n_layers + 2  # 2 all-reduces per layer, the embedding's, the logits' all-gather
    gap = single.median / n / collectives  # each rank's compute between two collectives
    nbytes, per_op = cfg.d_model * 4, steps("all_reduce", n)
    back, after = [], []
    for _ in range(rounds):  # interleaved, so that a change of load hits both alike
        back.append(pool.run(gloo.time_worker, "all_reduce", [nbytes], repeats)[0][0] / per_op)
        after.append(pool.run(gloo.time_worker, "all_reduce", [nbytes], repeats, gap)[0][0] / per_op)
    link = LinkModel(statistics.median(after), beta, "gloo, small messages after compute")
    return DecodeReport(n, single, tp, tuple(back), tuple(after), gap, link,
                        predicted_step_seconds(cfg, n, link, single.median), collectives, nbytes)


# --- the TP step from timestamps ------------------------------------------------------------------------------

COLLECTIVES = ("all_reduce", "all_gather")
PARTS = ("input", "compute", "wait for peer", "in collective", "late exit", "sample", "other")
"""What a rank's decode step is made of (StepTimeline.parts). Per collective, with every rank's entry and exit
on one clock: `wait for peer` runs from this rank's entry to the last rank's entry (the peer was still
computing, or descheduled); `in collective` from the last entry to the first exit (the message itself, what
alpha prices); `late exit` from the first exit to this rank's exit (the data was there, this rank's thread was
not running yet). `compute` is the forward minus its collectives; `input` builds the step's token tensor,
`sample` takes the argmax; `other` is the rest of the rank's span (none where the spans touch, as
timeline_worker's do)."""


@dataclass(frozen=True)
class Event:
    """One span on one rank during decode step `step`, in nanoseconds of time.monotonic_ns (CLOCK_MONOTONIC,
    one clock for every process of a machine): kind "input", "forward", "sample", or a collective inside the
    forward ("all_reduce", "all_gather")."""
    rank: int
    step: int
    kind: str
    start_ns: int
    end_ns: int


def _timed(fn, kind: str, rank: int, events: list, step: list):
    def run(x: torch.Tensor) -> torch.Tensor:
        t0 = time.monotonic_ns()
        out = fn(x)
        events.append(Event(rank, step[0], kind, t0, time.monotonic_ns()))
        return out
    return run


@torch.no_grad()
def timeline_worker(rank: int, world: int, cfg, state: dict, prompt: list[int], steps: int) -> dict:
    """One rank of step_timeline: greedy decode as tensor_parallel_generate does, with a timestamped Event
    for the token tensor, the forward, each collective inside it, and the argmax of every step."""
    sharded = ShardedTinyLM(rebuild_model(cfg, state), rank, world)
    comm = next(m.comm for m in sharded.modules() if isinstance(m, RowParallelLinear))  # the layers' one
    events: list[Event] = []
    step = [-1]  # -1: the prefill, whose collectives are left out
    comm.all_reduce = _timed(comm.all_reduce, "all_reduce", rank, events, step)
    comm.all_gather_last = _timed(comm.all_gather_last, "all_gather", rank, events, step)
    cache = KVCache(shard_config(cfg, world), max_len=len(prompt) + steps)
    tokens = [int(sharded(torch.tensor([prompt]), cache)[0, -1].argmax())]
    events.clear()
    dist.barrier()  # every rank starts step 0 together
    for s in range(steps):
        step[0] = s
        t0 = time.monotonic_ns()
        x = torch.tensor([[tokens[-1]]])
        t1 = time.monotonic_ns()
        logits = sharded(x, cache)[0, -1]
        t2 = time.monotonic_ns()
        tokens.append(int(logits.argmax()))
        t3 = time.monotonic_ns()
        events += [Event(rank, s, "input", t0, t1), Event(rank, s, "forward", t1, t2), Event(rank, s, "sample", t2, t3)]
    return {"tokens": tokens, "events": events}


@dataclass(frozen=True)
class StepTimeline:
    """Every rank's Events over `steps` decode steps with TP = `tp_degree` (step_timeline), read per part
    (PARTS): parts() in seconds per rank and step, table() their medians, explain() where the step goes,
    timeline(step) one step collective by collective. `alpha` (seconds, e.g. DecodeReport.link.alpha) is the
    link model's price of one collective, to set against `in collective`; `tokens` the greedy ones generated
    (the prefill's first, then one per step)."""
    tp_degree: int
    n_layers: int
    events: tuple[Event, ...]
    alpha: float | None = None
    tokens: tuple[int, ...] = ()

    @property
    def steps(self) -> int:
        return 1 + max(e.step for e in self.events)

    def of(self, rank: int, step: int) -> list[Event]:
        """Rank `rank`'s events of `step`, in the order they started."""
        return sorted((e for e in self.events if e.rank == rank and e.step == step), key=lambda e: e.start_ns)

    def collectives(self, step: int) -> list[list[Event]]:
        """The collectives of `step` in order, each as [rank 0's event, rank 1's, ...]."""
        per_rank = [[e for e in self.of(r, step) if e.kind in COLLECTIVES] for r in range(self.tp_degree)]
        if len({len(c) for c in per_rank}) != 1:
            fail("events", [len(c) for c in per_rank], f"the same number of collectives on every rank in step "
                 f"{step} (got the count per rank)")
        return [list(c) for c in zip(*per_rank)]

    def step_seconds(self) -> list[float]:
        """Seconds of each step, from the first rank's start to the last rank's end."""
        out = []
        for s in range(self.steps):
            spans = [e for e in self.events if e.step == s]
            out.append((max(e.end_ns for e in spans) - min(e.start_ns for e in spans)) / 1e9)
        return out

    def parts(self, rank: int, step: int) -> dict[str, float]:
        """Seconds of each part (PARTS) of rank `rank`'s step; they add up to its span (first start to last
        end) exactly, `other` being the rest."""
        mine = self.of(rank, step)
        span = max(e.end_ns for e in mine) - mine[0].start_ns
        ns = dict.fromkeys(PARTS, 0)
        for e in mine:
            if e.kind in ("input", "sample"):
                ns[e.kind] += e.end_ns - e.start_ns
            elif e.kind == "forward":
                ns["compute"] += e.end_ns - e.start_ns
        for group in self.collectives(step):
            own = group[rank]
            last_in, first_out = max(e.start_ns for e in group), min(e.end_ns for e in group)
            ns["wait for peer"] += last_in - own.start_ns
            ns["in collective"] += first_out - last_in
            ns["late exit"] += own.end_ns - first_out
            ns["compute"] -= own.end_ns - own.start_ns
        ns["other"] = span - sum(ns.values())
        return {k: v / 1e9 for k, v in ns.items()}

    def medians(self) -> list[dict[str, float]]:
        """Per rank, the median seconds of each part over the steps."""
        return [{k: statistics.median(self.parts(r, s)[k] for s in range(self.steps)) for k in PARTS}
                for r in range(self.tp_degree)]

    def table(self) -> str:
        """The parts of a step in ms, one row each, one column per rank (medians over the steps)."""
        med = self.medians()
        head = f"{'part of a step (ms, median)':<30}" + "".join(f"{f'rank {r}':>9}" for r in range(self.tp_degree))
        rows = [f"{k:<30}" + "".join(f"{m[k] * 1e3:>9.3f}" for m in med) for k in PARTS]
        total = f"{'sum':<30}" + "".join(f"{sum(m.values()) * 1e3:>9.3f}" for m in med)
        return "\n".join([head, *rows, total])

    def per_collective(self) -> dict[str, float]:
        """Seconds per collective (median over steps, the mean over ranks within a step): the three parts
        of a collective and its whole duration."""
        out = {}
        for part in ("wait for peer", "in collective", "late exit"):
            out[part] = statistics.median(
                statistics.fmean(self.parts(r, s)[part] for r in range(self.tp_degree)) / len(self.collectives(s))
                for s in range(self.steps))
        out["whole"] = sum(out.values())
        return out

    def tail(self) -> str:
        """The spread of `in collective` over every collective of every step: median against mean (a step
        pays the sum of its collectives, so the mean; alpha is fitted on medians) and the slowest tenth."""
        ns = sorted(min(e.end_ns for e in g) - max(e.start_ns for e in g)
                    for s in range(self.steps) for g in self.collectives(s))
        slow = ns[len(ns) - max(1, len(ns) // 10):]
        return (f"from the last entry to the first exit, over {len(ns)} collectives: median "
                f"{statistics.median(ns) / 1e3:.0f} us, mean {statistics.fmean(ns) / 1e3:.0f} us; the slowest tenth "
                f"(from {slow[0] / 1e3:.0f} us) holds {sum(slow) / sum(ns):.0%} of the time")

    def explain(self) -> str:
        """Where the median step goes, in shares of the step, and the collective against the link model."""
        step = statistics.median(self.step_seconds())
        med = self.medians()
        mean = {k: statistics.fmean(m[k] for m in med) for k in PARTS}
        n = len(self.collectives(0))
        shares = ", ".join(f"{k} {mean[k] / step:.0%}" for k in sorted(PARTS, key=lambda k: -mean[k]) if mean[k] > 0)
        one = self.per_collective()
        line = (f"median step {step * 1e3:.2f} ms, {n} collectives; the average rank spends: {shares}\n"
                f"one collective takes {one['whole'] * 1e6:.0f} us: {one['wait for peer'] * 1e6:.0f} waiting for "
                f"the peer, {one['in collective'] * 1e6:.0f} from the last entry to the first exit, "
                f"{one['late exit'] * 1e6:.0f} exiting late")
        if self.alpha is not None:
            line += f" (the link model prices {self.alpha * 1e6:.0f} us)"
        return line

    def timeline(self, step: int) -> str:
        """Step `step` collective by collective: each rank's entry and exit in us from the step's start."""
        check_int("step", step, 0, self.steps - 1)
        t0 = min(e.start_ns for e in self.events if e.step == step)
        us = lambda ns: f"{(ns - t0) / 1e3:7.0f}"  # noqa: E731
        lines = [f"{'#':>2} {'kind':<10}" + "".join(f"   rank {r} in/out (us)" for r in range(self.tp_degree))]
        for i, group in enumerate(self.collectives(step)):
            lines.append((f"{i:>2} {group[0].kind:<10}" + "".join(f"   {us(e.start_ns)} {us(e.end_ns)}      "
                                                                 for e in group)).rstrip())
        return "\n".join(lines)


def step_timeline(model: TinyLM, prompt: list[int], pool: Pool, steps: int = 24,
                  alpha: float | None = None) -> StepTimeline:
    """Greedy decode of `steps` tokens after `prompt` with TP = pool.world, every rank timestamping its step
    (timeline_worker); the StepTimeline of it. `alpha`: seconds per collective the link model prices."""
    check_type("pool", pool, Pool)
    cfg, state = tp_inputs(model, pool.world, pool)
    check_positive_int("steps", steps)
    if alpha is not None:
        check_positive("alpha", alpha, unit="seconds")
    prompt = [check_int("each prompt token", t, 0, cfg.vocab_size - 1) for t in prompt]
    if not prompt or len(prompt) + steps > cfg.max_seq_len:
        fail("steps", steps, f"<= {cfg.max_seq_len - len(prompt)} with a prompt of {len(prompt)}")
    runs = pool.run(timeline_worker, cfg, state, prompt, steps)
    if any(r["tokens"] != runs[0]["tokens"] for r in runs):
        raise RuntimeError("ranks disagree on the generated tokens")
    return StepTimeline(pool.world, cfg.n_layers, tuple(e for r in runs for e in r["events"]), alpha,
                        tuple(runs[0]["tokens"]))
