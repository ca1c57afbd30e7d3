"""The decode runs the benchmark and notebook time: each does the same work as one forward over the whole text
(its last logits equal the uncached model's), and can be re-run (rewinding) with the same result."""
import pytest
import torch

from labkit.kv_cache import speed
from labkit.tinylm import corpus
from tests.refusals import assert_refused


def test_every_run_decodes_the_same_text(pretrained):
    model, _ = pretrained
    runs = speed.decode_runs(model, context=64, steps=8, block_size=4, quantized=("int8", "fp8-e4m3"))
    assert set(runs) == {"contiguous", "paged", "int8", "fp8-e4m3"}
    tokens = torch.tensor([list(corpus.corpus("test", 64, seed=0))[:64]])
    with torch.no_grad():
        want = model(tokens)[0, -1]
    for name, run in runs.items():
        first, again = run(), run()
        assert torch.equal(first, again), name
        tol = 1e-4 if name in ("contiguous", "paged") else 0.5
        assert torch.allclose(first, want, atol=tol, rtol=0), name


def test_bad_input_is_refused(pretrained):
    model, _ = pretrained
    assert_refused(lambda: speed.decode_runs(model, context=300), ValueError, "context", 300, "[2, 256]")
    assert_refused(lambda: speed.decode_runs(model, context=16, steps=16), ValueError, "steps", 16, "[1, 15]")


def test_the_timing_verdict_is_unreliable_when_any_spread_is_large():
    from labkit.course.timing import Timing
    steady, busy = Timing((1.0, 1.1, 1.05)), Timing((1.0, 2.0, 1.2))  # spreads 0.1 and 0.83
    assert speed.timing_verdict({"a": steady, "b": steady}, "fine") == "fine"
    assert speed.timing_verdict({"a": steady, "b": busy}, "fine").startswith("unreliable on this run")
    assert speed.timing_verdict({"a": busy}, "fine", limit=1.0) == "fine"
    assert_refused(lambda: speed.timing_verdict([steady], "x"), TypeError, "t", [steady], "a {name: Timing} dict")
