"""Sequence: a request's tokens, state and timestamps; bad requests refused naming the field."""
import pytest

from labkit.serving import SamplingParams
from labkit.serving.sequence import Sequence, Status
from tests.refusals import assert_refused


def test_a_sequence_grows_and_finishes():
    seq = Sequence("a", [3, 4, 5], SamplingParams(max_tokens=4), arrival=1.5, priority=2)
    assert (seq.status, seq.tokens, seq.max_total_tokens, seq.finish_time) == (Status.WAITING, [3, 4, 5], 7, None)
    seq.output += [9, 8]
    seq.token_times += [2.0, 2.5]
    assert seq.tokens == [3, 4, 5, 9, 8] and seq.num_tokens == 5 and seq.num_output_tokens == 2
    seq.finish("length")
    assert seq.finished and seq.finish_reason == "length" and seq.finish_time == 2.5
    assert "finished" in repr(seq)


@pytest.mark.parametrize("kwargs, error, name, value, expected", [
    (dict(request_id=""), TypeError, "request_id", "", "a non-empty str"),
    (dict(prompt="hi"), TypeError, "prompt", "hi", "a list of token ids"),
    (dict(prompt=[1, -2]), TypeError, "prompt", [1, -2], "non-negative ints"),
    (dict(prompt=[]), ValueError, "prompt", [], "at least one token"),
    (dict(params=None), TypeError, "params", None, "SamplingParams"),
    (dict(arrival=-1.0), ValueError, "arrival", -1.0, ">= 0"),
    (dict(priority=1.5), TypeError, "priority", 1.5, "an int"),
])
def test_bad_requests_are_refused(kwargs, error, name, value, expected):
    args = {"request_id": "a", "prompt": [1], "params": SamplingParams(), **kwargs}
    assert_refused(lambda: Sequence(**args), error, name, value, expected)


def test_finish_refuses_an_unknown_reason():
    assert_refused(lambda: Sequence("a", [1], SamplingParams()).finish("done"), ValueError, "reason", "done", "one of")


def test_a_sequence_keeps_its_images_sorted_and_refuses_bad_ones():
    import torch
    from labkit.serving.mm import MultiModalInput
    late, early = MultiModalInput(3, 2, "b", torch.zeros(2, 4)), MultiModalInput(0, 2, "a", torch.zeros(2, 4))
    seq = Sequence("a", [7] * 6, SamplingParams(), mm=[late, early])
    assert seq.mm == (early, late) and seq.mm_spans == ((0, 2, "a"), (3, 2, "b"))
    assert Sequence("t", [1], SamplingParams()).mm == ()
    assert_refused(lambda: Sequence("a", [7] * 4, SamplingParams(), mm=[late]), ValueError, "mm[0]",
                   "positions [3, 5)", "inside the prompt's 4 tokens")
