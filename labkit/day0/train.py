"""Train TinyVLM and write its release, data/tinyvlm/ (the folder notebook 07 adapts on "day 0").

    python -m labkit.day0.train              # 10-20 minutes on 2 CPU cores (tqdm shows the steps)

LLaVA's recipe, shrunk (Liu et al. 2023): the decoder starts from the course's pretrained TinyLM (its 256 byte
embeddings copied, 8 new ids), the vision tower and projector from scratch, and everything is trained together
on three streams per step: windows of TinyLM's own corpus, with TinyLM itself as a teacher (cross-entropy plus the
KL divergence to TinyLM's predictions, so the text tasks keep their accuracy: Hinton et al. 2015), TinyLM's tasks
from the train split (loss on the answer only), and questions about images drawn by labkit.day0.images (loss on
the answer only). QK-norm is new to the decoder: its weights
start at each layer's measured RMS of q and k, so the pretrained attention begins close to where it was.
AdamW, cosine schedule, FP32, seeded. The release: config.json, sharded safetensors with their index, and a
model card (README.md) with the measured accuracy.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..paths import DATA
from ..tinylm import ByteTokenizer, TinyLM, corpus, load_pretrained
from .config import TinyVLMConfig
from .evaluate import image_accuracy, task_tokens, text_quality
from .images import QUESTION_KINDS, make_image_tasks, to_pixels
from .model import TinyVLM

RELEASE = DATA / "tinyvlm"
RECIPE = dict(steps=1400, text_batch=12, image_batch=48, lr=1e-3, decoder_lr=3e-4, min_lr_ratio=0.05, warmup=50,
              weight_decay=0.05, grad_clip=1.0, train_bytes=4_000_000, image_pool=24_000, digit_share=0.5,
              task_batch=32, task_pool=30_000, seed=0,
              max_shard_size="1MB")


def from_tinylm(tinylm: TinyLM, cfg: TinyVLMConfig = TinyVLMConfig(), calibration: torch.Tensor | None = None,
                seed: int = 0) -> TinyVLM:
    """A TinyVLM whose decoder holds TinyLM's weights (byte rows of the embedding copied) and whose QK-norm
    weights are each layer's RMS of q and k on `calibration` tokens [B, T]."""
    torch.manual_seed(seed)
    model = TinyVLM(cfg)
    lm, src = model.language_model, tinylm.state_dict()
    with torch.no_grad():
        for name, p in lm.state_dict().items():
            if name == "lm_head.weight" and cfg.text_config.tie_embeddings:
                continue  # the same tensor as tok_emb
            if name == "tok_emb.weight":
                p[:src[name].shape[0]] = src[name]
            elif name in src:
                p.copy_(src[name])
        if calibration is not None:
            rms: dict[str, float] = {}
            hooks = [getattr(b.attn, w).register_forward_hook(
                lambda m, i, o, key=f"{n}.{w}", hd=cfg.text_config.head_dim:
                rms.__setitem__(key, o.view(-1, hd).pow(2).mean(-1).sqrt().mean().item()))
                for n, b in enumerate(tinylm.layers) for w in ("wq", "wk")]
            tinylm(calibration)
            for h in hooks:
                h.remove()
            for n, b in enumerate(lm.layers):
                b.attn.q_norm.weight.fill_(rms[f"{n}.wq"])
                b.attn.k_norm.weight.fill_(rms[f"{n}.wk"])
    return model


def _answer_batch(rows: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [n, L] right-padded, mask [n, L]: the positions whose next token is part of the answer) for
    (prompt + answer ids, prompt length) rows."""
    L = max(len(s) for s, _ in rows)
    tokens = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), L, dtype=torch.bool)  # positions whose NEXT token is part of the answer
    for i, (s, n) in enumerate(rows):
        tokens[i, :len(s)] = torch.tensor(s)
        mask[i, n - 1:len(s) - 1] = True
    return tokens, mask


def _image_batches(cfg: TinyVLMConfig, pool: int, seed: int, digit_share: float = 0.25):
    """The training image questions: (pixels uint8 [n, 3, S, S], tokens [n, L], loss mask [n, L]); digit
    questions make `digit_share` of them (glyphs are the hardest kind), the other kinds share the rest."""
    others = [k for k in QUESTION_KINDS if k != "digit"]
    counts = {k: int(pool * (1 - digit_share)) // len(others) for k in others} | {"digit": int(pool * digit_share)}
    tasks = [t for kind in QUESTION_KINDS for t in make_image_tasks(kind, counts[kind], "train", seed)]
    tok = ByteTokenizer()
    tokens, mask = _answer_batch([(task_tokens(cfg, t.question) + tok.encode(t.answer + "\n"),
                                   len(task_tokens(cfg, t.question))) for t in tasks])
    pixels = (to_pixels([t.image for t in tasks]) * 255).round().to(torch.uint8)
    return pixels, tokens, mask


def _text_task_batches(pool: int, seed: int):
    """TinyLM's own tasks from the train split (arithmetic pairs disjoint from the test's): (tokens, mask)."""
    tok = ByteTokenizer()
    tasks = [t for kind in corpus.TASK_KINDS for t in corpus.make_tasks(kind, pool // len(corpus.TASK_KINDS), "train",
                                                                        seed + 11)]
    return _answer_batch([(tok.encode(t.prompt + t.answer + "\n"), len(tok.encode(t.prompt))) for t in tasks])


def train(steps: int = RECIPE["steps"], seed: int = RECIPE["seed"], **overrides) -> TinyVLM:
    """Train TinyVLM from TinyLM (see the module docstring); a tqdm bar shows the steps."""
    r = {**RECIPE, "steps": steps, "seed": seed, **overrides}
    cfg = TinyVLMConfig()
    tinylm, _ = load_pretrained()
    T = cfg.text_config.max_seq_len
    stream = torch.frombuffer(bytearray(corpus.corpus("train", r["train_bytes"], seed + 7)), dtype=torch.uint8).long()
    gen = torch.Generator().manual_seed(seed)

    def text_batch(n):
        starts = torch.randint(0, stream.numel() - T - 1, (n,), generator=gen).tolist()
        return torch.stack([stream[s:s + T + 1] for s in starts])  # [n, T + 1]

    model = from_tinylm(tinylm, cfg, text_batch(8)[:, :-1], seed)
    pixels, tokens, mask = _image_batches(cfg, r["image_pool"], seed, r["digit_share"])
    task_tokens_, task_mask = _text_task_batches(r["task_pool"], seed)
    decoder = [p for n, p in model.named_parameters() if n.startswith("language_model.") and "_norm." not in n]
    new = [p for n, p in model.named_parameters() if not n.startswith("language_model.") or "_norm." in n]
    opt = torch.optim.AdamW([{"params": decoder, "base": r["decoder_lr"]}, {"params": new, "base": r["lr"]}],
                            weight_decay=r["weight_decay"], betas=(0.9, 0.95))
    model.train()
    bar = tqdm(range(steps), desc="training TinyVLM", unit="step")
    for step in bar:
        scale = min(1.0, (step + 1) / r["warmup"]) * (r["min_lr_ratio"] + (1 - r["min_lr_ratio"]) * 0.5 *
                                                      (1 + math.cos(math.pi * step / max(1, steps))))
        for g in opt.param_groups:
            g["lr"] = g["base"] * scale
        text = text_batch(r["text_batch"])
        student = model.language_model(text[:, :-1]).flatten(0, 1)                   # [n * T, 264]
        with torch.no_grad():  # TinyLM's own predictions over the 256 bytes
            teacher = F.log_softmax(tinylm(text[:, :-1]).flatten(0, 1), -1)          # [n * T, 256]
        kl = (teacher.exp() * (teacher - F.log_softmax(student, -1)[:, :256])).sum(-1).mean()
        text_loss = F.cross_entropy(student, text[:, 1:].flatten()) + kl
        idx = torch.randint(0, tokens.shape[0], (r["image_batch"],), generator=gen)
        logits = model(tokens[idx, :-1], pixels=pixels[idx].float() / 255)       # [n, L - 1, V]
        m = mask[idx, :-1]
        image_loss = F.cross_entropy(logits[m], tokens[idx, 1:][m])
        idx = torch.randint(0, task_tokens_.shape[0], (r["task_batch"],), generator=gen)
        m = task_mask[idx, :-1]
        task_loss = F.cross_entropy(model.language_model(task_tokens_[idx, :-1])[m], task_tokens_[idx, 1:][m])
        loss = text_loss + image_loss + task_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            bar.set_postfix(text=f"{text_loss.item():.3f}", image=f"{image_loss.item():.3f}")
    return model.eval()


def model_card(cfg: TinyVLMConfig, meta: dict, quality: dict, baseline: dict) -> str:
    """The release's README.md: what the model is, how it was trained, what it scores."""
    img = "\n".join(f"| {k} | {v:.1%} |" for k, v in quality["image"].items())
    txt = "\n".join(f"| {k} | {v:.1%} | {baseline['accuracy'][k]:.1%} |"
                    for k, v in quality["text"]["accuracy"].items())
    return f"""# TinyVLM model card

The model the course releases for its capstone (notebook 07): a small vision-language model in the LLaVA-1.5
layout, trained by `python -m labkit.day0.train`. Load it the day-0 way (labkit.day0: each tensor-parallel rank
reads its own slices) or whole in one process with `labkit.day0.load_model` (the FP32 reference).

- Vision tower: ViT, {cfg.vision_config.image_size}x{cfg.vision_config.image_size} RGB images in \
{cfg.vision_config.patch_size}x{cfg.vision_config.patch_size} patches -> {cfg.tokens_per_image} image tokens, \
{cfg.vision_config.num_layers} pre-LN blocks of width {cfg.vision_config.hidden_size}, GELU.
- Projector: linear -> GELU -> linear into the decoder's width {cfg.text_config.d_model}.
- Decoder: TinyLM (Llama-style, byte-level) with **QK-norm** (RMSNorm of each head's q and k before RoPE); the
  vocabulary is 264 ids: 256 bytes, the image placeholder {cfg.image_token_id}, 7 reserved.
- Prompt format: {cfg.tokens_per_image} placeholder ids per image, then the question: `colour=`, `shape=`,
  `count=` (shape scenes) or `digit=` (digit scenes); the model answers and ends with a newline. In chat, a \
message's parts are concatenated in order.
- Initialised from TinyLM (data/tinylm) and trained on three streams per step: TinyLM's corpus with
  TinyLM as the teacher, TinyLM's tasks from the train split, and the image questions (see
  labkit/day0/train.py); recipe {json.dumps(meta["recipe"])}.
- Trained in {meta["train_seconds"] / 60:.1f} minutes on {meta["machine"]} (torch threads: {meta["threads"]}),
  torch {meta["torch"]}.

## Evaluation (greedy, exact match, held-out test split)

| image question ({quality["n_image"]} images each) | accuracy |
|---|---|
{img}

| text task ({quality["n_text"]} each) | TinyVLM | TinyLM |
|---|---|---|
{txt}

Validation perplexity: TinyVLM {quality["text"]["val_perplexity"]:.3f}, TinyLM {baseline["val_perplexity"]:.3f}.
"""


def main(argv=None) -> None:
    from .release import write_release  # the release writer (labkit.day0.release)
    parser = argparse.ArgumentParser(prog="python -m labkit.day0.train", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=RECIPE["steps"], help="training steps")
    parser.add_argument("--out", type=Path, default=RELEASE, help="release folder to write")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    t0 = time.perf_counter()
    model = train(args.steps)
    meta = {"recipe": {**RECIPE, "steps": args.steps}, "train_seconds": round(time.perf_counter() - t0, 1),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "machine": f"{platform.machine()} {platform.processor() or platform.system()}"}
    quality = {"image": image_accuracy(model), "text": text_quality(model.language_model),
               "n_image": 200, "n_text": 200}
    baseline = text_quality(load_pretrained()[0])
    state = {k: v for k, v in model.state_dict().items() if k != "language_model.lm_head.weight"}
    card = model_card(model.config, meta, quality, baseline)
    write_release(state, model.config, args.out, max_shard_size=RECIPE["max_shard_size"], card=card)
    print(card)


if __name__ == "__main__":
    main()
