"""The decode runs the benchmark and notebook time: each does the same work as one forward over the whole text
(its last logits equal the uncached model's), and can be re-run (rewinding) with the same result."""
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


def test_the_timing_verdict_concludes_only_when_every_pair_separates():
    from labkit.course.timing import Timing
    fast, slow = Timing((1.0, 1.1, 1.05, 1.02)), Timing((1.5, 1.6, 1.55, 1.7))
    mixed = Timing((1.0, 1.6, 1.2, 1.3))  # overlaps both
    assert speed.timing_verdict({"a": fast, "b": slow}, "fine", [("a", "b")]) == "fine"
    assert speed.timing_verdict({"a": fast, "b": slow, "c": mixed}, "fine", [("a", "b"), ("a", "c")]).startswith(
        "unreliable on this run (the repeats of a (1-1.1 s) and c (1-1.6 s) overlap")
    short = {"a": Timing((1.0, 1.1, 1.05)), "b": Timing((1.5, 1.6, 1.55))}
    assert "3 and 3 repeats" in speed.timing_verdict(short, "fine", [("a", "b")])
    assert_refused(lambda: speed.timing_verdict([fast], "x", [("a", "b")]), TypeError, "t", [fast],
                   "a {name: Timing} dict")
    assert_refused(lambda: speed.timing_verdict({"a": fast}, "x", [("a", "z")]), ValueError, "pairs", [("a", "z")],
                   "pairs of t's names")
    assert_refused(lambda: speed.timing_verdict({"a": fast}, "x", []), ValueError, "pairs", [], "at least one")
