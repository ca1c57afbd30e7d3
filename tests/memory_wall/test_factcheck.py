"""Notebook 01's fact-check: every figure against arithmetic written out here, and every verdict follows its
numbers (change the claim's figures and the verdict changes with them)."""
import math

import pytest

from labkit import specs
from labkit.memory_wall import factcheck
from labkit.memory_wall.factcheck import FactCheck
from labkit.memory_wall.footprint import footprint
from labkit.memory_wall.transfer import region, setting, sweep

from ..refusals import assert_refused

GB = 1e9


@pytest.mark.parametrize("claim", factcheck.CLAIMS, ids=[c.__name__ for c in factcheck.CLAIMS])
def test_every_claim_is_quoted_and_prints_in_the_verdict_format(claim, capsys):
    check = claim()
    assert isinstance(check, FactCheck) and check.claim.count('"') >= 2  # the source's words, quoted
    assert check.arithmetic and all(isinstance(line, str) and line for line in check.arithmetic)
    assert check.show() is None
    out = capsys.readouterr().out
    assert out.startswith(f"CLAIM    {check.claim}\n") and f"VERDICT  {check.judgement}\n" in out
    assert out.endswith(f"HOLDS IF {check.holds_if}\n\n")


def test_gpt3_fits_the_named_budget_only_as_fp16_with_offloading():
    g3 = specs.model("gpt3-175b")
    weights = g3.n_params * 2
    kv = 2048 * 2 * 96 * 96 * 128 * 2  # tokens x (K and V) x layers x heads x head_dim x bytes
    check = factcheck.gpt3_memory()
    total = check.numbers["fp16_total_bytes"]
    assert total == pytest.approx(weights + kv + 2048 * (2 * 12288 + 2 * 49152) * 2)
    assert check.numbers["stream_s_per_token"] == pytest.approx((total - 128e9) / 31.5e9)
    assert total <= 384e9 and check.judgement.startswith("Plausible as one configuration")
    assert f"({check.numbers['stream_s_per_token']:.1f} s per token)" in check.judgement


def test_the_320b_ceiling_is_bandwidth_over_bytes_and_the_ways_out_are_computed():
    d = specs.model("dense-320b")
    kv_per_token = 2 * d.n_layers * d.n_kv_heads * d.head_dim * 2
    assert not d.tied_embeddings  # a step reads one row of the input embedding, and every matrix
    step = (d.n_params - (d.vocab_size - 1) * d.d_model) / 2 + 2048 * kv_per_token  # 4 bits, FP16 KV cache
    check = factcheck.dense_320b_speed()
    assert check.numbers["ceiling"] == pytest.approx(1.2e12 / step)
    # one token of context: the weights alone cap the ceiling, still short of 20 tokens/s
    cap = check.numbers["ceiling_any_context"]
    assert cap == pytest.approx(1.2e12 / (step - 2047 * kv_per_token)) and cap < 20
    assert check.numbers["active_params"] == pytest.approx(1.2e12 / 20 / (4.5 / 8))
    assert check.numbers["tokens_per_step"] == math.ceil(20 / check.numbers["ceiling"]) == 3
    b = check.numbers["batch_needed"]
    assert b * 1.2e12 / (step + (b - 1) * 2048 * kv_per_token) >= 20 > \
        (b - 1) * 1.2e12 / (step + (b - 2) * 2048 * kv_per_token)
    assert check.judgement.startswith("False for one stream") and f"({b}+ sequences" in check.holds_if
    # a claim the arithmetic supports gets the other verdict
    assert factcheck.dense_320b_speed(target=5).judgement.startswith("Possible: the ceiling is 7 tokens/s")


def test_the_transfer_verdict_is_the_region_of_the_sweep():
    check = factcheck.transfer_share()
    reg = check.numbers["region"]
    assert reg == region(sweep(specs.model("llama-2-70b")))
    holding = [r for r in reg if r["holds"]]
    # every setting where the claim holds is named in the verdict, with its layers; none where it does not
    for r in reg:
        named = f"{setting(r['gpu'], r['link'])}, {r['workload'].split(', ')[1]}: {r['in_band_possible']} layer"
        assert (named in check.judgement) == r["holds"], named
    decode = [r for r in holding if r["workload"].startswith("decode")]
    assert decode and all(r["gpu"] == "h200" for r in decode)  # an H100 must offload too much to decode in the band
    assert "Never for decoding on h100-sxm" in check.judgement
    # the audit's H100 figures are computed and called impossible: 79 or 75 layers do not fit in 80 GB
    points = check.numbers["points"]
    assert not points["h100-sxm", "pcie5-x16", 1]["fits"] and points["h200", "pcie5-x16", 1]["fits"]
    assert "h100-sxm + pcie5-x16, 1 offloaded -> 39.7% (impossible" in check.arithmetic[0]
    assert check.numbers["possible"] == sum(r["fits"] and 0.3 <= r["share"] <= 0.5
                                            for r in sweep(specs.model("llama-2-70b")))


def test_three_trillion_parameters_in_fp16_and_an_off_claim():
    check = factcheck.trillion_fp16()
    assert check.numbers["weight_bytes"] == 6e12 and check.numbers["h200s"] == math.ceil(6e12 / 141e9) == 43
    assert check.arithmetic[0] == "3e12 x 2 bytes = 6.0 TB = 5.46 TiB of weights"
    assert check.judgement.startswith("True for the weights (6.0 TB")
    assert "(48 TB;" in check.holds_if
    assert factcheck.trillion_fp16(claimed_tb=12).judgement == "Off: the weights alone are 6.0 TB, not 12."


def test_int4_compression_counts_scales_and_zero_points():
    ratios = factcheck.int4_compression().numbers["ratios"]
    assert ratios[32, 4] == 8 and ratios[16, 4] == 4
    assert ratios[32, 5.0] == pytest.approx(6.4) and ratios[16, 4.25] == pytest.approx(16 / 4.25)
    assert "(FP16) is 3.2-3.8:1." in factcheck.int4_compression().judgement


def test_the_cost_table_is_read_per_day_and_per_month_and_the_claim_picks_the_month():
    check = factcheck.cost_roi()
    days = check.numbers["breakeven_days"]
    assert days["per day"] == pytest.approx(5300 / 2100)
    assert days["per month"] == pytest.approx(5300 / (2100 * 12 / 365.25))  # 76.8 days, 2.5 months
    assert check.numbers["implied_reading"] == "per month"
    assert check.judgement.startswith("True if the $2,100 is per month: break-even after 77 days (2.5 months)")
    assert "read per day the same table pays back in 2.5 days, 72x sooner than claimed" in check.judgement
    assert check.judgement.endswith("The table's ROI line implies the per-month reading.")
    assert check.numbers["implied_cloud_per_day"] == pytest.approx(5300 / 182.5)
    # the verdict follows the figures: too slow either way, or too fast either way
    assert factcheck.cost_roi(cloud=20).judgement == "False either way: the table's figures give 265.0 days or " \
                                                     "8066 days, more than 182."
    assert factcheck.cost_roi(cloud=40000).judgement.startswith("Understated either way: even read per month")
    # a cloud bill that breaks even only read per day
    assert factcheck.cost_roi(cloud=100).numbers["implied_reading"] == "per day"


def test_the_course_stand_ins_are_labelled_as_assumptions():
    assert specs.model("dense-320b").hypothetical and specs.model("moe-3t").hypothetical
    assert not specs.model("llama-2-70b").hypothetical
    assert factcheck.stand_in(specs.model("dense-320b")).startswith("the course's stand-in dense-320b (an assumed")
    assert factcheck.stand_in(specs.model("gpt3-175b")) == "gpt3-175b"
    assert "the course's stand-in dense-320b" in factcheck.dense_320b_speed().arithmetic[0]
    assert "the course's stand-in moe-3t" in factcheck.trillion_fp16().arithmetic[1]


def test_gpt3s_budget_holds_up_to_a_computed_batch_and_context():
    check = factcheck.gpt3_memory()
    g3 = specs.model("gpt3-175b")
    b, c = check.numbers["max_batch"], check.numbers["max_context"]
    total = lambda batch, context: footprint(g3, "fp16", batch, context)["total"]  # noqa: E731
    assert total(b, 2048) <= 384e9 < total(b + 1, 2048) and total(1, c) <= 384e9 < total(1, c + 1)
    assert f"at most {b} sequences of 2,048 tokens" in check.holds_if


@pytest.mark.parametrize("call,error,name,value,expected", [
    (lambda: factcheck.dense_320b_speed(target="20"), TypeError, "target", "20", "a positive finite number"),
    (lambda: factcheck.dense_320b_speed(target=0), ValueError, "target", 0, "a positive finite number"),
    (lambda: factcheck.dense_320b_speed(target=float("nan")), ValueError, "target", float("nan"), "a positive"),
    (lambda: factcheck.dense_320b_speed(bandwidth=1e-300), ValueError, "bandwidth", 1e-300, ">= 1 (bytes/s)"),
    (lambda: factcheck.dense_320b_speed(context=2048.0), TypeError, "context", 2048.0, "a positive int"),
    (lambda: factcheck.trillion_fp16(claimed_tb=None), TypeError, "claimed_tb", None, "a positive finite number"),
    (lambda: factcheck.trillion_fp16(claimed_tb=float("inf")), ValueError, "claimed_tb", float("inf"), "finite"),
    (lambda: factcheck.trillion_fp16(n_params=-3e12), ValueError, "n_params", -3e12, "a positive finite number"),
    (lambda: factcheck.cost_roi(claimed_days=0), ValueError, "claimed_days", 0, "a positive finite number"),
    (lambda: factcheck.cost_roi(cloud=True), TypeError, "cloud", True, "a positive finite number"),
    (lambda: factcheck.cost_roi(local="5300"), TypeError, "local", "5300", "a positive finite number"),
])
def test_bad_claim_figures_are_refused(call, error, name, value, expected):
    assert_refused(call, error, name, value, expected)


def test_a_target_no_batch_reaches_is_said_so():
    check = factcheck.dense_320b_speed(target=1e6)
    assert check.numbers["batch_needed"] is None and "no batch up to 1,024 sequences gets there" in check.holds_if
