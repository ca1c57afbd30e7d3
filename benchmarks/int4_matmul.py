"""INT4 weight-only matmul speed, measured by notebook 03's own method in one run.

    python benchmarks/int4_matmul.py [repeats]

Goals: QuantLinear INT4 batch-1 forward on a 4096x4096 layer at least 2x faster than torch.nn.functional.linear
in FP32, judged on notebook 03's headline figure, the 1-thread ratio (a 1-thread kernel runs on whichever
core is free, while a 2-thread one waits for its slower thread whenever another program holds a core; the
2-thread ratio is printed too); quantizing a 4096x4096 matrix at group size 32 in at most 0.5 s.

The measurement is labkit.quant.speed.measure_matmuls: 8 distinct 4096x4096 matrices cycled (beyond any
last-level cache), FP32 and BF16 F.linear and INT4 QuantLinear on all threads, FP32 and INT4 on one thread,
and the memory roofs (torch's sum over 256 MiB on all threads and on one), all timed in turns, medians of
`repeats` rounds with their spreads. labkit.quant.verdicts draws the conclusions, or says "unreliable on this
run" when the machine is too busy. Also times the reference path (tiled dequantize-multiply-accumulate).

The kernel ladder (labkit.quant.kernels, timed by labkit.quant.kernels_speed.measure_ladder in the
same run): rungs 1-7 (rungs 6-7: C built here by the machine's compiler, where there is one) and torch's INT4
kernel, batch 1, on 4096x4096 (8 matrices) and 4096x14336 (N = 4096 outputs, K = 14336 inputs, as ggml's
MUL_MAT perf case; 3 matrices), every product on the matrix after the one the product before it read, on 1
and 2 threads, each beside the roof of its thread count.
Goals: the best rung at least as fast as torch's INT4 kernel and at least 70% of the measured roof (per
round, under the course's rule for a goal: labkit.course.evidence.against_goal); its GFLOP/s beside
llama.cpp's Q4_0 / Q4_K on 4096x14336, as ggml's `test-backend-ops perf -o MUL_MAT` measured them (LLAMA_CPP;
that tool times one matrix again and again, on half the hardware threads unless told otherwise: 1 thread on these
2-core machines). benchmarks/peers.py times llama.cpp in turns with the ladder's top rung.

The builds of rung 7 in turns (builds_in_turns): the same weights laid out once per build this CPU runs (this
CPU's own, with VNNI's vpdpbusd where it has it; its AVX2 byte products, VNNI switched off; plain C), each build's
products timed in the same rounds, with the roof, on 4096x4096 at 1 and 2 threads: what VNNI buys on this CPU.

Copy the output into benchmarks/RESULTS.md.
"""

import os
import sys

import torch

from labkit.course import evidence, interleave
from labkit.course.timing import measure
from labkit.quant import QuantLinear, kernels, kernels_c, kernels_speed, quantize, speed, verdicts

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
    """The ladder's table and goals on each shape."""
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


# rung 7's builds compared in turns: $LABKIT_CFLAGS of each ("" = this CPU's own choice)
BUILDS = {"this CPU's own": "",
          "AVX2 byte products (no VNNI)": "-O3 -march=native -mno-avx512vnni -mno-avxvnni -fopenmp",
          "plain C": "-O3 -fopenmp -mno-avx2"}


def builds_in_turns(repeats: int = 15, matrices: int = 8) -> None:
    """Rung 7 under each build this CPU runs, the same weights, in the same rounds as the roof."""
    gen = torch.Generator().manual_seed(1)
    qs = [quantize(torch.randn(N, K, generator=gen) * 0.02, 4, "asym", 32) for _ in range(matrices)]
    x = torch.randn(1, K, generator=gen)
    laid_out, paths, saved = {}, set(), os.environ.get("LABKIT_CFLAGS")
    for name, flags in BUILDS.items():
        os.environ["LABKIT_CFLAGS"] = flags
        ok, how = kernels_c.available()
        here = kernels_c.build()
        path = (here.lanes, here.int8_path) if here else None  # a build that repeats another's is left out
        print(f"{name}: {how}" + ("" if not ok or path not in paths else " (the same path as above: left out)"))
        if ok and path not in paths:
            paths.add(path)
            laid_out[name] = [kernels.pack_weight(q) for q in qs]  # each weight keeps the build it was laid out for
    if saved is None:
        os.environ.pop("LABKIT_CFLAGS")
    else:
        os.environ["LABKIT_CFLAGS"] = saved
    if not laid_out:
        print("no build of rung 7 runs here")
        return
    roof = torch.ones(speed.ROOF_BYTES // 4)

    def on(threads, fn):
        def run():
            with kernels.threads(threads):
                fn()
        return run

    cases = {}
    for t in (2, 1):
        for name, ws in laid_out.items():
            cases[f"rung 7, {name}, {t} thread(s)"] = on(t, lambda ws=ws: [kernels.compiled_c_int8(x, w) for w in ws])
        cases[f"roof, {t} thread(s)"] = on(t, roof.sum)
    timings = interleave(cases, repeats=repeats, warmup=1)
    weight_bytes = sum(w.nbytes for w in next(iter(laid_out.values())))
    print(f"\nrung 7's builds in turns, {matrices} x [{N}, {K}], batch 1, {repeats} rounds (medians)")
    for t in (2, 1):
        roof_rate = roof.numel() * 4 / timings[f"roof, {t} thread(s)"].median
        for name in laid_out:
            timing = timings[f"rung 7, {name}, {t} thread(s)"]
            rate = weight_bytes / timing.median
            print(f"  @{t} {name:<30} {timing.median * 1e3 / matrices:6.3f} ms per matrix, {rate / 1e9:5.1f} GB/s = "
                  f"{rate / roof_rate:4.0%} of the roof (spread {timing.spread:.0%})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
    ladder()
    builds_in_turns()
