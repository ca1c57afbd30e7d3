"""The release folder: the shard split equals huggingface_hub's greedy rule, the files are Hugging Face's (names,
index, safetensors read back by the real library), the bytes are deterministic, the headers are read without the
data, and every broken release of the issue's "Bad input" list is refused with a ReleaseError naming the file,
tensor or field."""
import json
import shutil
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from labkit.day0 import release as rel
from labkit.day0.config import small_config
from labkit.day0.model import TinyVLM, tp_plan
from tests.refusals import assert_refused

LIMIT = "20KB"  # the small model's ~170 KB in several shards


def hf_split(sizes: dict, max_shard_size: int) -> list[list[str]]:
    """The reference: huggingface_hub's split_state_dict_into_shards_factory, transcribed (repository
    huggingface/huggingface_hub, src/huggingface_hub/serialization/_base.py; no storage sharing). Loop over the
    keys in order: a tensor above the limit is appended as a shard of its own right away (the open shard stays
    open); otherwise, if current + size > limit, the open shard is appended and a new one begun; the tensor
    joins the open shard. At the end the open shard is appended if it is not empty."""
    shard_list, current, current_size = [], {}, 0
    for key, size in sizes.items():
        if size > max_shard_size:
            shard_list.append({key: size})
            continue
        if current_size + size > max_shard_size:
            shard_list.append(current)
            current, current_size = {}, 0
        current[key] = size
        current_size += size
    if len(current) > 0:
        shard_list.append(current)
    return [list(s) for s in shard_list]


def hf_parse_size(s: str) -> int:
    """huggingface_hub's parse_size_to_int (same file): the last two characters are the unit (TB GB MB KB, decimal)."""
    units = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}
    s = s.strip()
    return int(float(s[:-2].strip()) * units[s[-2:].upper()])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 120), max_size=30), st.integers(1, 100))
def test_split_equals_huggingface_hub(sizes, limit):
    named = {f"t{i}": s for i, s in enumerate(sizes)}
    assert rel.split_into_shards(named, limit) == hf_split(named, limit)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3 * 10**6), max_size=12), st.sampled_from(["1MB", "500KB", "0.5MB", " 2 mb", "1GB"]))
def test_split_with_size_strings_equals_huggingface_hub(sizes, limit):
    named = {f"t{i}": s for i, s in enumerate(sizes)}
    assert rel.parse_size(limit) == hf_parse_size(limit)
    assert rel.split_into_shards(named, limit) == hf_split(named, hf_parse_size(limit))


def test_split_examples():
    gb = 10**9
    sizes = dict(zip("abcdef", [6 * gb, 6 * gb, 2 * gb, 6 * gb, 2 * gb, 2 * gb]))  # huggingface_hub's docstring
    assert rel.split_into_shards(sizes, "10GB") == [["a"], ["b", "c"], ["d", "e", "f"]]
    assert rel.split_into_shards({"a": 2, "big": 20, "c": 3}, 10) == [["big"], ["a", "c"]]
    assert rel.parse_size("1MiB") == 2**20 and rel.parse_size("1KiB") == 1024 and rel.parse_size(7) == 7
    assert rel.shard_files(1) == ["model.safetensors"]
    assert rel.shard_files(3)[2] == "model-00003-of-00003.safetensors"


def test_bad_sizes_are_refused():
    assert_refused(lambda: rel.parse_size("1XB"), ValueError, "max_shard_size", "1XB", "a positive size")
    assert_refused(lambda: rel.parse_size(0), ValueError, "max_shard_size", 0, "a positive int")
    assert_refused(lambda: rel.parse_size(True), TypeError, "max_shard_size", True, "an int (bytes)")
    assert_refused(lambda: rel.parse_size(1.5), TypeError, "max_shard_size", 1.5, "an int (bytes)")
    assert_refused(lambda: rel.split_into_shards({"a": -1}, 10), ValueError, "sizes['a']", -1, "a non-negative int")
    assert_refused(lambda: rel.split_into_shards([1], 10), TypeError, "sizes", [1], "a dict")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyVLM(small_config()).eval()


@pytest.fixture(scope="module")
def release_dir(model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("release")
    rel.write_release(model.state_dict(), model.config, folder, LIMIT, card="# TinyVLM\n")
    return folder


def stored(model) -> dict:
    plan = tp_plan(model.config)
    return {n: t for n, t in model.state_dict().items() if n in plan}


def test_release_files_are_hugging_face_s(model, release_dir):
    index = json.loads((release_dir / rel.INDEX).read_text())
    want = stored(model)
    sizes = {n: t.numel() * t.element_size() for n, t in want.items()}
    shards = hf_split(sizes, hf_parse_size(LIMIT))
    assert len(shards) > 2
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    assert index["metadata"]["total_size"] == sum(sizes.values())
    assert index["weight_map"] == {n: files[i] for i, names in enumerate(shards) for n in names}
    for file, names in zip(files, shards):  # the real library reads each shard back
        got = load_file(release_dir / file)
        assert sorted(got) == sorted(names)
        assert all(torch.equal(got[n], want[n]) for n in names)
    assert "language_model.lm_head.weight" not in index["weight_map"]  # tied: stored once
    assert json.loads((release_dir / "config.json").read_text()) == model.config.to_dict()
    assert (release_dir / "README.md").read_text() == "# TinyVLM\n"


def test_same_inputs_give_the_same_bytes_and_stale_shards_go(model, release_dir, tmp_path):
    rel.write_release(model.state_dict(), model.config, tmp_path, LIMIT, card="# TinyVLM\n")
    names = sorted(p.name for p in release_dir.iterdir())
    assert names == sorted(p.name for p in tmp_path.iterdir())
    assert all((release_dir / n).read_bytes() == (tmp_path / n).read_bytes() for n in names)
    index = rel.write_release(model.state_dict(), model.config, tmp_path, "10MB")  # one shard now
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert set(index["weight_map"].values()) == {"model.safetensors"}
    assert rel.read_release(tmp_path).index == index


def test_headers_are_read_without_the_data(model, release_dir):
    r = rel.read_release(release_dir)
    assert r.config == model.config and r.total_size == r.index["metadata"]["total_size"]
    assert sorted(r.files) == sorted(set(r.index["weight_map"].values()))
    want = stored(model)
    for name, info in r.tensors.items():
        with safe_open(release_dir / info.file, "pt") as f:  # the library's view of the same tensor
            s = f.get_slice(name)
            assert (s.get_dtype(), tuple(s.get_shape())) == (info.dtype, info.shape)
        with open(release_dir / info.file, "rb") as f:
            f.seek(info.start)
            raw = f.read(info.nbytes)
        assert raw == want[name].numpy().tobytes()


def test_write_refuses_a_state_the_config_does_not_describe(model, tmp_path):
    state = stored(model)
    bad = dict(state, extra=torch.zeros(3))
    with pytest.raises(rel.ReleaseError, match="unknown tensor 'extra'"):
        rel.write_release(bad, model.config, tmp_path)
    del state["language_model.norm.weight"]
    with pytest.raises(rel.ReleaseError, match="'language_model.norm.weight' is missing"):
        rel.write_release(state, model.config, tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert_refused(lambda: rel.write_release(stored(model), model.config, 3), TypeError, "folder", 3, "a folder path")
    assert_refused(lambda: rel.write_release(stored(model), model.config, tmp_path, card=1), TypeError, "card", 1,
                   "a str")
    assert_refused(lambda: rel.write_release([], model.config, tmp_path), TypeError, "state", [], "a dict")
    assert_refused(lambda: rel.write_release(stored(model), {}, tmp_path), TypeError, "config", {}, "a labkit.day0")


# --- broken releases: each one a copy of the good release with one thing wrong ------------------------------

def _index(folder):
    return json.loads((folder / rel.INDEX).read_text())


def _save_index(folder, index):
    (folder / rel.INDEX).write_text(json.dumps(index))


def _rewrite_shard(folder, file, change):
    """Rewrite one shard with the real library after change(tensors) edited its tensors; fix the index."""
    tensors = load_file(folder / file)
    change(tensors)
    save_file(tensors, folder / file)
    index = _index(folder)
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if f != file} | {n: file for n in tensors}
    index["metadata"]["total_size"] = sum(t.nbytes for f in set(index["weight_map"].values())
                                          for t in load_file(folder / f).values())
    _save_index(folder, index)


def _header(path):
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return data, n, json.loads(data[8:8 + n])


def _break(folder, what):
    index = _index(folder)
    name = "language_model.layers.1.mlp.w_up.weight"
    file = index["weight_map"][name]
    if what == "missing tensor":
        _rewrite_shard(folder, file, lambda t: t.pop(name))
    elif what == "wrong shape":
        _rewrite_shard(folder, file, lambda t: t.update({name: t[name][:-1].contiguous()}))
    elif what == "unknown tensor":
        _rewrite_shard(folder, file, lambda t: t.update({"language_model.extra.weight": torch.zeros(4)}))
    elif what in ("unknown field", "missing field"):
        config = json.loads((folder / "config.json").read_text())
        if what == "unknown field":
            config["text_config"]["foo"] = 1
        else:
            del config["vision_config"]["patch_size"]
        (folder / "config.json").write_text(json.dumps(config))
    elif what == "missing shard":
        (folder / file).unlink()
    elif what == "truncated shard":
        data = (folder / file).read_bytes()
        (folder / file).write_bytes(data[:-10])
    elif what == "header not JSON":
        data, n, _ = _header(folder / file)
        (folder / file).write_bytes(data[:8] + b"{" * n + data[8 + n:])
    elif what == "header length":
        data = (folder / file).read_bytes()
        (folder / file).write_bytes(struct.pack("<Q", 2**40) + data[8:])
    elif what == "offsets out of range":
        data, n, header = _header(folder / file)
        del header["__metadata__"]  # room for the longer numbers
        header[name]["data_offsets"] = [o + 10**9 for o in header[name]["data_offsets"]]
        text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
        assert len(text) == n
        (folder / file).write_bytes(data[:8] + text[:n] + data[8 + n:])
    elif what == "offsets disagree with shape":
        data, n, header = _header(folder / file)
        header[name]["data_offsets"].reverse()  # same characters, a negative length
        text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
        (folder / file).write_bytes(data[:8] + text + data[8 + n:])
    elif what == "index names a missing file":
        index["weight_map"][name] = "model-00099-of-00099.safetensors"
        _save_index(folder, index)
    elif what == "index names a tensor the shard lacks":
        index["weight_map"]["language_model.ghost.weight"] = file
        _save_index(folder, index)
    elif what == "total_size":
        index["metadata"]["total_size"] += 4
        _save_index(folder, index)
    elif what == "index not JSON":
        (folder / rel.INDEX).write_text("{weight_map")
    return file


BROKEN = {  # what -> (named in the message: "file" or a literal, then a phrase)
    "missing tensor": ("config.json", "'language_model.layers.1.mlp.w_up.weight' is missing"),
    "wrong shape": ("file", "'language_model.layers.1.mlp.w_up.weight' has shape ("),
    "index names a tensor the shard lacks": ("file", "tensor 'language_model.ghost.weight' is missing (named by"),
    "unknown tensor": ("file", "unknown tensor 'language_model.extra.weight'"),
    "unknown field": ("config.json", "text_config.foo"),
    "missing field": ("config.json", "vision_config.patch_size is missing"),
    "missing shard": ("file", "missing"),
    "truncated shard": ("file", "truncated"),
    "header not JSON": ("file", "not valid JSON"),
    "header length": ("file", "header length 1099511627776"),
    "offsets out of range": ("file", "out of range: tensor 'language_model.layers.1.mlp.w_up.weight' needs bytes"),
    "offsets disagree with shape": ("file", "'language_model.layers.1.mlp.w_up.weight' has data_offsets"),
    "index names a missing file": ("model-00099-of-00099.safetensors", "missing"),
    "total_size": (rel.INDEX, "total_size"),
    "index not JSON": (rel.INDEX, "not valid JSON"),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_broken_releases_are_refused_naming_the_culprit(release_dir, tmp_path, what):
    folder = tmp_path / "broken"
    shutil.copytree(release_dir, folder)
    file = _break(folder, what)
    first, phrase = BROKEN[what]
    with pytest.raises(rel.ReleaseError) as info:
        rel.read_release(folder)
    message = str(info.value)
    assert message.startswith(file if first == "file" else first), message
    assert phrase in message, message


def test_not_a_folder_is_refused(tmp_path):
    with pytest.raises(rel.ReleaseError, match="not a folder"):
        rel.read_release(tmp_path / "nowhere")
    assert_refused(lambda: rel.read_release(7), TypeError, "folder", 7, "a release folder")
