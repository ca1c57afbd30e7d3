"""Fine-tuning TinyLM on a task it cannot do yet (notebook 09, section 3): batches of task lines with the loss on
the answer only, a short training loop for any method (full, LoRA, QLoRA), and the before/after table:
held-out accuracy on the new task and on TinyLM's own tasks (forgetting)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .._checks import check_choice, check_number, check_positive_int, fail, is_int
from ..tinylm import TASK_KINDS, ByteTokenizer, Task, check_tinylm, corpus, make_tasks, task_accuracy
from .lora import BASE_DTYPES, add_lora, trainable_params
from .memory import lm_loss

METHODS = {"full": None, "lora": "fp32", "lora-bf16": "bf16", "qlora": "nf4", "qlora-int4": "int4"}
"""Method name -> the frozen base's dtype (None: every parameter trains)."""


def _encoded(tasks: list[Task]) -> list[tuple[list[int], list[int]]]:
    """(prompt tokens, answer + "\\n" tokens) of each task; refuses anything but a non-empty list of Task."""
    if not isinstance(tasks, (list, tuple)) or not tasks or not all(isinstance(t, Task) for t in tasks):
        fail("tasks", tasks, "a non-empty list of labkit.tinylm.Task")
    tok = ByteTokenizer()
    return [(tok.encode(t.prompt), tok.encode(t.answer + "\n")) for t in tasks]


def task_batch(tasks: list[Task]) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, T] (prompt + answer + "\\n", right-padded with "\\n") and mask [B, T - 1]: True where the
    target token is part of the answer (its "\\n" included): the loss is taken there only."""
    seqs = _encoded(tasks)
    T = max(len(p) + len(a) for p, a in seqs)
    tokens = torch.full((len(tasks), T), 10, dtype=torch.long)
    mask = torch.zeros(len(tasks), T - 1, dtype=torch.bool)
    for i, (p, a) in enumerate(seqs):
        tokens[i, :len(p) + len(a)] = torch.tensor(p + a)
        mask[i, len(p) - 1:len(p) - 1 + len(a)] = True  # position j predicts token j + 1
    return tokens, mask


def length_groups(lengths: list[int]) -> list[list[int]]:
    """The indices of a batch in at most two groups by length, split where the padded token count (each group's
    size times its longest) is smallest: a replay batch's two or three long recall lines (up to 199 tokens) no
    longer pad thirteen short ones (10-50 tokens) to their length (half the time per step: RESULTS.md).
    `lengths`: a non-empty list of positive ints (tokens per line)."""
    if not isinstance(lengths, (list, tuple)) or not lengths or not all(is_int(n) and n > 0 for n in lengths):
        fail("lengths", lengths, "a non-empty list of positive ints (tokens per line)")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    s = [lengths[i] for i in order]
    n = len(s)
    cut = min(range(n, 0, -1), key=lambda c: c * s[c - 1] + (n - c) * s[-1])  # c = n: one group; ties keep it
    return [order[:cut], order[cut:]] if cut < n else [order]


def accumulate_gradients(model, tasks: list[Task]) -> float:
    """Backward of lm_loss on task_batch(tasks) (the mean over the answer tokens), run on length_groups(tasks)
    one group at a time: the gradients are the padded batch's, because attention is causal and right padding
    never changes an earlier position (tests/finetune/test_train.py compares them). Adds to .grad; returns the
    loss."""
    check_tinylm(model)
    groups = length_groups([len(p) + len(a) for p, a in _encoded(tasks)])
    batches = [task_batch([tasks[i] for i in g]) for g in groups]
    answers = sum(int(mask.sum()) for _, mask in batches)
    total = 0.0
    for tokens, mask in batches:
        part = lm_loss(model, tokens, mask) * (int(mask.sum()) / answers)
        part.backward()
        total += float(part.detach())
    return total


def training_tasks(new_kind: str = "first", n: int = 2000, replay: float = 0.0, seed: int = 0) -> list[Task]:
    """`n` tasks of the new kind (train split) and, for `replay` r in [0, 1), TinyLM's own tasks (train split, the
    same number of each kind) making a share r of the list: fine-tuning that keeps seeing the old tasks forgets
    them less (fine_tune draws its batches at random from the list)."""
    check_positive_int("n", n)
    check_number("replay", replay, low=0.0, high=1.0, high_open=True)
    tasks = corpus.make_new_tasks(new_kind, n, "train", seed)
    per_kind = round(n * replay / (1 - replay) / len(TASK_KINDS))
    if per_kind:
        tasks += [t for k in TASK_KINDS for t in make_tasks(k, per_kind, "train", seed)]
    return tasks


def make_model(base, method: str, rank: int = 8, alpha: float = 16.0, targets=("attention", "mlp")):
    """A copy of `base` ready for `method` (a key of METHODS): all parameters trainable for "full", adapters of
    `rank` on `targets` over a frozen base of the method's dtype otherwise."""
    import copy
    check_tinylm(base)
    check_choice("method", method, tuple(METHODS))
    model = copy.deepcopy(base)
    if METHODS[method] is None:
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    return add_lora(model, rank, alpha, targets, METHODS[method])


@dataclass
class FinetuneRun:
    """What fine_tune did: the method, trainable parameters, steps, seconds, the loss at every step."""
    method: str
    trainable: int
    steps: int
    seconds: float
    losses: list[float] = field(default_factory=list)

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / max(self.steps, 1)


def fine_tune(model, tasks: list[Task], steps: int = 60, batch_size: int = 32, lr: float = 3e-3,
              seed: int = 0, method: str = "") -> FinetuneRun:
    """AdamW on the answers of `tasks` (batches of `batch_size` drawn in a fixed order from `seed`, each run in
    two length groups by accumulate_gradients) for `steps` steps, training the parameters that require a
    gradient. Returns a FinetuneRun."""
    check_tinylm(model)
    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    check_number("lr", lr, low=0.0, low_open=True)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        fail("model", type(model).__name__, "a model with trainable parameters (add_lora or full fine-tuning)")
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    run = FinetuneRun(method, trainable_params(model), steps, 0.0)
    model.train()
    t0 = time.perf_counter()
    for _ in range(steps):
        idx = torch.randint(0, len(tasks), (batch_size,), generator=g).tolist()
        opt.zero_grad(set_to_none=True)
        run.losses.append(accumulate_gradients(model, [tasks[i] for i in idx]))
        opt.step()
    run.seconds = time.perf_counter() - t0
    model.eval()
    return run


def evaluate(model, new_kind: str = "first", n: int = 200, n_old: int = 100, seed: int = 0) -> dict[str, float]:
    """Accuracy (0..1) on `n` held-out (test split) tasks of the new kind and on `n_old` of each of TinyLM's own
    task kinds (their test split: forgetting shows there)."""
    check_tinylm(model)
    tasks = (corpus.make_new_tasks(new_kind, n, "test", seed)
             + [t for k in TASK_KINDS for t in make_tasks(k, n_old, "test", seed)])
    return task_accuracy(model, tasks)


__all__ = ["BASE_DTYPES", "METHODS", "task_batch", "length_groups", "accumulate_gradients", "training_tasks",
           "make_model", "FinetuneRun", "fine_tune", "evaluate"]
