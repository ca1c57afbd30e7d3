"""INT4 weight-only matmul speed (issues 4 and 10), measured by notebook 03's own method in one run.

    python benchmarks/int4_matmul.py [repeats]

Goals: QuantLinear INT4 batch-1 forward on a 4096x4096 layer at least 2x faster than torch.nn.functional.linear
in FP32, judged on notebook 03's headline figure, the 1-thread ratio (a 1-thread kernel runs on whichever
core is free, while a 2-thread one waits for its slower thread whenever another program holds a core; the
2-thread ratio is printed too); quantizing a 4096x4096 matrix at group size 32 in at most 0.5 s.

The measurement is labkit.quant.speed.measure_matmuls: 8 distinct 4096x4096 matrices cycled (beyond any
last-level cache), FP32 and BF16 F.linear and INT4 QuantLinear on all threads, FP32 and INT4 on one thread,
and the memory roofs (torch's sum over 256 MiB on all threads and on one), all timed in turns, medians of
`repeats` rounds with their spreads. labkit.quant.verdicts draws the conclusions, or says "unreliable on this
run" when the machine was too busy. Also times the reference path (tiled dequantize-multiply-accumulate).

Issue 30, the kernel ladder (labkit.quant.kernels, timed by labkit.quant.kernels_speed.measure_ladder in the
same run): rungs 1-7 (rungs 6-7: C built here by the machine's compiler, where there is one) and torch's INT4
kernel, batch 1, on 4096x4096 (8 matrices) and 4096x14336 (N = 4096 outputs, K = 14336 inputs, as ggml's
MUL_MAT perf case; 3 matrices), every product on the matrix after the one the product before it read, on 1
and 2 threads, each beside the roof of its thread count.
Goals: the best rung at least as fast as torch's INT4 kernel and at least 70% of the measured roof (per
round, under the course's rule for a goal: labkit.course.evidence.against_goal); its GFLOP/s beside
llama.cpp's Q4_0 / Q4_K on 4096x14336, as ggml's `test-backend-ops perf -o MUL_MAT` measured them (LLAMA_CPP;
that tool times one matrix again and again, on half the hardware threads unless told otherwise: 1 thread on these
2-core machines). benchmarks/peers.py times llama.cpp in turns with the ladder's top rung.

Copy the output into benchmarks/RESULTS.md.
"""

import sys

import torch

from labkit.course import evidence
from labkit.course.timing import measure
from labkit.quant import QuantLinear, kernels, kernels_speed, quantize, speed, verdicts

N = K = 4096
LADDER_SHAPES = ((4096, 4096, 8), (4096, 14336, 3))  # (N, K, matrices cycled)
# ggml's MUL_MAT 4096x14336 batch 1, GFLOP/s by thread count: {threads: [(CPU, {type: GFLOP/s})]}. The Xeon's
# (shared/FACTS.md, 2026-12-01) ran on test-backend-ops' default thread count, half of 2 cores; the EPYC's are
# the best of 3 runs, each thread count set by a one-line patch (benchmarks/RESULTS.md, 2026-12-04).
LLAMA_CPP = {1: [("AVX-512 Xeon", {"q4_0": 58.7e9, "q4_K": 93.6e9}), ("AVX2 EPYC", {"q4_0": 29.2e9, "q4_K": 32.3e9})],
             2: [("AVX2 EPYC", {"q4_0": 57.8e9, "q4_K": 73.4e9})]}
ROOF_GOAL = 0.7


def main(repeats: int = 30) -> None:
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(0)) * 0.02
    t_quant = measure(lambda: quantize(w, 4, "asym", 32), repeats=3, warmup=0)
    reference = QuantLinear(quantize(w, 4, "asym", 32), backend="reference")
    x = torch.randn(1, K)
    t_ref = measure(lambda: reference(x), repeats=3)
    run = speed.measure_matmuls(N, K, repeats=repeats)
    assert run.path == "int4pack", "the INT4 kernel is not available in this torch build"
    v = verdicts.speed_verdicts(run)
    print(f"torch {torch.__version__}, {run.threads} threads, {run.matrices} distinct {N}x{K} layers, batch 1, "
          f"{repeats} rounds in turns (medians)")
    print(f"quantize {N}x{K} asym g32: {t_quant.best:.3f} s (best of 3)")
    print("\n".join(run.lines()))
    print(f"QuantLinear INT4 (reference path, tiled dequantize, FP32): {t_ref.median * 1e3:.2f} ms (median of 3)")
    print("\n".join(verdicts.lines(run)))
    goal = "met" if v["headline"].reliable and v["headline"].ratio >= 2 else \
        "not met" if v["headline"].reliable else "not decided on this run"
    print(f"goal INT4 >= 2x FP32 (1 thread): {goal}; quantize <= 0.5 s: {'met' if t_quant.best <= 0.5 else 'not met'}")
    print(f"INT4 weight bytes per layer: {run.weight_bytes[speed.INT4] / 2**20:.2f} MiB "
          f"({8 * run.weight_bytes[speed.INT4] / (N * K):.2f} bits/weight incl. BF16 scales and zeros)")


def ladder(repeats: int = 15) -> None:
    """Issue 30: the ladder's table and goals on each shape."""
    print(f"\nrungs 6-7 (C): {kernels.available(kernels.C_RUNGS[0])[1]}")
    for n, k, matrices in LADDER_SHAPES:
        run = kernels_speed.measure_ladder(n, k, matrices=matrices, repeats=repeats, slow_repeats=3)
        print(f"\nINT4 GEMV ladder, {n}x{k} (N x K), batch 1, {matrices} matrices cycled, asym g32, "
              f"{repeats} rounds in turns (rungs 1-2: 3 rounds)")
        print("\n".join(run.lines()))
        for t in run.threads:
            v = run.verdicts(t)
            best = run.best(t)
            peers = "; ".join(f"{cpu} " + ", ".join(f"{f} {g / 1e9:.1f}" for f, g in figures.items())
                              for cpu, figures in LLAMA_CPP.get(t, []))
            print(f"@{t}: best rung {best!r}: {run.flops_per_s(best, t) / 1e9:.1f} GFLOP/s"
                  + (f" (llama.cpp on {t} thread{'s' if t > 1 else ''}, 4096x14336, one matrix again and again: "
                     f"{peers} GFLOP/s)" if peers and (n, k) == (4096, 14336) else ""))
            print(f"@{t}: vs torch: {v['vs torch']}")
            print(f"@{t}: roof: {v['roof']}")
            fast = "met" if v["vs torch"].reliable and v["vs torch"].ratio >= 1 else \
                "not met" if v["vs torch"].reliable else "not decided on this run"
            shares = run.roof_shares(best, t)
            roof = evidence.against_goal(f"{best} @{t}, share of the roof", shares, ROOF_GOAL)
            print(f"@{t}: goal best rung >= torch's kernel: {fast}; goal >= {ROOF_GOAL:.0%} of the roof: "
                  f"{roof.verdict()} (median {roof.median:.0%}, per round {min(shares):.0%}-{max(shares):.0%})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
    ladder()
