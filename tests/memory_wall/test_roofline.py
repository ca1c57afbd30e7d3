import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from labkit.memory_wall import roofline as rl
from labkit.tinylm import KVCache, TinyLMConfig

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


@pytest.mark.parametrize("n,bits", [(0, 4), (-1, 4), (float("nan"), 4), (float("inf"), 4), (10, 0), (10, 33),
                                    (10, -4), (10, float("nan"))])
def test_weight_bytes_refuses_bad_sizes(n, bits):
    with pytest.raises(ValueError, match="n_params|bits_per_weight"):
        rl.weight_bytes(n, bits)


@pytest.mark.parametrize("n,bits", [("7e9", 4), (True, 4), (10, None)])
def test_weight_bytes_refuses_non_numbers(n, bits):
    with pytest.raises(TypeError, match="must be a real number"):
        rl.weight_bytes(n, bits)


def test_kv_bytes_per_token_equals_the_tensors_of_tinylms_cache():
    cfg = TinyLMConfig(d_model=96, n_layers=3, n_heads=6, n_kv_heads=2, d_ff=64, max_seq_len=40)
    for dtype in (torch.float32, torch.bfloat16):
        cache = KVCache(cfg, batch_size=3, max_len=40, dtype=dtype)
        per_token = rl.kv_bytes_per_token(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim,
                                          torch.tensor([], dtype=dtype).element_size())
        assert per_token * 3 * 40 == cache.nbytes()


def test_kv_bytes_per_token_matches_the_vllm_papers_opt_13b_figure():
    # Kwon et al., PagedAttention (SOSP 2023), section 3: OPT-13B needs 800 KB per token:
    # 2 (key and value) x 5120 (hidden size) x 40 (layers) x 2 (bytes per FP16).
    assert rl.kv_bytes_per_token(40, 40, 128, 2) == 2 * 5120 * 40 * 2 == 800 * 1024


def test_kv_bytes_per_token_rounds_fractional_elements_up():
    assert rl.kv_bytes_per_token(1, 1, 3, 0.5) == 3
    assert rl.kv_bytes_per_token(1, 1, 1, 0.3) == 1


@pytest.mark.parametrize("args", [(0, 8, 128), (32, -8, 128), (32, 8, 128, 0), (32, 8, 128, float("nan"))])
def test_kv_bytes_per_token_refuses_bad_sizes(args):
    with pytest.raises(ValueError, match="n_layers|n_kv_heads|head_dim|bytes_per_element"):
        rl.kv_bytes_per_token(*args)


@pytest.mark.parametrize("args", [(32, 8, 12.5), (32, 8, True), (32, 8, 128, "2")])
def test_kv_bytes_per_token_refuses_non_integers(args):
    with pytest.raises(TypeError, match="head_dim|bytes_per_element"):
        rl.kv_bytes_per_token(*args)


@given(pos, pos)
def test_decode_ceiling_times_bytes_is_the_bandwidth(b, bw):
    assert math.isclose(rl.decode_ceiling(b, bw) * b, bw, rel_tol=1e-12)


def test_decode_ceiling_of_a_7b_fp16_model_on_an_h100_is_about_250_tokens_per_second():
    # 6.74e9 parameters x 2 bytes = 13.5 GB read per token; 3.35 TB/s / 13.5 GB = 249 tokens/s
    assert round(rl.decode_ceiling(6.738e9 * 2, 3.35e12)) == 249


@pytest.mark.parametrize("b,bw", [(0, 1e9), (1e9, 0), (float("nan"), 1e9), (1e9, -1)])
def test_decode_ceiling_refuses_bad_input(b, bw):
    with pytest.raises(ValueError, match="bytes_per_token|bandwidth"):
        rl.decode_ceiling(b, bw)


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
    with pytest.raises(ValueError, match="intensity"):
        rl.attainable_flops(np.array([1.0, np.nan]), 1e12, 1e9)
    with pytest.raises(ValueError, match="intensity"):
        rl.attainable_flops(-1.0, 1e12, 1e9)


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


@pytest.mark.parametrize("kwargs,match", [
    ({"resident_bytes": 0, "offloaded_bytes": 0}, "resident_bytes \\+ offloaded_bytes"),
    ({"resident_bytes": -1}, "resident_bytes"),
    ({"link_bandwidth": 0}, "link_bandwidth"),
    ({"mode": "split"}, "host_bandwidth is required"),
    ({"mode": "overlap"}, "mode must be"),
    ({"flops": 1e12}, "peak_flops is required"),
    ({"flops": -1.0, "peak_flops": 1e15}, "flops"),
    ({"link_bandwidth": None}, "link_bandwidth"),
])
def test_offload_time_refuses_bad_input(kwargs, match):
    args = {"resident_bytes": 1e9, "offloaded_bytes": 1e9, "device_bandwidth": 1e12, "link_bandwidth": 3e10,
            **kwargs}
    with pytest.raises(ValueError, match=match):
        rl.offload_time(**args)


def test_plot_roofline_draws_one_line_per_device_and_one_marker_per_point():
    import matplotlib
    matplotlib.use("Agg")
    ax = rl.plot_roofline([("a", 1e12, 1e10), ("b", 1e13, 1e11)], points=[("p", 2.0, 1e10)])
    assert len(ax.lines) == 3
    x, y = ax.lines[0].get_data()
    assert y == pytest.approx(rl.attainable_flops(x, 1e12, 1e10))
    with pytest.raises(ValueError, match="ceilings"):
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
