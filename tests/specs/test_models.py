import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from labkit import specs

PUBLISHED = ["gpt3-175b", "opt-13b", "llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "mixtral-8x7b",
             "dense-320b", "moe-3t", "tinylm"]


def build(spec: specs.ModelSpec) -> nn.Module:
    """The architecture as real torch modules on the meta device (no memory): an independent count."""
    d, hd = spec.d_model, spec.head_dim
    Norm = (lambda: nn.LayerNorm(d)) if spec.norm == "layernorm" else (lambda: nn.RMSNorm(d))

    def mlp():
        mats = [nn.Linear(d, spec.d_ff, bias=spec.bias), nn.Linear(spec.d_ff, d, bias=spec.bias)]
        if spec.mlp == "swiglu":
            mats.append(nn.Linear(d, spec.d_ff, bias=spec.bias))
        return nn.ModuleList(mats)

    def block():
        b = nn.ModuleDict({
            "norm1": Norm(), "norm2": Norm(),
            "q": nn.Linear(d, spec.n_heads * hd, bias=spec.bias),
            "k": nn.Linear(d, spec.n_kv_heads * hd, bias=spec.bias),
            "v": nn.Linear(d, spec.n_kv_heads * hd, bias=spec.bias),
            "o": nn.Linear(spec.n_heads * hd, d, bias=spec.bias),
            "experts": nn.ModuleList(mlp() for _ in range(spec.n_experts)),
        })
        if spec.n_experts > 1:
            b["router"] = nn.Linear(d, spec.n_experts, bias=False)
        return b

    with torch.device("meta"):
        m = nn.ModuleDict({"embed": nn.Embedding(spec.vocab_size, d), "blocks": nn.ModuleList(
            block() for _ in range(spec.n_layers)), "final_norm": Norm()})
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
        assert abs(m.active_params / m.published_active - 1) < 0.02


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b"])
def test_llama_counts_are_exact_to_the_parameter(name):
    assert specs.model(name).n_params == specs.model(name).published_params


small_specs = st.builds(
    lambda L, kv, g, hd, ff, v, mlp, norm, bias, tied, pos, e, k: specs.ModelSpec(
        "x", L, kv * g * hd, kv * g, kv, ff, v, 64, mlp, norm, bias, tied, pos, e, min(k, e)),
    st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 8), st.integers(1, 40),
    st.integers(1, 50), st.sampled_from(["gelu", "swiglu"]), st.sampled_from(["layernorm", "rmsnorm"]),
    st.booleans(), st.booleans(), st.integers(0, 9), st.integers(1, 4), st.integers(1, 4))


@settings(max_examples=40, deadline=None)
@given(small_specs)
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


def test_kv_bytes_of_llama_2_7b_are_half_a_mebibyte_per_token():
    assert specs.model("llama-2-7b").kv_bytes_per_token(2) == 2**19  # 2 x 32 layers x 4096 x 2 bytes


@pytest.mark.parametrize("name", ["GPT3-175B", "llama2-7b", "", None, 7])
def test_unknown_model_names_are_refused_with_the_list_of_presets(name):
    with pytest.raises(ValueError, match="gpt3-175b.*llama-2-7b|llama-2-7b.*gpt3-175b") as e:
        specs.model(name)
    assert repr(name) in str(e.value)


def test_every_device_names_its_source_and_the_required_ones_exist():
    for name in ["h100-sxm", "h200", "a100-80gb", "mi300x", "rtx-4090", "m2-ultra", "pcie4-x16", "pcie5-x16",
                 "nvlink4"]:
        d = specs.device(name)
        assert d.source and d.bandwidth > 0
        assert (d.kind == "link") == (d.memory_bytes == 0)
        assert d.kind in ("link", "host") or d.peak_flops["fp32"] > 0
    assert set(specs.device_names("link")) >= {"pcie4-x16", "pcie5-x16", "nvlink4"}


def test_spec_sheet_figures():
    # H100 SXM datasheet: 80 GB HBM3 at 3.35 TB/s; BF16 1,979 TFLOPS with sparsity, so 989 dense.
    h100 = specs.device("h100-sxm")
    assert (h100.memory_bytes, h100.bandwidth, round(h100.peak_flops["bf16"] / 1e12)) == (80e9, 3.35e12, 989)
    # PCIe x16 per direction: lanes x GT/s x 128/130 / 8 bits.
    assert specs.device("pcie4-x16").bandwidth == pytest.approx(16 * 16e9 * 128 / 130 / 8, rel=2e-3)
    assert specs.device("pcie5-x16").bandwidth == pytest.approx(16 * 32e9 * 128 / 130 / 8, rel=2e-3)


def test_unknown_device_names_are_refused_with_the_list():
    with pytest.raises(ValueError, match="h100-sxm") as e:
        specs.device("h100")
    assert "'h100'" in str(e.value)


@pytest.mark.parametrize("change,match", [({"n_layers": 0}, "n_layers"), ({"d_ff": -5}, "d_ff"),
                                          ({"n_kv_heads": 3}, "n_kv_heads must divide"),
                                          ({"experts_per_token": 2}, "experts_per_token"),
                                          ({"mlp": "relu"}, "mlp must be"), ({"positions": -1}, "positions"),
                                          ({"vocab_size": 2.5}, "vocab_size")])
def test_bad_architectures_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(specs.model("llama-2-7b"), **change)
