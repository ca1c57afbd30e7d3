"""How much quality a precision setting keeps (notebook 03, section 6; benchmarks/quant_quality.py).

Each quantized model answers the *same* tasks as the baseline (FP32), so its retention (right answers /
the baseline's right answers) is judged from the tasks that flip, a paired comparison:

    gained = tasks wrong in the baseline, right here        lost = right in the baseline, wrong here
    retained = 1 + (gained - lost) / baseline's right answers
    95% interval = 1 + (gained - lost +- 1.96 * sqrt(gained + lost)) / baseline's right answers

(a normal approximation to McNemar's paired test: under "no change", gained - lost has variance about
gained + lost). A claimed retention is "reached" only if the whole interval is at or above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch.nn as nn

from .._checks import check_positive, check_positive_int, fail
from ..tinylm import TASK_KINDS, Task, make_tasks, perplexity, task_correct
from .policy import SETTINGS, Setting


@dataclass(frozen=True)
class Retention:
    """Paired retention of one model against the baseline, with its interval (fractions, 1.0 = 100%)."""
    correct: int
    base_correct: int
    gained: int
    lost: int
    low: float
    high: float

    @property
    def retained(self) -> float:
        return self.correct / self.base_correct

    def decide(self, target: float) -> str:
        """The verdict on a claimed retention `target`: "reached" (the whole interval is >= target),
        "not reached" (all of it below) or "cannot tell: ..."."""
        check_positive("target", target)
        if self.low >= target:
            return "reached"
        if self.high < target:
            return "not reached"
        return f"cannot tell: {target:.1%} is inside the interval"


def _check_answers(name: str, ok) -> list[bool]:
    if isinstance(ok, (str, bytes)) or not isinstance(ok, Sequence) or not all(isinstance(o, bool) for o in ok):
        fail(name, type(ok).__name__ if not isinstance(ok, Sequence) else ok, "a sequence of bools", TypeError)
    return list(ok)


def retention(ok: Sequence[bool], base_ok: Sequence[bool], z: float = 1.96) -> Retention:
    """The retention of answers `ok` against the baseline's `base_ok` (the same tasks, in the same order),
    with the paired interval of the module docstring (z = 1.96: 95%)."""
    ok, base_ok = _check_answers("ok", ok), _check_answers("base_ok", base_ok)
    check_positive("z", z)
    if len(ok) != len(base_ok):
        raise ValueError(f"ok must hold as many answers as base_ok ({len(base_ok)}), got {len(ok)}")
    base = sum(base_ok)
    if base == 0:
        raise ValueError("base_ok must contain at least one right answer (retention divides by their number)")
    gained = sum(o and not b for o, b in zip(ok, base_ok))
    lost = sum(b and not o for o, b in zip(ok, base_ok))
    half = z * math.sqrt(gained + lost)
    return Retention(sum(ok), base, gained, lost, 1 + (gained - lost - half) / base, 1 + (gained - lost + half) / base)


def quality_tasks(per_kind: int = 200, split: str = "test", seed: int = 0) -> list[Task]:
    """`per_kind` tasks of each kind, sorted by length (each batch of similar lengths pads little; the
    answers do not depend on the order). Notebook 03 and the benchmark use the same 600."""
    check_positive_int("per_kind", per_kind)
    tasks = [t for kind in TASK_KINDS for t in make_tasks(kind, per_kind, split=split, seed=seed)]
    return sorted(tasks, key=lambda t: len(t.prompt) + len(t.answer))


def evaluate(model: nn.Module, tasks: list[Task], text, batch_size: int = 32) -> dict:
    """{"ppl": perplexity on `text`, "ok": per-task right/wrong, "correct": their number, and the accuracy
    (a fraction) of each task kind present}. task_correct and perplexity check their arguments."""
    ok = task_correct(model, tasks, batch_size=batch_size)
    kinds = [k for k in TASK_KINDS if any(t.kind == k for t in tasks)]
    acc = {k: sum(o for o, t in zip(ok, tasks) if t.kind == k) / sum(t.kind == k for t in tasks) for k in kinds}
    return {"ppl": perplexity(model, text), "ok": ok, "correct": sum(ok), **acc}


def sweep(model: nn.Module, tasks: list[Task], text, settings: Sequence[Setting] = SETTINGS,
          batch_size: int = 32) -> dict[str, dict]:
    """Quantize `model` with each setting and evaluate it; the first setting is the baseline of the
    retention. Returns {name: evaluate(...) + "KiB", "bpw", "ratio" (vs FP32), "retention" (a Retention)
    and its "gained", "lost", "retained", "low", "high"}."""
    settings = tuple(settings)
    if not settings or not all(isinstance(s, Setting) for s in settings):
        fail("settings", settings, "a non-empty sequence of labkit.quant.Setting", TypeError)
    names = [s.name for s in settings]
    if len(set(names)) != len(names):
        fail("settings", names, "settings with distinct names")
    results = {}
    for s in settings:
        qmodel, report = s.apply(model)
        results[s.name] = {**evaluate(qmodel, tasks, text, batch_size), "KiB": report["bytes"] / 2**10,
                           "bpw": report["bits_per_weight"], "ratio": report["compression"]}
    base = results[names[0]]["ok"]
    for r in results.values():
        k = retention(r["ok"], base)
        r.update(retention=k, gained=k.gained, lost=k.lost, retained=k.retained, low=k.low, high=k.high)
    return results
