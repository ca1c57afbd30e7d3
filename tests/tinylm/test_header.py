"""The safetensors header reader against the safetensors library itself: the same tensors at the same bytes, and
every truncation or flipped length refused, naming the file."""
import json
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from labkit.tinylm.header import SAFETENSORS_DTYPES, HeaderError, read_header

CODES = {v: k for k, v in SAFETENSORS_DTYPES.items()}


def write(path, shapes, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(shape, generator=gen).to(dtype) for i, shape in enumerate(shapes)}
    save_file(tensors, str(path), metadata={"format": "pt", "note": "x"})
    return tensors


@pytest.mark.parametrize("dtype", list(SAFETENSORS_DTYPES.values()))
def test_each_tensor_lies_where_the_library_put_it(tmp_path, dtype):
    path = tmp_path / "w.safetensors"
    write(path, [(3, 5), (0,), (7,), (2, 2, 2)], dtype)
    tensors, metadata = read_header(path)
    assert metadata == {"format": "pt", "note": "x"}
    blob = path.read_bytes()
    for name, ref in load_file(str(path)).items():
        info = tensors[name]
        assert (info.file, info.dtype, info.shape, info.nbytes) == (path.name, CODES[dtype], tuple(ref.shape),
                                                                    ref.numel() * ref.element_size())
        got = torch.frombuffer(bytearray(blob[info.start:info.start + info.nbytes]), dtype=dtype) \
            if info.nbytes else torch.empty(0, dtype=dtype)
        assert torch.equal(got.reshape(ref.shape), ref)


@settings(max_examples=30, deadline=None)
@given(cut=st.integers(0, 1000))
def test_any_truncation_is_refused_naming_the_file(tmp_path_factory, cut):
    path = tmp_path_factory.mktemp("h") / "w.safetensors"
    write(path, [(4, 8), (16,)])
    blob = path.read_bytes()
    path.write_bytes(blob[:max(0, len(blob) - 1 - cut)])
    with pytest.raises(HeaderError, match=r"^w\.safetensors: .*(truncated|header length)"):
        read_header(path)


def test_a_corrupted_header_is_refused(tmp_path):
    path = tmp_path / "w.safetensors"
    write(path, [(4, 8)])
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header["t0"]["dtype"] = "I4"
    path.write_bytes(blob[:8] + json.dumps(header, separators=(",", ":")).encode().ljust(n) + blob[8 + n:])
    with pytest.raises(HeaderError, match="corrupted header entry for tensor 't0'"):
        read_header(path)
    path.write_bytes(struct.pack("<Q", 2**40) + blob[8:])
    with pytest.raises(HeaderError, match="header length 1099511627776"):
        read_header(path)
    with pytest.raises(HeaderError, match="missing from"):
        read_header(tmp_path / "none.safetensors")
    with pytest.raises(TypeError, match="path must be a safetensors file's path"):
        read_header(3)
