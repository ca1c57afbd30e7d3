"""The release folder (labkit.tinylm.checkpoint): round trips, the one name map, and every kind of bad folder
refused with the file and the tensor named. transformers reads the same folder in test_hf.py."""
import hashlib
import json
import re
import shutil
import struct

import pytest
import torch

from labkit import tinylm as lm
from labkit.tinylm import checkpoint as ck
from labkit.tinylm.checkpoint import CHECKPOINT, CheckpointError, load_pretrained, save_pretrained

from ..refusals import assert_refused


def small_model(tie_embeddings: bool) -> lm.TinyLM:
    torch.manual_seed(0)
    return lm.TinyLM(lm.TinyLMConfig(d_model=64, n_layers=2, d_ff=96, max_seq_len=64,
                                     tie_embeddings=tie_embeddings)).eval()


@pytest.fixture
def release(tmp_path):
    """A copy of the committed release, to break."""
    return shutil.copytree(CHECKPOINT, tmp_path / "tinylm")


def header(path) -> tuple[int, dict]:
    blob = (path / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    return n, json.loads(blob[8:8 + n])


def rewrite_weights(path, state: dict, metadata: dict | None = None) -> None:
    from safetensors.torch import save_file
    save_file(state, str(path / "model.safetensors"), metadata=metadata or {"format": "pt"})


def test_committed_release_is_complete_and_small_enough():
    names = {p.name for p in CHECKPOINT.iterdir()}
    assert names == {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json", "README.md"}
    assert (CHECKPOINT / "model.safetensors").stat().st_size <= 25e6
    assert not list(CHECKPOINT.parent.glob("tinylm.*")), "the pre-release files are gone"


def test_the_model_card_states_the_sha256_of_the_committed_weights():
    digest = hashlib.sha256((CHECKPOINT / "model.safetensors").read_bytes()).hexdigest()
    assert f"SHA-256 `{digest}`" in (CHECKPOINT / "README.md").read_text()


def test_committed_files_are_what_labkit_writes():
    model, _ = load_pretrained()
    for name, content in {"config.json": ck.llama_config(model.cfg), **ck.tokenizer_files()}.items():
        assert json.loads((CHECKPOINT / name).read_text()) == content, name
    assert ck.read_config() == model.cfg == lm.TinyLMConfig()
    assert ck.read_training()["recipe"]["steps"] == 3200


def test_save_and_load_round_trip(tmp_path):
    for tie in (True, False):
        m = small_model(tie)
        folder = save_pretrained(m, tmp_path / "m", training={"note": "test"})
        loaded, tok = load_pretrained(folder)
        assert isinstance(tok, lm.ByteTokenizer) and loaded.cfg == m.cfg
        for k, v in m.state_dict().items():
            assert torch.equal(loaded.state_dict()[k], v), k
        n, head = header(folder)
        assert ("lm_head.weight" in head) is not tie
        assert head["__metadata__"]["format"] == "pt" and ck.read_training(folder) == {"note": "test"}


def test_the_name_map_is_one_table_read_both_ways():
    names = lm.TinyLM(lm.TinyLMConfig(n_layers=12)).state_dict()
    for name in names:
        assert ck.tinylm_name(ck.hf_name(name)) == name
    assert len({ck.hf_name(n) for n in names}) == len(names)
    assert ck.hf_name("layers.11.mlp.w_gate.weight") == "model.layers.11.mlp.gate_proj.weight"
    assert ck.hf_name("layers.0.attn_norm.weight") == "model.layers.0.input_layernorm.weight"
    assert ck.hf_name("tok_emb.weight") == "model.embed_tokens.weight"
    assert ck.tinylm_name("model.norm.weight") == "norm.weight"
    for bad in ("layers.0.attn.wz.weight", "embed", 3):
        assert_refused(lambda: ck.hf_name(bad), ValueError, "name", bad, "a TinyLM parameter name")
    assert_refused(lambda: ck.tinylm_name("model.layers.0.self_attn.rotary_emb.inv_freq"), ValueError, "name",
                   "model.layers.0.self_attn.rotary_emb.inv_freq", "a Llama parameter name")


def test_the_tokenizer_file_maps_every_byte_to_its_value():
    vocab = ck.tokenizer_files()["tokenizer.json"]["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(256)) and all(len(c) == 1 for c in vocab)
    assert vocab["a"] == ord("a") and vocab["Ġ"] == ord(" ") and vocab["Ċ"] == ord("\n")  # GPT-2's alphabet


def test_missing_files_name_the_file_and_the_command(release, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere/config\.json is missing; rebuild it with "
                                                r"`python -m labkit.tinylm.train`"):
        load_pretrained(tmp_path / "nowhere")
    (release / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"tinylm/model\.safetensors is missing"):
        load_pretrained(release)


def test_a_config_that_is_not_a_tinylm_llama_is_refused(release):
    config_path = release / "config.json"
    config = json.loads(config_path.read_text())
    for change, message in (({"model_type": "mistral"}, "model_type is 'mistral', expected 'llama'"),
                            ({"hidden_act": "gelu"}, "hidden_act is 'gelu', expected 'silu'"),
                            ({"attention_bias": True}, "attention_bias is True, expected False"),
                            ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling is"),
                            ({"head_dim": 64}, "head_dim is 64, expected hidden_size / num_attention_heads = 32"),
                            ({"num_key_value_heads": 3}, "n_heads (4) must be a multiple of n_kv_heads (3)")):
        config_path.write_text(json.dumps({**config, **change}))
        with pytest.raises(CheckpointError, match=re.escape(f"{config_path}: {message}")):
            load_pretrained(release)
    config_path.write_text(json.dumps({k: v for k, v in config.items() if k != "intermediate_size"}))
    with pytest.raises(CheckpointError, match="key 'intermediate_size' is missing"):
        load_pretrained(release)
    config_path.write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json is not JSON"):
        load_pretrained(release)


def test_a_config_that_does_not_match_the_weights_names_the_tensor(release):
    config_path = release / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "intermediate_size": 512}))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor model\.layers\.0\.mlp\.gate_proj\.weight "
                                              r"has shape \[384, 128\], config\.json asks for \[512, 128\]"):
        load_pretrained(release)


def test_a_missing_or_extra_tensor_is_named(release):
    from safetensors.torch import load_file
    state = load_file(str(release / "model.safetensors"))
    del state["model.layers.2.self_attn.v_proj.weight"]
    rewrite_weights(release, state)
    with pytest.raises(CheckpointError, match=r"have no tensor model\.layers\.2\.self_attn\.v_proj\.weight"):
        load_pretrained(release)
    state["model.layers.2.self_attn.v_proj.weight"] = torch.zeros(64, 128)
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(128)
    rewrite_weights(release, state)
    with pytest.raises(CheckpointError, match=r"tensor\(s\) \['model\.layers\.0\.self_attn\.q_proj\.bias'\] that "
                                              r"config\.json has no place for"):
        load_pretrained(release)


def test_a_truncated_file_names_the_first_tensor_cut(release):
    f = release / "model.safetensors"
    n, head = header(release)
    tensors = sorted((v["data_offsets"], k) for k, v in head.items() if k != "__metadata__")
    (start, end), name = tensors[len(tensors) // 2]
    f.write_bytes(f.read_bytes()[:8 + n + start + 10])
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(f))} are not a valid safetensors file .* truncated, "
                                              rf"or data_offsets out of range: tensor '{re.escape(name)}' needs "
                                              rf"bytes \[{start}, {end}\] of the data, the file holds {start + 10}"):
        load_pretrained(release)
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="not a valid safetensors file .model.safetensors: "
                                              "corrupted or truncated: header length"):
        load_pretrained(release)


def test_one_flipped_byte_is_caught(release):
    f = release / "model.safetensors"
    blob = bytearray(f.read_bytes())
    blob[-1000] ^= 0x01
    f.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="do not match the SHA-256 of their data recorded in their header"):
        load_pretrained(release)


def test_a_failed_write_leaves_the_old_release_as_it_was(tmp_path, monkeypatch):
    folder = save_pretrained(small_model(True), tmp_path / "m")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def broken_card(sha256):
        raise RuntimeError("evaluation failed")
    with pytest.raises(RuntimeError, match="evaluation failed"):
        save_pretrained(small_model(False), folder, card=broken_card)
    real_write = type(folder).write_text

    def failing_write(self, *args, **kwargs):
        if self.name == "tokenizer.json":
            raise OSError("disk full")
        return real_write(self, *args, **kwargs)
    monkeypatch.setattr(type(folder), "write_text", failing_write)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(small_model(False), folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary folder left


def test_a_path_or_model_of_the_wrong_type_is_refused(tmp_path):
    assert_refused(lambda: load_pretrained(3), TypeError, "path", 3, "a path (str or pathlib.Path)")
    with pytest.raises(TypeError, match="model must be a TinyLM"):
        save_pretrained(None, tmp_path / "m")
    assert_refused(lambda: save_pretrained(small_model(True), tmp_path / "m", training=[1]), TypeError, "training",
                   [1], "a dict or None")
    assert not (tmp_path / "m").exists()
