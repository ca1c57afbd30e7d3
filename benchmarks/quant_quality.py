"""TinyLM quality after quantization on a larger evaluation than notebook 03 can afford (issue 4).

    python benchmarks/quant_quality.py

Perplexity on 64 KiB of the test split and exact-match accuracy on 200 test tasks per kind, for the
notebook's precision settings, the one-type-at-a-time INT4 sensitivity, and GPTQ vs round-to-nearest.
Deterministic (no timings); takes a few minutes on 2 cores. Copy the output into benchmarks/RESULTS.md.
"""

import math

import torch

from labkit.quant import gptq as calibrate
from labkit.tinylm import corpus as data
from labkit.tinylm import perplexity, task_correct
from labkit.tinylm import load_pretrained
from labkit.quant import quantize_model

ALL = ("embedding", "attention", "mlp")
INT4 = {k: "int4" for k in ALL}
CONFIGS = {
    "FP32": ({}, 32, "asym"),
    "BF16": ({k: "bf16" for k in ALL}, 32, "asym"),
    "INT8 asym g32": ({k: "int8" for k in ALL}, 32, "asym"),
    "INT8 sym channel": ({k: "int8" for k in ALL}, "channel", "sym"),
    "INT4 sym g32": (INT4, 32, "sym"),
    "INT4 sym channel": (INT4, "channel", "sym"),
    "INT4 asym g32": (INT4, 32, "asym"),
    "INT4 asym g64": (INT4, 64, "asym"),
    "INT4 asym g128": (INT4, 128, "asym"),
    "INT4 asym channel": (INT4, "channel", "asym"),
    "INT4 asym g32, emb INT8": ({**INT4, "embedding": "int8"}, 32, "asym"),
    "mixed (attn FP16, MLP INT4 g32, emb INT8)": ({"attention": "fp16", "mlp": "int4", "embedding": "int8"}, 32, "asym"),
}
N_TASKS = 200


def main() -> None:
    model, _ = load_pretrained()
    val = data.corpus("test", n_bytes=65536, seed=0)
    tasks = [t for kind in data.TASK_KINDS for t in data.make_tasks(kind, N_TASKS, split="test", seed=0)]
    tasks.sort(key=lambda t: len(t.prompt) + len(t.answer))  # less padding per batch; same answers
    print("| setting | bits/weight | vs FP32 | perplexity | arithmetic | recall | copy | tasks right | gained / lost "
          "| retained (95% interval) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = None
    for name, (policy, group, scheme) in CONFIGS.items():
        qm, report = quantize_model(model, policy, group, scheme)
        ok = task_correct(qm, tasks, batch_size=32)
        acc = {k: sum(o for o, t in zip(ok, tasks) if t.kind == k) / N_TASKS for k in data.TASK_KINDS}
        ppl = perplexity(qm, val)
        base = base or (ppl, sum(ok), ok)
        gained = sum(o and not b for o, b in zip(ok, base[2]))
        lost = sum(b and not o for o, b in zip(ok, base[2]))
        half = 1.96 * math.sqrt(gained + lost)  # paired (McNemar-style) normal approximation, as in notebook 03
        lo, hi = 1 + (gained - lost - half) / base[1], 1 + (gained - lost + half) / base[1]
        print(f"| {name} | {report['bits_per_weight']:.2f} | {report['compression']:.1f}x | {ppl:.4f} "
              f"({ppl / base[0] - 1:+.2%}) | {acc['arithmetic']:.1%} | {acc['recall']:.1%} | {acc['copy']:.1%} "
              f"| {sum(ok)} / {3 * N_TASKS} | {gained} / {lost} | {sum(ok) / base[1]:.1%} ({lo:.1%}-{hi:.1%}) |",
              flush=True)
    print()
    for kind in ALL:
        ppl = perplexity(quantize_model(model, {kind: "int4"}, 32, "asym")[0], val)
        print(f"only {kind} in INT4 asym g32: perplexity {ppl:.4f} ({ppl - base[0]:+.4f})", flush=True)
    print()
    cal = torch.tensor(list(data.corpus("train", 8 * 256, seed=0))).view(8, 256)
    policy = {"attention": "int4", "mlp": "int4"}
    for group, scheme in ((32, "asym"), (128, "asym"), ("channel", "sym"), (32, "sym")):
        rtn = perplexity(quantize_model(model, policy, group, scheme)[0], val)
        qts = calibrate.gptq(model, cal, 4, group, scheme)
        gq = perplexity(quantize_model(model, policy, group, scheme, qtensors=qts)[0], val)
        print(f"INT4 {scheme} group {group} (attention + MLP): FP32 {base[0]:.4f}  RTN {rtn:.4f} "
              f"({rtn - base[0]:+.4f})  GPTQ {gq:.4f} ({gq - base[0]:+.4f})", flush=True)


if __name__ == "__main__":
    main()
