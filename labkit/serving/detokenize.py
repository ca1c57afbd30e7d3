"""Incremental detokenization for streaming (notebook 06, section 6): the text of a byte-level token stream as
it grows, never half a UTF-8 character, with OpenAI's stop strings (the service runs one TextDecoder per
request on its engine thread)."""

from __future__ import annotations

import codecs

from .._checks import fail
from ..tinylm import ByteTokenizer


class TextDecoder:
    """Text of a byte-level token stream as it grows, with stop strings.

    Bytes go through an incremental UTF-8 decoder, so half a character is never emitted (it waits for its other
    bytes; invalid bytes become U+FFFD exactly as ByteTokenizer.decode shows them). Text that could still be
    the start of a stop string is held back until it is known not to be one; when a stop string appears the
    text before it is emitted and the stop string itself is not (OpenAI's rule)."""

    def __init__(self, tokenizer=None, stop: tuple[str, ...] = ()):
        self._tokenizer = tokenizer or ByteTokenizer()
        if isinstance(stop, str) or not isinstance(stop, (tuple, list)) or not all(isinstance(s, str) for s in stop):
            fail("stop", stop, "a tuple of non-empty strings", TypeError)
        if not all(stop):
            fail("stop", stop, "a tuple of non-empty strings")
        self._stop = tuple(stop)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded, not yet emitted: could be the start of a stop string

    def feed(self, token_id: int) -> tuple[str, bool]:
        """(text that is now safe to emit, whether a stop string was completed)."""
        self._pending += self._utf8.decode(self._tokenizer.decode_bytes([token_id]))
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            out, self._pending = self._pending[:min(hits)], ""
            return out, True
        keep = max((k for s in self._stop for k in range(1, min(len(s), len(self._pending) + 1))
                    if self._pending.endswith(s[:k])), default=0)
        out, self._pending = self._pending[:len(self._pending) - keep], self._pending[len(self._pending) - keep:]
        return out, False

    def flush(self) -> str:
        """The rest at the end of the request (an unfinished character shows as U+FFFD)."""
        out, self._pending = self._pending + self._utf8.decode(b"", final=True), ""
        return out
