"""labkit.day0.peak: a rank's load measured in a fresh process. Measurements vary run to run: no ordering between
the modes is asserted, only what holds on any run (the kept bytes are exact and equal load_rank's)."""
import pytest
import torch

from labkit.day0 import loading, peak, release as rel
from labkit.day0.config import small_config
from labkit.day0.model import TinyVLM
from tests.refusals import assert_refused


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    state = TinyVLM(small_config()).state_dict()
    out = tmp_path_factory.mktemp("peak") / "release"
    rel.write_release(state, small_config(), out, max_shard_size="20KB")
    return out


@pytest.mark.timeout(120)
def test_peak_memory_is_measured_for_both_ways(folder):
    kept = sum(t.numel() * t.element_size() for t in loading.load_rank(folder, 0, 2)[0].values())
    for mode in ("slices", "whole"):
        m = peak.measure_load_memory(folder, mode, 0, 2)
        assert m.mode == mode and m.kept == kept, m
        assert m.total > 0 and m.anonymous >= 0 and m.file >= 0, m
        assert isinstance(m.notes, tuple) and all(isinstance(n, str) for n in m.notes)
    assert isinstance(peak.measure_load_peak(folder, "slices", 1, 2), int)


def test_bad_arguments_are_refused(folder):
    assert_refused(lambda: peak.measure_load_peak(folder, "half"), ValueError, "mode", "half", "one of")
    assert_refused(lambda: peak.measure_load_memory(folder, "slices", 2, 2), ValueError, "rank", 2, "an int in [0, 1]")
