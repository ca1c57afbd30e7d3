"""TinyLM quality after quantization on a larger evaluation than notebook 03 can afford.

    python benchmarks/quant_quality.py

Perplexity on 64 KiB of the test split and exact-match accuracy on 200 test tasks per kind, for the
notebook's precision settings (labkit.quant.SETTINGS, the same list notebook 03 sweeps, with the same
paired retention interval, labkit.quant.quality), the one-type-at-a-time INT4 sensitivity on the whole text
and on 8 pieces of 8 KiB (the noise between texts), the notebook's fact-check verdicts computed from these
numbers (labkit.quant.factcheck), and GPTQ vs round-to-nearest (labkit.quant.quality.gptq_vs_rtn, the
comparison notebook 03 prints: perplexity on the whole text, and the paired GPTQ - RTN differences over the
8 pieces with their 95% interval for the verdict). Deterministic (no timings; the sweep, the
sensitivity and GPTQ run on one thread, as in the notebook); takes a few minutes on 2 cores. Copy the output into
benchmarks/RESULTS.md.
"""

import torch

from labkit.quant import SETTINGS, factcheck, quality
from labkit.tinylm import TASK_KINDS, corpus, load_pretrained

TYPES = ("embedding", "attention", "mlp")
GPTQ_SETTINGS = ((32, "asym"), (128, "asym"), ("channel", "sym"), (32, "sym"))


def main() -> None:
    model, _ = load_pretrained()
    val = corpus.corpus("test", n_bytes=65536, seed=0)
    tasks = quality.quality_tasks(per_kind=200)
    print("| setting | bits/weight | vs FP32 | perplexity | arithmetic | recall | copy | tasks right | gained / lost "
          "| retained (95% interval) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = quality.sweep(model, tasks, val, SETTINGS)
    base = results[SETTINGS[0].name]
    for name, r in results.items():
        kinds = " | ".join(f"{r[k]:.1%}" for k in TASK_KINDS)
        print(f"| {name} | {r['bpw']:.2f} | {r['ratio']:.1f}x | {r['ppl']:.4f} ({r['ppl'] / base['ppl'] - 1:+.2%}) "
              f"| {kinds} | {r['correct']} / {len(tasks)} | {r['gained']} / {r['lost']} "
              f"| {r['retained']:.1%} ({r['low']:.1%}-{r['high']:.1%}) |", flush=True)
    print()
    sens = quality.sensitivity(model, val, TYPES, n_pieces=8)
    print("\n".join(quality.sensitivity_lines(sens)), flush=True)
    print()
    for check in (factcheck.compression(results), factcheck.retention(results),
                  factcheck.mixed_precision(results, sens, tied=model.cfg.tie_embeddings)):
        check.show()
    cal = torch.tensor(list(corpus.corpus("train", 8 * 256, seed=0))).view(8, 256)
    for c in quality.gptq_vs_rtn(model, val, cal, GPTQ_SETTINGS, n_pieces=8).values():
        print(c.line(), flush=True)


if __name__ == "__main__":
    main()
