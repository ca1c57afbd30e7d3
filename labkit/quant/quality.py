"""How much quality a precision setting keeps (notebook 03, section 6; benchmarks/quant_quality.py).

Each quantized model answers the *same* tasks as the baseline (FP32), so its retention (right answers /
the baseline's right answers) is judged from the tasks that flip, a paired comparison:

    gained = tasks wrong in the baseline, right here        lost = right in the baseline, wrong here
    retained = 1 + (gained - lost) / baseline's right answers
    95% interval = 1 + (gained - lost +- 1.96 * sqrt(gained + lost)) / baseline's right answers

(a normal approximation to McNemar's paired test: under "no change", gained - lost has variance about
gained + lost). A claimed retention is "reached" only if the whole interval is at or above it.

    sweep        quantize with each Setting, evaluate, retention against the first (one thread, a progress bar)
    table        the sweep's results as the notebook prints them
    sensitivity  one layer type at a time in INT4: perplexity increase on the whole text and on pieces of it
                 (the pieces show how much the figure moves from one text to another)
    gptq_vs_rtn  GPTQ against round-to-nearest, the one comparison notebook 03 and the benchmark print:
                 perplexity on the whole text, and the paired GPTQ - RTN differences over its pieces with
                 their 95% interval (labkit.quant.noise) for the verdict
"""

from __future__ import annotations

import copy

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

from tqdm.auto import tqdm

from .._checks import check_bool, check_positive, check_positive_int, check_type, fail
from ..tinylm import TASK_KINDS, Task, make_tasks, perplexity, task_correct
from .gptq import gptq
from .noise import BELOW, PairedDifference, paired_difference
from .policy import SETTINGS, Setting, quantize_model
from .qtensor import check_group_size, check_scheme, check_word
from .threads import torch_threads

SHORT = {"arithmetic": "arith"}  # column headers of table()
ROW_KEYS = frozenset({"KiB", "bpw", "ratio", "ppl", "gained", "lost", "retained", "low", "high", "correct", "ok"})
SENSITIVE_KINDS = ("embedding", "attention", "mlp", "head")  # the layer types sensitivity() quantizes alone
SENSITIVE_PRECISIONS = ("fp16", "bf16", "int8", "int4")


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
          batch_size: int = 32, threads: int | None = 1, progress: bool = False) -> dict[str, dict]:
    """Quantize `model` with each setting and evaluate it; the first setting is the baseline of the
    retention. Runs on `threads` torch threads (None: as many as torch uses now; the results do not depend
    on it, and one thread is the steadiest on a busy laptop: labkit.quant.threads), with a progress bar
    per setting if `progress`. Returns {name: evaluate(...) + "KiB", "bpw", "ratio" (vs FP32),
    "retention" (a Retention) and its "gained", "lost", "retained", "low", "high"}."""
    settings = tuple(settings)
    if not settings or not all(isinstance(s, Setting) for s in settings):
        fail("settings", settings, "a non-empty sequence of labkit.quant.Setting", TypeError)
    names = [s.name for s in settings]
    if len(set(names)) != len(names):
        fail("settings", names, "settings with distinct names")
    check_bool("progress", progress)
    results = {}
    with torch_threads(threads, "threads"), tqdm(settings, desc="settings", disable=not progress) as bar:
        for s in bar:
            bar.set_postfix_str(s.name)
            qmodel, report = s.apply(model)
            results[s.name] = {**evaluate(qmodel, tasks, text, batch_size), "KiB": report["bytes"] / 2**10,
                               "bpw": report["bits_per_weight"], "ratio": report["compression"]}
    base = results[names[0]]["ok"]
    for r in results.values():
        k = retention(r["ok"], base)
        r.update(retention=k, gained=k.gained, lost=k.lost, retained=k.retained, low=k.low, high=k.high)
    return results


def table(results: dict[str, dict]) -> list[str]:
    """The lines notebook 03 prints for a sweep: memory, bits per weight, compression, perplexity, accuracy
    per task kind, tasks gained / lost and the retention with its interval; then what one task is worth."""
    check_type("results", results, dict, "a dict from quality.sweep")
    if not results:
        fail("results", results, "a non-empty dict from quality.sweep")
    for name, r in results.items():
        if not isinstance(r, dict) or not ROW_KEYS <= set(r):
            error = TypeError if not isinstance(r, dict) else ValueError
            fail(f"results[{name!r}]", r if not isinstance(r, dict) else sorted(r),
                 f"a dict from quality.sweep (with {sorted(ROW_KEYS)})", error)
    base = next(iter(results.values()))
    if not base["correct"]:
        fail("results", f"a first row with {base['correct']} right answers",
             "a first row (the baseline) with at least one right answer (retention divides by their number)")
    kinds = [k for k in TASK_KINDS if k in base]
    width = max(len(n) for n in results) + 2
    lines = [f"{'':<{width}}{'KiB':>6}{'bits/w':>7}{'vs FP32':>8}{'ppl':>8}"
             + "".join(f"{SHORT.get(k, k)[:6]:>7}" for k in kinds) + f"{'+/-':>7}{'retained (95%)':>23}"]
    for name, r in results.items():
        lines.append(f"{name:<{width}}{r['KiB']:>6.0f}{r['bpw']:>7.2f}{r['ratio']:>7.1f}x{r['ppl']:>8.4f}"
                     + "".join(f"{r[k]:>7.0%}" for k in kinds) + f"{r['gained']:>4}/{r['lost']:<2}"
                     f"{r['retained']:>8.1%} ({r['low']:.1%}-{r['high']:.1%})")
    lines.append(f"the first row answers {base['correct']} of {len(base['ok'])} tasks: one task is "
                 f"{1 / base['correct']:.2%} of retention")
    return lines


def split_text(text, n: int) -> list:
    """`text` (bytes or 1-D token ids) cut into `n` consecutive pieces of equal length (a remainder shorter
    than n is dropped), for measuring how much a perplexity moves from one text to another."""
    if not isinstance(text, (bytes, bytearray)) and not (isinstance(text, torch.Tensor) and text.dim() == 1 and
                                                         not text.is_floating_point() and text.dtype != torch.bool):
        fail("text", type(text).__name__, "bytes or a 1-D integer tensor of token ids", TypeError)
    check_positive_int("n", n)
    size = len(text) // n
    if size < 2:
        fail("n", n, f"at most {len(text) // 2} for a text of {len(text)} tokens (2 tokens per piece)")
    return [text[i * size:(i + 1) * size] for i in range(n)]


@dataclass(frozen=True)
class Sensitivity:
    """Perplexity increase when only one layer type is quantized: on the whole text (`delta`) and on each
    piece of it (`piece_deltas`); `share` is that type's fraction of all the model's weights."""
    kind: str
    precision: str
    share: float
    delta: float
    piece_deltas: tuple[float, ...]

    @property
    def per_weight(self) -> float:
        """delta / share: the increase scaled to all the weights, to compare types of different sizes."""
        return self.delta / self.share

    @property
    def piece_per_weight(self) -> tuple[float, ...]:
        return tuple(d / self.share for d in self.piece_deltas)


def sensitivity(model: nn.Module, text, kinds: Sequence[str] = ("embedding", "attention", "mlp"), n_pieces: int = 4,
                precision: str = "int4", group_size: int | str = 32, scheme: str = "asym",
                threads: int | None = 1) -> dict[str, Sensitivity]:
    """For each layer type in `kinds`: quantize only that type (to `precision`, the rest stays FP32) and measure
    the perplexity increase over `model` on `text` and on its `n_pieces` pieces (split_text). Notebook 03,
    section 6, and benchmarks/quant_quality.py."""
    if isinstance(kinds, str) or not isinstance(kinds, Sequence) or not kinds:
        fail("kinds", kinds, f"a non-empty sequence of layer types from {SENSITIVE_KINDS}", TypeError)
    for kind in kinds:
        check_word("kinds", kind, SENSITIVE_KINDS)
    check_word("precision", precision, SENSITIVE_PRECISIONS)
    pieces = split_text(text, n_pieces)
    out = {}
    with torch_threads(threads, "threads"):
        base, base_pieces = perplexity(model, text), [perplexity(model, p) for p in pieces]
        for kind in kinds:
            qmodel, report = quantize_model(model, {kind: precision}, group_size, scheme)
            params = sum(r["params"] for r in report["layers"])
            share = sum(r["params"] for r in report["layers"] if r["type"] == kind) / params
            if share == 0:
                fail("kinds", list(kinds), f"layer types this model has ({kind!r} has no weights of its own)")
            deltas = tuple(perplexity(qmodel, p) - b for p, b in zip(pieces, base_pieces))
            out[kind] = Sensitivity(kind, precision, share, perplexity(qmodel, text) - base, deltas)
    return out


def sensitivity_lines(sens: dict[str, Sensitivity]) -> list[str]:
    """One line per layer type: its share, the perplexity increase, and that increase per weight on the
    whole text and on each piece."""
    check_type("sens", sens, dict, "a dict from quality.sensitivity")
    for kind, v in sens.items():
        check_type(f"sens[{kind!r}]", v, Sensitivity, "a labkit.quant.quality.Sensitivity")
    return [f"only {s.kind:<10} in {s.precision.upper()} ({s.share:4.0%} of the weights): perplexity {s.delta:+.4f}, "
            f"{s.per_weight:+.4f} per weight; on each piece " + " ".join(f"{v:+.4f}" for v in s.piece_per_weight)
            for s in sens.values()]


GPTQ_POLICY = {"attention": "int4", "mlp": "int4"}  # the linear layers (GPTQ needs a matmul's inputs)


@dataclass(frozen=True)
class GptqComparison:
    """GPTQ against round-to-nearest for one INT4 setting (attention and MLP in INT4, the rest FP32):
    perplexities on the whole text of FP32 (`base`), RTN and GPTQ, and the paired GPTQ - RTN differences
    over the text's pieces (`paired`, labkit.quant.noise)."""
    group_size: int | str
    scheme: str
    base: float
    rtn: float
    gptq: float
    paired: PairedDifference

    @property
    def removed(self) -> float:
        """The share of RTN's perplexity increase over FP32 that GPTQ removes (1 = all of it; above 1:
        GPTQ ends below FP32)."""
        return (self.rtn - self.gptq) / (self.rtn - self.base) if self.rtn != self.base else math.nan

    @property
    def verdict(self) -> str:
        """"GPTQ beats RTN" only when the whole interval of GPTQ - RTN is below 0."""
        if self.paired.decision == BELOW:
            return "GPTQ beats RTN"
        return "RTN beats GPTQ" if self.paired.low > 0 else "within the noise between texts"

    def line(self) -> str:
        better = self.paired.n - self.paired.above
        return (f"INT4 {self.scheme} group {self.group_size}: perplexity vs FP32 RTN {self.rtn - self.base:+.4f}, "
                f"GPTQ {self.gptq - self.base:+.4f} (removes {self.removed:.0%} of RTN's increase); GPTQ - RTN over "
                f"{self.paired.n} pieces {self.paired.mean:+.4f} (95% interval {self.paired.low:+.4f} to "
                f"{self.paired.high:+.4f}, GPTQ better on {better} of {self.paired.n}) -> {self.verdict}")


def gptq_vs_rtn(model: nn.Module, text, calibration, settings: Sequence[tuple[int | str, str]] = ((32, "asym"),),
                n_pieces: int = 4, threads: int | None = 1) -> dict[tuple[int | str, str], GptqComparison]:
    """{(group_size, scheme): GptqComparison} for each INT4 setting: GPTQ calibrated on `calibration` tokens
    [batch, time] (labkit.quant.gptq.gptq) against round-to-nearest, attention and MLP in INT4, measured on
    `text` and on its `n_pieces` pieces (split_text), every model evaluated in float64 (the figures then print
    the same on any CPU). Notebook 03, section 7, and benchmarks/quant_quality.py."""
    if isinstance(settings, (str, bytes)) or not isinstance(settings, Sequence) or not settings:
        fail("settings", settings, "a non-empty sequence of (group_size, scheme) pairs", TypeError)
    for pair in settings:
        if not isinstance(pair, tuple) or len(pair) != 2:
            fail("settings", tuple(settings), "a sequence of (group_size, scheme) pairs", TypeError)
        check_group_size(pair[0]), check_scheme(pair[1])
    pieces = split_text(text, n_pieces)
    out = {}
    f64 = lambda m: copy.deepcopy(m).double()  # noqa: E731
    # Every perplexity in float64: the differences are thousandths, which float32 kernels (AVX2, AVX-512, AMX)
    # move in the fourth decimal, and notebook 03 prints them there.
    with torch_threads(threads, "threads"):
        base = perplexity(f64(model), text)
        for group, scheme in settings:
            qts = gptq(model, calibration, 4, group, scheme, threads=None)
            rtn = f64(quantize_model(model, GPTQ_POLICY, group, scheme)[0])
            calibrated = f64(quantize_model(model, GPTQ_POLICY, group, scheme, qtensors=qts)[0])
            paired = paired_difference([perplexity(calibrated, p) for p in pieces],
                                       [perplexity(rtn, p) for p in pieces])
            out[(group, scheme)] = GptqComparison(group, scheme, base, perplexity(rtn, text),
                                                  perplexity(calibrated, text), paired)
    return out
