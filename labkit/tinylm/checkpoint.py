"""TinyLM's release: a Hugging Face Llama folder that labkit and transformers both open (notebook 00;
`labkit.tinylm.load_pretrained()` is the entry point every lab uses).

    data/tinylm/
      config.json              Llama config: model_type "llama", LlamaForCausalLM, TinyLM's sizes
      model.safetensors        the weights under Llama's tensor names, FP32 (a tied output layer is stored
                               once, as model.embed_tokens.weight); header metadata: "format": "pt", the
                               SHA-256 of the tensor data and the training record
      generation_config.json   greedy, stops at "\\n" (id 10), as the course generates
      tokenizer.json           byte-level: token id = byte value (GPT-2's byte-to-character alphabet, no merges)
      tokenizer_config.json
      README.md                the model card (written by labkit.tinylm.train)

TinyLM is a Llama: the same blocks, the same half-split rotary layout; only the names differ, and NAMES below
is the one table that maps them, for writing and for reading.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Callable

from safetensors.torch import load, save

from .._checks import check_type
from ..paths import TINYLM_CHECKPOINT as CHECKPOINT
from .config import TinyLMConfig, check_tinylm
from .header import HeaderError, TensorInfo, read_header
from .model import TinyLM
from .tokenizer import ByteTokenizer

EOS = ByteTokenizer.eos_id  # the release's bos, eos and pad id

REBUILD = "rebuild it with `python -m labkit.tinylm.train`"
NAMES = {  # TinyLM parameter (without ".weight"; i: the block) -> Hugging Face Llama's
    "tok_emb": "model.embed_tokens",
    "layers.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "layers.{i}.attn.wq": "model.layers.{i}.self_attn.q_proj",
    "layers.{i}.attn.wk": "model.layers.{i}.self_attn.k_proj",
    "layers.{i}.attn.wv": "model.layers.{i}.self_attn.v_proj",
    "layers.{i}.attn.wo": "model.layers.{i}.self_attn.o_proj",
    "layers.{i}.mlp_norm": "model.layers.{i}.post_attention_layernorm",
    "layers.{i}.mlp.w_gate": "model.layers.{i}.mlp.gate_proj",
    "layers.{i}.mlp.w_up": "model.layers.{i}.mlp.up_proj",
    "layers.{i}.mlp.w_down": "model.layers.{i}.mlp.down_proj",
    "norm": "model.norm",
    "lm_head": "lm_head",
}
CONFIG_KEYS = {  # TinyLMConfig field -> Llama config.json key
    "vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "d_ff": "intermediate_size",
    "max_seq_len": "max_position_embeddings", "rope_theta": "rope_theta", "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
}
LLAMA_FIXED = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}  # what TinyLM's blocks are


class CheckpointError(ValueError):
    """A release folder that is incomplete, truncated, corrupted or does not match its config."""


def _rename(name: str, table: dict[str, str]) -> str | None:
    stem, dot, suffix = name.rpartition(".")
    parts = stem.split(".")
    block = next((p for p in parts if p.isdigit()), None)
    for src, dst in table.items():
        if src.format(i=block) == stem:
            return dst.format(i=block) + dot + suffix
    return None


def hf_name(name: str) -> str:
    """The Llama name of a TinyLM parameter: "layers.0.attn.wq.weight" -> "model.layers.0.self_attn.q_proj.weight"."""
    out = _rename(name, NAMES) if isinstance(name, str) else None
    if out is None:
        raise ValueError(f"name must be a TinyLM parameter name such as 'layers.0.attn.wq.weight', got {name!r}")
    return out


def tinylm_name(name: str) -> str:
    """The TinyLM name of a Llama parameter (the inverse of hf_name)."""
    out = _rename(name, {v: k for k, v in NAMES.items()}) if isinstance(name, str) else None
    if out is None:
        raise ValueError(f"name must be a Llama parameter name of TinyLM's blocks such as "
                         f"'model.layers.0.self_attn.q_proj.weight', got {name!r}")
    return out


def llama_config(cfg: TinyLMConfig) -> dict:
    """config.json of a release of a TinyLM with config `cfg`."""
    check_type("cfg", cfg, TinyLMConfig, "a TinyLMConfig")
    sizes = {key: getattr(cfg, field) for field, key in CONFIG_KEYS.items()}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **sizes, "head_dim": cfg.head_dim,
            **LLAMA_FIXED, "bos_token_id": EOS, "eos_token_id": EOS, "torch_dtype": "float32"}


def read_config(path=CHECKPOINT) -> TinyLMConfig:
    """The TinyLMConfig of the release folder `path`, from its config.json. FileNotFoundError when it is
    missing, CheckpointError (naming the file and the key) when it is not a Llama that TinyLM can run."""
    file = _folder(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"release file {file} is missing; {REBUILD}")
    try:
        config = json.loads(file.read_text())
    except ValueError as e:
        raise CheckpointError(f"release config {file} is not JSON ({e}); {REBUILD}") from None
    if not isinstance(config, dict) or config.get("model_type") != "llama":
        got = config.get("model_type") if isinstance(config, dict) else type(config).__name__
        raise CheckpointError(f"release config {file}: model_type is {got!r}, expected 'llama' (a TinyLM release)")
    theta = config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
    fixed = {**LLAMA_FIXED, "rope_scaling": None, "pretraining_tp": 1}
    for key, want in fixed.items():
        if config.get(key, want) != want:
            raise CheckpointError(f"release config {file}: {key} is {config[key]!r}, expected {want!r} "
                                  f"(TinyLM's blocks)")
    if (config.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        raise CheckpointError(f"release config {file}: rope_parameters is {config['rope_parameters']!r}, expected "
                              f"rope_type 'default' (TinyLM's rotary positions)")
    try:
        cfg = TinyLMConfig(**{field: theta if key == "rope_theta" else config[key]
                              for field, key in CONFIG_KEYS.items()})
    except KeyError as e:
        raise CheckpointError(f"release config {file}: key {e} is missing") from None
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"release config {file}: {e}") from None
    if config.get("head_dim", cfg.head_dim) != cfg.head_dim:
        raise CheckpointError(f"release config {file}: head_dim is {config['head_dim']!r}, expected hidden_size / "
                              f"num_attention_heads = {cfg.head_dim}")
    return cfg


def tokenizer_files() -> dict[str, dict]:
    """tokenizer.json and tokenizer_config.json of a byte-level tokenizer whose id for a byte is its value, the
    same as ByteTokenizer: a BPE model without merges over GPT-2's 256 byte characters (the `tokenizers`
    library's ByteLevel pre-tokenizer and decoder map bytes to them and back). No special tokens: "\\n" is an
    ordinary byte, as in the course."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": {chars[b]: b for b in range(256)}, "merges": []}
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
                 "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level, "model": model}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": TinyLMConfig().max_seq_len,
              "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config}


def weights_file(model: TinyLM, training: dict | None = None) -> bytes:
    """model.safetensors of `model`: Llama names, the tied output layer once; the header records the SHA-256 of
    the tensor data (checked on load) and `training` (JSON)."""
    check_tinylm(model)
    check_type("training", training, (dict, type(None)), "a dict or None")
    state = {hf_name(k): v.detach().contiguous() for k, v in model.state_dict().items()
             if not (model.cfg.tie_embeddings and k == "lm_head.weight")}
    meta = {"format": "pt"}
    digest = hashlib.sha256(_data(save(state, meta))).hexdigest()  # the data bytes do not depend on the header
    return save(state, {**meta, "labkit.data_sha256": digest, "labkit.training": json.dumps(training or {})})


def save_pretrained(model: TinyLM, path=CHECKPOINT, training: dict | None = None,
                    card: Callable[[str], str] | None = None) -> Path:
    """Write the release folder `path` (see the module docstring): into a temporary folder beside it, renamed
    into place once every file is written, so a failure leaves the old release as it was. `card(sha256 of
    model.safetensors)` gives README.md's text (none without it). Returns the folder."""
    path = Path(check_type("path", path, (str, os.PathLike), "a path (str or pathlib.Path)"))
    blob = weights_file(model, training)
    files = {"config.json": llama_config(model.cfg),
             "generation_config.json": {"bos_token_id": EOS, "eos_token_id": EOS, "pad_token_id": EOS,
                                        "do_sample": False},
             **tokenizer_files()}
    readme = card(hashlib.sha256(blob).hexdigest()) if card is not None else None
    tmp, old = path.with_name(f".{path.name}.tmp-{os.getpid()}"), path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        (tmp / "model.safetensors").write_bytes(blob)
        for name, content in files.items():
            (tmp / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        if readme is not None:
            (tmp / "README.md").write_text(readme, encoding="utf-8")
        if path.exists():
            path.rename(old)
        try:
            tmp.rename(path)
        except OSError:
            if old.exists():
                old.rename(path)  # the old release back in place
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _folder(path) -> Path:
    return Path(check_type("path", path, (str, os.PathLike), "a path (str or pathlib.Path)"))


def _data(blob: bytes) -> bytes:
    return blob[8 + struct.unpack("<Q", blob[:8])[0]:]


def _header(file: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """read_header's (tensors, metadata) of the release weights, a bad file refused with the way to restore it."""
    try:
        return read_header(file)
    except HeaderError as e:
        raise CheckpointError(f"release weights {file} are not a valid safetensors file ({e}); restore it "
                              f"(git checkout) or {REBUILD}") from None


def load_pretrained(path=CHECKPOINT):
    """(model, tokenizer) from the release folder `path` (default: the committed one in data/), in eval mode;
    no network. FileNotFoundError names a missing file and the command that rebuilds it; CheckpointError names
    the file and the tensor (or config key) that is wrong: missing, of the wrong shape, cut short, corrupted."""
    cfg = read_config(path)
    file = _folder(path) / "model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"release file {file} is missing; {REBUILD}")
    header, metadata = _header(file)
    model = TinyLM(cfg)
    expected = {hf_name(k): tuple(v.shape) for k, v in model.state_dict().items()
                if not (cfg.tie_embeddings and k == "lm_head.weight")}
    for name, shape in expected.items():
        if name not in header:
            raise CheckpointError(f"release weights {file} have no tensor {name} (config.json asks for {list(shape)})")
        if header[name].shape != shape:
            raise CheckpointError(f"release weights {file}: tensor {name} has shape {list(header[name].shape)}, "
                                  f"config.json asks for {list(shape)}")
    extra = sorted(set(header) - set(expected))
    if extra:
        raise CheckpointError(f"release weights {file} hold tensor(s) {extra} that config.json has no place for")
    digest = metadata.get("labkit.data_sha256")
    blob = file.read_bytes()
    if digest is not None and hashlib.sha256(_data(blob)).hexdigest() != digest:
        raise CheckpointError(f"release weights {file} do not match the SHA-256 of their data recorded in their "
                              f"header (corrupted file); restore it (git checkout) or {REBUILD}")
    try:
        state = {tinylm_name(k): v for k, v in load(blob).items()}
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise CheckpointError(f"release weights {file} are not a valid safetensors file: {e}") from None
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["tok_emb.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval(), ByteTokenizer()


def read_training(path=CHECKPOINT) -> dict:
    """The training record that model.safetensors' header carries ({} when there is none)."""
    return json.loads(_header(_folder(path) / "model.safetensors")[1].get("labkit.training", "{}"))
