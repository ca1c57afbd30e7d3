"""The model release, a Hugging Face-style folder (notebook 07, sections 1 and 3; the service reads it at start-up):

    config.json                          TinyVLMConfig.to_dict(): nested text_config and vision_config
    model-00001-of-0000K.safetensors     the tensors, split greedily by max_shard_size ("model.safetensors"
    ...                                  when one shard holds them all, as huggingface_hub names it)
    model.safetensors.index.json         {"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}
    README.md                            the model card (optional)

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON ({name: {"dtype", "shape",
"data_offsets": [begin, end]}}, offsets counted from the end of the header), then the data. read_release parses
those headers itself, reading no tensor data, and refuses a release that would not load with a ReleaseError
naming the file, tensor or config field: before any rank has read a byte of weights, so nothing is half-loaded.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from .._checks import check_type, fail, is_int
from ..tinylm import SAFETENSORS_DTYPES as DTYPES
from ..tinylm import HeaderError, TensorInfo
from ..tinylm import read_header as read_safetensors_header
from .config import TinyVLMConfig
from .model import TinyVLM, tp_plan

CONFIG, INDEX, CARD, SINGLE = "config.json", "model.safetensors.index.json", "README.md", "model.safetensors"
SHARD = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors")
UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,  # huggingface_hub's parse_size_to_int (decimal)
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # binary units, as transformers also reads them
CODES = {v: k for k, v in DTYPES.items()}


class ReleaseError(ValueError):
    """A release folder that does not load; the message starts with the file (and names the tensor or field)."""


def parse_size(max_shard_size: int | str) -> int:
    """Bytes in a shard-size limit: an int, or a string such as "1MB" (10**6), "500KB", "2GB", "1MiB" (2**20)."""
    if is_int(max_shard_size):
        if max_shard_size < 1:
            fail("max_shard_size", max_shard_size, "a positive int (bytes) or a size such as '1MB' or '1MiB'")
        return int(max_shard_size)
    if not isinstance(max_shard_size, str):
        fail("max_shard_size", max_shard_size, "an int (bytes) or a size such as '1MB' or '1MiB'", TypeError)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]I?B)\s*", max_shard_size.upper())
    size = int(float(m.group(1)) * UNITS[m.group(2)]) if m else 0
    if size < 1:
        fail("max_shard_size", max_shard_size, f"a positive size with a unit of {tuple(UNITS)} such as '1MB'")
    return size


def split_into_shards(sizes: dict[str, int], max_shard_size: int | str) -> list[list[str]]:
    """Tensor names per shard, huggingface_hub's greedy rule (split_state_dict_into_shards_factory): in key
    order, a tensor bigger than the limit becomes a shard of its own at once (the open shard stays open);
    any other tensor closes the open shard first when adding it would take the shard past the limit."""
    check_type("sizes", sizes, dict, "a dict {tensor name: bytes}")
    limit = parse_size(max_shard_size)
    shards, current, used = [], [], 0
    for name, size in sizes.items():
        if not is_int(size) or size < 0:
            fail(f"sizes[{name!r}]", size, "a non-negative int (bytes)", TypeError if not is_int(size) else ValueError)
        if size > limit:
            shards.append([name])
            continue
        if used + size > limit:
            shards.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    return shards + [current] if current else shards


def shard_files(k: int) -> list[str]:
    """File names of a release in k shards (huggingface_hub's pattern)."""
    return [SINGLE] if k == 1 else [f"model-{i:05d}-of-{k:05d}.safetensors" for i in range(1, k + 1)]


@dataclass(frozen=True)
class Release:
    """A checked release: its folder, config, index (as in the file), every tensor's place and its tensor-parallel
    style (labkit.day0.tp_plan: "column", "row", "vocab", "replicated" or "encoder")."""
    folder: Path
    config: TinyVLMConfig
    index: dict
    tensors: dict[str, TensorInfo]
    plan: dict[str, str]

    @property
    def files(self) -> list[str]:
        """The shard files, in order."""
        return sorted(set(self.index["weight_map"].values()))

    @property
    def total_size(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def _replace(path: Path, data: bytes | dict) -> None:
    """Write `data` (a dict: as indented JSON) through a temporary name, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes((json.dumps(data, indent=2) + "\n").encode() if isinstance(data, dict) else data)
    os.replace(tmp, path)


def stored_tensors(state: dict) -> dict[str, torch.Tensor]:
    """`state` without the tensors that alias an earlier one (a tied lm_head is stored once, as HF saves it)."""
    check_type("state", state, dict, "a dict {name: torch.Tensor}")
    seen, out = set(), {}
    for name, t in state.items():
        check_type(f"state[{name!r}]", t, torch.Tensor, "a torch.Tensor")
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if t.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().contiguous()
    return out


def write_release(state: dict, config, folder, max_shard_size: int | str = "1MB", card: str | None = None) -> dict:
    """Write `state` (checked against `config`: the names and shapes the model needs) as a release in `folder`
    (created; stale shards of an earlier release there are removed) and return its index. Same inputs, same
    bytes. Notebook 07 and labkit.day0.train write the course's release with it."""
    state = stored_tensors(state)
    check_type("config", config, TinyVLMConfig, "a labkit.day0.TinyVLMConfig")
    check_type("folder", folder, (str, Path), "a folder path (str or Path)")
    if card is not None:
        check_type("card", card, str, "a str (the model card, Markdown) or None")
    check_weights(config, {n: (CODES.get(t.dtype, str(t.dtype)), tuple(t.shape), "state") for n, t in state.items()})
    shards = split_into_shards({n: t.numel() * t.element_size() for n, t in state.items()}, max_shard_size)
    files = shard_files(len(shards))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if SHARD.fullmatch(old.name) and old.name not in files or old.name == INDEX and len(files) == 1:
            old.unlink()
    weight_map = {}
    for file, names in zip(files, shards):
        save_file({n: state[n] for n in names}, str(folder / (file + ".tmp")), metadata={"format": "pt"})
        os.replace(folder / (file + ".tmp"), folder / file)
        os.chmod(folder / file, 0o644)  # safetensors writes 0600; a release is for everyone to read
        weight_map.update({n: file for n in names})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
             "weight_map": {n: weight_map[n] for n in state}}
    _replace(folder / CONFIG, config.to_dict())
    if len(files) > 1:  # as huggingface_hub: a single shard has no index file
        _replace(folder / INDEX, index)
    if card is not None:
        _replace(folder / CARD, card.encode())
    return index


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Every tensor of one shard from its header alone (labkit.tinylm.read_header); ReleaseError naming the file
    for a missing, truncated or corrupted one."""
    try:
        return read_safetensors_header(path)[0]
    except HeaderError as e:
        raise ReleaseError(str(e)) from None


def expected_shapes(config, plan: dict[str, str] | None = None) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a TinyVLM with `config` stores (built on the meta device: no memory)."""
    with torch.device("meta"):
        state = TinyVLM(config).state_dict()
    return {name: tuple(state[name].shape) for name in (plan or tp_plan(config))}


def check_weights(config, weights: dict[str, tuple[str, tuple[int, ...], str]], plan: dict | None = None) -> None:
    """ReleaseError unless `weights` ({name: (dtype code, shape, where it is)}) are exactly the tensors `config`
    needs, with the shapes it implies; the message starts with where the bad tensor is (its file)."""
    want = expected_shapes(config, plan)
    for name, shape in want.items():
        if name not in weights:
            raise ReleaseError(f"{CONFIG}: tensor {name!r} is missing from the weights (the config's model needs it)")
        dtype, got, where = weights[name]
        if got != shape:
            raise ReleaseError(f"{where}: tensor {name!r} has shape {got}, {CONFIG} implies {shape}")
        if dtype not in DTYPES:
            raise ReleaseError(f"{where}: tensor {name!r} has dtype {dtype}, expected one of {tuple(DTYPES)}")
    for name, (_, _, where) in weights.items():
        if name not in want:
            raise ReleaseError(f"{where}: unknown tensor {name!r} (not part of the model {CONFIG} describes)")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise ReleaseError(f"{path.name}: missing from {path.parent}")
    try:
        obj = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReleaseError(f"{path.name}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ReleaseError(f"{path.name}: a JSON {type(obj).__name__}, expected an object")
    return obj


def _read_index(folder: Path) -> dict:
    """The index file's content (synthesized for a single-shard release), its shape checked."""
    if not (folder / INDEX).exists() and (folder / SINGLE).is_file():
        names = read_header(folder / SINGLE)
        return {"metadata": {"total_size": sum(t.nbytes for t in names.values())},
                "weight_map": {n: SINGLE for n in names}}
    index = _read_json(folder / INDEX)
    wmap, meta = index.get("weight_map"), index.get("metadata")
    if not isinstance(wmap, dict) or not all(isinstance(f, str) for f in wmap.values()):
        raise ReleaseError(f"{INDEX}: field weight_map must be an object {{tensor: file}}, got {str(wmap)[:80]}")
    if not isinstance(meta, dict) or not is_int(meta.get("total_size")):
        raise ReleaseError(f"{INDEX}: field metadata.total_size must be an int, got {str(meta)[:80]}")
    for file in wmap.values():
        if Path(file).name != file or not (folder / file).is_file():
            raise ReleaseError(f"{file}: named by {INDEX} but missing from {folder}")
    return index


def read_release(folder) -> Release:
    """The release in `folder`, checked whole before any tensor data is read (see the module docstring):
    config.json parses (unknown or missing fields named), every shard the index names exists and has a sound
    header, the index and the headers agree tensor by tensor and on total_size, and the tensors are exactly
    those the config implies, with its shapes. Used by labkit.day0.loading and the service's start-up."""
    check_type("folder", folder, (str, Path), "a release folder (str or Path)")
    folder = Path(folder)
    if not folder.is_dir():
        raise ReleaseError(f"{folder}: not a folder")
    raw = _read_json(folder / CONFIG)
    try:
        config = TinyVLMConfig.from_dict(raw)
    except (ValueError, TypeError) as e:
        raise ReleaseError(f"{CONFIG}: {e}") from None
    index = _read_index(folder)
    tensors: dict[str, TensorInfo] = {}
    for file in dict.fromkeys(index["weight_map"].values()):
        for name, info in read_header(folder / file).items():
            if index["weight_map"].get(name) != file:
                raise ReleaseError(f"{file}: holds tensor {name!r}, which {INDEX} places in "
                                   f"{index['weight_map'].get(name, 'no file')}")
            tensors[name] = info
    for name, file in index["weight_map"].items():
        if name not in tensors:
            raise ReleaseError(f"{file}: tensor {name!r} is missing (named by {INDEX})")
    total = sum(t.nbytes for t in tensors.values())
    if index["metadata"]["total_size"] != total:
        raise ReleaseError(f"{INDEX}: metadata.total_size is {index['metadata']['total_size']}, the shards' headers "
                           f"add up to {total} bytes")
    plan = tp_plan(config)
    check_weights(config, {n: (t.dtype, t.shape, t.file) for n, t in tensors.items()}, plan)
    return Release(folder, config, index, tensors, plan)
