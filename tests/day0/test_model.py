"""labkit.day0.model: each part against an independent torch reference."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from labkit.day0 import TinyVLM, small_config
from labkit.day0.model import tp_plan
from labkit.day0.config import TinyVLMConfig
from labkit.tinylm import TinyLM, TinyLMConfig, linear_layers


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyVLM(small_config()).eval()


def test_without_qk_norm_the_decoder_is_tinylm(model):
    cfg = small_config(qk_norm=False)
    vlm = TinyVLM(cfg).eval()
    plain = TinyLM(TinyLMConfig(**{k: v for k, v in cfg.text_config.to_dict().items() if k != "qk_norm"})).eval()
    plain.load_state_dict(vlm.language_model.state_dict())
    tokens = torch.randint(0, 256, (2, 9))
    torch.testing.assert_close(vlm.language_model(tokens), plain(tokens))


def test_qk_norm_attention_equals_a_hand_written_one(model):
    attn, cfg = model.language_model.layers[0].attn, model.config.text_config
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 2)
        attn.k_norm.weight.uniform_(0.5, 2)
    x = torch.randn(1, 5, cfg.d_model)
    q = F.rms_norm(attn.wq(x).view(1, 5, cfg.n_heads, -1), (cfg.head_dim,), attn.q_norm.weight, cfg.norm_eps)
    k = F.rms_norm(attn.wk(x).view(1, 5, cfg.n_kv_heads, -1), (cfg.head_dim,), attn.k_norm.weight, cfg.norm_eps)
    got_q, got_k, _ = attn.qkv(x)
    torch.testing.assert_close(got_q, q.transpose(1, 2))
    torch.testing.assert_close(got_k, k.transpose(1, 2))


def test_patch_embedding_is_a_strided_convolution(model):
    v = model.config.vision_config
    tower = model.vision_tower
    pixels = torch.rand(2, 3, v.image_size, v.image_size)
    weight = tower.patch_embed.weight.view(v.hidden_size, v.num_channels, v.patch_size, v.patch_size)
    conv = F.conv2d(pixels, weight, tower.patch_embed.bias, stride=v.patch_size)  # [n, d, g, g]
    expected = conv.flatten(2).transpose(1, 2) + tower.pos_emb
    tower_only = nn.Sequential()  # run the tower with no blocks and no final norm: the embedding alone
    layers, norm = tower.layers, tower.norm
    tower.layers, tower.norm = nn.ModuleList(), tower_only
    try:
        torch.testing.assert_close(tower(pixels), expected, rtol=1e-5, atol=1e-5)
    finally:
        tower.layers, tower.norm = layers, norm


def test_vision_attention_is_torch_multihead_attention(model):
    attn, v = model.vision_tower.layers[0].attn, model.config.vision_config
    ref = nn.MultiheadAttention(v.hidden_size, v.num_heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(attn.qkv.weight)
        ref.in_proj_bias.copy_(attn.qkv.bias)
        ref.out_proj.weight.copy_(attn.proj.weight)
        ref.out_proj.bias.copy_(attn.proj.bias)
    x = torch.randn(3, v.num_patches, v.hidden_size)
    torch.testing.assert_close(attn(x), ref(x, x, x, need_weights=False)[0], rtol=1e-5, atol=1e-5)


def test_image_features_replace_the_placeholders_in_order(model):
    cfg, n = model.config, model.config.tokens_per_image
    pixels = torch.rand(2, 3, 32, 32)
    tokens = torch.tensor([[5] + [cfg.image_token_id] * n + [7, 8] + [cfg.image_token_id] * n + [9]])
    feats = model.encode_images(pixels)  # [2, n, d]
    x = model.language_model.tok_emb(tokens).clone()
    x[0, 1:1 + n], x[0, 3 + n:3 + 2 * n] = feats[0], feats[1]  # by hand, slice by slice
    h = x
    lm = model.language_model
    cos, sin = lm.rope_cos[:tokens.shape[1]], lm.rope_sin[:tokens.shape[1]]
    for block in lm.layers:
        h = block(h, cos, sin)
    torch.testing.assert_close(model(tokens, pixels=pixels), lm.lm_head(lm.norm(h)))


def test_forward_refuses_missing_or_extra_images(model):
    cfg = model.config
    tokens = torch.tensor([[cfg.image_token_id] * cfg.tokens_per_image + [7]])
    with pytest.raises(ValueError, match="pixels"):
        model(tokens)
    with pytest.raises(ValueError, match="2 image"):
        model(tokens, pixels=torch.rand(2, 3, 32, 32))
    with pytest.raises(ValueError, match="pixels must be"):
        model(tokens, pixels=torch.rand(1, 3, 16, 16))
    with pytest.raises(TypeError, match="pixels"):
        model.encode_images(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


def test_tp_plan_covers_every_stored_tensor():
    cfg = small_config()
    plan = tp_plan(cfg)
    stored = {k for k in TinyVLM(cfg).state_dict() if k != "language_model.lm_head.weight"}
    assert set(plan) == stored
    styles = {"language_model." + e.path + ".weight": e.tp_style for e in linear_layers(cfg.text_config)}
    for name, style in plan.items():
        if name.startswith(("vision_tower.", "multi_modal_projector.")):
            assert style == "encoder"
        else:
            assert style == styles.get(name, "replicated"), name
    assert plan["language_model.layers.0.attn.q_norm.weight"] == "replicated"


def test_the_released_size_fits_the_issue():
    from labkit.paths import DATA
    files = list((DATA / "tinyvlm").iterdir())  # the committed release, model card included
    assert any(f.suffix == ".safetensors" for f in files) and sum(f.stat().st_size for f in files) <= 25e6
    n = sum(p.numel() for p in TinyVLM(TinyVLMConfig()).parameters())  # tied lm_head counted once
    assert n * 4 <= sum(f.stat().st_size for f in files if f.suffix == ".safetensors")


def test_the_vision_tower_sees_pixels_in_minus_one_to_one():
    """encode_images takes pixels in [0, 1] (to_pixels) and hands the tower [-1, 1], as it was trained."""
    vlm = TinyVLM(small_config()).eval()
    seen = []
    hook = vlm.vision_tower.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    try:
        size = vlm.config.vision_config.image_size
        with torch.no_grad():
            vlm.encode_images(torch.cat([torch.zeros(1, 3, size, size), torch.ones(1, 3, size, size)]))
    finally:
        hook.remove()
    assert torch.equal(seen[0][0], -torch.ones(3, size, size)) and torch.equal(seen[0][1], torch.ones(3, size, size))
