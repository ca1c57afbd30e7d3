"""The planner: "about 6 TB in FP16" and the card counts for the 3T preset, every plan it keeps obeys the
constraints and fits in memory, rejected plans say why, the ranking is by the objective, and the model
reproduces hand arithmetic on a small case."""
import math

import pytest

from labkit.parallel import planner as pl
from labkit.parallel.linkmodel import LinkModel
from labkit.specs import device, model
from tests.refusals import assert_refused


def test_six_terabytes_and_the_card_counts():
    spec = model("moe-3t")
    assert spec.n_params * 2 / 1e12 == pytest.approx(6.0, abs=0.1)
    assert pl.min_devices(spec, 80e9) == math.ceil(spec.n_params * 2 / 80e9) == 76
    assert pl.min_devices(spec, 141e9) == 43


@pytest.mark.parametrize("name,cluster", [("moe-3t", pl.Hardware(16)), ("deepseek-v3", pl.Hardware(4)),
                                          ("kimi-k2", pl.Hardware(4, device="h200")),
                                          ("llama-3.1-405b", pl.Hardware(2)), ("dense-320b", pl.Hardware(2))])
def test_kept_plans_obey_the_constraints(name, cluster):
    spec, wl = model(name), pl.Workload(batch=32, context=4096)
    plans = pl.plan(name, cluster, wl)
    kept = [p for p in plans if p.fits]
    assert kept, name
    mem = device(cluster.device).memory_bytes
    for p in kept:
        assert p.tp <= cluster.per_node and spec.n_heads % p.tp == 0 and spec.n_experts % p.ep == 0
        assert p.devices == p.tp * p.pp * p.ep * p.dp <= cluster.devices
        assert sum(p.memory.values()) <= 0.9 * mem
    assert all(p.reason for p in plans if not p.fits)
    tput = [p.throughput(wl.batch) for p in kept]
    assert tput == sorted(tput, reverse=True)
    lat = [p.latency for p in pl.plan(name, cluster, wl, "latency") if p.fits]
    assert lat == sorted(lat)


def test_reasons():
    spec, cl, wl = model("llama-3.1-405b"), pl.Hardware(2), pl.Workload()
    assert pl.estimate(spec, cl, wl, 16, 1, 1).reason == "TP=16 spans nodes (8 devices per node)"
    assert pl.estimate(spec, cl, wl, 3, 1, 1).reason == "TP=3 does not divide the 128 heads"
    assert pl.estimate(spec, cl, wl, 1, 1, 1).reason.startswith("needs ")
    assert pl.estimate(model("deepseek-v3"), cl, wl, 1, 1, 3).reason == "EP=3 does not divide the 256 experts"


def test_one_plan_by_hand():
    spec, cl, wl = model("llama-3-70b"), pl.Hardware(1), pl.Workload(batch=1, context=1024)
    p = pl.estimate(spec, cl, wl, 8, 1, 1)
    weights = spec.n_params * 2 / 8
    kv = 1024 * spec.kv_bytes_per_token(2) / 8
    assert p.memory["weights"] == pytest.approx(weights) and p.memory["kv_cache"] == pytest.approx(kv)
    assert p.time["stages (roofline)"] == pytest.approx((weights + kv) / device("h100-sxm").bandwidth)
    nv = LinkModel.from_spec("nvlink4")
    assert p.time["tp all-reduce"] == pytest.approx(2 * 80 * nv.collective("all_reduce", 8192 * 2, 8))
    assert p.bound == "memory" and p.dp == 1


def test_nothing_fits_is_refused():
    with pytest.raises(ValueError, match="cluster must be a cluster on which some layout fits"):
        pl.best("moe-3t", pl.Hardware(1))
    assert_refused(lambda: pl.Hardware(0), ValueError, "nodes", 0, "a positive int")
    assert_refused(lambda: pl.Hardware(1, device="nvlink4"), ValueError, "device", "nvlink4", "not a link")
    assert_refused(lambda: pl.plan("moe-3t", pl.Hardware(1), objective="cost"), ValueError, "objective", "cost",
                   "one of")


def test_tp_decode_seconds_by_hand():
    spec = model("llama-3-70b")
    nv = LinkModel.from_spec("nvlink4")
    t8 = pl.tp_decode_seconds(spec, "h100-sxm", "nvlink4", 8)
    assert t8 == pytest.approx(spec.active_params * 2 / 8 / 3.35e12 + 160 * nv.collective("all_reduce", 16384, 8))
    assert pl.tp_decode_seconds(spec, "h100-sxm", "nvlink4", 1) == pytest.approx(spec.active_params * 2 / 3.35e12)
    assert pl.tp_decode_seconds(model("tinylm"), "h100-sxm", "nvlink4", 2) > \
        pl.tp_decode_seconds(model("tinylm"), "h100-sxm", "nvlink4", 1)


def test_sequences_are_whole_on_the_busiest_ep_rank():
    spec, cl = model("deepseek-v3"), pl.Hardware(40)
    one = pl.estimate(spec, cl, pl.Workload(batch=1, context=131072), 1, 1, 256)
    per_sequence = 131072 * spec.kv_bytes_per_token(2)  # MLA: one latent per token, no TP split
    assert one.memory["kv_cache"] == pytest.approx(per_sequence)
    assert any("255 ranks serve none" in n for n in one.notes)
    uneven = pl.estimate(spec, cl, pl.Workload(batch=10, context=4096), 1, 1, 4)
    assert uneven.memory["kv_cache"] == pytest.approx(math.ceil(10 / 4) * 4096 * spec.kv_bytes_per_token(2))
    assert any("busiest rank holds 3" in n for n in uneven.notes)
    even = pl.estimate(spec, cl, pl.Workload(batch=8, context=4096), 1, 1, 4)
    assert even.notes == () and even.memory["kv_cache"] == pytest.approx(2 * 4096 * spec.kv_bytes_per_token(2))


def test_uneven_pp_stages_are_stated_and_the_largest_counts():
    spec, cl, wl = model("deepseek-v3"), pl.Hardware(4), pl.Workload(batch=8, context=1024)
    p4, p1 = pl.estimate(spec, cl, wl, 8, 4, 1), pl.estimate(spec, cl, wl, 8, 1, 1)
    assert 61 % 4 and any("1 of 16 and 3 of 15" in n for n in p4.notes)
    assert p4.memory["kv_cache"] == pytest.approx(p1.memory["kv_cache"] * 16 / 61)
    assert not pl.estimate(model("llama-3.1-405b"), cl, wl, 8, 2, 1).notes  # 126 layers: even


def test_nearest_miss_is_the_smallest_memory_excess():
    plans = pl.plan("llama-3.1-405b", pl.Hardware(1, device="h200"), pl.Workload(batch=64, context=8192))
    assert not any(p.fits for p in plans)
    miss = pl.nearest_miss(plans)
    assert miss.reason.startswith("needs ")
    assert sum(miss.memory.values()) == min(sum(p.memory.values()) for p in plans if p.memory)
    assert miss is not plans[0] and pl.nearest_miss([]) is None


@pytest.mark.parametrize("name", ["tp", "pp", "ep"])
def test_a_degree_below_one_is_refused_by_name(name):
    spec, cl, wl = model("moe-3t"), pl.Hardware(1), pl.Workload()
    degrees = {"tp": 1, "pp": 1, "ep": 1}
    for bad in (0, -2):
        assert_refused(lambda: pl.estimate(spec, cl, wl, **{**degrees, name: bad}), ValueError, name, bad,
                       "a positive int")


def test_kv_cache_is_split_over_at_most_the_kv_heads():
    """TinyLM has 2 KV heads: at TP=4 each KV head is held by 2 ranks, so the cache is split 2 ways, not 4."""
    spec, cl, wl = model("tinylm"), pl.Hardware(1), pl.Workload(batch=1, context=64)
    assert spec.n_kv_heads == 2
    per_sequence = 64 * 2 * spec.n_layers * 2 * spec.head_dim * 2  # K and V, 2 heads, BF16
    assert pl.estimate(spec, cl, wl, 2, 1, 1).memory["kv_cache"] == pytest.approx(per_sequence / 2)
    assert pl.estimate(spec, cl, wl, 4, 1, 1).memory["kv_cache"] == pytest.approx(per_sequence / 2)


def test_ep_splits_only_the_routed_experts():
    """By hand for DeepSeek-V3 at TP=4: the dense part (attention, embeddings, shared experts, dense layers,
    routers) is cut 4 ways whatever EP is; each routed expert lives on one EP group, cut 4 ways inside it."""
    spec, cl, wl = model("deepseek-v3"), pl.Hardware(4), pl.Workload(batch=8, context=1024)
    routed = spec.moe_layers * spec.n_experts * 3 * spec.d_model * spec.moe_d_ff  # SwiGLU: 3 matrices
    dense = spec.n_params - routed
    for ep in (1, 8):
        p = pl.estimate(spec, cl, wl, 4, 1, ep)
        assert p.memory["weights"] == pytest.approx((dense / 4 + routed / (4 * ep)) * 2)


def test_a_layout_that_does_not_fit_is_never_the_best_tp():
    """812 GB of BF16 Llama-3.1-405B weights do not fit 8 x 80 GB: no degree is the best; on 8 H200s TP=8 is."""
    spec = model("llama-3.1-405b")
    assert spec.n_params * 2 > 8 * 80e9
    assert not any(pl.tp_fits(spec, "h100-sxm", t) for t in (1, 2, 4, 8))
    assert pl.best_decode_tp(spec, "h100-sxm", "nvlink4") is None
    assert pl.tp_fits(spec, "h200", 8) and not pl.tp_fits(spec, "h200", 4)
    assert pl.best_decode_tp(spec, "h200", "nvlink4") == 8
    spec70 = model("llama-3-70b")  # 141 GB: TP=1 does not fit 80 GB, and the fastest fitting degree wins
    assert not pl.tp_fits(spec70, "h100-sxm", 1) and pl.tp_fits(spec70, "h100-sxm", 2)
    times = {t: pl.tp_decode_seconds(spec70, "h100-sxm", "nvlink4", t) for t in (2, 4, 8)}
    assert pl.best_decode_tp(spec70, "h100-sxm", "nvlink4") == min(times, key=times.get)
    assert pl.best_decode_tp(spec70, "h100-sxm", "nvlink4", tps=(1,)) is None


@pytest.mark.parametrize("pp", [1, 2])
def test_a_pipeline_sends_its_hidden_state_once_per_stage_boundary(pp):
    """p stages pass the batch's hidden state p - 1 times per step (NVLink within a node), by lab 04's link
    model; one stage sends nothing."""
    spec, wl = model("llama-3-70b"), pl.Workload(batch=8, context=4096)
    plan = pl.estimate(spec, pl.Hardware(1), wl, 4, pp, 1)
    assert not plan.reason, plan.reason
    hidden = 8 * spec.d_model * wl.act_bytes
    assert plan.time["pp send"] == pytest.approx((pp - 1) * LinkModel.from_spec("nvlink4").send(hidden))
