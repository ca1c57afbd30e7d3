"""Notebook 02's fact-checks: the one-transfer model against its formula, and each verdict built from the
numbers passed in: other numbers, another verdict (made-up rows whose answers are counted by hand)."""
import math

import pytest

from labkit.unified_memory import factcheck as fc
from labkit.unified_memory.tenants import BALANCED, SKEWED

from ..refusals import assert_refused

L, B = 30e-6, 25e9


def test_busy_share_and_its_inverse():
    assert fc.busy_share(4096, L, B) == pytest.approx((4096 / B) / (L + 4096 / B))
    assert fc.busy_share(4096, 0, B) == 1.0
    for share in (0.005, 0.5, 0.92):
        assert fc.busy_share(fc.bytes_for_share(share, L, B), L, B) == pytest.approx(share)
    assert fc.bytes_for_share(0.92, L, B) / 2**20 == pytest.approx(30e-6 * 25e9 * 0.92 / 0.08 / 2**20)  # 8.2 MiB
    assert_refused(lambda: fc.bytes_for_share(1.0, L, B), ValueError, "share", 1.0, "below 1")
    assert_refused(lambda: fc.busy_share("4096", L, B), TypeError, "nbytes", "4096", "")
    assert_refused(lambda: fc.busy_share(4096, -1.0, B), ValueError, "latency", -1.0, "")


def row(faults, batches, gb, busy):
    return {"faults": faults, "batches": batches, "GB_moved": gb, "link_busy": busy}


# a sweep that does not fit: every fault moves a page in and a victim out (8 KiB); density: hits between faults
REPLAYS = {("None", 1): row(1000, 1000, 1000 * 8192 / 1e9, 0.0108),
           ("None", 256): row(1024, 4, 1024 * 8192 / 1e9, 0.737),
           ("density", 1): row(50, 50, 0.02, 0.48), ("density", 256): row(50, 50, 0.02, 0.48)}


def test_link_utilization_is_built_from_its_numbers():
    check = fc.link_utilization(L, B, 4096, REPLAYS)
    assert check.claim == '"92% bandwidth utilization"'
    lines = "\n".join(check.arithmetic)
    assert "92% needs S = L*B*0.92/0.08 = 8.2 MiB per latency paid" in lines
    assert "one 4 KiB fault at a time: 0.5%" in lines
    assert "batches of 256 faults without prefetch: 2.0 MiB per latency paid -> 74% (92% would need 33 KiB" in lines
    assert "50 batches for 50 faults" in lines
    assert check.judgement == ("Not reached by demand paging in this model: 1% with 4 KiB faults one at a time, 48% "
                               "with density prefetch, 74% with CUDA-sized batches of 256 faults.")
    assert check.numbers["best_setting"] == ("None", 256)
    # other numbers, another verdict: a replay at 95% reaches the claim; batches that do merge drop a line
    faster = {**REPLAYS, ("density", 256): row(50, 10, 0.02, 0.95)}
    check = fc.link_utilization(L, B, 4096, faster)
    assert check.judgement.startswith("Reached in this model by density prefetch in batches of 256 (95%)")
    assert not any("gains nothing" in line for line in check.arithmetic)


def test_link_utilization_says_which_latency_would_reach_the_claim():
    check = fc.link_utilization(L, B, 4096, REPLAYS)
    per_latency = 1024 * 8192 / 4  # bytes moved per batch of the ("None", 256) replay
    needed = check.numbers["latency_needed"]
    assert fc.busy_share(per_latency, needed, B) == pytest.approx(0.92)  # the inverse, checked by the forward model
    assert f"92% needs a fault latency of at most {needed * 1e6:.1f} us (this model: 30 us)" in "\n".join(
        check.arithmetic)
    assert f"{needed * 1e6:.1f} us or less" in check.holds_if


def test_link_utilization_wants_every_replay():
    short = {k: v for k, v in REPLAYS.items() if k != ("density", 256)}
    with pytest.raises(ValueError, match=r"replays must be a dict with \('density', 256\)"):
        fc.link_utilization(L, B, 4096, short)


def pools(static, dynamic, static_equal, dynamic_full):
    return {"STATIC": {"utilization": static}, "DYNAMIC": {"utilization": dynamic},
            "STATIC 0.4/0.4": {"utilization": static_equal}, "DYNAMIC thr 1.0": {"utilization": dynamic_full}}


BURST = {"STATIC": {"utilization": 0.4, "failed": 5}, "DYNAMIC": {"utilization": 0.5, "failed": 0}}


def test_dynamic_allocation_names_where_the_claim_is_reached():
    results = {BALANCED: pools(0.9, 0.8, 0.78, 0.95), SKEWED: pools(0.7, 0.77, 0.6, 0.945)}
    check = fc.dynamic_allocation(results, BURST, 80e9, 14e9)
    # gains by hand: balanced -11%, +3%, +6%; skewed +10%, +28%, +35% (0.945/0.7 = 1.35); burst +25%
    assert check.arithmetic[0] == (f"{BALANCED}: DYNAMIC vs STATIC -11%, DYNAMIC vs STATIC 0.4/0.4 +3%, "
                                   "DYNAMIC thr 1.0 vs STATIC +6%")
    bound = 0.8 / (0.5 + 14 / 80) - 1
    assert f"gains at most {bound:+.0%}" in check.arithmetic[2] and f"{1 / 0.675 - 1:+.0%}" in check.arithmetic[2]
    assert check.judgement == ("False as a general statement: +35% or more only for imbalanced load, DYNAMIC thr 1.0 "
                               "vs STATIC (+35%). With both models busy DYNAMIC changes utilization by +3% against an "
                               "equal budget and by -11% against full STATIC halves.")
    assert check.holds_if.startswith("one model is mostly idle") and "never retried" not in check.holds_if
    # a lucky order alone
    lucky = {"STATIC": {"utilization": 0.35, "failed": 5}, "DYNAMIC": {"utilization": 0.475, "failed": 0}}
    results[SKEWED] = pools(0.7, 0.77, 0.6, 0.8)
    check = fc.dynamic_allocation(results, lucky, 80e9, 14e9)
    assert "only for the burst order (+35.7%)" in check.judgement and check.holds_if.startswith("requests are never")
    # nowhere
    check = fc.dynamic_allocation(results, BURST, 80e9, 14e9)
    assert check.judgement.startswith("Not reached in any of these runs (+35% claimed)")
    assert check.numbers["reached"] == [] and math.isclose(check.numbers["bound"][0.8], bound)


def test_dynamic_allocation_over_several_request_streams():
    results = {BALANCED: pools(0.9, 0.8, 0.78, 0.95), SKEWED: pools(0.7, 0.77, 0.6, 0.945)}  # +35% in the skew
    other = {BALANCED: pools(0.9, 0.8, 0.78, 0.95), SKEWED: pools(0.7, 0.77, 0.6, 0.91)}      # +30% there
    check = fc.dynamic_allocation(results, BURST, 80e9, 14e9, sweep={0: results, 1: other})
    assert "DYNAMIC thr 1.0 vs STATIC +30%..+35% (+35% or more in 1 of 2)" in check.arithmetic[-3]
    assert "DYNAMIC vs STATIC +10% (+35% or more in 0 of 2)" in check.arithmetic[-3]  # the same in both seeds
    assert "imbalanced load, DYNAMIC thr 1.0 vs STATIC (+35%; in 1 of 2 seeds, +30%..+35%)" in check.judgement
    assert check.numbers["reaches"][SKEWED, "DYNAMIC thr 1.0", "STATIC"] == 1
    # a seed that reaches the claim is named even when the main run does not
    check = fc.dynamic_allocation(other, BURST, 80e9, 14e9, sweep={0: results, 1: other})
    assert "(+30%; in 1 of 2 seeds, +30%..+35%)" in check.judgement
    assert_refused(lambda: fc.dynamic_allocation(results, BURST, 80e9, 14e9, sweep={}), ValueError, "sweep", {},
                   "a non-empty dict")


def test_dynamic_allocation_wants_both_scenarios_and_pools():
    with pytest.raises(ValueError, match="results"):
        fc.dynamic_allocation({BALANCED: pools(1, 1, 1, 1)}, BURST, 80e9, 14e9)
    with pytest.raises(ValueError, match="burst"):
        fc.dynamic_allocation({BALANCED: pools(1, 1, 1, 1), SKEWED: pools(1, 1, 1, 1)}, {}, 80e9, 14e9)


def curve(shares, total=100):
    """An ngl_curve-like list: N = 0.. with its transfer share; offloaded bytes fall by 10 per N."""
    return [{"k": k, "transfer_share": s, "offloaded_bytes": total - 10 * k} for k, s in enumerate(shares)]


STEADY = {"time_s": 2.0, "transfer_s": 1.0, "latency_s": 0.9}


def test_transfer_share_reports_each_window():
    slow = curve([0.98, 0.9, 0.8, 0.6, 0.45, 0.2, 0.0])                 # the band only at N = 4
    fast = curve([0.9, 0.7, 0.5, 0.4, 0.3, 0.1, 0.0])                   # N = 2..4
    split = curve([0.0001] * 7)
    check = fc.transfer_share({"slow link": slow, "fast link": fast}, split, STEADY)
    assert check.arithmetic[0] == ("streamed over slow link: 98% of the time with every layer offloaded; 30-50% only "
                                   "for -ngl 4 (1 of 7 settings, 60.0% of the weights offloaded)")
    assert "-ngl 2..4 (3 of 7 settings, 60.0-80.0% of the weights offloaded)" in check.arithmetic[1]
    assert "transfers at most 0.0% for every N" in check.arithmetic[2]
    assert check.arithmetic[3].endswith("link transfers 50% of its time, fault latency 45%")
    assert check.judgement.startswith("In a wide range of the streamed -ngl curve (-ngl 4 over slow link; -ngl 2..4 "
                                      "over fast link), and 0.0% with split execution")  # 4 of 14 settings > 25%
    assert check.numbers["windows"] == {"slow link": [4], "fast link": [2, 3, 4]}
    assert "offloaded: 60.0% of the weights over slow link or 60.0-80.0% of the weights over fast link;" in \
        check.holds_if
    never = fc.transfer_share({"slow link": curve([0.98, 0.9, 0.7, 0.2, 0.0] + [0.0] * 12)}, split, STEADY)
    assert "never 30-50%" in never.arithmetic[0] and "never over slow link" in never.judgement
    assert never.judgement.startswith("Never on the streamed -ngl curve (never over slow link)")
    assert "which no setting here puts in the band" in never.holds_if


def test_transfer_share_wants_curves_and_a_steady_row():
    assert_refused(lambda: fc.transfer_share({}, [], STEADY), ValueError, "stream", {}, "at least one")
    with pytest.raises(ValueError, match="steady"):
        fc.transfer_share({"x": curve([0.4])}, curve([0.0]), {"time_s": 1.0})


def test_the_40_percent_implies_a_baseline_and_the_verdict_counts_the_settings_above_it():
    busy = {"one at a time": 0.01, "batched": 0.70, "prefetch": 0.80}
    check = fc.improvement(busy, L, B)
    base = 0.92 / 1.4
    assert check.numbers["baselines"] == pytest.approx({"relative": base, "points": 0.52})
    assert check.numbers["bytes_needed"][base] == pytest.approx(L * B * base / (1 - base))
    assert check.numbers["above"] == ["batched", "prefetch"] and check.numbers["best"] == "prefetch"
    assert "(2 of 3 settings), and none reaches 92%" in check.judgement
    reached = fc.improvement({**busy, "bulk": 0.95}, L, B)
    assert "'bulk' reaches 92%" in reached.judgement
    assert "no setting reaches even the baseline" in fc.improvement({"x": 0.5}, L, B).judgement
    assert_refused(lambda: fc.improvement({}, L, B), ValueError, "busy", {}, "at least one")
    assert_refused(lambda: fc.improvement(busy, L, B, gain=2.0), ValueError, "gain", 2.0, "less than")
