"""Step 5 on paper, against independent references: what the hardware can do at all (at the claimed request rate,
FLOP/s within the devices' peak and weight bytes/s within their bandwidth), hand arithmetic with the alpha-beta
formulas and the device sheet (a dense and an MoE prefill), a simulated M/D/1 queue (Lindley's recursion) for the
TTFT with queueing; lab 04's estimate for the decode step; monotonicity with hypothesis (more rate never fewer
devices; a looser target never more), the router's limit, and bad input refused by name."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from labkit.cluster.scale import (ReplicaPlan, prefill_seconds, replica_options, replicas_for, replicas_needed,
                                  router_limit)
from labkit.parallel import Hardware, LinkModel, Workload, planner
from labkit.specs import device, model
from tests.refusals import assert_refused

PROMPT, OUT = 1024, 256
H100 = device("h100-sxm")
NV, IB = LinkModel.from_spec("nvlink4"), LinkModel.from_spec("ib-ndr-400")


def test_the_chosen_replica_is_lab_04_s_estimate_at_the_largest_batch_meeting_tpot_or_a_halving():
    answer = replicas_for(50, "moe-3t", "h100-sxm", PROMPT, OUT, ttft=2.0, tpot=0.05)
    r = answer.replica
    spec, big = model("moe-3t"), Hardware(64)  # a bigger cluster: more DP replicas, the same step

    def meets(batch: int) -> bool:
        step = planner.estimate(spec, big, Workload(batch, PROMPT + OUT), r.tp, r.pp, r.ep)
        return step.fits and step.latency <= 0.05
    largest = next(b for b in range(4096, 0, -1) if meets(b))  # by a scan from the top, not a bisection
    assert r.batch in {largest >> k for k in range(12)}
    step = planner.estimate(spec, big, Workload(r.batch, PROMPT + OUT), r.tp, r.pp, r.ep)
    assert step.fits and r.tpot == pytest.approx(step.latency, rel=1e-12) and r.tpot <= 0.05
    assert r.tokens_per_s == pytest.approx(r.batch / r.tpot) and answer.tpot_seen <= 0.05 * (1 + 1e-9)
    per_replica = min(0.8 * r.requests_per_s, r.max_rate)  # the fewest replicas that carry the rate
    assert answer.replicas * per_replica >= 50 > (answer.replicas - 1) * per_replica
    assert answer.ttft <= 2.0 and answer.tpot_seen > r.tpot  # others' prefills stretch the TPOT seen
    assert answer.devices == answer.replicas * r.tp * r.pp * r.ep and r.devices == r.tp * r.pp * r.ep
    assert "moe-3t" in str(answer) and f"TP={r.tp}" in str(answer)


@pytest.mark.parametrize("name", ["moe-3t", "llama-3-70b", "llama-3-8b"])
def test_no_replica_claims_more_than_its_devices_can_compute_or_read(name):
    """At requests_per_s, every token's matmuls (2 x active parameters each: prompt and output tokens, no
    attention even) need FLOP/s within devices x peak, and each decode step reads the active weights at least
    once: bytes/s within devices x bandwidth. Charging prefill as free (B / (TTFT + (OUT - 1) TPOT)) broke the
    first bound (llama-3-70b on 4 H100s: 1.8x their peak); this test checks that it could fail."""
    spec, broke = model(name), False
    for o in replica_options(name, ttft=2.0, tpot=0.05):
        flop_per_request = 2 * spec.active_params * (PROMPT + OUT - 1)
        assert o.requests_per_s * flop_per_request <= o.devices * H100.peak_flops["bf16"]
        steps_per_s = o.requests_per_s * (OUT - 1) / o.batch
        assert steps_per_s * spec.active_params * 2 <= o.devices * H100.bandwidth
        free_prefill = o.batch / (o.ttft + (OUT - 1) * o.tpot)
        broke |= free_prefill * flop_per_request > o.devices * H100.peak_flops["bf16"]
    assert broke or name != "llama-3-70b"


def test_ttft_with_queueing_is_a_simulated_m_d_1_queue():
    """O = 1 (no decode): prefill alone is an M/D/1 queue; Lindley's recursion W' = max(0, W + T_p - A) over
    200 000 Poisson arrivals gives the mean wait to compare with."""
    o = replica_options("llama-3-8b", output_tokens=1, ttft=2.0, tpot=0.05)[0]
    rng = np.random.default_rng(17)
    for busy in (0.3, 0.6, 0.75):
        rate = busy / o.ttft
        gaps = rng.exponential(1 / rate, 200_000)
        wait, total = 0.0, 0.0
        for gap in gaps:
            wait = max(0.0, wait + o.ttft - gap)
            total += wait
        assert o.ttft_at(rate) == pytest.approx(o.ttft + total / len(gaps), rel=0.02)
    assert o.ttft_at(1 / o.ttft) == math.inf and o.ttft_at(0) == o.ttft


def test_max_rate_is_where_the_mean_ttft_or_the_tpot_seen_meets_its_target():
    for o in replica_options(ttft=0.5, tpot=0.05):
        assert 0 < o.max_rate <= o.requests_per_s
        assert o.ttft_at(o.max_rate) <= 0.5 * (1 + 1e-9) and o.tpot_at(o.max_rate) <= 0.05 * (1 + 1e-9)
        if o.max_rate < o.requests_per_s:
            assert o.ttft_at(o.max_rate * 1.01) > 0.5 or o.tpot_at(o.max_rate * 1.01) > 0.05
    tight, loose = replicas_for(50, ttft=0.3), replicas_for(50, ttft=4.0)
    assert tight.ttft <= 0.3 and loose.ttft <= 4.0 and tight.devices >= loose.devices


def test_no_layout_serves_the_rate_with_fewer_devices():
    answer = replicas_for(200, tpot=0.08)
    for option in replica_options(tpot=0.08):
        assert replicas_needed(200, option) * option.devices >= answer.devices


def test_prefill_of_one_token_is_lab_04_s_one_sequence_decode_for_a_dense_model():
    """One prompt token reads the weights once and is memory-bound: tp_decode_seconds' own arithmetic."""
    spec = model("llama-2-70b")
    for tp in (1, 2, 8):
        got = prefill_seconds(spec, Hardware(1), tp, 1, 1, 1)
        assert got == pytest.approx(planner.tp_decode_seconds(spec, "h100-sxm", "nvlink4", tp), rel=1e-9)


def test_prefill_of_a_long_prompt_by_hand():
    """Dense, one device: compute-bound, 2 x parameters x P plus causal attention 2 P^2 heads head_dim layers."""
    spec, p = model("llama-3-8b"), 4096
    flop = 2 * spec.active_params * p + 2 * p * p * spec.n_heads * (spec.d_model // spec.n_heads) * spec.n_layers
    assert flop / H100.peak_flops["bf16"] > spec.n_params * 2 / H100.bandwidth
    assert prefill_seconds(spec, Hardware(1), 1, 1, 1, p) == pytest.approx(flop / H100.peak_flops["bf16"], rel=1e-12)
    two = prefill_seconds(spec, Hardware(1), 2, 1, 1, p)  # halves the work, adds two all-reduces per layer
    link = LinkModel.from_spec("nvlink4").collective("all_reduce", p * spec.d_model * 2, 2)
    assert two == pytest.approx(flop / 2 / H100.peak_flops["bf16"] + 2 * spec.n_layers * link, rel=1e-12)


def test_prefill_of_an_moe_layout_by_hand():
    """moe-3t on TP=8 PP=2 EP=8 (128 H100s): the routed experts split over tp x ep = 64 devices, the rest over
    tp; two all-reduces per layer over NVLink, two all-to-alls per MoE layer and one stage send over InfiniBand
    (the EP group spans nodes), each by the alpha-beta formulas written out."""
    spec, p, tp, pp, ep = model("moe-3t"), 1024, 8, 2, 8
    expert = spec.counts()["expert_mlp"]
    routed, routed_active = spec.moe_layers * spec.n_experts * expert, spec.moe_layers * spec.experts_per_token * expert
    stage = math.ceil(spec.n_layers / pp) / spec.n_layers  # the larger stage: 39 of 77 layers
    read = ((spec.n_params - routed) / tp + routed / (tp * ep)) * stage * 2
    flop = (2 * (spec.active_params - routed_active) * p / tp + 2 * routed_active * p / (tp * ep)
            + 2 * p * p * spec.n_heads * spec.head_dim * spec.n_layers / tp) * stage
    hidden = p * spec.d_model * 2
    all_reduce = 2 * (tp - 1) * NV.alpha + 2 * (tp - 1) / tp * hidden / NV.beta
    all_to_all = (ep - 1) * IB.alpha + (ep - 1) / ep * hidden * spec.experts_per_token / IB.beta
    send = IB.alpha + hidden / IB.beta
    by_hand = (pp * max(read / H100.bandwidth, flop / H100.peak_flops["bf16"]) + 2 * spec.n_layers * all_reduce
               + 2 * spec.moe_layers * all_to_all + (pp - 1) * send)
    assert prefill_seconds(spec, Hardware(16), tp, pp, ep, p) == pytest.approx(by_hand, rel=1e-12)
    assert flop / H100.peak_flops["bf16"] < read / H100.bandwidth  # memory-bound: every expert is read for P tokens


def test_options_are_sorted_by_requests_per_device_and_all_meet_the_targets():
    options = replica_options(tpot=0.1, ttft=1.0)
    per_device = [o.requests_per_s / o.devices for o in options]
    assert per_device == sorted(per_device, reverse=True) and len(options) > 5
    assert all(o.tpot <= 0.1 and o.ttft <= 1.0 and o.plan.fits and isinstance(o, ReplicaPlan) for o in options)


RATES = st.floats(0.5, 2000.0)
TPOTS = st.sampled_from([0.03, 0.04, 0.05, 0.07, 0.1, 0.2])
TTFTS = st.sampled_from([0.3, 0.5, 1.0, 4.0])


@settings(max_examples=40, deadline=None)
@given(a=RATES, b=RATES, tpot=TPOTS, ttft=TTFTS)
def test_more_rate_never_needs_fewer_devices(a, b, tpot, ttft):
    low, high = sorted((a, b))
    small, big = replicas_for(low, tpot=tpot, ttft=ttft), replicas_for(high, tpot=tpot, ttft=ttft)
    assert small.devices <= big.devices  # by construction: each layout's count only grows with the rate
    assert small.replicas <= big.replicas  # a property of moe-3t here (one layout family wins), not of the search
    assert replicas_needed(low, big.replica) <= big.replicas  # the same layout: never fewer replicas


@settings(max_examples=40, deadline=None)
@given(rate=RATES, tpots=st.lists(TPOTS, min_size=2, max_size=2), ttfts=st.lists(TTFTS, min_size=2, max_size=2))
def test_a_looser_target_never_needs_more_devices(rate, tpots, ttfts):
    (tight_tpot, loose_tpot), (tight_ttft, loose_ttft) = sorted(tpots), sorted(ttfts)
    tight = replicas_for(rate, tpot=tight_tpot, ttft=tight_ttft)
    loose = replicas_for(rate, tpot=loose_tpot, ttft=loose_ttft)
    assert loose.devices <= tight.devices  # by construction: the minimum over a larger set of layouts
    assert loose.replicas <= tight.replicas  # a property of moe-3t here, as above
    assert replicas_needed(rate, tight.replica) >= tight.replicas  # the tight layout is still allowed


@settings(max_examples=100, deadline=None)
@given(per_request=st.floats(1e-5, 1e-1), per_chunk=st.floats(0.0, 1e-3), chunks=st.integers(0, 4096),
       cores=st.integers(1, 64))
def test_the_router_limit_is_cores_over_cpu_seconds_per_request(per_request, per_chunk, chunks, cores):
    limit = router_limit(per_request, per_chunk, chunks, cores)
    assert limit * (per_request + chunks * per_chunk) == pytest.approx(cores)
    assert router_limit(per_request, per_chunk, chunks + 1, cores) <= limit
    assert router_limit(per_request, per_chunk, chunks, cores + 1) > limit


def test_bad_input_is_refused_by_name():
    assert_refused(lambda: replicas_for(0), ValueError, "rate", 0, "positive")
    assert_refused(lambda: replicas_for(1, tpot=0.001), ValueError, "tpot", 0.001, "a target some layout meets")
    assert_refused(lambda: replicas_for(1, ttft=0.001), ValueError, "ttft", 0.001, "a target some layout meets")
    assert_refused(lambda: replicas_for(1, max_replica_devices=8), ValueError, "max_replica_devices", 8,
                   "enough devices")
    assert_refused(lambda: replicas_for(1, model="gpt-5"), ValueError, "model", "gpt-5", "one of")
    assert_refused(lambda: replicas_for(1, device_name="h100"), ValueError, "device_name", "h100", "one of")
    assert_refused(lambda: replicas_for(1, intra="pcie9"), ValueError, "intra", "pcie9", "one of")
    assert_refused(lambda: replicas_for(1, inter="ib9"), ValueError, "inter", "ib9", "one of")
    for layout, name, value, why in [((5, 1, 1), "tp", 5, "does not divide the 96 heads"),
                                     ((1, 1, 3), "ep", 3, "does not divide the 64 experts"),
                                     ((1, 78, 1), "pp", 78, "exceeds the 77 layers")]:
        assert_refused(lambda: prefill_seconds(model("moe-3t"), Hardware(32), *layout, 8), ValueError, name, value, why)
    assert_refused(lambda: prefill_seconds(model("moe-3t"), Hardware(1), 8, 1, 16, 8), ValueError, "cluster",
                   Hardware(1), "128 exceeds the 8 devices")
    assert_refused(lambda: replicas_for(1, device_name="nvlink4"), ValueError, "device_name", "nvlink4", "computes")
    assert_refused(lambda: replicas_for(1, utilization=1.5), ValueError, "utilization", 1.5, "in (0, 1]")
    assert_refused(lambda: replicas_for(1, prompt_tokens=0), ValueError, "prompt_tokens", 0, "positive int")
    assert_refused(lambda: replicas_for(1, intra=3), TypeError, "intra", 3, "str")
    assert_refused(lambda: replicas_needed(1, "r"), TypeError, "replica", "r", "ReplicaPlan")
    assert_refused(lambda: prefill_seconds(model("moe-3t"), Hardware(1), 0, 1, 1, 8), ValueError, "tp", 0, "positive")
    assert_refused(lambda: router_limit(0, 0, 10), ValueError, "per_request_cpu_s", 0, "a positive cost")
    assert_refused(lambda: router_limit(-1e-3, 0, 10), ValueError, "per_request_cpu_s", -1e-3, "non-negative")
    assert_refused(lambda: router_limit(1e-3, 0, 10, cores=0), ValueError, "cores", 0, "positive int")
    assert_refused(lambda: router_limit(1e-3, "x", 10), TypeError, "per_chunk_cpu_s", "x", "non-negative")
