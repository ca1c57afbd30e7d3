"""Perplexity and exact-match task accuracy of TinyLM (notebook 00; notebook 03 compares them before and
after quantization). Both are deterministic: fixed windows, no sampling.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.nn.functional as F

from .._checks import check_fraction, check_positive_int, fail
from .corpus import Task
from .tokenizer import ByteTokenizer


def _as_tokens(tokens, vocab_size: int) -> torch.Tensor:
    """`tokens` (1-D token ids: a list, a tensor, bytes) as an int64 tensor, every id in [0, vocab_size)."""
    if isinstance(tokens, str):
        raise TypeError("tokens must be token ids or bytes, not str: encode text with ByteTokenizer first")
    if isinstance(tokens, (bytes, bytearray)):
        tokens = list(tokens)
    try:
        t = torch.as_tensor(tokens)
    except (TypeError, ValueError, RuntimeError):
        fail("tokens", tokens, "a 1-D sequence of at least 2 token ids", TypeError)
    if t.dim() != 1 or t.numel() < 2:
        fail("tokens", f"shape {tuple(t.shape)}", "a 1-D sequence of at least 2 token ids")
    if t.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        fail("tokens", f"a sequence of {t.dtype}", "a 1-D sequence of at least 2 token ids (ints)", TypeError)
    low, high = int(t.min()), int(t.max())
    if low < 0 or high >= vocab_size:
        fail("tokens", f"ids in [{low}, {high}]", f"token ids in [0, {vocab_size}) (the model's vocabulary)")
    return t.long()


def _check_model(model) -> None:
    """A language model here is any nn.Module whose .cfg gives max_seq_len and vocab_size (TinyLM, a quantized
    copy, or the tests' reference models) and whose forward maps [B, T] ids to [B, T, vocab] logits."""
    cfg = getattr(model, "cfg", None)
    if not isinstance(model, torch.nn.Module) or not all(hasattr(cfg, f) for f in ("max_seq_len", "vocab_size")):
        raise TypeError(f"model must be a TinyLM (an nn.Module with a .cfg giving max_seq_len and vocab_size), "
                        f"got {type(model).__name__}")


def _device(model) -> torch.device:
    """Where the model's weights are (CPU or a GPU); inputs are moved there."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


@torch.no_grad()
def perplexity(model, tokens, batch_size: int = 16) -> float:
    """exp(mean negative log-likelihood per predicted token), in nats -> perplexity (1 = perfect).

    `tokens` (1-D ids, or bytes) is cut into windows of context length + 1 that overlap by one token:
    every token after the first is predicted exactly once, from the tokens before it in its window
    (so each window restarts with no earlier context).
    """
    _check_model(model)
    t = _as_tokens(tokens, model.cfg.vocab_size)
    check_positive_int("batch_size", batch_size)
    ctx = model.cfg.max_seq_len
    windows = [t[i:i + ctx + 1] for i in range(0, t.numel() - 1, ctx)]
    total_nll, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        group = windows[i:i + batch_size]
        same = [w for w in group if w.numel() == group[0].numel()]
        rest = group[len(same):]
        for batch in ([torch.stack(same)] + [w[None] for w in rest]):
            batch = batch.to(_device(model))
            logits = model(batch[:, :-1])
            if not torch.isfinite(logits).all():
                raise ValueError("the model produced non-finite logits (NaN or inf): perplexity is undefined")
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), batch[:, 1:].reshape(-1),
                                  reduction="sum")
            total_nll += float(nll)
            count += batch[:, 1:].numel()
    mean_nll = total_nll / count
    if mean_nll > 700:  # exp would overflow a float
        raise ValueError(f"mean negative log-likelihood {mean_nll:.1f} nats: perplexity overflows")
    return math.exp(mean_nll)


@torch.no_grad()
def task_correct(model, tasks: list[Task], batch_size: int = 64) -> list[bool]:
    """For each task: does greedy decoding of the prompt produce exactly `answer` followed by "\\n"?

    Computed with one teacher-forced forward pass per batch: greedy decoding yields the answer iff, at
    every answer position, the argmax given the prompt and the answer so far is the next answer token.
    (Tested against `TinyLM.generate` in tests/tinylm/test_eval.py.)
    """
    _check_model(model)
    if not isinstance(tasks, (list, tuple)) or not all(isinstance(t, Task) for t in tasks):
        raise TypeError(f"tasks must be a non-empty list of labkit.tinylm.corpus.Task, got {type(tasks).__name__}")
    if not tasks:
        raise ValueError("tasks must be a non-empty list of labkit.tinylm.corpus.Task, got []")
    check_positive_int("batch_size", batch_size)
    typed = [t for t in tasks if not isinstance(t.prompt, str) or not isinstance(t.answer, str)]
    if typed:
        fail("tasks", typed[0], "Tasks whose prompt and answer are str", TypeError)
    empty = [t for t in tasks if not t.prompt]
    if empty:
        raise ValueError(f"every task needs a non-empty prompt, got {empty[0]!r}")
    tok = ByteTokenizer()
    ctx = model.cfg.max_seq_len
    correct: list[bool] = []
    for i in range(0, len(tasks), batch_size):
        group = tasks[i:i + batch_size]
        seqs = [(tok.encode(t.prompt), tok.encode(t.answer + "\n")) for t in group]
        longest = max(len(p) + len(a) for p, a in seqs)
        if longest - 1 > ctx:
            raise ValueError(f"a task of {longest} tokens does not fit the model's context of {ctx}")
        batch = torch.zeros(len(group), longest - 1, dtype=torch.long)  # right padding: causal, so harmless
        for j, (p, a) in enumerate(seqs):
            s = (p + a)[:-1]
            batch[j, :len(s)] = torch.tensor(s)
        logits = model(batch.to(_device(model)))
        if not torch.isfinite(logits).all():
            raise ValueError("the model produced non-finite logits (NaN or inf): accuracy is undefined")
        pred = logits.argmax(-1)
        for j, (p, a) in enumerate(seqs):
            got = pred[j, len(p) - 1:len(p) - 1 + len(a)].tolist()
            correct.append(got == a)
    return correct


def task_accuracy(model, tasks: list[Task], batch_size: int = 64) -> dict[str, float]:
    """Exact-match accuracy (0..1) per task kind, in order of first appearance in `tasks`."""
    hits: dict[str, list[bool]] = defaultdict(list)
    for t, ok in zip(tasks, task_correct(model, tasks, batch_size)):
        hits[t.kind].append(ok)
    return {kind: sum(v) / len(v) for kind, v in hits.items()}


def accuracy_gap(a: float, n_a: int, b: float, n_b: int) -> dict[str, float | bool]:
    """How far apart two exact-match accuracies are, against the noise of measuring each on a finite sample
    of tasks (notebook 00 compares train-split and test-split sums with it): accuracy `a` (0..1) measured on
    `n_a` tasks, `b` on `n_b`. Returns difference a - b, stderr = sqrt(a(1-a)/n_a + b(1-b)/n_b) (the
    binomial standard error of that difference) and within_noise: |a - b| <= 2 standard errors."""
    a, b = check_fraction("a", a, allow_zero=True), check_fraction("b", b, allow_zero=True)
    n_a, n_b = check_positive_int("n_a", n_a, unit="tasks"), check_positive_int("n_b", n_b, unit="tasks")
    stderr = math.sqrt(a * (1 - a) / n_a + b * (1 - b) / n_b)
    return {"difference": a - b, "stderr": stderr, "within_noise": abs(a - b) <= 2 * stderr}
