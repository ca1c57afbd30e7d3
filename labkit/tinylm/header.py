"""The one reader of a safetensors file's header (TinyLM's release, notebook 00; day 0's sharded releases,
notebook 07). The format (huggingface/safetensors, "format" in its README):

    bytes 0..8         n, the header's length (unsigned 64-bit, little-endian)
    bytes 8..8+n       JSON: {tensor name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]},
                              "__metadata__": {str: str}}   (optional)
    bytes 8+n..        the tensors' data; data_offsets count from here

The header is read without the data, and every entry is checked against the file's length, so a truncated or
corrupted file is refused before a byte of it is trusted.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from .._checks import check_type, is_int

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header (bytes)


class HeaderError(ValueError):
    """A safetensors file that is missing, truncated or corrupted; the message starts with the file's name."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: its file's name, dtype (safetensors' code, "F32"), shape, the absolute byte offset of
    its data in the file and its size in bytes."""
    file: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    nbytes: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return SAFETENSORS_DTYPES[self.dtype]


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """(every tensor of the file by name, the header's __metadata__ or {}), from the header alone. HeaderError
    naming the file for a missing, truncated or corrupted one: bad length or JSON, a bad entry, a dtype other than
    SAFETENSORS_DTYPES' keys, offsets that disagree with the shape, overlap, or run past the end of the file (the
    message then names the first tensor cut)."""
    path = Path(check_type("path", path, (str, os.PathLike), "a safetensors file's path (str or pathlib.Path)"))
    if not path.is_file():
        raise HeaderError(f"{path.name}: missing from {path.parent}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 2 <= n <= min(MAX_HEADER, size - 8):
            raise HeaderError(f"{path.name}: corrupted or truncated: header length {n} in a file of {size} bytes")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise HeaderError(f"{path.name}: corrupted header: not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{path.name}: corrupted header: a JSON {type(header).__name__}, expected an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise HeaderError(f"{path.name}: corrupted header: __metadata__ must map names to strings, got "
                          f"{str(metadata)[:120]}")
    tensors, data = {}, 8 + n
    for name, e in header.items():
        ok = isinstance(e, dict) and e.get("dtype") in SAFETENSORS_DTYPES and isinstance(e.get("shape"), list) \
            and all(is_int(s) and s >= 0 for s in e["shape"]) and isinstance(e.get("data_offsets"), list) \
            and len(e["data_offsets"]) == 2 and all(is_int(o) for o in e["data_offsets"])
        if not ok:
            raise HeaderError(f"{path.name}: corrupted header entry for tensor {name!r}: {str(e)[:120]}")
        begin, end = e["data_offsets"]
        nbytes = math.prod(e["shape"]) * SAFETENSORS_DTYPES[e["dtype"]].itemsize
        if begin < 0 or end - begin != nbytes:
            raise HeaderError(f"{path.name}: tensor {name!r} has data_offsets {[begin, end]}, expected "
                              f"{nbytes} bytes for {e['dtype']} {e['shape']}")
        tensors[name] = TensorInfo(path.name, e["dtype"], tuple(e["shape"]), data + begin, nbytes)
    spans = sorted((t.start, t.start + t.nbytes, name) for name, t in tensors.items())
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise HeaderError(f"{path.name}: tensors {a!r} and {b!r} overlap (corrupted data_offsets)")
    cut = [(begin, end, name) for begin, end, name in spans if end > size]
    if cut:
        begin, end, name = cut[0]
        raise HeaderError(f"{path.name}: truncated, or data_offsets out of range: tensor {name!r} needs bytes "
                          f"[{begin - data}, {end - data}] of the data, the file holds {size - data}")
    return tensors, metadata
