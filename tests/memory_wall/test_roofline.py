import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from labkit.memory_wall import roofline as rl

from ..refusals import assert_refused

pos = st.floats(min_value=1e-3, max_value=1e15, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize("dtype,bits", [(torch.float32, 32), (torch.bfloat16, 16), (torch.int8, 8)])
def test_weight_bytes_equals_the_bytes_torch_allocates(dtype, bits):
    w = torch.zeros(96, 160, dtype=dtype)
    assert rl.weight_bytes(w.numel(), bits) == w.numel() * w.element_size()


def test_weight_bytes_at_4_bits_equals_two_codes_per_byte_and_counts_group_scales():
    n = 4096
    packed = np.zeros(n // 2, dtype=np.uint8)  # two 4-bit codes per byte
    assert rl.weight_bytes(n, 4) == packed.nbytes
    scales = np.zeros(n // 32, dtype=np.float16)  # llama.cpp Q4_0: one fp16 scale per 32 weights = 4.5 bits
    assert rl.weight_bytes(n, 4 + 16 / 32) == packed.nbytes + scales.nbytes


@given(st.floats(min_value=1, max_value=1e15), st.floats(min_value=1, max_value=1e15))
def test_decode_ceiling_times_bytes_is_the_bandwidth(b, bw):
    assert math.isclose(rl.decode_ceiling(b, bw) * b, bw, rel_tol=1e-12)


def test_decode_ceiling_of_a_7b_fp16_model_on_an_h100_is_about_250_tokens_per_second():
    # 6.74e9 parameters x 2 bytes = 13.5 GB read per token; 3.35 TB/s / 13.5 GB = 249 tokens/s
    assert round(rl.decode_ceiling(6.738e9 * 2, 3.35e12)) == 249


@given(pos, pos, pos)
def test_attainable_flops_is_the_bandwidth_slope_left_of_the_ridge_and_flat_right_of_it(i, peak, bw):
    got = rl.attainable_flops(i, peak, bw)
    ridge = rl.ridge_point(peak, bw)
    if i <= ridge:
        assert math.isclose(got, i * bw, rel_tol=1e-12)
    else:
        assert got == peak
    assert got <= peak * (1 + 1e-12)


def test_attainable_flops_on_arrays_matches_the_scalar_version_and_never_decreases():
    x = np.geomspace(0.01, 1e4, 101)
    y = rl.attainable_flops(x, 67e12, 3.35e12)
    assert np.all(np.diff(y) >= 0)
    assert y == pytest.approx([rl.attainable_flops(float(v), 67e12, 3.35e12) for v in x], rel=1e-12)
    assert rl.attainable_flops([1, 2], 1e12, 1e9).tolist() == [1e9, 2e9]  # lists and ints too


@pytest.mark.parametrize("m,n,k", [(1, 256, 128), (8, 64, 96), (128, 128, 128)])
def test_matmul_intensity_agrees_with_torchs_flop_counter_and_tensor_sizes(m, n, k):
    x, w = torch.randn(m, k), torch.randn(k, n)
    with FlopCounterMode(display=False) as counter:
        y = x @ w
    moved = x.nbytes + w.nbytes + y.nbytes
    assert rl.matmul_intensity(m, n, k, 4) == pytest.approx(counter.get_total_flops() / moved, rel=1e-12)


def layer_by_layer(layers, on_device, dev_bw, link_bw, host_bw, mode):
    """Brute force: walk the layers one at a time."""
    t = transfer = 0.0
    for size, resident in zip(layers, on_device):
        if resident:
            t += size / dev_bw
        elif mode == "stream":
            transfer += size / link_bw
            t += size / link_bw + size / dev_bw
        else:
            t += size / host_bw
    return t, transfer


@settings(max_examples=50)
@given(st.lists(st.integers(1, 10**9), min_size=1, max_size=20), st.integers(0, 20),
       st.sampled_from(["stream", "split"]))
def test_offload_time_equals_a_layer_by_layer_walk(layers, k, mode):
    k = min(k, len(layers))
    on_device = [i < k for i in range(len(layers))]
    resident, offloaded = sum(layers[:k]), sum(layers[k:])
    got = rl.offload_time(resident, offloaded, 2e12, 32e9, host_bandwidth=50e9, mode=mode)
    t, transfer = layer_by_layer(layers, on_device, 2e12, 32e9, 50e9, mode)
    assert got["time_s"] == pytest.approx(t, rel=1e-9)
    assert got["transfer_s"] == pytest.approx(transfer, rel=1e-9, abs=1e-15)
    assert 0 <= got["transfer_share"] < 1
    assert got["time_s"] == pytest.approx(got["device_s"] + got["transfer_s"] + got["host_s"], rel=1e-12)


def test_plot_roofline_draws_one_line_per_device_and_one_marker_per_point():
    import matplotlib
    matplotlib.use("Agg")
    ax = rl.plot_roofline([("a", 1e12, 1e10), ("b", 1e13, 1e11)], points=[("p", 2.0, 1e10)])
    assert len(ax.lines) == 3
    x, y = ax.lines[0].get_data()
    assert y == pytest.approx(rl.attainable_flops(x, 1e12, 1e10))
    assert x[0] == pytest.approx(0.05) and x[-1] == pytest.approx(2000.0)
    with pytest.raises(ValueError, match="ceilings must name at least one"):
        rl.plot_roofline([])


def test_offload_time_with_compute_is_the_slower_of_memory_and_arithmetic():
    # A prefill of 2,048 tokens through Llama-2-70B (6.9e10 parameters, 2 bytes each) on an H100 (989 TFLOP/s
    # BF16, 3.35 TB/s), 10 of 80 layers streamed over PCIe 5.0 (63 GB/s).
    weights, flops = 68.98e9 * 2, 2 * 68.98e9 * 2048
    r = rl.offload_time(weights * 70 / 80, weights * 10 / 80, 3.35e12, 63e9, flops=flops, peak_flops=989.4e12)
    assert r["device_s"] == pytest.approx(flops / 989.4e12)          # compute-bound: 286 ms
    assert r["transfer_s"] == pytest.approx(weights / 8 / 63e9)       # 274 ms on the link
    assert 0.45 < r["transfer_share"] < 0.5
    decode = rl.offload_time(weights * 70 / 80, weights * 10 / 80, 3.35e12, 63e9, flops=2 * 68.98e9,
                             peak_flops=989.4e12)
    assert decode["device_s"] == pytest.approx(weights / 3.35e12)     # one token: memory-bound
    split = rl.offload_time(60.0, 40.0, 10.0, None, host_bandwidth=1.0, mode="split", flops=1000.0, peak_flops=10.0)
    assert split["device_s"] == pytest.approx(60.0) and split["host_s"] == pytest.approx(40.0)


OFFLOAD = {"resident_bytes": 1e9, "offloaded_bytes": 1e9, "device_bandwidth": 1e12, "link_bandwidth": 3e10}

# (function, arguments, error, argument named, bad value, what the message says was expected)
REFUSED = [
    (rl.weight_bytes, (0, 4), ValueError, "n_params", 0, "a positive finite number"),
    (rl.weight_bytes, (float("inf"), 4), ValueError, "n_params", float("inf"), "a positive finite number"),
    (rl.weight_bytes, ("7e9", 4), TypeError, "n_params", "7e9", "a positive finite number"),
    (rl.weight_bytes, (True, 4), TypeError, "n_params", True, "a positive finite number"),
    (rl.weight_bytes, (10, 33), ValueError, "bits_per_weight", 33, "in (0, 32] (bits)"),
    (rl.weight_bytes, (10, 0), ValueError, "bits_per_weight", 0, "in (0, 32]"),
    (rl.weight_bytes, (10, float("nan")), ValueError, "bits_per_weight", float("nan"), "in (0, 32]"),
    (rl.weight_bytes, (10, None), TypeError, "bits_per_weight", None, "a finite number"),
    (rl.decode_ceiling, (0, 1e9), ValueError, "bytes_per_token", 0, "a finite number >= 1 (bytes)"),
    (rl.decode_ceiling, (1e-300, 1e300), ValueError, "bytes_per_token", 1e-300, "a finite number >= 1 (bytes)"),
    (rl.decode_ceiling, (1e9, -1), ValueError, "bandwidth", -1, "a finite number >= 1 (bytes/s)"),
    (rl.decode_ceiling, (1e9, 1e-300), ValueError, "bandwidth", 1e-300, "a finite number >= 1 (bytes/s)"),
    (rl.decode_ceiling, (1e9, float("inf")), ValueError, "bandwidth", float("inf"), "a finite number >= 1"),
    (rl.decode_ceiling, (1e9, "3.35e12"), TypeError, "bandwidth", "3.35e12", "a finite number >= 1"),
    (rl.decode_ceiling, (float("nan"), 1e9), ValueError, "bytes_per_token", float("nan"), "a finite number >= 1"),
    (rl.attainable_flops, (-1.0, 1e12, 1e9), ValueError, "intensity", -1.0, "a positive finite number"),
    (rl.attainable_flops, ("1", 1e12, 1e9), TypeError, "intensity", "1", "a positive finite number"),
    (rl.attainable_flops, ([1.0, float("nan")], 1e12, 1e9), ValueError, "intensity", [1.0, float("nan")],
     "a non-empty array of finite numbers > 0"),
    (rl.attainable_flops, ([], 1e12, 1e9), ValueError, "intensity", [], "a non-empty array"),
    (rl.attainable_flops, (["a"], 1e12, 1e9), TypeError, "intensity", ["a"], "an array of numbers"),
    (rl.attainable_flops, (1.0, 0, 1e9), ValueError, "peak_flops", 0, "a positive finite number (FLOP/s)"),
    (rl.attainable_flops, (1.0, 1e12, None), TypeError, "bandwidth", None, "a positive finite number"),
    (rl.ridge_point, (-1e12, 1e9), ValueError, "peak_flops", -1e12, "a positive finite number (FLOP/s)"),
    (rl.ridge_point, (1e12, 0), ValueError, "bandwidth", 0, "a positive finite number (bytes/s)"),
    (rl.ridge_point, (1e15, 1e-300), ValueError, "peak_flops / bandwidth", 1e-300, "a finite ratio > 0 (FLOP/byte)"),
    (rl.ridge_point, (1e-300, 1e300), ValueError, "peak_flops / bandwidth", 1e300, "a finite ratio > 0"),
    (rl.matmul_intensity, (0, 8, 8), ValueError, "m", 0, "a positive int"),
    (rl.matmul_intensity, (1, 8.0, 8), TypeError, "n", 8.0, "a positive int"),
    (rl.matmul_intensity, (1, 8, True), TypeError, "k", True, "a positive int"),
    (rl.matmul_intensity, (1, 8, 8, 0), ValueError, "bytes_per_element", 0, "a finite number >= 0.125 (bytes"),
    (rl.matmul_intensity, (1, 8, 8, 1e-300), ValueError, "bytes_per_element", 1e-300, "a finite number >= 0.125"),
    (rl.plot_roofline, ("h100",), TypeError, "ceilings", "h100", "a list of (label, number, number) triples"),
    (rl.plot_roofline, ([("a", 1e12)],), TypeError, "ceilings", [("a", 1e12)], "triples"),
    (rl.plot_roofline, ([("a", 0, 1e9)],), ValueError, "peak_flops", 0, "a positive finite number"),
    (rl.plot_roofline, ([("a", 1e12, 1e9)], [("p", 1.0, -5)]), ValueError, "flops_per_s", -5, "a positive"),
    (rl.plot_roofline, ([("a", 1e12, 1e9)], [("p", 0, 5)]), ValueError, "intensity", 0, "a positive"),
    (rl.plot_roofline, ([("a", 1e12, 1e9)], (), None, (10, 1)), ValueError, "intensity_range", (10, 1),
     "low < high"),
    (rl.plot_roofline, ([("a", 1e12, 1e9)], (), None, 5), TypeError, "intensity_range", 5, "a (low, high) pair"),
]


@pytest.mark.parametrize("fn,args,error,name,value,expected", REFUSED,
                         ids=[f"{r[0].__name__}-{r[3]}-{r[4]!r}" for r in REFUSED])
def test_bad_input_is_refused_with_the_argument_the_value_and_the_expectation(fn, args, error, name, value, expected):
    assert_refused(lambda: fn(*args), error, name, value, expected)


@pytest.mark.parametrize("change,error,name,value,expected", [
    ({"resident_bytes": -1}, ValueError, "resident_bytes", -1, "a non-negative finite number (bytes)"),
    ({"offloaded_bytes": "1e9"}, TypeError, "offloaded_bytes", "1e9", "a non-negative finite number"),
    ({"device_bandwidth": 0}, ValueError, "device_bandwidth", 0, "a positive finite number (bytes/s)"),
    ({"link_bandwidth": 0}, ValueError, "link_bandwidth", 0, "a positive finite number (bytes/s)"),
    ({"mode": "overlap"}, ValueError, "mode", "overlap", "one of ('stream', 'split')"),
    ({"flops": -1.0, "peak_flops": 1e15}, ValueError, "flops", -1.0, "a non-negative finite number (FLOP)"),
    ({"flops": 1.0, "peak_flops": 0}, ValueError, "peak_flops", 0, "a positive finite number (FLOP/s)"),
    ({"mode": "split", "host_bandwidth": float("inf")}, ValueError, "host_bandwidth", float("inf"), "finite"),
    ({"peak_flops": -1}, ValueError, "peak_flops", -1, "a positive finite number (FLOP/s)"),  # even with no FLOP
    ({"peak_flops": float("nan")}, ValueError, "peak_flops", float("nan"), "a positive finite number"),
    # a bandwidth the mode does not use is checked all the same
    ({"host_bandwidth": "1e11"}, TypeError, "host_bandwidth", "1e11", "a positive finite number (bytes/s)"),
    ({"host_bandwidth": True}, TypeError, "host_bandwidth", True, "a positive finite number"),
    ({"mode": "split", "host_bandwidth": 1e11, "link_bandwidth": -3e10}, ValueError, "link_bandwidth", -3e10,
     "a positive finite number"),
    # bytes and bandwidths so far apart that the step's time overflows (inf) or underflows (0): no inf, no NaN
    ({"device_bandwidth": 1e-300}, ValueError, "the bytes and bandwidths", float("inf"),
     "such that the step takes a finite time > 0 seconds (resident_bytes=1000000000.0"),
    ({"resident_bytes": 1e-300, "offloaded_bytes": 0, "device_bandwidth": 1e300}, ValueError,
     "the bytes and bandwidths", 0.0, "device_bandwidth=1e+300"),
])
def test_offload_time_refuses_bad_settings(change, error, name, value, expected):
    assert_refused(lambda: rl.offload_time(**{**OFFLOAD, **change}), error, name, value, expected)


@pytest.mark.parametrize("change,match", [
    ({"resident_bytes": 0, "offloaded_bytes": 0}, "resident_bytes \\+ offloaded_bytes must be > 0"),
    ({"mode": "split"}, "host_bandwidth is required when mode='split'"),
    ({"link_bandwidth": None}, "link_bandwidth is required when mode='stream'"),
    ({"flops": 1e12}, "peak_flops is required when flops > 0"),
])
def test_offload_time_refuses_inconsistent_settings(change, match):
    with pytest.raises(ValueError, match=match):
        rl.offload_time(**{**OFFLOAD, **change})
