"""TinyLM checkpoints: safetensors weights plus a JSON config that records their SHA-256 (notebook 00;
`labkit.tinylm.load_pretrained()` is the entry point every lab uses).

    data/tinylm.safetensors   the weights (the tied output layer is stored once, as tok_emb.weight)
    data/tinylm.json          {"format", "config", "sha256", "training"}
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from safetensors.torch import load, save_file

from .._checks import check_type
from ..paths import TINYLM_CHECKPOINT as CHECKPOINT
from .config import TinyLMConfig, check_tinylm
from .model import TinyLM
from .tokenizer import ByteTokenizer
FORMAT = "labkit-tinylm-1"


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupted or does not match its config."""


def save_checkpoint(model: TinyLM, path=CHECKPOINT, extra: dict | None = None) -> None:
    """Write `path`.safetensors and `path`.json; the JSON records the config and the weights' SHA-256."""
    check_tinylm(model)
    path = Path(check_type("path", path, (str, os.PathLike), "a path (str or pathlib.Path)"))
    check_type("extra", extra, (dict, type(None)), "a dict or None")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (model.cfg.tie_embeddings and k == "lm_head.weight")}
    save_file(state, str(path.with_suffix(".safetensors")), metadata={"format": FORMAT})
    digest = hashlib.sha256(path.with_suffix(".safetensors").read_bytes()).hexdigest()
    meta = {"format": FORMAT, "config": model.cfg.to_dict(), "sha256": digest, **(extra or {})}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")


def load_pretrained(path=CHECKPOINT):
    """(model, tokenizer) from the committed checkpoint in data/, in eval mode; no network.

    Raises FileNotFoundError naming the path and the command that rebuilds it when the files are missing,
    and CheckpointError when they are truncated, corrupted or inconsistent.
    """
    path = Path(check_type("path", path, (str, os.PathLike), "a path (str or pathlib.Path)"))
    weights, meta_path = path.with_suffix(".safetensors"), path.with_suffix(".json")
    for f in (meta_path, weights):
        if not f.is_file():
            raise FileNotFoundError(f"checkpoint file {f} is missing; rebuild it with `python -m labkit.tinylm.train`")
    try:
        meta = json.loads(meta_path.read_text())
        cfg = TinyLMConfig.from_dict(meta["config"])
        expected = meta["sha256"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint config {meta_path} is unreadable ({e}); "
                              f"rebuild it with `python -m labkit.tinylm.train`") from None
    blob = weights.read_bytes()
    if hashlib.sha256(blob).hexdigest() != expected:
        raise CheckpointError(f"checkpoint weights {weights} do not match the SHA-256 in {meta_path.name} "
                              f"(truncated or corrupted file, {len(blob)} bytes); "
                              f"restore it (git checkout) or rebuild it with `python -m labkit.tinylm.train`")
    try:
        state = load(blob)
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise CheckpointError(f"checkpoint weights {weights} are not a valid safetensors file: {e}") from None
    model = TinyLM(cfg)
    if cfg.tie_embeddings:
        state = {**state, "lm_head.weight": state.get("tok_emb.weight")}
    try:
        model.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError) as e:
        raise CheckpointError(f"checkpoint weights {weights} do not match its config: {e}") from None
    return model.eval(), ByteTokenizer()
