"""Lab 08, part 1 on the pretrained TinyLM: torch.compile (inductor) against eager on the course decode loop,
the kernels inductor launches against the fusion groups labkit finds, and the activation-buffer plan of one
decode step, planned and measured, in one run.

    python benchmarks/cluster_compile.py

Prints compile seconds, eager and compiled tokens/s and their ratio (medians of interleaved repeats, same
run), the verdict, kernels (inductor's generated_kernel_count and the launches of one captured step against
labkit.cluster.graph.fused_kernels), and the buffer plan: peak activation bytes with reuse and without,
planned and measured by torch's profiler. Records nothing by itself: copy the output into
benchmarks/RESULTS.md. Needs a C++ compiler for the compiled half (it says so and prints the rest without).
"""

import torch

from labkit.cluster.buffers import liveness, measured_peak, plan_buffers
from labkit.cluster.compiled import compare_compile, compiler_available, inductor_kernels
from labkit.cluster.graph import capture_decode, fused_kernels, fusion_groups
from labkit.tinylm import load_pretrained


def main() -> None:
    model, _ = load_pretrained()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    ok, reason = compiler_available()
    print(f"C++ compiler: {reason}")
    r = compare_compile(model, prompt_tokens=16, new_tokens=48, repeats=7)
    print(f"decode loop: prompt {r.prompt_tokens} + {r.new_tokens} new tokens, {r.repeats} interleaved repeats")
    print(f"eager:    {r.eager_tokens_per_s:7.0f} tokens/s  ({r.eager_s * 1e3:.1f} ms/loop, spread "
          f"{r.eager_spread:.0%})")
    if r.compiled_s is not None:
        print(f"compiled: {r.compiled_tokens_per_s:7.0f} tokens/s  ({r.compiled_s * 1e3:.1f} ms/loop, spread "
              f"{r.compiled_spread:.0%})")
        print(f"compile time {r.compile_s:.1f} s; compiled / eager tokens/s: {r.speedup:.2f}x")
        print(f"graphs {r.graphs}, graph breaks {r.graph_breaks} (one decode step); generated_kernel_count "
              f"{r.kernels}; max |logit difference| {r.max_abs_diff:.1e}")
    else:
        print(f"compiled: not run ({r.reason})")
    print(f"verdict: {r.verdict}")

    decode = capture_decode(model, cached=16)
    predicted = fused_kernels(fusion_groups(decode.graph_module))
    try:
        launched = inductor_kernels(decode.graph_module, decode.inputs) if ok else None
    except RuntimeError as e:  # the compiler passed the probe, yet inductor failed
        print(f"one decode step at 16 cached: {e}")
    else:
        found = "not run (no compiler)" if launched is None else f"inductor launches {len(launched)} C++ kernels"
        print(f"one decode step at 16 cached: {found}, fused_kernels predicts {len(predicted)}")
    for cached in (16, 240):
        decode = capture_decode(model, cached=cached)
        buffers = liveness(decode.graph_module, decode.inputs)
        plan = plan_buffers(buffers, alignment=1)
        aligned = plan_buffers(buffers, alignment=64)
        reused = measured_peak(decode.graph_module, decode.inputs, reuse=True)
        kept = measured_peak(decode.graph_module, decode.inputs, reuse=False)
        print(f"buffers at {cached} cached: {len(buffers)} activations; peak live {plan.peak_live_bytes:,} B "
              f"(measured {reused:,}), no reuse {plan.no_reuse_bytes:,} B (measured {kept:,}); at 64-byte "
              f"alignment the arena is {aligned.arena_bytes:,} B, {aligned.no_reuse_bytes / aligned.arena_bytes:.1f}x "
              f"less than the {aligned.no_reuse_bytes:,} B without reuse")


if __name__ == "__main__":
    main()
