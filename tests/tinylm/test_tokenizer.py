"""The byte-level tokenizer: exact round trips, clear errors."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.tinylm import ByteTokenizer

from ..refusals import assert_refused


@given(st.binary(max_size=300))
def test_tokenizer_round_trips_arbitrary_bytes(raw):
    tok = ByteTokenizer()
    ids = tok.encode(raw)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode_bytes(ids) == raw


@given(st.text(max_size=200))
@settings(max_examples=200)
def test_tokenizer_round_trips_text(text):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) == len(text.encode("utf-8"))


def test_bad_ids_and_text_are_refused():
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match=r"ids must be byte values \(ints in \[0, 256\)\), got 300"):
        tok.decode([65, 300])
    with pytest.raises(TypeError, match="got 65.7"):
        tok.decode([65.7])
    with pytest.raises(TypeError, match="text must be str or bytes"):
        tok.encode(42)
    assert tok.decode([104, 105]) == "hi"


def test_ids_that_are_not_a_sequence_are_refused():
    tok = ByteTokenizer()
    assert_refused(lambda: tok.decode(None), TypeError, "ids", None, "a sequence of byte values")
    assert_refused(lambda: tok.decode("hi"), TypeError, "ids", "hi", "a sequence of byte values")
    assert tok.decode(b"hi") == "hi"
