"""INT4 weight-only matmul speed (issue 4), measured in one run on the same inputs.

    python benchmarks/int4_matmul.py

Goals: QuantLinear INT4 batch-1 forward on a 4096x4096 layer at least 2x faster than
torch.nn.functional.linear in FP32; quantizing a 4096x4096 matrix at group size 32 in at most 0.5 s.
Also prints BF16 F.linear, the reference (tiled dequantize-multiply-accumulate) path, and the effective
weight bandwidth of each (weight bytes read per call / time) next to this machine's measured memory
bandwidth (labkit.hardware.measure_bandwidth). Several distinct matrices are cycled so that the weights
come from main memory, not from the last-level cache. Copy the output into benchmarks/RESULTS.md.
"""

import statistics
import time

import torch
import torch.nn.functional as F

from labkit.hardware import measure_bandwidth
from labkit.quant import QuantLinear, quantize

N = K = 4096
LAYERS = 8  # 8 x 64 MiB of FP32 weights: far beyond any L3 cache


def per_call(fn, layers, x, repeats=30) -> float:
    """Median seconds per call, cycling through the layers."""
    for w in layers:
        fn(x, w)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for w in layers:
            fn(x, w)
        times.append((time.perf_counter() - t0) / len(layers))
    return statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    weights = [torch.randn(N, K) * 0.02 for _ in range(LAYERS)]
    t_quant = []
    for w in weights[:3]:
        t0 = time.perf_counter()
        quantize(w, 4, "asym", 32)
        t_quant.append(time.perf_counter() - t0)
    layers = []
    for w in weights:
        lin = torch.nn.Linear(K, N, bias=False)
        lin.weight.data = w
        layers.append(QuantLinear.from_linear(lin, 4, 32, "asym"))
    x = torch.randn(1, K)
    assert layers[0].path(x) == "int4pack", "the INT4 kernel is not available in this torch build"
    bf16 = [w.bfloat16() for w in weights]
    t_fp32 = per_call(lambda x, w: F.linear(x, w), weights, x)
    t_bf16 = per_call(lambda x, w: F.linear(x, w), bf16, x.bfloat16())
    t_int4 = per_call(lambda x, m: m(x), layers, x)
    t_ref = per_call(lambda x, m: m.forward_reference(x), layers[:2], x, repeats=3)
    int4_bytes = layers[0].int4pack.numel() + layers[0].scales_and_zeros.numel() * 2  # codes + bf16 scales/zeros
    bw = measure_bandwidth(progress=False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {LAYERS} distinct {N}x{K} layers, batch 1")
    print(f"quantize {N}x{K} asym g32:       {min(t_quant):.3f} s (best of 3)")
    rows = [("F.linear FP32", t_fp32, 4 * N * K), ("F.linear BF16", t_bf16, 2 * N * K),
            ("QuantLinear INT4 (int4pack)", t_int4, int4_bytes), ("QuantLinear INT4 (reference)", t_ref, None)]
    for name, t, nbytes in rows:
        eff = f"{nbytes / t / 1e9:6.1f} GB/s effective weight bandwidth" if nbytes else "(tiled dequantize, FP32)"
        print(f"{name:<30} {t * 1e3:8.2f} ms  {2 * N * K / t / 1e9:6.1f} GFLOP/s  {eff}")
    print(f"INT4 speed-up over FP32: {t_fp32 / t_int4:.2f}x;  over BF16: {t_bf16 / t_int4:.2f}x")
    print(f"measured memory bandwidth (numpy, 1 core): read {bw['read'] / 1e9:.1f} GB/s, copy {bw['copy'] / 1e9:.1f} GB/s")
    print(f"INT4 weight bytes per call: {int4_bytes / 2**20:.2f} MiB "
          f"({8 * int4_bytes / (N * K):.2f} bits/weight incl. BF16 scales and zeros)")


if __name__ == "__main__":
    main()
