"""The three overlap cases on 2 real gloo ranks compute what a brute-force, one-process version of the same
work computes, in both modes (overlap changes when bytes move, never the result); the bucket timeline
follows the alpha-beta model by hand."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.parallel import overlap_cases as oc
from labkit.parallel.linkmodel import LinkModel
from tests.refusals import assert_refused


def _w(seed, width, count=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(width, width, generator=g) / width ** 0.5 for _ in range(count)]


@pytest.mark.timeout(90)
def test_every_case_computes_the_brute_force_result(pool2):
    rows, width, depth = 8, 16, 2
    # (a) pipeline: stage 0 then stage 1 on each micro-batch
    run = oc.run_case("pipeline", pool=pool2, repeats=1, microbatches=3, rows=rows, width=width, depth=depth)
    (w0,), (w1,) = _w(100, width), _w(101, width)
    want = [float(oc._layer(oc._layer(torch.randn(rows, width, generator=torch.Generator().manual_seed(i)),
                                      w0, depth), w1, depth).double().sum()) for i in range(3)]
    for mode in oc.MODES:
        assert run["ranks"][1]["result"][mode] == pytest.approx(want, rel=1e-5)
        assert len(run["seconds"][mode]) == 1 and run["seconds"][mode][0] > 0
    # (b) tp: every layer, each rank's matmuls, then the mean over ranks
    run = oc.run_case("tp", pool=pool2, repeats=1, layers=3, rows=rows, width=width, depth=depth)
    ws = [_w(200 + r, width, 3) for r in range(2)]
    for j in range(2):
        x = torch.randn(rows, width, generator=torch.Generator().manual_seed(j))
        for layer in range(3):
            x = sum(oc._layer(x, ws[r][layer], depth) for r in range(2)) / 2
        for rank in run["ranks"]:
            for mode in oc.MODES:
                assert torch.allclose(rank["result"][mode][j], x, atol=1e-5)
    # (c) buckets: the sum of both ranks' own gradients, whatever the bucket size (3 does not divide 5)
    for bucket_layers in (1, 3, 5):
        run = oc.run_case("buckets", pool=pool2, repeats=1, layers=5, rows=rows, width=width, depth=depth,
                          bucket_layers=bucket_layers, keep_grads=True)
        total = run["ranks"][0]["local"] + run["ranks"][1]["local"]
        assert run["ranks"][0]["buckets"] == -(-5 // bucket_layers)
        for rank in run["ranks"]:
            for mode in oc.MODES:
                assert torch.allclose(rank["result"][mode], total, atol=1e-6)


def test_bad_sizes_are_refused():
    assert_refused(lambda: oc.run_case("ring"), ValueError, "case", "ring", "one of")
    assert_refused(lambda: oc.run_case("tp", layers=0), ValueError, "layers", 0, "positive")
    assert_refused(lambda: oc.run_case("tp", bucket_layers=2), ValueError, "sizes", ["bucket_layers"], "keyword")
    assert_refused(lambda: oc.run_case("buckets", layers=2, bucket_layers=3), ValueError, "bucket_layers", 3,
                   "at most the 2 layers")
    assert_refused(lambda: oc.run_case("pipeline", world=1), ValueError, "world", 1, "at least 2")


def test_bucket_timeline_by_hand():
    link = LinkModel(0.0, 1.0)  # a bucket of b bytes takes b seconds over 2 ranks (2(n-1)/n = 1)
    # 4 layers of 1 s, buckets of 2 layers of 0.75 bytes each -> 1.5 s per bucket
    assert oc.bucket_timeline(4, 1.0, 0.75, 2, 2, link) == pytest.approx(5.5)  # ready at 2 and 4; 3.5, 5.5
    assert oc.bucket_timeline(4, 1.0, 0.75, 2, 2, link, "sequential") == pytest.approx(7.0)  # 4 + 1.5 + 1.5
    assert oc.bucket_timeline(4, 1.0, 2.0, 1, 2, link) == pytest.approx(1 + 4 * 2.0)  # link-bound
    assert_refused(lambda: oc.bucket_timeline(4, 1.0, 1.0, 2, 2, link, "both"), ValueError, "mode", "both", "one of")


@settings(max_examples=50, deadline=None)
@given(layers=st.integers(1, 12), bucket=st.integers(1, 12), layer_s=st.floats(1e-4, 1.0),
       grad=st.floats(1.0, 1e9), alpha=st.floats(0, 1e-3))
def test_overlap_never_loses_and_never_beats_either_part(layers, bucket, layer_s, grad, alpha):
    link = LinkModel(alpha, 1e9)
    bucket = min(bucket, layers)
    ovl = oc.bucket_timeline(layers, layer_s, grad, bucket, 2, link)
    seq = oc.bucket_timeline(layers, layer_s, grad, bucket, 2, link, "sequential")
    comm = seq - layers * layer_s
    assert ovl <= seq * (1 + 1e-12)
    assert ovl >= max(layers * layer_s, comm) * (1 - 1e-12)
