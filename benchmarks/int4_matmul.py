"""INT4 weight-only matmul speed (issue 4), measured in one run on the same inputs.

    python benchmarks/int4_matmul.py

Goals: QuantLinear INT4 batch-1 forward on a 4096x4096 layer at least 2x faster than
torch.nn.functional.linear in FP32; quantizing a 4096x4096 matrix at group size 32 in at most 0.5 s.
Also prints BF16 F.linear, the reference (tiled dequantize-multiply-accumulate) path, and the effective
weight bandwidth of each (weight bytes read per call / time) next to this machine's measured memory
bandwidth (labkit.memory_wall.hardware.measure_bandwidth: the higher of its 1-core read and all-thread read), and each
case's share of that roof. Eight distinct matrices are cycled so that the weights come from main memory,
not from the last-level cache. Copy the output into benchmarks/RESULTS.md.
"""

import torch
import torch.nn.functional as F

from labkit.course.timing import interleave, measure
from labkit.memory_wall.hardware import measure_bandwidth
from labkit.quant import QuantLinear, quantize

N = K = 4096
LAYERS = 8  # 8 x 64 MiB of FP32 weights: far beyond any L3 cache


def per_call(cases: dict, repeats: int = 30) -> dict:
    """Median seconds per call for each case (fn, layers, x), cycling through its layers; the cases take
    turns (labkit.course.timing.interleave), so a change in the machine's load hits all of them alike."""
    fns = {name: (lambda fn=fn, layers=layers, x=x: [fn(x, w) for w in layers])
           for name, (fn, layers, x) in cases.items()}
    return {name: t.median / len(cases[name][1]) for name, t in interleave(fns, repeats=repeats).items()}


def main() -> None:
    torch.manual_seed(0)
    weights = [torch.randn(N, K) * 0.02 for _ in range(LAYERS)]
    t_quant = measure(lambda: quantize(weights[0], 4, "asym", 32), repeats=3, warmup=0)
    layers = []
    for w in weights:
        lin = torch.nn.Linear(K, N, bias=False)
        lin.weight.data = w
        layers.append(QuantLinear.from_linear(lin, 4, 32, "asym"))
    x = torch.randn(1, K)
    assert layers[0].path(x) == "int4pack", "the INT4 kernel is not available in this torch build"
    bf16 = [w.bfloat16() for w in weights]
    cases = {"fp32": (lambda x, w: F.linear(x, w), weights, x), "bf16": (lambda x, w: F.linear(x, w), bf16, x.bfloat16()),
             "int4": (lambda x, m: m(x), layers, x)}
    threads = torch.get_num_threads()
    t = per_call(cases)
    t_fp32, t_bf16, t_int4 = t["fp32"], t["bf16"], t["int4"]
    torch.set_num_threads(1)
    one = per_call(cases, repeats=10)
    torch.set_num_threads(threads)
    t_ref = per_call({"ref": (lambda x, m: m.forward_reference(x), layers[:2], x)}, repeats=3)["ref"]
    int4_bytes = layers[0].int4pack.numel() + layers[0].scales_and_zeros.numel() * 2  # codes + bf16 scales/zeros
    bw = measure_bandwidth(progress=False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {LAYERS} distinct {N}x{K} layers, batch 1")
    print(f"quantize {N}x{K} asym g32:       {t_quant.best:.3f} s (best of 3)")
    rows = [("F.linear FP32", t_fp32, 4 * N * K), ("F.linear BF16", t_bf16, 2 * N * K),
            ("QuantLinear INT4 (int4pack)", t_int4, int4_bytes), ("QuantLinear INT4 (reference)", t_ref, None)]
    for name, t, nbytes in rows:
        eff = f"{nbytes / t / 1e9:6.1f} GB/s effective weight bandwidth" if nbytes else "(tiled dequantize, FP32)"
        print(f"{name:<30} {t * 1e3:8.2f} ms  {2 * N * K / t / 1e9:6.1f} GFLOP/s  {eff}")
    print(f"INT4 speed-up over FP32: {t_fp32 / t_int4:.2f}x;  over BF16: {t_bf16 / t_int4:.2f}x")
    print(f"with 1 thread: FP32 {one['fp32'] * 1e3:.2f} ms, BF16 {one['bf16'] * 1e3:.2f} ms, INT4 {one['int4'] * 1e3:.2f} ms;"
          f" INT4 speed-up over FP32 {one['fp32'] / one['int4']:.2f}x")
    roof = max(bw["read"], bw["read_threads"])
    print(f"measured memory bandwidth: numpy 1 core read {bw['read'] / 1e9:.1f} GB/s, copy {bw['copy'] / 1e9:.1f} GB/s; "
          f"torch {bw['threads']} threads read {bw['read_threads'] / 1e9:.1f} GB/s -> roof {roof / 1e9:.1f} GB/s")
    for name, t, nbytes in rows[:3]:
        print(f"  {name:<30} streams its weight bytes at {nbytes / t / roof:4.0%} of the roof")
    print(f"INT4 weight bytes per call: {int4_bytes / 2**20:.2f} MiB "
          f"({8 * int4_bytes / (N * K):.2f} bits/weight incl. BF16 scales and zeros)")


if __name__ == "__main__":
    main()
