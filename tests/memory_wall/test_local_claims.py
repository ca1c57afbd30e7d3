"""Notebook 01's local-deployment fact-checks: each figure against arithmetic written out here from the spec
sheets, the page-fault model against lab 02's simulator, and each verdict following its numbers."""
import pytest

from labkit import specs
from labkit.course import FactCheck
from labkit.memory_wall import local_claims as lc
from labkit.memory_wall.verdicts import UNRELIABLE, Verdict
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


def test_a_measured_bandwidth_carries_the_verdict_of_its_own_cross_check():
    """An unreliable measurement is tagged on its line and never enters the verdict; a reliable one does."""
    doubtful = Verdict(False, 1.3, f"{UNRELIABLE} (the roof was measured low)")
    near_the_claim = 1.2e12 / 15  # a measured box at exactly the claimed ratio
    tagged = lc.cpu_only_speedup(measured_bandwidth=near_the_claim, measured_check=doubtful)
    line = next(x for x in tagged.arithmetic if x.startswith(lc.MEASURED))
    assert line.endswith(f"; {doubtful.text}") and lc.MEASURED not in tagged.numbers["near"]
    assert lc.MEASURED not in tagged.judgement
    trusted = lc.cpu_only_speedup(measured_bandwidth=near_the_claim, measured_check=Verdict(True, 1.0, "fine"))
    assert lc.MEASURED in trusted.numbers["near"] and lc.MEASURED in trusted.judgement
    assert not any(UNRELIABLE in x for x in trusted.arithmetic)
    assert_refused(lambda: lc.cpu_only_speedup(measured_check=doubtful), ValueError, "measured_bandwidth", None, "")
    assert_refused(lambda: lc.cpu_only_speedup(measured_bandwidth=1e9, measured_check="unreliable"), TypeError,
                   "measured_check", "unreliable", "Verdict")


def test_request_latency_by_hand():
    m, d = specs.model("llama-3-8b"), specs.device("rtx-4090")
    r = lc.request_latency("llama-3-8b", lc.Q4_0, "rtx-4090", 512, rtt_s=0.01)
    assert r["per_token"] == pytest.approx(decode_bytes_per_step(m, lc.Q4_0, 1, 512) / d.bandwidth)
    # 512 embedding rows read
    compute = 2 * (m.n_params - (m.vocab_size - 512) * m.d_model) * 512 / d.peak_flops["bf16"]
    assert r["prefill"] == pytest.approx(max(compute, footprint(m, lc.Q4_0, 1, 1)["weights"] / d.bandwidth), rel=1e-3)
    assert r["first_token"] == pytest.approx(0.01 + r["prefill"])
    assert_refused(lambda: lc.request_latency("llama-3-8b", lc.Q4_0, "rtx-4090", 0), ValueError, "prompt_tokens", 0, "")


def test_latency_verdicts_follow_the_numbers_and_speak_of_bounds():
    check = lc.latency_local_cloud()
    assert "within reach locally for llama-3-8b" in check.judgement
    assert "out of reach for llama-2-70b (48.5 ms at best)" in check.judgement
    assert lc.latency_local_cloud(local_ms=60).judgement.count("out of reach") == 0
    # every time is a lower bound: the cloud's times are "no less than", never "at most"
    cloud = check.numbers["cloud"].values()
    low, high = min(1e3 * r["first_token"] for r in cloud), max(1e3 * r["first_token"] for r in cloud)
    assert f"no less than {low:.0f}-{high:.0f} ms here with a 50 ms round trip" in check.judgement
    assert "at most" not in check.judgement
    assert all(" at least " in line for line in check.arithmetic[:4])
    edge = lc.edge_realtime()
    ok = edge.numbers["first_ok"]["llama-3-8b", "rtx-4090"]
    rows = edge.numbers["rows"]
    assert rows["llama-3-8b", "rtx-4090", ok]["first_token"] < 0.05
    assert all(rows["llama-3-8b", "rtx-4090", n]["first_token"] >= 0.05 for n in lc.PROMPTS if n > ok)
    assert "every decoded token" in lc.edge_realtime(limit_ms=1e5).judgement


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


def _met_and_missed(judgement: str) -> tuple[list[str], list[str]]:
    """The models a latency verdict says can meet the local figure and those it says cannot."""
    met = judgement.split("within reach locally for ", 1)[1].split(";")[0].split(" and out of reach for ")[0]
    missed = (judgement.split(" and out of reach for ", 1)[1].split(";")[0] if " and out of reach for " in judgement
              else "")

    def names(part):
        return [w.split(" (")[0] for w in part.split(", ") if w and w != "none of these"]
    return names(met), names(missed)


@pytest.mark.parametrize("local_ms", [1.0, 4.0, 15.0, 48.0, 60.0])
def test_each_local_model_is_met_or_missed_never_both_by_its_time_in_ms(local_ms):
    check = lc.latency_local_cloud(local_ms=local_ms)
    met, missed = _met_and_missed(check.judgement)
    ms = {m: 1e3 * r["per_token"] for (m, _), r in check.numbers["local"].items()}
    assert sorted(met) == sorted(m for m, t in ms.items() if t <= local_ms)
    assert sorted(missed) == sorted(m for m, t in ms.items() if t > local_ms)
    for m in missed:  # the miss prints the model's own bound in ms
        assert f"{m} ({ms[m]:.1f} ms at best)" in check.judgement
    prefill = max(r["prefill"] for r in check.numbers["cloud"].values())
    assert check.numbers["rtt_needed"] == pytest.approx(0.2 - prefill)


@pytest.mark.parametrize("limit_ms", [5.0, 30.0, 50.0, 200.0, 3000.0])
def test_edge_verdicts_follow_each_models_numbers_in_ms(limit_ms):
    edge = lc.edge_realtime(limit_ms=limit_ms)
    rows = edge.numbers["rows"]
    for m, _, d in lc.LOCAL:
        every = all(rows[m, d, n]["per_token"] < limit_ms / 1e3 for n in lc.PROMPTS)
        upto = max([n for n in lc.PROMPTS if rows[m, d, n]["per_token"] < limit_ms / 1e3], default=0)
        first = max([n for n in lc.PROMPTS if rows[m, d, n]["first_token"] < limit_ms / 1e3], default=0)
        assert edge.numbers["token_ok"][m, d] == every and edge.numbers["first_ok"][m, d] == first
        part = edge.judgement.split(f"{m} on {d}: ", 1)[1].split(";")[0].rstrip(".")
        assert part.startswith("every decoded token" if every else
                               f"decoded tokens up to {upto:,}-token contexts" if upto else "no decoded token")
        assert part.endswith(f"first token up to {first:,}-token prompts" if first else "no first token")
    assert f"under {limit_ms:.0f} ms" in edge.judgement


def test_the_figures_print_in_gb_and_ms_as_the_claims_use_them():
    """GB = 1e9 bytes (not GiB), times in ms where the claims use ms."""
    tri = lc.trillion_consumer()
    assert "1T dense at Q4_0 (4.5 bits): 562 GB to hold, 562.5 GB read per token, 5,625 GB/s for 10 tokens/s" \
        in tri.arithmetic
    assert any(line.startswith("m3-ultra (512 GB, 819 GB/s) would need") for line in tri.arithmetic)
    speed = lc.cpu_only_speedup()
    assert "15x needs a CPU-only box reading 80 GB/s beside 1.2 TB/s" in speed.arithmetic[0]
    assert speed.arithmetic[1].startswith("ddr5-5600-2ch: 89.6 GB/s -> 13.4x")
    m, d = specs.model("llama-3-8b"), specs.device("rtx-4090")
    per_token = decode_bytes_per_step(m, lc.Q4_0, 1, 512) / d.bandwidth
    local = lc.latency_local_cloud()
    assert local.arithmetic[0].startswith("local llama-3-8b at Q4_0 on rtx-4090: at least "
                                          f"{1e3 * per_token:.1f} ms per token")
    fifth = lc.latency_fifth()
    assert "800 dependent latencies of 100 ns add 0.080 ms" in fifth.arithmetic[0]
    assert "a 138 GB sweep in 4 KiB faults" in fifth.arithmetic[2]


def test_a_verdict_needs_prompts_and_latency_fifth_names_its_own_arguments():
    for bad in ((), []):
        assert_refused(lambda: lc.edge_realtime(prompts=bad), ValueError, "prompts", bad, "non-empty")
    assert_refused(lambda: lc.edge_realtime(prompts="128"), ValueError, "prompts", "128", "non-empty tuple")
    assert_refused(lambda: lc.edge_realtime(prompts=(128, 0)), ValueError, "prompts[1]", 0, "positive")
    assert_refused(lambda: lc.latency_fifth(fault_latency=-1e-6), ValueError, "fault_latency", -1e-6, "positive")
    assert_refused(lambda: lc.latency_fifth(fault_latency=0), ValueError, "fault_latency", 0, "positive")
    assert_refused(lambda: lc.latency_fifth(link_bandwidth=0), ValueError, "link_bandwidth", 0, "positive")
    assert_refused(lambda: lc.latency_fifth(link_bandwidth="25e9"), TypeError, "link_bandwidth", "25e9", "number")


def test_a_device_with_more_than_the_need_is_said_to_have_enough_never_to_lack_it():
    tri = lc.trillion_consumer()
    for d in lc.CONSUMER:
        line = next(x for x in tri.arithmetic if x.startswith(f"{d} ("))
        for m in ("1T dense", "1T MoE (kimi-k2)"):
            cap, bw = tri.numbers["short"][m, d]
            for ratio, what in ((cap, "capacity"), (bw, "bandwidth")):
                assert f"{ratio:.1f}x its {what}" + (" (enough)" if ratio <= 1 else "") in line
        assert "lacks" not in line


def test_the_recap_has_one_line_per_claim_and_each_verdict_follows_its_numbers():
    checks = [claim() for claim in lc.CLAIMS]
    lines = lc.recap(checks).splitlines()
    assert len(lines) == 1 + len(checks) and lines[0].startswith("claim (Hardware Challenges)")
    speed, latency, edge, trillion, fifth = (c.numbers for c in checks)
    assert f"{speed['ratios']['ddr5-5600-2ch']:.1f}x against a 2-channel desktop" in lines[1]
    assert lines[2].endswith("within reach for llama-3-8b, not for llama-2-70b")
    assert lines[3].endswith("llama-3-8b: every token, first token to 512-token prompts; "
                             "llama-2-70b: tokens to 2,048-token contexts, no first token")
    assert f"needs {trillion['gaps']['1T dense']:.1f}x the bandwidth of m3-ultra" in lines[4]
    assert f"4 KiB faults {fifth['fault_gain'][4096]:.1f}x" in lines[5]
    assert all(len(line) <= 160 for line in lines)
    assert_refused(lambda: lc.recap([]), ValueError, "checks", [], "non-empty")
    plain = FactCheck('"x"', ["y"], "z", "w")
    assert_refused(lambda: lc.recap([plain]), ValueError, "checks[0]", '"x"', "numbers['recap']")
