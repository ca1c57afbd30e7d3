"""torch_threads sets torch's thread count for a block and always puts the old one back."""
import pytest
import torch

from labkit.quant.threads import torch_threads

from ..refusals import assert_refused


def test_the_count_holds_inside_and_is_restored_after():
    before = torch.get_num_threads()
    with torch_threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with torch_threads(None) as n:
        assert n == before == torch.get_num_threads()


def test_the_count_is_restored_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with torch_threads(1):
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before


def test_bad_counts_are_refused_and_change_nothing():
    before = torch.get_num_threads()
    for bad, error in ((0, ValueError), (1.0, TypeError), (True, TypeError)):
        def enter(bad=bad):
            with torch_threads(bad):
                pass
        assert_refused(enter, error, "n", bad, "a positive int")
        assert torch.get_num_threads() == before

    def named():
        with torch_threads(0, "threads"):
            pass
    assert_refused(named, ValueError, "threads", 0, "a positive int")
