"""Notebook 01's fact-check: every figure against arithmetic written out here, and every verdict follows its
numbers (change the claim's figures and the verdict changes with them)."""
import math

import pytest

from labkit import specs
from labkit.memory_wall import factcheck
from labkit.memory_wall.factcheck import FactCheck

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
    assert check.numbers["active_params"] == pytest.approx(1.2e12 / 20 / (4.5 / 8))
    assert check.numbers["tokens_per_step"] == math.ceil(20 / check.numbers["ceiling"]) == 3
    b = check.numbers["batch_needed"]
    assert b * 1.2e12 / (step + (b - 1) * 2048 * kv_per_token) >= 20 > \
        (b - 1) * 1.2e12 / (step + (b - 2) * 2048 * kv_per_token)
    assert check.judgement.startswith("False for one stream") and f"({b}+ sequences" in check.holds_if
    # a claim the arithmetic supports gets the other verdict
    assert factcheck.dense_320b_speed(target=5).judgement.startswith("Possible: the ceiling is 7 tokens/s")


def test_transfer_shares_match_the_step_time_written_out():
    m = specs.model("llama-2-70b")
    layer = m.n_params * 2 / 80
    check = factcheck.transfer_share()
    for k, share in check.numbers["decode"].items():
        transfer = k * layer / 31.5e9
        assert share == pytest.approx(transfer / (80 * layer / 4.8e12 + transfer))
    compute = 2 * m.n_params * 2048 / 989.4e12
    for k, share in check.numbers["prefill"].items():
        transfer = k * layer / 63e9
        assert share == pytest.approx(transfer / (max(80 * layer / 4.8e12, compute) + transfer))
    assert check.numbers["bands"][1] is None  # decoding is never 30-50%
    assert check.numbers["bands"][2048] == (6, 10) and check.numbers["bands"][8192] == (18, 40)
    assert "30-50% is a prefill-heavy setting" in check.judgement
    assert "2,048 tokens, 6-10 layers; 8,192 tokens, 18-40 layers" in check.holds_if


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


def test_the_cost_table_breaks_even_in_days_and_a_slow_payback_is_called_false():
    check = factcheck.cost_roi()
    assert check.numbers["breakeven_days"] == pytest.approx(5300 / 2100)
    assert check.numbers["implied_cloud_per_day"] == pytest.approx(5300 / 182.5)
    assert check.judgement.startswith("Inconsistent: the table's own figures give 2.5 days, 72x sooner")
    assert factcheck.cost_roi(cloud_per_day=20).judgement == "False: the table's own figures give 265 days, " \
                                                             "more than 6 months."
