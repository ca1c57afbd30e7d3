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


def test_mixed_precision_states_the_noise_between_texts():
    c = fc.mixed_precision(RESULTS, SENS)
    assert c.arithmetic[0] == ("perplexity increase per weight, one type in INT4 (whole text): embedding +0.468, "
                               "attention +0.00342, mlp +0.00269")
    assert c.arithmetic[1].startswith("on each of 4 pieces of the text: attention above the MLP on 2 of 4, the "
                                      "embedding above both on 4 of 4; attention's and the MLP's figures move by "
                                      "up to 0.013 from piece to piece, 18x the 0.00072 between them")
    assert c.judgement == ('"embedding INT8" is supported: per weight the embedding is 137x as sensitive as the '
                           "others, on every piece; whether attention is more sensitive per weight than the MLP this "
                           "text cannot tell (+0.00342 against +0.00269, higher on 2 of 4 pieces); attention in FP16 "
                           "buys 0.0007 perplexity for 1.5x the memory.")


def test_attention_above_on_every_piece_is_called_more_sensitive():
    sens = {**SENS, "attention": Sensitivity("attention", "int4", 0.24, 0.0013, (0.006, 0.004, 0.005, 0.007))}
    c = fc.mixed_precision(RESULTS, sens)
    assert "attention is more sensitive per weight than the MLP on every piece (+0.00542 against +0.00269)" \
        in c.judgement
    below = {**SENS, "attention": Sensitivity("attention", "int4", 0.24, -0.001, (-0.01, -0.01, -0.01, -0.01))}
    assert "attention is less sensitive per weight than the MLP on every piece" \
        in fc.mixed_precision(RESULTS, below).judgement


def test_asymmetric_error_reads_each_data_set():
    lower = {"Gaussian N(0,1)": 0.30, "uniform [0, 1)": 0.79, "silu(gate) output": 0.66}
    fair = {"asym g32 vs Q4_0": (0.89, 1.0), "asym g64 vs sym g32, equal bits": (0.88, 1.0)}
    c = fc.asymmetric_error(lower, fair)
    assert c.arithmetic[0] == "Gaussian N(0,1)        group 32:  30% lower MSE,  16% lower RMSE -> does not hold"
    assert c.judgement == ('Holds only for "uniform [0, 1)", "silu(gate) output". Against the fairer baselines on '
                           "TinyLM's MLP weights asymmetric has 11%-12% lower MSE.")
    assert 'as RMSE it holds for "uniform [0, 1)")' in c.holds_if
    assert fc.asymmetric_error({"x": 0.5}, fair).judgement.startswith("Holds for every data set here.")


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match=r"results must be a sweep with the settings \['mixed: attn FP16"):
        fc.compression({"FP32": RESULTS["FP32"], "INT4 asym g32": RESULTS["INT4 asym g32"]})
    with pytest.raises(TypeError, match="results must be a dict from labkit.quant.quality.sweep"):
        fc.retention([1, 2])
    assert_refused(lambda: fc.retention(RESULTS, target=98.7), ValueError, "target", 98.7, "in (0, 1]")
    with pytest.raises(ValueError, match="sens must be the sensitivity of 'embedding', 'attention' and 'mlp'"):
        fc.mixed_precision(RESULTS, {"mlp": SENS["mlp"]})
