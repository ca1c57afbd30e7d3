"""Fine-tuning TinyLM, measured in one run (issue 31): a LoRA step at least 2x faster than a full fine-tuning step
at the same batch, and QLoRA's peak memory at most half of LoRA's with an FP32 base.

    python benchmarks/finetune.py [--repeats N] [--batch B] [--seq T]

Speed: one training step (forward, backward, AdamW) on the same batch of B x T tokens, full fine-tuning vs LoRA
(rank 8 on every attention and MLP linear), timed in turns (labkit.course.timing.interleave), one torch thread;
the direction is stated only when the repeats separate (labkit.course.evidence). Memory: the peak of one step
(labkit.finetune.memory.measure_step: weights, optimizer states and the profiler's peak during the step) for LoRA
on an FP32 base and QLoRA (NF4 base), on a small batch (2 x 32 tokens) where the weights dominate, as they do
when a 65B model is fine-tuned.
"""

import argparse

import torch

from labkit.course import evidence, timing
from labkit.finetune import memory
from labkit.finetune.train import make_model
from labkit.tinylm import load_pretrained


def step_fn(model, tokens):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step():
        opt.zero_grad(set_to_none=True)
        memory.lm_loss(model, tokens).backward()
        opt.step()
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(1)
    base, _ = load_pretrained()
    tokens = torch.randint(0, 256, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(0))
    full, lora = make_model(base, "full"), make_model(base, "lora")
    times = timing.interleave({"full": step_fn(full, tokens), "lora": step_fn(lora, tokens)},
                              repeats=args.repeats, warmup=2, calls=3)
    c = evidence.compare("lora", times["lora"], "full", times["full"], "s")
    print(f"step on {args.batch} x {args.seq} tokens: full {1e3 * times['full'].median:.1f} ms, "
          f"LoRA {1e3 * times['lora'].median:.1f} ms (medians of {args.repeats})")
    print(f"LoRA speed-up over full fine-tuning: {c.ratio:.2f}x "
          f"({'meets' if c.reliable and c.ratio >= 2 else 'misses'} the 2x goal; "
          f"{'separated' if c.reliable else c.unreliable()})")
    small = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    peaks = {}
    for method in ("lora", "qlora"):
        model = make_model(base, method)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        peaks[method] = memory.measure_step(model, small, opt)
    ratio = peaks["qlora"].peak / peaks["lora"].peak
    for method, m in peaks.items():
        print(f"{method:6s} peak {m.peak / 2**20:.2f} MiB (weights {m.weights / 2**20:.2f}, optimizer "
              f"{m.optimizer / 2**20:.2f}, activations {m.activations / 2**20:.2f})")
    print(f"QLoRA peak / LoRA-FP32 peak: {ratio:.2f} ({'meets' if ratio <= 0.5 else 'misses'} the 0.5 goal)")


if __name__ == "__main__":
    main()
