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
    compute_density(results, models)       that table "triples compute density while limiting accuracy loss
                                           to <1%" (section 6)

`results` is a labkit.quant.quality.sweep of labkit.quant.SETTINGS, `sens` a quality.sensitivity.
"""

from __future__ import annotations

import math
from typing import Mapping

from .._checks import check_bool, check_fraction, check_number, check_positive, check_type, fail
from ..course import FactCheck
from ..tinylm import linear_layers
from .qtensor import quantized_bytes
from .noise import ABOVE, BELOW, paired_difference
from .policy import SETTINGS, resolve_policy
from .quality import Sensitivity


SOURCE = ("two technical articles, one on deploying large models locally on unified-memory hardware, one on "
          "adapting a trillion-parameter open model on the day of its release")
QUOTE = '"4-bit asymmetric quantization: 8:1 compression, 42% lower error than symmetric, 98.7% accuracy retained"'
INT4, EMB8 = "INT4 asym g32", "INT4 asym g32, emb INT8"
MIXED = "mixed: attn FP16, MLP INT4 g32, emb INT8"


def _names(names) -> str:
    """Setting and data names, quoted (several hold commas of their own), or "none"."""
    return ", ".join(f'"{n}"' for n in names) if names else "none"


def _results(results, *names: str, keys: tuple[str, ...] = ()) -> dict:
    """results: a sweep holding the settings `names`, each row a dict with `keys`."""
    check_type("results", results, Mapping, "a dict from labkit.quant.quality.sweep")
    missing = [n for n in names if n not in results]
    if missing:
        fail("results", sorted(results), f"a sweep with the settings {missing}")
    for name, r in results.items():
        if not isinstance(r, Mapping) or not set(keys) <= set(r):
            fail(f"results[{name!r}]", r if not isinstance(r, Mapping) else sorted(r),
                 f"a row of quality.sweep (with {list(keys)})", TypeError if not isinstance(r, Mapping) else ValueError)
    return dict(results)


def asymmetric_error(lower: Mapping[str, Mapping[int | str, float]], fair: Mapping[str, tuple[float, float]],
                     target: float = 0.42, group: int | str = 32) -> FactCheck:
    """"42% lower error than symmetric". lower: {data: {group size: 1 - MSE(asym) / MSE(sym)}} for INT4, with
    `group` (the headline group size) among the group sizes of every data set; fair: {comparison: (MSE of
    asymmetric, MSE of a fairer baseline)} on TinyLM's MLP weights. The verdict is read at `group`; the other
    group sizes say for which data a change of group size turns it."""
    check_type("lower", lower, Mapping, "a dict of data name -> {group size: fraction}")
    check_type("fair", fair, Mapping, "a dict of comparison -> (mse, mse)")
    if not lower or not fair:
        fail("lower and fair", (lower, fair), "non-empty dicts")
    target = check_fraction("target", target)
    for name, by_group in lower.items():
        check_type(f"lower[{name!r}]", by_group, Mapping, "a dict of group size -> fraction")
        if group not in by_group:
            fail(f"lower[{name!r}]", dict(by_group), f"a fraction for the group size {group!r}")
        for g, d in by_group.items():  # 1 - MSE(asym) / MSE(sym): at most 1, negative when asymmetric is worse
            check_number(f"lower[{name!r}][{g!r}]", d, high=1.0)
    for name, pair in fair.items():
        if not isinstance(pair, tuple) or len(pair) != 2:
            fail(f"fair[{name!r}]", pair, "a pair (mse, mse)", TypeError)
        check_positive(f"fair[{name!r}][0]", pair[0], allow_zero=True)
        check_positive(f"fair[{name!r}][1]", pair[1])
    at = {n: d[group] for n, d in lower.items()}
    rmse = {n: 1 - math.sqrt(1 - d) for n, d in at.items()}
    holds = [n for n, d in at.items() if d >= target]
    turns = {n: [g for g, d in lower[n].items() if d >= target] for n in at if n not in holds}
    turns = {n: gs for n, gs in turns.items() if gs}
    gains = {n: 1 - a / b for n, (a, b) in fair.items()}
    others = lambda n: ", ".join(f"group {g}: {d:.0%}" for g, d in lower[n].items() if g != group)  # noqa: E731
    arithmetic = [f"{n:<26} group {group}: {d:4.0%} lower MSE, {rmse[n]:4.0%} lower RMSE -> "
                  f"{'holds' if n in holds else 'does not hold'} ({others(n)})" for n, d in at.items()]
    arithmetic += ["TinyLM MLP weights, fairer baselines:"]
    arithmetic += [f"  {n:<44} {g:4.0%} lower MSE, {1 - math.sqrt(1 - g):4.0%} lower RMSE" for n, g in gains.items()]
    lo, hi = min(gains.values()), max(gains.values())
    judgement = (f"At group {group} holds only for {_names(holds)}." if 0 < len(holds) < len(at) else
                 f"At group {group} holds for every data set here." if holds else
                 f"At group {group} holds for none of the data sets here.")
    if turns:
        judgement += " At other group sizes it also holds for " + "; ".join(
            f"{_names([n])} (" + ", ".join(f"{lower[n][g]:.0%} at group {g}" for g in gs) + ")"
            for n, gs in turns.items()) + "."
    judgement += f" Against the fairer baselines on TinyLM's MLP weights asymmetric has {lo:.0%}-{hi:.0%} lower MSE."
    turned = "; ".join(f"{_names([n])} at group {' or '.join(map(str, gs))}" for n, gs in turns.items())
    return FactCheck(f'Asymmetric 4-bit quantization has "{target:.0%} lower error than symmetric" '
                     "(INT4; error = MSE, RMSE = sqrt(MSE))", arithmetic, judgement,
                     f"the data are those it holds for at group {group} ({_names(holds)})"
                     + (f", or with other groups {turned}" if turns else "")
                     + f"; the error is the MSE (as RMSE it holds at group {group} for "
                     f"{_names([n for n, r in rmse.items() if r >= target])}) and the symmetric baseline is ours, "
                     f"which leaves code -8 unused: against the fairer baselines the gain is {lo:.0%}-{hi:.0%}.",
                     {"holds": holds, "turns": turns, "rmse": rmse, "fair": gains})


def compression(results: Mapping[str, dict], int4: str = INT4, mixed: str = MIXED) -> FactCheck:
    """"8:1 compression": whole-model ratios of the sweep against FP32 and FP16, and what one scale per
    4096-wide row gives (the best case)."""
    results = _results(results, int4, mixed, keys=("ratio",))
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
    results = _results(results, keys=("retention", "retained", "low", "high", "ok"))
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


def mixed_precision(results: Mapping[str, dict], sens: Mapping[str, Sensitivity], tied: bool = True,
                    emb8: str = EMB8, mixed: str = MIXED) -> FactCheck:
    """"attention FP16, FFN INT4, embedding INT8": the sensitivity of each layer type per weight, on the
    whole text and on each piece (the noise between texts), and what attention in FP16 buys."""
    results = _results(results, emb8, mixed, keys=("ppl", "ratio"))
    check_type("sens", sens, Mapping, "a dict from labkit.quant.quality.sensitivity")
    if not {"embedding", "attention", "mlp"} <= set(sens):
        fail("sens", sorted(sens), "the sensitivity of 'embedding', 'attention' and 'mlp'")
    for kind, s in sens.items():
        check_type(f"sens[{kind!r}]", s, Sensitivity, "a labkit.quant.quality.Sensitivity")
    check_bool("tied", tied)
    base = next(iter(results.values()))["ppl"]
    emb, attn, mlp = sens["embedding"], sens["attention"], sens["mlp"]
    pair = paired_difference(attn.piece_per_weight, mlp.piece_per_weight)  # attention - MLP, piece by piece
    top = [max(a, m) for a, m in zip(attn.piece_per_weight, mlp.piece_per_weight)]
    k_emb = sum(e > t for e, t in zip(emb.piece_per_weight, top))
    # the embedding's figures are ~100x the others' and vary as much between pieces: it is ranked first only
    # if its smallest figure on any piece is above the largest of the others on any piece (no overlap at all)
    others = attn.piece_per_weight + mlp.piece_per_weight
    emb_low, others_high = min(emb.piece_per_weight), max(others)
    separated = emb_low > max(others_high, 0)
    e8, mx = results[emb8], results[mixed]
    gain, memory = e8["ppl"] - mx["ppl"], e8["ratio"] / mx["ratio"]
    a, m, n = attn.per_weight, mlp.per_weight, pair.n
    ratio = f"{a / m:.1f}x" if m > 0 and a > 0 else "of opposite signs or zero"
    arithmetic = [
        "perplexity increase per weight, one type in INT4 (whole text): "
        + ", ".join(f"{k} {s.per_weight:+.3g}" for k, s in sens.items()),
        f"attention - MLP per weight, paired over {n} pieces of the text: {pair.describe()}; on the whole text "
        f"{a:+.4f} against {m:+.4f} ({ratio})",
        f"embedding per weight on the pieces: {emb_low:+.3g} to {max(emb.piece_per_weight):+.3g}, above both "
        f"others on {k_emb} of {n}; attention's and the MLP's: {min(others):+.3g} "
        f"to {others_high:+.3g}",
        f"mixed policy {mx['ppl'] - base:+.4f} ppl at {mx['ratio']:.1f}:1; INT4 everywhere + emb INT8 "
        f"{e8['ppl'] - base:+.4f} ppl at {e8['ratio']:.1f}:1"]
    emb_verdict = (f'"embedding INT8" is supported: per weight the embedding is {emb.per_weight / max(a, m):.0f}x as '
                   f"sensitive as the others on the whole text, and its smallest figure on any piece is "
                   f"{emb_low / others_high:.0f}x the largest of theirs" if separated else
                   f"that the embedding is the most sensitive type this text cannot tell (above both on {k_emb} of "
                   f"{n} pieces; its figures on the pieces overlap theirs)")
    interval = f"paired difference over {n} pieces {pair.mean:+.2g}, 95% interval {pair.low:+.2g} to {pair.high:+.2g}"
    attn_verdict = (f"attention is more sensitive per weight than the MLP ({a:+.3g} against {m:+.3g}, {ratio}; "
                    f"{interval})" if pair.decision == ABOVE else
                    f"attention is less sensitive per weight than the MLP ({a:+.3g} against {m:+.3g}; {interval})"
                    if pair.decision == BELOW else
                    f"whether attention is more sensitive per weight than the MLP this text cannot tell: on the whole "
                    f"text {a:+.3g} against {m:+.3g} ({ratio}), but the {interval}, includes 0")
    return FactCheck('Mixed precision by layer type: "attention FP16, FFN INT4, embedding INT8"', arithmetic,
                     f"{emb_verdict[0].upper()}{emb_verdict[1:]}; {attn_verdict}; attention in FP16 buys "
                     f"{gain:.4f} perplexity for {memory:.1f}x the memory.",
                     ("the embedding writes the logits (it is tied to the output layer)" if tied else
                      "the embedding is the most sensitive type") +
                     f"; attention in FP16 pays only if {gain:.4f} perplexity is worth {memory:.1f}x the memory.",
                     {"attention_vs_mlp": pair, "attention_above": pair.above, "embedding_above": k_emb,
                      "embedding_separated": separated, "gain": gain})


# Tensor-core rates relative to FP16, NVIDIA A100 Tensor Core GPU datasheet (dense): FP16/BF16 312 TFLOPS,
# INT8 624 TOPS, INT4 1,248 TOPS (TF32, for an FP32 layer, 156). The last NVIDIA part with INT4 tensor cores.
TENSOR_RATE = {"fp32": 0.5, "fp16": 1.0, "bf16": 1.0, "int8": 2.0, "int4": 4.0}
MATMUL_TYPES = ("attention", "mlp", "head")  # what a token's matmuls read: the embedding is a row lookup


def _bits(precision: str, group_len: int, scheme: str) -> float:
    """Bits per weight of one precision: codes plus fp16 scales (and zeros) per `group_len` weights."""
    if precision in ("int8", "int4"):
        n = 2 ** 20 * group_len
        return 8 * quantized_bytes(n, int(precision[3:]), group_len, scheme) / n
    return 32.0 if precision == "fp32" else 16.0


def compute_density(results: Mapping[str, dict], models: Mapping[str, object], mixed: str = MIXED,
                    target: float = 3.0, loss: float = 0.01) -> FactCheck:
    """"triples compute density while limiting accuracy loss to <1%", for the mixed policy `mixed` (a setting
    of labkit.quant.SETTINGS, measured in `results`, a quality.sweep whose first row is FP32).

    Density, for each model of `models` ({name: TinyLMConfig or labkit.specs.ModelSpec of a dense model}),
    per decoded token against FP16: the bytes its matmuls read (attention, MLP and output layer at the
    policy's precisions, scales and zeros included) and the tensor-core FLOP/s its matmuls run at (INT8 2x,
    INT4 4x FP16: TENSOR_RATE), with attention in FP16 as Amdahl's ceiling, 1 / attention's share.
    Accuracy: the mixed setting's paired 95% retention interval against 1 - loss."""
    results = _results(results, mixed, keys=("ratio", "ppl", "retention", "retained", "low", "high"))
    check_type("models", models, Mapping, "a dict of name -> TinyLMConfig or ModelSpec")
    if not models:
        fail("models", models, "a non-empty dict of name -> TinyLMConfig or ModelSpec")
    setting = {s.name: s for s in SETTINGS}.get(mixed)
    if setting is None or not isinstance(setting.group_size, int):
        fail("mixed", mixed, "the name of a setting of labkit.quant.SETTINGS with an int group size (a mixed one)")
    target = check_number("target", target, low=1.0, low_open=True)
    loss = check_fraction("loss", loss, allow_one=False)
    prec = resolve_policy(setting.policy)
    bits = {t: _bits(prec[t], setting.group_size, setting.scheme) for t in MATMUL_TYPES}
    if prec["attention"] == prec["mlp"]:
        fail("mixed", mixed, "a setting of labkit.quant.SETTINGS that gives attention and the MLP different "
             "precisions (a mixed one)")
    density = {}
    for name, cfg in models.items():
        weights = dict.fromkeys(MATMUL_TYPES, 0)
        for e in linear_layers(cfg):  # TypeError unless a config with TinyLM's fields
            if e.layer_type in weights:
                weights[e.layer_type] += e.shape[0] * e.shape[1]
        share = {t: w / sum(weights.values()) for t, w in weights.items()}
        density[name] = {"share": share, "bytes": 16 / sum(share[t] * bits[t] for t in share),
                         "flops": 1 / sum(share[t] / TENSOR_RATE[prec[t]] for t in share),
                         "ceiling": 1 / share["attention"]}
    first = next(iter(results))
    mx = results[mixed]
    decided = mx["retention"].decide(1 - loss)
    fp16 = mx["ratio"] / 2
    ppl = mx["ppl"] / results[first]["ppl"] - 1
    mlp_rate = TENSOR_RATE[prec["mlp"]] / TENSOR_RATE[prec["attention"]]
    # the largest attention share that still triples, with the rest at the MLP's bits / rate
    attn_bytes = (16 / target - bits["mlp"]) / (bits["attention"] - bits["mlp"])
    attn_flops = (1 / target - 1 / mlp_rate) / (1 - 1 / mlp_rate)
    policy = ", ".join(f"{t} {prec[t].upper()} ({bits[t]:g} bits)" for t in MATMUL_TYPES)
    arithmetic = [f"{mixed}: {policy}; a token's matmuls against FP16, FLOP/s at A100's tensor-core rates "
                  f"(INT8 2x, INT4 4x FP16)",
                  f"TinyLM as measured: {mx['ratio']:.1f}:1 vs FP32 = {fp16:.2f}:1 vs FP16 (all the weights stored)"]
    arithmetic += [f"{n:<12} attention {d['share']['attention']:4.0%} mlp {d['share']['mlp']:4.0%} head "
                   f"{d['share']['head']:4.0%} of the matmul weights: bytes {d['bytes']:.2f}x fewer, FLOP/s "
                   f"{d['flops']:.2f}x; ceiling with attention in FP16 {d['ceiling']:.1f}x" for n, d in density.items()]
    arithmetic += [f"{target:g}x needs attention at most {max(attn_bytes, 0):.1%} of the matmul weights (bytes) or "
                   f"{max(attn_flops, 0):.1%} (FLOP/s)",
                   f"accuracy: {mixed} retains {mx['retained']:.1%} of FP32's right answers (95% interval "
                   f"{mx['low']:.1%}-{mx['high']:.1%}) -> loss < {loss:.0%} (retention >= {1 - loss:.0%}): {decided}; "
                   f"perplexity {ppl:+.2%}"]
    best = max(max(d["bytes"], d["flops"]) for d in density.values())
    tripled = [n for n, d in density.items() if max(d["bytes"], d["flops"]) >= target]
    half1 = (f"The density half does not hold: against FP16 the policy reaches at most {best:.2f}x "
             f"({_names(list(density))}), because attention stays in FP16" if not tripled else
             f"The density half holds for {_names(tripled)} (up to {best:.2f}x against FP16)")
    half2 = ("the accuracy half holds on TinyLM (the whole interval is above "
             f"{1 - loss:.0%})" if decided == "reached" else
             f"the accuracy half does not hold on TinyLM (the whole interval is below {1 - loss:.0%})"
             if decided == "not reached" else f"the accuracy half this test set cannot decide ({1 - loss:.0%} is "
             f"inside the interval)")
    return FactCheck(f'Mixed precision "triples compute density while limiting accuracy loss to <{loss:.0%}"',
                     arithmetic, f"{half1}; {half2}.",
                     f"the baseline is FP32 ({mx['ratio']:.1f}:1 in bytes on TinyLM), or attention is a small "
                     f"share of the matmuls (at most {max(attn_bytes, 0):.1%} for bytes, {max(attn_flops, 0):.1%} "
                     f"for FLOP/s), or attention too runs in INT8 or INT4.",
                     {"density": density, "fp16": fp16, "decided": decided, "ppl": ppl, "tripled": tripled,
                      "attention_max": (attn_bytes, attn_flops)})
