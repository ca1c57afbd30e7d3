"""labkit.day0.config: config.json round trips, and every bad field is refused by name."""
import copy
import json

import pytest
from hypothesis import given, settings, strategies as st

from labkit.day0 import ConfigError, TinyVLMConfig, small_config
from labkit.day0.config import TextConfig, VisionConfig


@settings(max_examples=40, deadline=None)
@given(kv=st.integers(1, 4), group=st.integers(1, 3), hd=st.sampled_from([4, 8, 16]), grid=st.integers(1, 4),
       patch=st.sampled_from([4, 8]), images=st.integers(1, 3), qk=st.booleans())
def test_round_trip_through_json(kv, group, hd, grid, patch, images, qk):
    heads = kv * group
    cfg = TinyVLMConfig(TextConfig(d_model=heads * hd, n_heads=heads, n_kv_heads=kv, d_ff=32, qk_norm=qk),
                        VisionConfig(image_size=grid * patch, patch_size=patch), max_images_per_prompt=images)
    text = json.dumps(cfg.to_dict())
    assert TinyVLMConfig.from_dict(json.loads(text)) == cfg
    assert cfg.tokens_per_image == grid * grid  # one token per patch, counted by hand


def test_config_json_has_the_hugging_face_fields():
    d = TinyVLMConfig().to_dict()
    assert d["architectures"] == ["TinyVLMForConditionalGeneration"] and d["model_type"] == "tinyvlm"
    assert set(d["text_config"]) >= {"vocab_size", "d_model", "qk_norm"} and d["vision_config"]["patch_size"] == 8
    assert d["text_config"]["vocab_size"] % 8 == 0 and d["image_token_id"] >= 256


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(rope_scaling=2), "rope_scaling"),
    (lambda d: d["text_config"].update(sliding_window=8), "text_config.sliding_window"),
    (lambda d: d["vision_config"].update(foo=1), "vision_config.foo"),
    (lambda d: d["text_config"].pop("qk_norm"), "text_config.qk_norm"),
    (lambda d: d["vision_config"].pop("patch_size"), "vision_config.patch_size"),
    (lambda d: d.update(model_type="llava"), "model_type"),
    (lambda d: d["vision_config"].update(patch_size=5), "patch_size"),
    (lambda d: d["text_config"].update(n_heads=3), "n_heads"),
    (lambda d: d.update(image_token_id=12), "image_token_id"),
    (lambda d: d.update(text_config=[1]), "text_config"),
    (lambda d: d.update(max_images_per_prompt=100), "max_images_per_prompt"),
    (lambda d: d.pop("image_token_id"), "image_token_id is missing"),
    (lambda d: d.pop("torch_dtype"), "torch_dtype is missing"),
    (lambda d: d.update(architectures=["LlamaForCausalLM"]), "architectures"),
    (lambda d: d.update(torch_dtype="int8"), "torch_dtype"),
])
def test_bad_config_fields_are_named(edit, field):
    d = copy.deepcopy(small_config().to_dict())
    edit(d)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        TinyVLMConfig.from_dict(d)


def test_not_a_dict():
    with pytest.raises(ConfigError, match="JSON object"):
        TinyVLMConfig.from_dict([1, 2])
