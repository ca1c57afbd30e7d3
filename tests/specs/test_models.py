import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from labkit import specs
from labkit.specs.models import MODELS
from labkit.tinylm import KVCache, TinyLMConfig

from ..refusals import assert_refused

PUBLISHED = ["gpt3-175b", "opt-13b", "llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-405b",
             "mixtral-8x7b", "deepseek-v3", "kimi-k2", "dense-320b", "moe-3t", "tinylm"]


def build(spec: specs.ModelSpec) -> nn.Module:
    """The architecture as real torch modules on the meta device (no memory): an independent count."""
    d, hd = spec.d_model, spec.head_dim
    Norm = (lambda: nn.LayerNorm(d)) if spec.norm == "layernorm" else (lambda: nn.RMSNorm(d))

    def mlp(width):
        mats = [nn.Linear(d, width, bias=spec.bias), nn.Linear(width, d, bias=spec.bias)]
        if spec.mlp == "swiglu":
            mats.append(nn.Linear(d, width, bias=spec.bias))
        return nn.ModuleList(mats)

    def attention():
        h = spec.n_heads
        if not spec.kv_lora_rank:  # DeepSeek-V2's MLA below, as Hugging Face's DeepseekV3Attention builds it
            return {"q": nn.Linear(d, h * hd, bias=spec.bias), "k": nn.Linear(d, spec.n_kv_heads * hd, bias=spec.bias),
                    "v": nn.Linear(d, spec.n_kv_heads * hd, bias=spec.bias), "o": nn.Linear(h * hd, d, bias=spec.bias)}
        q = ({"q_a": nn.Linear(d, spec.q_lora_rank, bias=False), "q_a_norm": nn.RMSNorm(spec.q_lora_rank),
              "q_b": nn.Linear(spec.q_lora_rank, h * hd, bias=False)} if spec.q_lora_rank
             else {"q": nn.Linear(d, h * hd, bias=False)})
        return {**q, "kv_a": nn.Linear(d, spec.kv_lora_rank + spec.qk_rope_head_dim, bias=False),
                "kv_a_norm": nn.RMSNorm(spec.kv_lora_rank),
                "kv_b": nn.Linear(spec.kv_lora_rank, h * (spec.qk_nope_head_dim + spec.v_head_dim), bias=False),
                "o": nn.Linear(h * spec.v_head_dim, d, bias=False)}

    def block(i):
        b = nn.ModuleDict({"norm1": Norm(), "norm2": Norm(), **attention()})
        if spec.n_experts == 1 or i < spec.first_dense_layers:
            b["mlp"] = mlp(spec.d_ff)
        else:
            width = spec.moe_d_ff or spec.d_ff
            b["experts"] = nn.ModuleList(mlp(width) for _ in range(spec.n_experts + spec.n_shared_experts))
            b["router"] = nn.Linear(d, spec.n_experts, bias=False)
        return b

    with torch.device("meta"):
        m = nn.ModuleDict({"embed": nn.Embedding(spec.vocab_size, d), "blocks": nn.ModuleList(
            block(i) for i in range(spec.n_layers)), "final_norm": Norm()})
        if spec.positions:
            m["positions"] = nn.Embedding(spec.positions, d)
        if not spec.tied_embeddings:
            m["lm_head"] = nn.Linear(d, spec.vocab_size, bias=False)
    return m


@pytest.mark.parametrize("name", PUBLISHED)
def test_counts_from_the_architecture_match_the_published_totals_within_2_percent(name):
    m = specs.model(name)
    assert abs(m.n_params / m.published_params - 1) < 0.02, (m.n_params, m.published_params)
    if m.published_active:
        # Kimi K2 publishes "32B activated": two digits, and its count leaves out part of the embeddings
        # (ours reads both embedding matrices, 32.9B); every other preset is within 2%.
        assert abs(m.active_params / m.published_active - 1) < (0.03 if name == "kimi-k2" else 0.02)


def test_deepseek_v3_caches_70272_bytes_per_token_and_counts_671b_total_37b_active():
    # DeepSeek-V3 report (arXiv:2412.19437): MLA caches d_c + d_h^R = 512 + 64 elements per layer and token.
    m = specs.model("deepseek-v3")
    assert m.is_mla and m.kv_bytes_per_token(2) == (512 + 64) * 61 * 2 == 70_272
    assert round(m.n_params / 1e9) == 671 and round(m.active_params / 1e9) in (37, 38)
    assert m.kv_bytes_per_token(1) * 2 == m.kv_bytes_per_token(2)


def test_a_dense_first_layer_and_shared_experts_are_always_active():
    m = specs.model("kimi-k2")
    no_shared = dataclasses.replace(m, n_shared_experts=0)
    expert = m.counts()["expert_mlp"]
    assert m.active_params - no_shared.active_params == m.moe_layers * expert == 60 * 3 * 7168 * 2048
    all_moe = dataclasses.replace(m, first_dense_layers=0)
    assert m.moe_layers == 60 and all_moe.moe_layers == 61


def test_course_stand_ins_are_marked_hypothetical_and_real_models_are_not():
    assert [n for n in specs.model_names() if specs.model(n).hypothetical] == ["dense-320b", "moe-3t"]


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b"])
def test_llama_counts_are_exact_to_the_parameter(name):
    assert specs.model(name).n_params == specs.model(name).published_params


small_specs = st.builds(
    lambda L, kv, g, hd, ff, v, mlp, norm, bias, tied, pos, e, k: specs.ModelSpec(
        "x", L, kv * g * hd, kv * g, kv, ff, v, 64, mlp, norm, bias, tied, pos, e, min(k, e)),
    st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 8), st.integers(1, 40),
    st.integers(1, 50), st.sampled_from(["gelu", "swiglu"]), st.sampled_from(["layernorm", "rmsnorm"]),
    st.booleans(), st.booleans(), st.integers(0, 9), st.integers(1, 4), st.integers(1, 4))


small_moe_mla_specs = st.builds(
    lambda L, h, q_lora, kv_lora, rope, nope, v, e, k, ff, shared, dense: specs.ModelSpec(
        "x", L, 4 * h, h, h, 12, 30, 64, n_experts=e, experts_per_token=min(k, e), moe_d_ff=ff,
        n_shared_experts=shared, first_dense_layers=min(dense, L - 1), q_lora_rank=q_lora, kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=v),
    st.integers(1, 3), st.integers(1, 4), st.integers(0, 5), st.integers(1, 6), st.integers(1, 4),
    st.integers(1, 4), st.integers(1, 4), st.integers(2, 5), st.integers(1, 3), st.integers(0, 7),
    st.integers(0, 2), st.integers(0, 2))


@settings(max_examples=40, deadline=None)
@given(st.one_of(small_specs, small_moe_mla_specs))
def test_counts_equal_the_parameters_of_the_same_architecture_built_from_torch_modules(spec):
    assert spec.n_params == sum(p.numel() for p in build(spec).parameters())


def test_mixture_of_experts_counts_only_the_picked_experts_as_active():
    m = specs.model("mixtral-8x7b")
    dense = dataclasses.replace(m, n_experts=1, experts_per_token=1)
    assert m.active_params == dense.n_params + m.n_layers * (1 * m.counts()["expert_mlp"] + m.d_model * 8)
    assert specs.model("llama-3-8b").active_params == specs.model("llama-3-8b").n_params


def test_tinylm_preset_matches_the_committed_model(pretrained):
    model, _ = pretrained
    t = specs.model("tinylm")
    assert t.n_params == sum(p.numel() for p in model.parameters())
    assert (t.n_layers, t.n_kv_heads, t.head_dim) == (model.cfg.n_layers, model.cfg.n_kv_heads, model.cfg.head_dim)


@pytest.mark.parametrize("name", ["GPT3-175B", "llama2-7b", ""])
def test_unknown_model_names_are_refused_with_the_list_of_presets(name):
    with pytest.raises(ValueError, match="gpt3-175b.*llama-2-7b|llama-2-7b.*gpt3-175b") as e:
        specs.model(name)
    assert str(e.value).startswith("name must be one of") and repr(name) in str(e.value)


@pytest.mark.parametrize("name", [None, 7, ["llama-2-7b"]])
def test_model_names_that_are_not_strings_are_a_type_error(name):
    assert_refused(lambda: specs.model(name), TypeError, "name", name, "one of ('deepseek-v3', 'dense-320b'")


def test_model_names_are_the_presets_and_tinylm_last():
    assert specs.model_names() == [*MODELS, "tinylm"]
    assert all(specs.model(n).name == n for n in specs.model_names())


def test_kv_bytes_per_token_equals_the_tensors_of_tinylms_cache():
    cfg = TinyLMConfig(d_model=96, n_layers=3, n_heads=6, n_kv_heads=2, d_ff=64, max_seq_len=40)
    for dtype in (torch.float32, torch.bfloat16):
        cache = KVCache(cfg, batch_size=3, max_len=40, dtype=dtype)
        per_token = specs.kv_bytes_per_token(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim,
                                             torch.tensor([], dtype=dtype).element_size())
        assert per_token * 3 * 40 == cache.nbytes()


def test_kv_bytes_per_token_matches_the_vllm_papers_opt_13b_figure():
    # Kwon et al., PagedAttention (SOSP 2023), section 3: OPT-13B needs 800 KB per token:
    # 2 (key and value) x 5120 (hidden size) x 40 (layers) x 2 (bytes per FP16).
    assert specs.kv_bytes_per_token(40, 40, 128, 2) == 2 * 5120 * 40 * 2 == 800 * 1024


def test_kv_bytes_per_token_rounds_fractional_elements_up():
    assert specs.kv_bytes_per_token(1, 1, 3, 0.5) == 3
    assert specs.kv_bytes_per_token(1, 1, 1, 0.3) == 1


def test_kv_bytes_of_llama_2_7b_are_half_a_mebibyte_per_token():
    assert specs.model("llama-2-7b").kv_bytes_per_token(2) == 2**19  # 2 x 32 layers x 4096 x 2 bytes


@pytest.mark.parametrize("args,error,name,value,expected", [
    ((0, 8, 128), ValueError, "n_layers", 0, "a positive int"),
    ((32, -8, 128), ValueError, "n_kv_heads", -8, "a positive int"),
    ((32, 8, 12.5), TypeError, "head_dim", 12.5, "a positive int"),
    ((32, 8, True), TypeError, "head_dim", True, "a positive int"),
    ((32, 8, 128, 0), ValueError, "bytes_per_element", 0, "a positive finite number"),
    ((32, 8, 128, float("nan")), ValueError, "bytes_per_element", float("nan"), "a positive finite number"),
    ((32, 8, 128, "2"), TypeError, "bytes_per_element", "2", "a positive finite number"),
])
def test_kv_bytes_per_token_refuses_bad_sizes(args, error, name, value, expected):
    assert_refused(lambda: specs.kv_bytes_per_token(*args), error, name, value, expected)


@pytest.mark.parametrize("change,error,name,expected", [
    ({"n_layers": 0}, ValueError, "n_layers", "a positive int"),
    ({"d_ff": -5}, ValueError, "d_ff", "a positive int"),
    ({"vocab_size": 2.5}, TypeError, "vocab_size", "a positive int"),
    ({"context": "4096"}, TypeError, "context", "a positive int"),
    ({"n_experts": True}, TypeError, "n_experts", "a positive int"),
    ({"positions": -1}, ValueError, "positions", "a non-negative int"),
    ({"experts_per_token": 2}, ValueError, "experts_per_token", "<= n_experts (1)"),
    ({"mlp": "relu"}, ValueError, "mlp", "one of ('gelu', 'swiglu')"),
    ({"norm": "batchnorm"}, ValueError, "norm", "one of ('layernorm', 'rmsnorm')"),
    ({"bias": 0}, TypeError, "bias", "True or False"),
    ({"tied_embeddings": "no"}, TypeError, "tied_embeddings", "True or False"),
    ({"published_params": -1.0}, ValueError, "published_params", "a positive finite number (parameters)"),
    ({"published_active": 7e9}, ValueError, "published_active", "<= published_params"),
    ({"name": ""}, ValueError, "name", "a non-empty str"),
    ({"name": None}, TypeError, "name", "str"),
    ({"source": 3}, TypeError, "source", "str"),
    ({"kv_lora_rank": -1}, ValueError, "kv_lora_rank", "a non-negative int"),
    ({"qk_rope_head_dim": 64}, ValueError, "qk_rope_head_dim", "0 unless kv_lora_rank > 0"),
    ({"n_shared_experts": 1}, ValueError, "n_shared_experts", "0 for a dense model (n_experts=1)"),
    ({"moe_d_ff": 1.5}, TypeError, "moe_d_ff", "a non-negative int"),
])
def test_bad_architectures_are_refused(change, error, name, expected):
    [(_, value)] = change.items()
    assert_refused(lambda: dataclasses.replace(specs.model("llama-2-7b"), **change), error, name, value, expected)


def test_inconsistent_heads_are_refused_and_unknown_settings_too():
    with pytest.raises(ValueError, match="n_kv_heads must divide n_heads, got d_model=4096, n_heads=32, n_kv_heads=3"):
        dataclasses.replace(specs.model("llama-2-7b"), n_kv_heads=3)
    with pytest.raises(ValueError, match="n_heads must divide d_model"):
        dataclasses.replace(specs.model("llama-2-7b"), n_heads=3, n_kv_heads=3)
    with pytest.raises(TypeError, match="n_expert"):
        specs.ModelSpec("x", 1, 8, 2, 2, 8, 8, 8, n_expert=2)  # a typo is not silently ignored


def test_latent_attention_needs_every_width_and_no_kv_head_grouping():
    mla = specs.model("deepseek-v3")
    assert_refused(lambda: dataclasses.replace(mla, v_head_dim=0), ValueError, "v_head_dim", 0,
                   "a positive int when kv_lora_rank > 0")
    with pytest.raises(ValueError, match="n_kv_heads must equal n_heads .128."):
        dataclasses.replace(mla, n_kv_heads=8)
    assert_refused(lambda: dataclasses.replace(mla, first_dense_layers=61), ValueError, "first_dense_layers", 61,
                   "< n_layers (61)")


def test_numpy_sizes_are_stored_as_python_ints():
    m = specs.ModelSpec("x", np.int64(2), 8, 2, 2, 8, 8, 8)
    assert type(m.n_layers) is int and m == specs.ModelSpec("x", 2, 8, 2, 2, 8, 8, 8)
