"""Continuous batching against static batching (and chunked prefill) on the same trace, measured in one run
(goal: continuous at least 2x the output tokens/s of static at a request rate where static queues).

    python benchmarks/serving_batching.py [--n 600] [--repeats 6] [--max-num-seqs 32] [--fractions 0.5,1,2,inf]

The trace is labkit.serving.workload.make_trace (the course's task prompts, 20% long-tailed outputs, Poisson
arrivals). Each policy replays it on a fresh Engine with the "measured" clock: time advances by the measured wall
time of every step (scheduling, the batched forward, sampling) and idle gaps between arrivals are skipped, so the
figures are real compute times on this machine without sleeping. In each repeat the policies' replays run in
lockstep (Engine.replay, one step per next()), the next step always going to the replay furthest behind in its share
of the trace's output tokens: they finish together, and a busy second of the machine slows the same share of every
policy's work (run back to back, 10 s each, per-repeat ratios spread 1.6-2.9x on a noisy machine). The steps run on
one thread and never overlap, so each step's measured time is its own (a thread per replay would give each thread
its own OpenMP team, whose spinning while idle slows the other's steps). The tables show medians
over `repeats`, the ratio is the median of the per-repeat ratios; the goal is met when enough repeats' ratios reach
it (labkit.course.evidence.against_goal, the sign test: all 6 of 6, 12 of 15). Output tokens/s = output tokens /
(last token - first arrival).

First the offered load is calibrated: continuous batching's capacity at rate inf (everything at once), in
requests/s; the rates then tried are 0.5, 1 and 2 times it, and everything at once (--fractions 2,inf: only the
two rates of the goal, e.g. to afford more repeats on a noisy machine). "Static queues" is read from its own
numbers: its mean time to first token exceeds twice its mean time per request in service.
"""

import argparse
import statistics

import torch

from labkit.course import evidence
from labkit.serving import Engine
from labkit.serving.metrics import summarize
from labkit.serving.workload import make_trace
from labkit.tinylm import load_pretrained

POLICIES = ("static", "continuous", "chunked")
GOAL = 2.0


def replay(model, trace, policy: str, max_num_seqs: int) -> dict:
    return lockstep(model, trace, [policy], max_num_seqs)[policy]


def lockstep(model, trace, policies, max_num_seqs: int) -> dict[str, dict]:
    """Replay `trace` under every policy at once, one engine step at a time (see the module docstring), on this
    thread: the next step always goes to the unfinished replay (Engine.replay) with the smallest share of the
    trace's output tokens produced. {policy: figures}."""
    total = sum(r.max_tokens for r in trace)
    engines = {p: Engine(model, policy=p, max_num_seqs=max_num_seqs, clock="measured") for p in policies}
    steps = {p: engines[p].replay(trace) for p in policies}
    while steps:
        behind = min(steps, key=lambda p: engines[p].generated_tokens / total)
        if next(steps[behind], None) is None:
            del steps[behind]
    out = {}
    for p, engine in engines.items():
        s = summarize([engine.requests[r.request_id] for r in trace])
        out[p] = {"tok_s": s.output_throughput, "ttft": s.stats["ttft"].mean, "e2el": s.stats["e2el"].mean,
                  "steps": engine.steps}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=evidence.MIN_GOAL_REPEATS)
    parser.add_argument("--max-num-seqs", type=int, default=32, help="the batch limit of every policy")
    parser.add_argument("--fractions", default="0.5,1,2,inf", help="the rates tried, as fractions of the capacity")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, _ = load_pretrained()
    replay(model, make_trace(16, float("inf"), seed=1), "continuous", args.max_num_seqs)  # warm-up
    capacity = summarize(Engine(model, max_num_seqs=args.max_num_seqs, clock="measured").run(
        make_trace(args.n, float("inf")))).request_throughput
    print(f"torch threads {torch.get_num_threads()}, max_num_seqs {args.max_num_seqs}; continuous batching's "
          f"capacity: {capacity:.1f} requests/s ({args.n} requests at once)")
    for fraction in (float(f) for f in args.fractions.split(",")):
        rate = fraction * capacity
        trace = make_trace(args.n, rate)
        runs = {p: [] for p in POLICIES}
        for _ in range(args.repeats):
            figures = lockstep(model, trace, POLICIES, args.max_num_seqs)
            for p in POLICIES:
                runs[p].append(figures[p])
        med = {p: {k: statistics.median(r[k] for r in runs[p]) for k in runs[p][0]} for p in POLICIES}
        ratios = [c["tok_s"] / s["tok_s"] for c, s in zip(runs["continuous"], runs["static"])]
        ratio = statistics.median(ratios)  # paired: each repeat's policies ran in lockstep
        queues = med["static"]["ttft"] > 2 * (med["static"]["e2el"] - med["static"]["ttft"])
        print(f"\nrate {rate:.1f} req/s ({fraction:.0%} of continuous batching's capacity):")
        for p in POLICIES:
            m = med[p]
            print(f"  {p:<11} {m['tok_s']:8,.0f} output tokens/s   mean TTFT {m['ttft']:8.1f} ms   "
                  f"mean E2E {m['e2el']:8.1f} ms   {m['steps']:.0f} steps")
        verdict = evidence.against_goal("continuous / static", ratios, GOAL).verdict()
        print(f"  continuous / static = {ratio:.2f}x (per repeat {', '.join(f'{r:.2f}' for r in ratios)}); "
              f"static queues: {'yes' if queues else 'no'}; {verdict}")


if __name__ == "__main__":
    main()
