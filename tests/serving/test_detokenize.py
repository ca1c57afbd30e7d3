"""Incremental detokenization: against Python's own UTF-8 decoder on the whole text, and a brute-force search
for stop strings."""
from hypothesis import given, strategies as st

from labkit.serving.detokenize import TextDecoder
from tests.refusals import assert_refused


def stopped_reference(text: str, stops) -> tuple[str, bool]:
    """Brute force: the first prefix of `text` that contains a stop string ends it, at that string's start."""
    for end in range(1, len(text) + 1):
        hits = [text[:end].find(s) for s in stops if s in text[:end]]
        if hits:
            return text[:min(hits)], True
    return text, False


@given(st.binary(max_size=40))
def test_text_decoder_equals_decoding_everything_at_once(data):
    dec = TextDecoder()
    pieces = [dec.feed(b)[0] for b in data] + [dec.flush()]
    assert "".join(pieces) == data.decode("utf-8", errors="replace")


@given(st.text(max_size=20))
def test_text_decoder_never_emits_half_a_character(text):
    dec = TextDecoder()
    pieces = [dec.feed(b)[0] for b in text.encode()]
    assert "".join(pieces) + dec.flush() == text
    assert all("\ufffd" not in p for p in pieces) or "\ufffd" in text


@given(st.text("ab\né", max_size=16), st.lists(st.text("ab\né", min_size=1, max_size=3), max_size=3))
def test_text_decoder_cuts_at_the_first_stop_string(text, stops):
    dec = TextDecoder(stop=tuple(stops))
    out, stopped = [], False
    for b in text.encode():
        piece, stopped = dec.feed(b)
        out.append(piece)
        if stopped:
            break
    if not stopped:
        out.append(dec.flush())
    assert ("".join(out), stopped) == stopped_reference(text, stops)


def test_bad_stop_strings_are_refused():
    assert_refused(lambda: TextDecoder(stop="ab"), TypeError, "stop", "ab", "a tuple of non-empty strings")
    assert_refused(lambda: TextDecoder(stop=("",)), ValueError, "stop", ("",), "a tuple of non-empty strings")
