"""Train TinyLM from scratch on the course corpus and write its release folder, data/tinylm/ (model card included).

    python -m labkit.tinylm.train               # about 20 minutes on 2 CPU cores
    python -m labkit.tinylm.train --card-only   # rewrite data/tinylm/README.md from the committed release

AdamW, cosine learning-rate schedule with warm-up, FP32, seeded: the same run on the same machine gives
the same weights. The folder is written whole or not at all (labkit.tinylm.checkpoint.save_pretrained).
Notebook 00 loads the result with `labkit.tinylm.load_pretrained()`, and with transformers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .._checks import check_int, check_number, check_type
from . import corpus as data
from .checkpoint import CHECKPOINT, NAMES, load_pretrained, read_training, save_pretrained
from .eval import perplexity, task_accuracy
from .config import TinyLMConfig, param_counts
from .model import TinyLM

RECIPE = dict(steps=3200, batch_size=32, lr=2e-3, min_lr=1e-4, warmup=100, weight_decay=0.1,
              grad_clip=1.0, train_bytes=16_000_000, seed=0)
VAL_BYTES = 65_536   # 256 windows of 256 tokens
N_TASKS = 200        # per task kind, test split


def lr_at(step: int, steps: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warm-up to `lr`, then cosine decay to `min_lr` at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def train(cfg: TinyLMConfig = TinyLMConfig(), steps: int = RECIPE["steps"], batch_size: int = RECIPE["batch_size"],
          lr: float = RECIPE["lr"], min_lr: float = RECIPE["min_lr"], warmup: int = RECIPE["warmup"],
          weight_decay: float = RECIPE["weight_decay"], grad_clip: float = RECIPE["grad_clip"],
          train_bytes: int = RECIPE["train_bytes"], seed: int = RECIPE["seed"]) -> TinyLM:
    """Train a fresh TinyLM on random windows of the train split; shows a tqdm progress bar.
    steps=0 returns the initialised, untrained model."""
    check_type("cfg", cfg, TinyLMConfig, "a TinyLMConfig")
    for name, value, low in (("steps", steps, 0), ("batch_size", batch_size, 1), ("warmup", warmup, 1),
                             ("train_bytes", train_bytes, cfg.max_seq_len + 2), ("seed", seed, 0)):
        check_int(name, value, low)
    for name, value in (("lr", lr), ("min_lr", min_lr), ("weight_decay", weight_decay), ("grad_clip", grad_clip)):
        check_number(name, value, low=0.0)
    torch.manual_seed(seed)
    stream = torch.frombuffer(bytearray(data.corpus("train", train_bytes, seed)), dtype=torch.uint8).long()
    val = torch.frombuffer(bytearray(data.corpus("val", 16 * (cfg.max_seq_len + 1), seed)), dtype=torch.uint8)
    val = val.long().view(16, -1)
    model = TinyLM(cfg)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    T = cfg.max_seq_len
    bar = tqdm(range(steps), desc="training TinyLM", unit="step")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, min_lr, warmup)
        starts = torch.randint(0, stream.numel() - T - 1, (batch_size,), generator=gen)
        batch = torch.stack([stream[s:s + T + 1] for s in starts.tolist()])
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            with torch.no_grad():
                v = model(val[:, :-1])
                val_loss = F.cross_entropy(v.reshape(-1, cfg.vocab_size), val[:, 1:].reshape(-1))
            bar.set_postfix(loss=f"{loss.item():.3f}", val=f"{val_loss.item():.3f}")
    return model.eval()


def evaluate(model: TinyLM, seed: int = 0) -> dict:
    """Validation perplexity and test-split accuracy per task kind (what the model card reports)."""
    val = data.corpus("val", VAL_BYTES, seed)
    tasks = [t for kind in data.TASK_KINDS for t in data.make_tasks(kind, N_TASKS, "test", seed)]
    return {"val_perplexity": perplexity(model, val), "accuracy": task_accuracy(model, tasks)}


def model_card(model: TinyLM, training: dict, sha256: str) -> str:
    """data/tinylm/README.md: what TinyLM is, how it was trained (`training`: the record main() keeps), how to load
    it with labkit and with transformers, the SHA-256 of model.safetensors, perplexity and accuracy per task."""
    cfg, counts = model.cfg, param_counts(model.cfg)
    results = evaluate(model)
    rows = "\n".join(f"| {kind} | {acc:.1%} |" for kind, acc in results["accuracy"].items())
    count_rows = "\n".join(f"| {k} | {v:,} |" for k, v in counts.items())
    names = "\n".join(f"| `{k}` | `{v}` |" for k, v in NAMES.items())
    return f"""# TinyLM model card

The course model: a Llama decoder of {counts["total"]:,} parameters over bytes, trained by
`python -m labkit.tinylm.train` on the course corpus (`labkit.tinylm.corpus`, seed 0), released in the Hugging
Face Llama layout so that labkit and transformers open the same files. This card is written by
`python -m labkit.tinylm.train --card-only`.

| file | what |
|---|---|
| `config.json` | Llama config (`model_type` llama, `LlamaForCausalLM`); bos and eos are `"\\n"` (id 10) |
| `model.safetensors` | the weights, FP32, Llama tensor names; SHA-256 `{sha256}` |
| `generation_config.json` | greedy, stops at `"\\n"` |
| `tokenizer.json`, `tokenizer_config.json` | byte-level: token id = byte value, 256 tokens, no merges |

## Load it

```python
from labkit import tinylm
model, tok = tinylm.load_pretrained()            # data/tinylm, checked tensor by tensor

from transformers import AutoTokenizer, LlamaForCausalLM
hf = LlamaForCausalLM.from_pretrained("data/tinylm")
hf_tok = AutoTokenizer.from_pretrained("data/tinylm")  # the same ids as tinylm.ByteTokenizer
```

Both give the same logits within 2e-4 (float rounding: the same sums in another order) and the same greedy
text (tests/tinylm/test_hf.py).

## Architecture

Llama decoder: RMSNorm, rotary positions (half-split layout, as Llama's), grouped-query attention, SwiGLU
MLP, tied embeddings, byte-level vocabulary.

| TinyLMConfig | value |
|---|---|
""" + "\n".join(f"| {k} | {v} |" for k, v in cfg.to_dict().items()) + f"""

| parameters by layer type | count |
|---|---|
{count_rows}

Tensor names (`labkit.tinylm.checkpoint.NAMES`; each with `.weight`, i the block):

| TinyLM | Llama |
|---|---|
{names}

## Training

Recipe: {json.dumps(training["recipe"])}.
Measured: {training["train_seconds"] / 60:.1f} minutes for {training["recipe"]["steps"]} steps on
{training["machine"]} ({training["threads"]} torch threads), torch {training["torch"]}.

## Evaluation

Validation perplexity (first {VAL_BYTES:,} bytes of the val split, windows of {cfg.max_seq_len} tokens): \
{results["val_perplexity"]:.3f}

Exact-match accuracy, greedy, {N_TASKS} test-split tasks per kind (a test problem a+b never appears in
training; b+a may):

| task | accuracy |
|---|---|
{rows}

Command: `python -m labkit.tinylm.train --card-only` (evaluates the committed release).
"""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m labkit.tinylm.train", description=__doc__.splitlines()[0])
    parser.add_argument("--card-only", action="store_true", help="only rewrite data/tinylm/README.md")
    parser.add_argument("--steps", type=int, default=RECIPE["steps"], help="training steps")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.card_only:
        model, _ = load_pretrained()
        sha256 = hashlib.sha256((CHECKPOINT / "model.safetensors").read_bytes()).hexdigest()
        card = model_card(model, read_training(), sha256)
        tmp = CHECKPOINT / f".README.md.tmp-{os.getpid()}"
        tmp.write_text(card, encoding="utf-8")
        os.replace(tmp, CHECKPOINT / "README.md")
    else:
        recipe = {**RECIPE, "steps": args.steps}
        t0 = time.perf_counter()
        model = train(**recipe)
        training = {"recipe": recipe, "train_seconds": round(time.perf_counter() - t0, 1),
                    "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "machine": f"{platform.machine()} {platform.processor() or platform.system()}"}
        folder = save_pretrained(model, CHECKPOINT, training, card=lambda sha256: model_card(model, training, sha256))
        card = (folder / "README.md").read_text(encoding="utf-8")
    print(card)


if __name__ == "__main__":
    main()
