"""Notebook 01's local-deployment fact-checks: each figure against arithmetic written out here from the spec
sheets, the page-fault model against lab 02's simulator, and each verdict following its numbers."""
import pytest

from labkit import specs
from labkit.memory_wall import local_claims as lc
from labkit.memory_wall.footprint import decode_bytes_per_step, footprint
from labkit.unified_memory import UnifiedMemory

from ..refusals import assert_refused

GB = 1e9


@pytest.mark.parametrize("claim", lc.CLAIMS, ids=[c.__name__ for c in lc.CLAIMS])
def test_every_claim_is_quoted_and_prints_in_the_verdict_format(claim, capsys):
    check = claim()
    assert check.claim.count('"') >= 2 and check.arithmetic and check.show() is None
    out = capsys.readouterr().out
    assert out.startswith(f"CLAIM    {check.claim}\n") and f"VERDICT  {check.judgement}\n" in out


def test_the_speedup_is_the_bandwidth_ratio_and_the_verdict_follows_it():
    check = lc.cpu_only_speedup()
    assert check.numbers["ratios"]["ddr5-5600-2ch"] == pytest.approx(1.2e12 / (5600e6 * 8 * 2))
    assert check.numbers["ratios"]["ddr5-4800-8ch"] == pytest.approx(1.2e12 / (4800e6 * 8 * 8))
    assert check.numbers["needed_cpu_bandwidth"] == 80e9 and check.judgement.startswith("Plausible")
    assert lc.cpu_only_speedup(claimed=50).judgement.startswith("Not by bandwidth")
    mine = lc.cpu_only_speedup(measured_bandwidth=20e9)
    assert mine.numbers["ratios"]["this machine (measured)"] == pytest.approx(60)
    assert_refused(lambda: lc.cpu_only_speedup(measured_bandwidth=0), ValueError, "measured_bandwidth", 0, "")


def test_request_latency_by_hand():
    m, d = specs.model("llama-3-8b"), specs.device("rtx-4090")
    r = lc.request_latency("llama-3-8b", lc.Q4_0, "rtx-4090", 512, rtt_s=0.01)
    assert r["per_token"] == pytest.approx(decode_bytes_per_step(m, lc.Q4_0, 1, 512) / d.bandwidth)
    compute = 2 * (m.n_params - (m.vocab_size - 512) * m.d_model) * 512 / d.peak_flops["bf16"]  # 512 embedding rows read
    assert r["prefill"] == pytest.approx(max(compute, footprint(m, lc.Q4_0, 1, 1)["weights"] / d.bandwidth), rel=1e-3)
    assert r["first_token"] == pytest.approx(0.01 + r["prefill"])
    assert_refused(lambda: lc.request_latency("llama-3-8b", lc.Q4_0, "rtx-4090", 0), ValueError, "prompt_tokens", 0, "")


def test_latency_verdicts_follow_the_numbers():
    check = lc.latency_local_cloud()
    assert "met locally by llama-3-8b" in check.judgement and "missed by llama-2-70b" in check.judgement
    assert lc.latency_local_cloud(local_ms=60).judgement.count("missed") == 0
    edge = lc.edge_realtime()
    ok = edge.numbers["first_ok"]["llama-3-8b", "rtx-4090"]
    rows = edge.numbers["rows"]
    assert rows["llama-3-8b", "rtx-4090", ok]["first_token"] < 0.05
    assert all(rows["llama-3-8b", "rtx-4090", n]["first_token"] >= 0.05 for n in lc.PROMPTS if n > ok)
    assert lc.edge_realtime(limit_ms=1e5).judgement.count("not every token") == 0


def test_the_trillion_gaps_are_capacity_and_bandwidth_ratios():
    check = lc.trillion_consumer()
    short, kimi = check.numbers["short"], specs.model("kimi-k2")
    cap = footprint(kimi, lc.Q4_0, 1, 4096)["total"]
    assert short["1T MoE (kimi-k2)", "m3-ultra"][0] == pytest.approx(cap / 512e9)
    assert short["1T dense", "rtx-4090"] == pytest.approx((1e12 * 4.5 / 8 / 24e9, 1e12 * 4.5 / 8 * 10 / 1.008e12))
    for m in ("1T dense", "1T MoE (kimi-k2)"):  # the best device is the one with the smallest worst gap
        assert check.numbers["gaps"][m] == min(max(short[m, d]) for d in lc.CONSUMER)
    assert "Even 3x falls short for 1T dense" in lc.trillion_consumer(factor=3).judgement


def test_the_fault_model_is_lab_02s_simulator():
    pages, device = 64, 16
    pool = UnifiedMemory(device * 4096, pages * 4096)
    a = pool.alloc(pages * 4096)
    pool.access(a)                      # cold: no victims yet for the first device pages
    before = pool.stats.time_s
    pool.access(a)                      # every page faults and evicts one: the model's sweep
    assert pool.stats.time_s - before == pytest.approx(lc.fault_sweep_s(pages * 4096, 4096, 30e-6, 25e9), rel=1e-9)
    check = lc.latency_fifth()
    t4k = check.numbers["fault_s"][4096]
    assert check.numbers["fault_gain"][4096] == pytest.approx(t4k[0] / t4k[1]) and check.numbers["decode_gain"] < 1.01
    assert check.numbers["core"][20e-9] == pytest.approx(16 * 64 / 20e-9)
    assert_refused(lambda: lc.latency_fifth(factor=1), ValueError, "factor", 1, "")
