"""TinyLM's byte-level tokenizer: a token id is a byte value (notebook 00)."""

from __future__ import annotations

from .._checks import is_int


class ByteTokenizer:
    """Byte-level tokenizer: token id = byte value, vocabulary of 256, exact round trip on any bytes.

    >>> tok = ByteTokenizer(); tok.encode("hi")
    [104, 105]
    """

    vocab_size = 256
    eos_id = 10  # "\n": every document of the corpus ends with it, so every answer does (the release's bos and eos)

    def encode(self, text: str | bytes) -> list[int]:
        if isinstance(text, str):
            try:
                text = text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"text must be valid Unicode, got {text!r}: {e}") from None
        if not isinstance(text, (bytes, bytearray)):
            raise TypeError(f"text must be str or bytes, got {type(text).__name__}")
        return list(text)

    def decode_bytes(self, ids) -> bytes:
        if isinstance(ids, str) or not hasattr(ids, "__iter__") and not hasattr(ids, "tolist"):
            raise TypeError(f"ids must be a sequence of byte values (ints in [0, 256)), got {type(ids).__name__} "
                            f"{ids!r}"[:160])
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        wrong_type = [i for i in ids if not is_int(i)]
        if wrong_type:
            raise TypeError(f"ids must be byte values (ints in [0, 256)), got {wrong_type[0]!r}")
        bad = [i for i in ids if not 0 <= i < 256]
        if bad:
            raise ValueError(f"ids must be byte values (ints in [0, 256)), got {bad[0]!r}")
        return bytes(ids)

    def decode(self, ids) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 show as U+FFFD (use decode_bytes to keep them)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")
