import hashlib
import json
import shutil

import pytest
import torch

from labkit import tinylm as lm
from labkit.tinylm.checkpoint import CHECKPOINT, CheckpointError, load_pretrained, save_checkpoint

from ..refusals import assert_refused


def small_model(tie_embeddings: bool) -> lm.TinyLM:
    torch.manual_seed(0)
    return lm.TinyLM(lm.TinyLMConfig(d_model=64, n_layers=2, d_ff=96, max_seq_len=64,
                                     tie_embeddings=tie_embeddings)).eval()


def test_committed_checkpoint_is_small_enough():
    assert CHECKPOINT.with_suffix(".safetensors").stat().st_size <= 25e6


@pytest.fixture
def checkpoint_copy(tmp_path):
    for suffix in (".safetensors", ".json"):
        shutil.copy(CHECKPOINT.with_suffix(suffix), tmp_path / f"tinylm{suffix}")
    return tmp_path / "tinylm"


def test_save_and_load_round_trip(tmp_path):
    for tie in (True, False):
        m = small_model(tie)
        save_checkpoint(m, tmp_path / "m")
        loaded, _ = load_pretrained(tmp_path / "m")
        x = torch.randint(0, 256, (1, 9))
        with torch.no_grad():
            assert torch.equal(loaded(x), m(x))
        assert loaded.cfg == m.cfg


def test_missing_checkpoint_names_path_and_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere\.json is missing; rebuild it with `python -m labkit.tinylm.train`"):
        load_pretrained(tmp_path / "nowhere")


def test_truncated_checkpoint_is_refused(checkpoint_copy):
    f = checkpoint_copy.with_suffix(".safetensors")
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_pretrained(checkpoint_copy)


def test_one_flipped_byte_is_caught(checkpoint_copy):
    f = checkpoint_copy.with_suffix(".safetensors")
    blob = bytearray(f.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    f.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="do not match the SHA-256"):
        load_pretrained(checkpoint_copy)


def test_garbage_safetensors_with_matching_hash_is_refused(checkpoint_copy):
    f, meta_path = checkpoint_copy.with_suffix(".safetensors"), checkpoint_copy.with_suffix(".json")
    f.write_bytes(b"\xff" * 64)
    meta = json.loads(meta_path.read_text())
    meta["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        load_pretrained(checkpoint_copy)


def test_config_that_does_not_match_weights_is_refused(checkpoint_copy):
    meta_path = checkpoint_copy.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta["config"]["d_ff"] = 512
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="do not match its config"):
        load_pretrained(checkpoint_copy)
    meta["config"]["n_experts"] = 4
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="unknown TinyLMConfig field"):
        load_pretrained(checkpoint_copy)
    meta_path.write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_pretrained(checkpoint_copy)


def test_a_path_or_model_of_the_wrong_type_is_refused(tmp_path):
    assert_refused(lambda: load_pretrained(3), TypeError, "path", 3, "a path (str or pathlib.Path)")
    with pytest.raises(TypeError, match="model must be a TinyLM"):
        save_checkpoint(None, tmp_path / "m")
    assert_refused(lambda: save_checkpoint(small_model(True), tmp_path / "m", extra=[1]), TypeError, "extra", [1],
                   "a dict or None")
    assert not (tmp_path / "m.json").exists()
