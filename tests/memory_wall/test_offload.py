"""plan_device_map's rule (checked by invariants and a hand example) and the -ngl curve (checked by
arithmetic written out here)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.memory_wall.offload import ngl_curve, plan_device_map, share_range

from ..refusals import assert_refused


def test_hand_example_keeps_room_for_the_largest_offloaded_layer():
    layers = {"a": 4, "b": 4, "c": 4, "d": 6}
    # gpu 12: a, b, c would fill it exactly, but then d (6) could not be brought in to run.
    assert plan_device_map(layers, {"gpu": 12, "cpu": 8, "disk": 100}) == \
        {"a": "gpu", "b": "cpu", "c": "cpu", "d": "disk"}
    assert plan_device_map(layers, {"gpu": 16, "cpu": 100}) == {"a": "gpu", "b": "gpu", "c": "cpu", "d": "cpu"}
    assert plan_device_map(layers, {"gpu": 18}) == dict.fromkeys(layers, "gpu")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=12), st.lists(st.integers(0, 120), min_size=1, max_size=3))
def test_invariants(sizes, caps):
    layers = {f"l{i}": s for i, s in enumerate(sizes)}
    mem = {f"d{i}": c for i, c in enumerate(caps)}
    try:
        plan = plan_device_map(layers, mem)
    except ValueError as e:
        assert "does not fit" in str(e)
        return
    order = [list(mem).index(plan[n]) for n in layers]
    assert order == sorted(order)  # layers keep their order across devices
    for d, cap in mem.items():
        assert sum(s for n, s in layers.items() if plan[n] == d) <= cap
    k = order.count(0)
    rest = sizes[k:]
    if len(mem) > 1:
        assert k == 0 or sum(sizes[:k]) + max(rest, default=0) <= caps[0]
        if k < len(sizes):  # one more layer on the first device would break the rule
            assert sum(sizes[:k + 1]) + max(sizes[k + 1:], default=0) > caps[0]


def test_ngl_curve_by_hand():
    # 4 layers of 1, 2, 3, 4 GB, an output layer of 5 GB, an embedding row of 1 kB (llama.cpp's rule:
    # the last N layers on the device, the output layer only for N > 4, the embedding never)
    g, row = 10**9, 1000
    curve = ngl_curve([1 * g, 2 * g, 3 * g, 4 * g], device_bandwidth=1e12, link_bandwidth=25e9,
                      output_bytes=5 * g, embedding_row_bytes=row)
    assert [c["k"] for c in curve] == [0, 1, 2, 3, 4, 5]
    assert [c["resident_bytes"] for c in curve] == [0, 4 * g, 7 * g, 9 * g, 10 * g, 15 * g]
    # N = 1: layer 3 (4 GB) stays; 1 + 2 + 3 + 5 GB + the row cross the link and are read again on the device
    off = 11 * g + row
    assert curve[1]["offloaded_bytes"] == off
    assert curve[1]["time_s"] == pytest.approx((4 * g + off) / 1e12 + off / 25e9)
    assert curve[1]["transfer_share"] == pytest.approx((off / 25e9) / ((4 * g + off) / 1e12 + off / 25e9))
    assert curve[5]["offloaded_bytes"] == row and curve[5]["transfer_s"] == pytest.approx(row / 25e9)
    assert all(a["time_s"] > b["time_s"] for a, b in zip(curve, curve[1:]))
    split = ngl_curve([g] * 4, 1e12, 25e9, host_bandwidth=50e9, mode="split")
    assert split[0]["time_s"] == pytest.approx(4 * g / 50e9) and split[0]["transfer_share"] == 0
    assert share_range(ngl_curve([g] * 4, 1e12, 25e9), 0.0, 0.0) == [4, 5]


def test_layers_that_do_not_fit_anywhere_are_named():
    with pytest.raises(ValueError, match="layer 'a' \\(5 bytes\\) does not fit: max_memory .* is too small"):
        plan_device_map({"a": 5}, {"gpu": 1, "cpu": 2})


CURVE = ngl_curve([10, 10], 1e12, 25e9)

# (function, arguments, error, argument named, bad value, what the message says was expected)
REFUSED = [
    (plan_device_map, ({}, {"gpu": 1}), ValueError, "layer_bytes", {}, "a non-empty dict of byte counts"),
    (plan_device_map, ([1, 2], {"gpu": 1}), TypeError, "layer_bytes", [1, 2], "a dict"),
    (plan_device_map, ({"a": 1}, {"gpu": -1}), ValueError, "max_memory['gpu']", -1, "a non-negative int (bytes)"),
    (plan_device_map, ({"a": 1.5}, {"gpu": 1}), TypeError, "layer_bytes['a']", 1.5, "a non-negative int"),
    (plan_device_map, ({"a": 1}, None), TypeError, "max_memory", None, "a dict"),
    (ngl_curve, ([], 1e12, 1e9), ValueError, "layer_bytes", [], "a non-empty list of byte counts"),
    (ngl_curve, ({"a": 1}, 1e12, 1e9), TypeError, "layer_bytes", {"a": 1}, "a list"),
    (ngl_curve, ([1, -2], 1e12, 1e9), ValueError, "layer_bytes[1]", -2, "a non-negative int (bytes)"),
    (ngl_curve, ([1], 1e12, 1e9, None, "stream", -1), ValueError, "output_bytes", -1, "a non-negative int"),
    (ngl_curve, ([1], 1e12, 1e9, None, "stream", 0, 0.5), TypeError, "embedding_row_bytes", 0.5, "a non-negative"),
    (ngl_curve, ([1], 0, 1e9), ValueError, "device_bandwidth", 0, "a positive finite number (bytes/s)"),
    (ngl_curve, ([1], 1e12, "25e9"), TypeError, "link_bandwidth", "25e9", "a positive finite number"),
    (ngl_curve, ([1], 1e12, 1e9, None, "offload"), ValueError, "mode", "offload", "one of ('stream', 'split')"),
    (share_range, (CURVE, -0.1), ValueError, "low", -0.1, "a finite number in [0, 1]"),
    (share_range, (CURVE, 0.3, 1.5), ValueError, "high", 1.5, "a finite number in [0, 1]"),
    (share_range, (CURVE, 0.5, 0.3), ValueError, "high", 0.3, ">= low (0.5)"),
    (share_range, (CURVE, "0.3"), TypeError, "low", "0.3", "a finite number"),
    (share_range, ((1, 2),), TypeError, "curve", (1, 2), "a list (from ngl_curve)"),
    (share_range, ([{"k": 0}],), TypeError, "curve", [{"k": 0}], "dicts with 'k' and 'transfer_share'"),
]


@pytest.mark.parametrize("fn,args,error,name,value,expected", REFUSED,
                         ids=[f"{r[0].__name__}-{r[3]}-{r[4]!r}" for r in REFUSED])
def test_bad_input_is_refused_with_the_argument_the_value_and_the_expectation(fn, args, error, name, value, expected):
    assert_refused(lambda: fn(*args), error, name, value, expected)


def test_split_mode_needs_the_host_bandwidth_before_any_row_is_built():
    with pytest.raises(ValueError, match="host_bandwidth is required when mode='split'"):
        ngl_curve([1, 2], 1e12, None, mode="split")
