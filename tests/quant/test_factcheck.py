"""Notebook 03's fact-checks on fixed measurements: each verdict is computed from the numbers passed in,
so changing a number changes the words, and the claims are quoted with their source named once."""
import pytest

from labkit.quant import factcheck as fc
from labkit.quant.quality import Retention, Sensitivity

from ..refusals import assert_refused


def row(ratio, ppl, gained=0, lost=0, base=450, tasks=600):
    half = 1.96 * (gained + lost) ** 0.5
    r = Retention(base + gained - lost, base, gained, lost, 1 + (gained - lost - half) / base,
                  1 + (gained - lost + half) / base)
    return {"ratio": ratio, "ppl": ppl, "retention": r, "retained": r.retained, "low": r.low, "high": r.high,
            "ok": [True] * tasks}


# notebook 03's sweep, as stored (8 KiB of test text, 600 tasks)
RESULTS = {"FP32": row(1.0, 3.5725), "INT4 sym channel": row(7.7, 3.6180, 9, 31),
           "INT4 asym g32": row(6.4, 3.5908, 24, 18), "INT4 asym g64": row(7.1, 3.5839, 16, 11),
           fc.EMB8: row(6.2, 3.5751, 7, 7), fc.MIXED: row(4.1, 3.5744, 5, 1)}
# one type at a time in INT4: whole-text increase and its four pieces (notebook 03, 2026-12-01)
SENS = {"embedding": Sensitivity("embedding", "int4", 0.04, 0.0187, (0.0249, 0.0080, 0.0357, 0.0087)),
        "attention": Sensitivity("attention", "int4", 0.24, 0.00082, (-0.00113, 0.0017, 0.00206, 0.00077)),
        "mlp": Sensitivity("mlp", "int4", 0.72, 0.00194, (0.0046, -0.00043, -0.00014, 0.00367))}


def test_the_source_and_the_claims_are_quoted():
    assert fc.SOURCE.startswith("two technical articles, one on deploying large models locally on unified-memory")
    assert "trillion-parameter open model on the day of its release" in fc.SOURCE
    assert fc.QUOTE == ('"4-bit asymmetric quantization: 8:1 compression, 42% lower error than symmetric, 98.7% '
                        'accuracy retained"')
    assert fc.compression(RESULTS).claim == 'INT4 gives "8:1 compression"'


def test_compression_reads_the_best_setting():
    c = fc.compression(RESULTS)
    assert c.judgement == ('Does not hold for TinyLM: its best setting reaches 7.7:1 (INT4 sym channel); scales, '
                           "zero points and its short rows cost bits.")
    assert c.arithmetic[0] == "whole model INT4 asym g32 6.4:1 vs FP32, 3.2:1 vs FP16"
    assert c.numbers["row"] == pytest.approx(32 * 4096 / (4 * 4096 + 16))  # one fp16 scale per 4096-wide row
    assert fc.compression({**RESULTS, "ideal": row(7.99, 3.6)}).judgement == "Holds for TinyLM."


def test_retention_lists_every_setting_by_its_interval():
    c = fc.retention(RESULTS)
    assert c.judgement == ('Reached by "INT4 asym g64", "mixed: attn FP16, MLP INT4 g32, emb INT8"; not reached by '
                           '"INT4 sym channel"; undecided for "INT4 asym g32", "INT4 asym g32, emb INT8".')
    assert c.holds_if == ("a setting's whole 95% interval lies above 98.7%: on 600 tasks the intervals are 2.1-5.6 "
                          "points wide.")
    assert fc.retention(RESULTS, target=0.9).judgement.startswith('Reached by "INT4 sym channel", "INT4 asym g32"')


T975 = {3: 3.182446, 7: 2.364624}  # Student's t, 97.5% quantile, from a printed table (3 and 7 degrees of freedom)


def paired(a, b):
    """The paired differences' mean and 95% interval, from the textbook formula."""
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    sd = (sum((v - mean) ** 2 for v in d) / (len(d) - 1)) ** 0.5
    half = T975[len(d) - 1] * sd / len(d) ** 0.5
    return mean, mean - half, mean + half


def test_mixed_precision_states_the_noise_between_texts():
    c = fc.mixed_precision(RESULTS, SENS)
    assert c.arithmetic[0] == ("perplexity increase per weight, one type in INT4 (whole text): embedding +0.468, "
                               "attention +0.00342, mlp +0.00269")
    mean, low, high = paired(SENS["attention"].piece_per_weight, SENS["mlp"].piece_per_weight)
    assert low < 0 < high  # the notebook's 8 KiB: the interval holds 0
    assert c.arithmetic[1] == (f"attention - MLP per weight, paired over 4 pieces of the text: {mean:+.4f} (95% "
                               f"interval {low:+.4f} to {high:+.4f}, above on 2 of 4 pieces); on the whole text "
                               "+0.0034 against +0.0027 (1.3x)")
    # the embedding's smallest piece (0.0080 / 0.04 = +0.2) against the others' largest (0.00206 / 0.24 = +0.0086)
    assert c.judgement == ('"embedding INT8" is supported: per weight the embedding is 137x as sensitive as the '
                           "others on the whole text, and its smallest figure on any piece is 23x the largest of "
                           "theirs; whether attention is more sensitive per weight than "
                           "the MLP this text cannot tell: on the whole text +0.00342 against +0.00269 (1.3x), but "
                           f"the paired difference over 4 pieces {mean:+.2g}, 95% interval {low:+.2g} to {high:+.2g}, "
                           "includes 0; attention in FP16 buys 0.0007 perplexity for 1.5x the memory.")
    assert c.numbers["attention_vs_mlp"].decision == "cannot tell"


def test_attention_is_called_more_sensitive_only_when_the_interval_is_above_zero():
    # 64 KiB in 8 pieces, shaped like benchmarks/RESULTS.md: attention above on 7 of 8, and the whole interval above 0
    attn = (0.0062, 0.0041, 0.0075, 0.0049, -0.0003, 0.0068, 0.0057, 0.0071)
    mlp = (0.0021, 0.0030, 0.0019, 0.0028, 0.0012, 0.0031, 0.0018, 0.0025)
    sens = {"embedding": Sensitivity("embedding", "int4", 0.04, 0.0156, (0.02,) * 8),
            "attention": Sensitivity("attention", "int4", 1.0, 0.0056, attn),
            "mlp": Sensitivity("mlp", "int4", 1.0, 0.0024, mlp)}
    c = fc.mixed_precision(RESULTS, sens)
    mean, low, high = paired(attn, mlp)
    assert low > 0
    assert (f"attention is more sensitive per weight than the MLP (+0.0056 against +0.0024, 2.3x; paired difference "
            f"over 8 pieces {mean:+.2g}, 95% interval {low:+.2g} to {high:+.2g})") in c.judgement
    assert c.numbers["attention_above"] == 7
    below = {**SENS, "attention": Sensitivity("attention", "int4", 0.24, -0.001, (-0.01, -0.012, -0.009, -0.011))}
    assert "attention is less sensitive per weight than the MLP" in fc.mixed_precision(RESULTS, below).judgement
    # above on every piece is not enough: one piece far from the others widens the interval past 0
    spiky = {**SENS, "attention": Sensitivity("attention", "int4", 1.0, 0.01, (0.0051, 0.0005, 0.0001, 0.0551)),
             "mlp": Sensitivity("mlp", "int4", 1.0, 0.0, (0.0041, 0.0, -0.0009, 0.0041))}
    c = fc.mixed_precision(RESULTS, spiky)
    assert c.numbers["attention_above"] == 4 and "this text cannot tell" in c.judgement
    flat = {**SENS, "embedding": Sensitivity("embedding", "int4", 0.04, 0.0001, (0.0001, 0.0004, 0.0, -0.0002))}
    assert fc.mixed_precision(RESULTS, flat).judgement.startswith(
        "That the embedding is the most sensitive type this text cannot tell (above both on 1 of 4 pieces; its figures "
        "on the pieces overlap theirs)")


def test_asymmetric_error_reads_each_data_set_at_each_group_size():
    lower = {"Gaussian N(0,1)": {16: 0.33, 32: 0.30}, "uniform [0, 1)": {16: 0.80, 32: 0.79},
             "Laplace (symmetric, heavy tails)": {16: 0.43, 32: 0.39}, "silu(gate) output": {16: 0.64, 32: 0.66}}
    fair = {"asym g32 vs Q4_0": (0.89, 1.0), "asym g64 vs sym g32, equal bits": (0.88, 1.0)}
    c = fc.asymmetric_error(lower, fair)
    assert c.arithmetic[0] == ("Gaussian N(0,1)            group 32:  30% lower MSE,  16% lower RMSE -> does not hold "
                               "(group 16: 33%)")
    assert c.judgement == ('At group 32 holds only for "uniform [0, 1)", "silu(gate) output". At other group sizes it '
                           'also holds for "Laplace (symmetric, heavy tails)" (43% at group 16). Against the fairer '
                           "baselines on TinyLM's MLP weights asymmetric has 11%-12% lower MSE.")
    assert c.holds_if.startswith('the data are those it holds for at group 32 ("uniform [0, 1)", "silu(gate) output"), '
                                 'or with other groups "Laplace (symmetric, heavy tails)" at group 16; ')
    assert 'as RMSE it holds at group 32 for "uniform [0, 1)")' in c.holds_if
    assert c.numbers["turns"] == {"Laplace (symmetric, heavy tails)": [16]}
    every = fc.asymmetric_error({"x": {32: 0.5}}, fair)
    assert every.judgement.startswith("At group 32 holds for every data set here.")
    assert_refused(lambda: fc.asymmetric_error({"x": {16: 0.5}}, fair), ValueError, "lower['x']", {16: 0.5},
                   "a fraction for the group size 32")


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match=r"results must be a sweep with the settings \['mixed: attn FP16"):
        fc.compression({"FP32": RESULTS["FP32"], "INT4 asym g32": RESULTS["INT4 asym g32"]})
    with pytest.raises(TypeError, match="results must be a dict from labkit.quant.quality.sweep"):
        fc.retention([1, 2])
    assert_refused(lambda: fc.retention(RESULTS, target=98.7), ValueError, "target", 98.7, "in (0, 1]")
    with pytest.raises(ValueError, match="sens must be the sensitivity of 'embedding', 'attention' and 'mlp'"):
        fc.mixed_precision(RESULTS, {"mlp": SENS["mlp"]})


def test_rows_and_measurements_of_the_wrong_kind_are_refused_by_name():
    assert_refused(lambda: fc.compression({**RESULTS, "INT4 asym g32": {}}), ValueError, "results['INT4 asym g32']",
                   [], "a row of quality.sweep (with ['ratio'])")
    assert_refused(lambda: fc.retention({**RESULTS, "INT4 x": 1}), TypeError, "results['INT4 x']", 1,
                   "a row of quality.sweep")
    assert_refused(lambda: fc.mixed_precision(RESULTS, {**SENS, "mlp": 1}), TypeError, "sens['mlp']", 1,
                   "a labkit.quant.quality.Sensitivity")
    fair = {"a": (1.0, 2.0)}
    assert_refused(lambda: fc.asymmetric_error({"x": {32: float("nan")}}, fair), ValueError, "lower['x'][32]",
                   float("nan"), "a finite number <= 1")
    assert_refused(lambda: fc.asymmetric_error({"x": {32: 2.0}}, fair), ValueError, "lower['x'][32]", 2.0, "<= 1")
    assert_refused(lambda: fc.asymmetric_error({"x": {32: "0.5"}}, fair), TypeError, "lower['x'][32]", "0.5",
                   "a finite number")
    assert_refused(lambda: fc.asymmetric_error({"x": {32: 0.5}}, {"a": 1}), TypeError, "fair['a']", 1, "a pair")
    assert_refused(lambda: fc.asymmetric_error({"x": {32: 0.5}}, {"a": (1.0, 0.0)}), ValueError, "fair['a'][1]", 0.0,
                   "a positive finite number")


def density_by_hand(attention: int, mlp: int, head: int) -> tuple[float, float]:
    """Bytes and tensor-core FLOP/s against FP16 of attention FP16 (16 bits), MLP INT4 g32 asym (4 + 32/32 = 5
    bits) and the output layer INT8 g32 asym (9 bits), at A100's rates (INT8 2x, INT4 4x FP16)."""
    total = attention + mlp + head
    a, m, h = attention / total, mlp / total, head / total
    return 16 / (16 * a + 5 * m + 9 * h), 1 / (a + m / 4 + h / 2)


def test_compute_density_against_the_arithmetic_by_hand():
    from labkit.specs import model
    from labkit.tinylm import TinyLMConfig, param_counts
    cfg = TinyLMConfig()
    pc = param_counts(cfg)  # tied: the output layer is the embedding matrix
    c = fc.compute_density(RESULTS, {"TinyLM": cfg, "Llama-2-7B": model("llama-2-7b")})
    d = c.numbers["density"]
    assert (d["TinyLM"]["bytes"], d["TinyLM"]["flops"]) == pytest.approx(
        density_by_hand(pc["attention"], pc["mlp"], pc["embedding"]))
    # Llama-2-7B (Touvron et al., 2023): 32 layers, d_model 4096, d_ff 11008, 32,000 tokens, untied output layer
    llama = density_by_hand(32 * 4 * 4096 ** 2, 32 * 3 * 4096 * 11008, 32000 * 4096)
    assert (d["Llama-2-7B"]["bytes"], d["Llama-2-7B"]["flops"]) == pytest.approx(llama)
    assert d["Llama-2-7B"]["ceiling"] == pytest.approx((32 * 4 * 4096 ** 2 + 32 * 3 * 4096 * 11008 + 32000 * 4096)
                                                       / (32 * 4 * 4096 ** 2))
    assert c.numbers["fp16"] == 4.1 / 2 and c.numbers["decided"] == "reached" and c.numbers["tripled"] == []
    # 3x in bytes needs 16 a + 5 (1 - a) <= 16 / 3; in FLOP/s a + (1 - a) / 4 <= 1 / 3
    assert c.numbers["attention_max"] == pytest.approx(((16 / 3 - 5) / 11, (1 / 3 - 1 / 4) / (3 / 4)))
    most = max(max(llama), *density_by_hand(pc["attention"], pc["mlp"], pc["embedding"]))
    assert c.judgement.startswith("The density half does not hold: against FP16 the policy reaches at most "
                                  f"{most:.2f}x")
    assert c.judgement.endswith("the accuracy half holds on TinyLM (the whole interval is above 99%).")
    assert c.arithmetic[-1].startswith(f"accuracy: {fc.MIXED} retains 100.9% of FP32's right answers (95% interval "
                                       "99.8%-102.0%) -> loss < 1% (retention >= 99%): reached")


def test_compute_density_turns_with_the_model_and_the_interval():
    from labkit.tinylm import TinyLMConfig
    thin = TinyLMConfig(d_model=64, n_heads=1, n_kv_heads=1, d_ff=4096)  # attention about 2% of the matmuls
    c = fc.compute_density(RESULTS, {"thin attention": thin})
    assert c.numbers["tripled"] == ["thin attention"] and c.judgement.startswith('The density half holds for "thin')
    wide = {**RESULTS, fc.MIXED: row(4.1, 3.58, 10, 10)}  # 1 +- 1.96 sqrt(20) / 450: 98.1%-101.9%
    assert "the accuracy half this test set cannot decide (99% is inside the interval)" in \
        fc.compute_density(wide, {"TinyLM": TinyLMConfig()}).judgement
    lost = {**RESULTS, fc.MIXED: row(4.1, 3.6, 0, 30)}
    assert "the accuracy half does not hold on TinyLM (the whole interval is below 99%)" in \
        fc.compute_density(lost, {"TinyLM": TinyLMConfig()}).judgement


def test_compute_density_refuses_bad_input():
    from labkit.tinylm import TinyLMConfig
    models = {"TinyLM": TinyLMConfig()}
    assert_refused(lambda: fc.compute_density(RESULTS, {}), ValueError, "models", {}, "a non-empty dict")
    assert_refused(lambda: fc.compute_density(RESULTS, [1]), TypeError, "models", [1], "a dict of name")
    assert_refused(lambda: fc.compute_density(RESULTS, models, mixed="FP32"), ValueError, "mixed", "FP32",
                   "a setting of labkit.quant.SETTINGS")
    assert_refused(lambda: fc.compute_density(RESULTS, models, target=1.0), ValueError, "target", 1.0, "> 1")
    assert_refused(lambda: fc.compute_density(RESULTS, models, loss=1.0), ValueError, "loss", 1.0, "in (0, 1)")
    with pytest.raises(ValueError, match=r"results must be a sweep with the settings \['mixed"):
        fc.compute_density({"FP32": RESULTS["FP32"]}, models)
    with pytest.raises(TypeError, match="cfg must be a TinyLMConfig or a ModelSpec"):
        fc.compute_density(RESULTS, {"x": 1})
