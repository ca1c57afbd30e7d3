"""The 30-50% sweep: each step's share against the step time written out by hand, what fits against a
layer-by-layer count, and the region against a brute-force scan of the rows."""
import pytest

from labkit import specs
from labkit.memory_wall import transfer as tr

from ..refusals import assert_refused

M = specs.model("llama-2-70b")
LAYER = M.n_params * 2 / M.n_layers  # BF16, embeddings spread over the 80 layers
KV = 2 * 80 * 8 * 128 * 2            # bytes per token of context, per sequence


@pytest.mark.parametrize("gpu,link,k,batch", [("h200", "pcie5-x16", 1, 1), ("h100-sxm", "nvlink-c2c", 5, 1),
                                              ("h200", "nvlink-c2c", 7, 8), ("h200", "pcie4-x16", 30, 32)])
def test_a_decode_step_by_hand(gpu, link, k, batch):
    g, ln = specs.device(gpu), specs.device(link)
    transfer = k * LAYER / ln.bandwidth
    on_device = (80 * LAYER + batch * 4096 * KV) / g.bandwidth  # every weight, every sequence's KV cache
    got = tr.step(M, gpu, link, k, "decode", batch, 4096)
    assert got["transfer_share"] == pytest.approx(transfer / (on_device + transfer), rel=1e-12)
    assert got["kv_bytes"] == batch * 4096 * KV


def test_a_prefill_is_compute_bound_by_hand():
    g = specs.device("h200")
    compute = 2 * M.n_params * 8192 / g.peak_flops["bf16"]
    got = tr.step(M, "h200", "pcie5-x16", 20, "prefill", 8192)
    transfer = 20 * LAYER / 63e9
    assert compute > 80 * LAYER / g.bandwidth
    assert got["transfer_share"] == pytest.approx(transfer / (compute + transfer), rel=1e-12)


@pytest.mark.parametrize("gpu,batch", [("h100-sxm", 1), ("h100-sxm", 8), ("h200", 1), ("h200", 32)])
def test_what_fits_is_counted_layer_by_layer(gpu, batch):
    # brute force: put layers on the GPU one at a time, plus one layer of room for the streamed one
    memory = specs.device(gpu).memory_bytes
    fixed = batch * 4096 * KV + batch * (2 * M.d_model + 3 * M.d_ff) * 2  # KV cache, one token's activations
    for k in range(81):
        used = fixed + sum(LAYER for _ in range(80 - k)) + (LAYER if k else 0)
        assert tr.step(M, gpu, "pcie5-x16", k, "decode", batch)["fits"] == (used <= memory)


def test_the_region_is_every_possible_setting_in_the_band():
    rows = tr.sweep(M, gpus=["h100-sxm", "h200"], links=["pcie5-x16", "nvlink-c2c"])
    assert len(rows) == 2 * 2 * len(tr.WORKLOADS) * 81
    for r in tr.region(rows):
        mine = sorted((x for x in rows if (x["gpu"], x["link"], x["workload"]) == (r["gpu"], r["link"], r["workload"])),
                      key=lambda x: x["offloaded"])
        fitting = [x["offloaded"] for x in mine if x["fits"]]
        ok = [x["offloaded"] for x in mine if x["fits"] and 0.3 <= x["share"] <= 0.5]
        assert r["fewest"] == (fitting[0] if fitting else None) and r["holds"] == bool(ok)
        assert r["in_band_possible"] == ("-" if not ok else str(ok[0]) if len(ok) == 1 else f"{ok[0]}-{ok[-1]}")
        assert ok == list(range(ok[0], ok[-1] + 1)) if ok else True  # one interval: the share rises with k
        shares = [x["share"] for x in mine]
        assert shares == sorted(shares)


def test_the_offload_figures_and_whether_they_can_run():
    # the offload figures with the KV cache of 4,096 tokens read too: an H100 cannot keep 79 layers
    h100_pcie5 = tr.step(M, "h100-sxm", "pcie5-x16", 1)
    assert h100_pcie5["transfer_share"] == pytest.approx(0.397, abs=5e-4) and not h100_pcie5["fits"]
    assert [round(tr.step(M, "h100-sxm", "nvlink-c2c", k)["transfer_share"], 3) for k in (5, 10)] == [0.315, 0.48]
    h200 = tr.step(M, "h200", "pcie5-x16", 1)
    assert 0.3 <= h200["transfer_share"] <= 0.5 and h200["fits"]
    assert tr.setting("h200", "nvlink-c2c") == "h200 + nvlink-c2c (GH200-style)"


@pytest.mark.parametrize("call,error,name,value,expected", [
    (lambda: tr.step("llama-2-70b", "h200", "pcie5-x16", 1), TypeError, "spec", "llama-2-70b", "ModelSpec"),
    (lambda: tr.step(M, "pcie5-x16", "pcie5-x16", 1), ValueError, "gpu", "pcie5-x16", "a gpu preset, one of"),
    (lambda: tr.step(M, "h200", "h100-sxm", 1), ValueError, "link", "h100-sxm", "a link preset, one of"),
    (lambda: tr.step(M, "h200", "pcie5-x16", 81), ValueError, "offloaded", 81, "an int in [0, 80]"),
    (lambda: tr.step(M, "h200", "pcie5-x16", 1.0), TypeError, "offloaded", 1.0, "an int in [0, 80]"),
    (lambda: tr.step(M, "h200", "pcie5-x16", 1, "train"), ValueError, "phase", "train", "one of ('decode'"),
    (lambda: tr.step(M, "h200", "pcie5-x16", 1, tokens=0), ValueError, "tokens", 0, "a positive int"),
    (lambda: tr.step(M, "h200", "pcie5-x16", 1, context=-1), ValueError, "context", -1, "a positive int"),
    (lambda: tr.sweep(M, gpus="h200"), TypeError, "gpus", "h200", "a list of preset names"),
    (lambda: tr.sweep(M, links=[]), ValueError, "links", [], "a non-empty list"),
    (lambda: tr.sweep(M, workloads={}), ValueError, "workloads", {}, "a non-empty dict"),
    (lambda: tr.sweep(M, workloads={"x": "decode"}), TypeError, "workloads['x']", "decode", "a (phase, tokens) pair"),
    (lambda: tr.region([]), ValueError, "rows", [], "a non-empty list of rows from sweep()"),
    (lambda: tr.region("rows"), TypeError, "rows", "rows", "a list of rows from sweep()"),
    (lambda: tr.region([{"gpu": "h200"}]), ValueError, "rows", [{"gpu": "h200"}], "dicts with ['fits'"),
    (lambda: tr.region(tr.sweep(M, ["h200"], ["pcie5-x16"]), (0.5, 0.3)), ValueError, "band", (0.5, 0.3), "low <="),
    (lambda: tr.region(tr.sweep(M, ["h200"], ["pcie5-x16"]), (0.3, float("nan"))), ValueError, "band",
     float("nan"), "a finite number in [0, 1]"),
])
def test_bad_input_is_refused(call, error, name, value, expected):
    assert_refused(call, error, name, value, expected)
