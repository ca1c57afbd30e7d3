"""Notebook 03's fact-checks: one function per claim of the course's source material about 4-bit
quantization, each returning a labkit.course.FactCheck (the claim, quoted; the arithmetic
line by line; the verdict; the conditions under which the claim holds), every sentence built from the
measurements passed in, so that the words cannot disagree with the numbers beside them.

The source material is two technical articles: one on deploying large models locally on unified-memory
hardware, one on adapting a trillion-parameter open model on the day of its release. The words in
quotation marks are theirs:

    QUOTE   "4-bit asymmetric quantization: 8:1 compression, 42% lower error than symmetric, 98.7% accuracy
            retained", with mixed precision by layer type: "attention FP16, FFN INT4, embedding INT8"

    asymmetric_error(lower, fair)          the "42% lower error" (section 3)
    compression(results)                   the "8:1 compression" (sections 4 and 6)
    retention(results)                     the "98.7% accuracy retained" (section 6)
    mixed_precision(results, sens)         "attention FP16, FFN INT4, embedding INT8" (section 6)

`results` is a labkit.quant.quality.sweep of labkit.quant.SETTINGS, `sens` a quality.sensitivity.
"""

from __future__ import annotations

import math
from typing import Mapping

from .._checks import check_bool, check_fraction, check_type, fail
from ..course import FactCheck
from .qtensor import quantized_bytes
from .quality import Sensitivity


SOURCE = ("two technical articles, one on deploying large models locally on unified-memory hardware, one on "
          "adapting a trillion-parameter open model on the day of its release")
QUOTE = '"4-bit asymmetric quantization: 8:1 compression, 42% lower error than symmetric, 98.7% accuracy retained"'
INT4, EMB8 = "INT4 asym g32", "INT4 asym g32, emb INT8"
MIXED = "mixed: attn FP16, MLP INT4 g32, emb INT8"


def _names(names) -> str:
    """Setting and data names, quoted (several hold commas of their own), or "none"."""
    return ", ".join(f'"{n}"' for n in names) if names else "none"


def _results(results, *names: str) -> dict:
    check_type("results", results, Mapping, "a dict from labkit.quant.quality.sweep")
    missing = [n for n in names if n not in results]
    if missing:
        fail("results", sorted(results), f"a sweep with the settings {missing}")
    return dict(results)


def asymmetric_error(lower: Mapping[str, float], fair: Mapping[str, tuple[float, float]],
                     target: float = 0.42) -> FactCheck:
    """"42% lower error than symmetric". lower: {data: 1 - MSE(asym) / MSE(sym)} for INT4 in groups of 32;
    fair: {comparison: (MSE of asymmetric, MSE of a fairer baseline)} on TinyLM's MLP weights."""
    check_type("lower", lower, Mapping, "a dict of data name -> fraction")
    check_type("fair", fair, Mapping, "a dict of comparison -> (mse, mse)")
    if not lower or not fair:
        fail("lower and fair", (lower, fair), "non-empty dicts")
    target = check_fraction("target", target)
    rmse = {n: 1 - math.sqrt(1 - d) for n, d in lower.items()}
    holds = [n for n, d in lower.items() if d >= target]
    gains = {n: 1 - a / b for n, (a, b) in fair.items()}
    arithmetic = [f"{n:<22} group 32: {d:4.0%} lower MSE, {rmse[n]:4.0%} lower RMSE -> "
                  f"{'holds' if n in holds else 'does not hold'}" for n, d in lower.items()]
    arithmetic += ["TinyLM MLP weights, fairer baselines:"]
    arithmetic += [f"  {n:<44} {g:4.0%} lower MSE, {1 - math.sqrt(1 - g):4.0%} lower RMSE" for n, g in gains.items()]
    lo, hi = min(gains.values()), max(gains.values())
    judgement = (f"Holds only for {_names(holds)}." if 0 < len(holds) < len(lower) else
                 "Holds for every data set here." if holds else "Holds for none of the data sets here.")
    judgement += f" Against the fairer baselines on TinyLM's MLP weights asymmetric has {lo:.0%}-{hi:.0%} lower MSE."
    return FactCheck(f'Asymmetric 4-bit quantization has "{target:.0%} lower error than symmetric" '
                     "(INT4; error = MSE, RMSE = sqrt(MSE))", arithmetic, judgement,
                     f"the data are skewed or shifted ({_names(holds)}), the error is the MSE (as RMSE it holds for "
                     f"{_names([n for n, r in rmse.items() if r >= target])}) and the symmetric baseline is ours, "
                     f"which leaves code -8 unused: against the fairer baselines the gain is {lo:.0%}-{hi:.0%}.",
                     {"holds": holds, "rmse": rmse, "fair": gains})


def compression(results: Mapping[str, dict], int4: str = INT4, mixed: str = MIXED) -> FactCheck:
    """"8:1 compression": whole-model ratios of the sweep against FP32 and FP16, and what one scale per
    4096-wide row gives (the best case)."""
    results = _results(results, int4, mixed)
    best = max(results, key=lambda n: results[n]["ratio"])
    r_int4, r_best, r_mixed = results[int4]["ratio"], results[best]["ratio"], results[mixed]["ratio"]
    row = 4096 * 4096 * 32 / 8 / quantized_bytes(4096 * 4096, 4, 4096, "sym")
    arithmetic = [f"whole model {int4} {r_int4:.1f}:1 vs FP32, {r_int4 / 2:.1f}:1 vs FP16",
                  f"best setting {best} {r_best:.1f}:1; the mixed policy {r_mixed:.1f}:1",
                  f"one 4096 x 4096 matrix, INT4 per channel: {row:.2f}:1 vs FP32 (section 4)"]
    judgement = ("Holds for TinyLM." if r_best >= 7.95 else
                 f"Does not hold for TinyLM: its best setting reaches {r_best:.1f}:1 ({best}); scales, zero points "
                 "and its short rows cost bits.")
    return FactCheck('INT4 gives "8:1 compression"', arithmetic, judgement,
                     f"one scale per long row and FP32 as the baseline: a 4096-wide matrix per channel reaches "
                     f"{row:.2f}:1 against FP32, {row / 2:.2f}:1 against FP16.", {"best": best, "row": row})


def retention(results: Mapping[str, dict], target: float = 0.987) -> FactCheck:
    """"98.7% accuracy retained", judged for each INT4 and mixed setting of the sweep by its paired 95%
    interval (quality.Retention.decide)."""
    results = _results(results)
    target = check_fraction("target", target)
    decided = {n: r["retention"].decide(target) for n, r in results.items() if n.startswith(("INT4", "mixed"))}
    if not decided:
        fail("results", sorted(results), "a sweep with INT4 or mixed settings")
    arithmetic = [f"{n:<40} {results[n]['retained']:6.1%} ({results[n]['low']:.1%}-{results[n]['high']:.1%}) -> {d}"
                  for n, d in decided.items()]
    by = {k: [n for n, d in decided.items() if d.startswith(k)] for k in ("reached", "not reached", "cannot tell")}
    widths = [100 * (results[n]["high"] - results[n]["low"]) for n in decided]
    tasks = len(next(iter(results.values()))["ok"])
    return FactCheck(f'Asymmetric INT4 keeps "{target:.1%} accuracy retained"', arithmetic,
                     f"Reached by {_names(by['reached'])}; not reached by {_names(by['not reached'])}; "
                     f"undecided for {_names(by['cannot tell'])}.",
                     f"a setting's whole 95% interval lies above {target:.1%}: on {tasks} tasks the intervals are "
                     f"{min(widths):.1f}-{max(widths):.1f} points wide.", {"decided": decided})


def _above(a: tuple[float, ...], b: tuple[float, ...]) -> int:
    return sum(x > y for x, y in zip(a, b))


def mixed_precision(results: Mapping[str, dict], sens: Mapping[str, Sensitivity], tied: bool = True,
                    emb8: str = EMB8, mixed: str = MIXED) -> FactCheck:
    """"attention FP16, FFN INT4, embedding INT8": the sensitivity of each layer type per weight, on the
    whole text and on each piece (the noise between texts), and what attention in FP16 buys."""
    results = _results(results, emb8, mixed)
    check_type("sens", sens, Mapping, "a dict from labkit.quant.quality.sensitivity")
    if not {"embedding", "attention", "mlp"} <= set(sens):
        fail("sens", sorted(sens), "the sensitivity of 'embedding', 'attention' and 'mlp'")
    check_bool("tied", tied)
    base = next(iter(results.values()))["ppl"]
    emb, attn, mlp = sens["embedding"], sens["attention"], sens["mlp"]
    n = len(attn.piece_deltas)
    k_attn = _above(attn.piece_per_weight, mlp.piece_per_weight)
    k_emb = sum(e > max(a, m) for e, a, m in zip(emb.piece_per_weight, attn.piece_per_weight, mlp.piece_per_weight))
    moves = max(max(s.piece_per_weight) - min(s.piece_per_weight) for s in (attn, mlp))
    gap = abs(attn.per_weight - mlp.per_weight)
    e8, mx = results[emb8], results[mixed]
    gain, memory = e8["ppl"] - mx["ppl"], e8["ratio"] / mx["ratio"]
    arithmetic = [
        "perplexity increase per weight, one type in INT4 (whole text): "
        + ", ".join(f"{k} {s.per_weight:+.3g}" for k, s in sens.items()),
        f"on each of {n} pieces of the text: attention above the MLP on {k_attn} of {n}, the embedding above both "
        f"on {k_emb} of {n}; attention's and the MLP's figures move by up to {moves:.2g} from piece to piece, "
        f"{moves / gap if gap else math.inf:.0f}x the {gap:.2g} between them on the whole text",
        f"mixed policy {mx['ppl'] - base:+.4f} ppl at {mx['ratio']:.1f}:1; INT4 everywhere + emb INT8 "
        f"{e8['ppl'] - base:+.4f} ppl at {e8['ratio']:.1f}:1"]
    emb_verdict = (f'"embedding INT8" is supported: per weight the embedding is '
                   f"{emb.per_weight / max(attn.per_weight, mlp.per_weight):.0f}x as sensitive as the others, on every "
                   "piece" if k_emb == n else f"the embedding is the most sensitive on only {k_emb} of {n} pieces")
    attn_verdict = (f"attention is more sensitive per weight than the MLP on every piece ({attn.per_weight:+.3g} "
                    f"against {mlp.per_weight:+.3g})" if k_attn == n else
                    f"attention is less sensitive per weight than the MLP on every piece" if k_attn == 0 else
                    f"whether attention is more sensitive per weight than the MLP this text cannot tell "
                    f"({attn.per_weight:+.3g} against {mlp.per_weight:+.3g}, higher on {k_attn} of {n} pieces)")
    return FactCheck('Mixed precision by layer type: "attention FP16, FFN INT4, embedding INT8"', arithmetic,
                     f"{emb_verdict[0].upper()}{emb_verdict[1:]}; {attn_verdict}; attention in FP16 buys "
                     f"{gain:.4f} perplexity for {memory:.1f}x the memory.",
                     ("the embedding writes the logits (it is tied to the output layer)" if tied else
                      "the embedding is the most sensitive type") +
                     f"; attention in FP16 pays only if {gain:.4f} perplexity is worth {memory:.1f}x the memory.",
                     {"attention_above": k_attn, "embedding_above": k_emb, "moves": moves, "gap": gap, "gain": gain})
