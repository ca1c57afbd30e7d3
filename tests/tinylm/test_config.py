"""TinyLMConfig, parameter counts, and the table of linear layers against the modules themselves."""
import pytest
import torch.nn as nn

from labkit import specs
from labkit import tinylm as lm
from labkit.tinylm.config import random_config
from labkit.rng import Rng

from ..refusals import assert_refused


def test_param_counts_match_the_module():
    for seed in range(30):
        cfg = random_config(Rng(seed))
        m = lm.TinyLM(cfg)
        by_type = {}
        for name, p in m.named_parameters():  # named_parameters lists a tied weight once
            kind = {"head": "embedding"}.get(lm.layer_type(name), lm.layer_type(name))  # counts: both matrices
            by_type[kind] = by_type.get(kind, 0) + p.numel()
        counts = lm.param_counts(cfg)
        assert {k: counts[k] for k in by_type} == by_type
        assert counts["total"] == sum(p.numel() for p in m.parameters())


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match=r"unknown TinyLMConfig field\(s\) \['n_experts'\]"):
        lm.TinyLMConfig.from_dict({"d_model": 64, "n_experts": 8})
    with pytest.raises(ValueError, match="n_heads .4. must be a multiple of n_kv_heads .3."):
        lm.TinyLMConfig(n_kv_heads=3)
    with pytest.raises(ValueError, match="d_model must be a positive int, got -1"):
        lm.TinyLMConfig(d_model=-1)
    with pytest.raises(ValueError, match="rope_theta must be a positive finite number, got nan"):
        lm.TinyLMConfig(rope_theta=float("nan"))
    with pytest.raises(TypeError, match="cfg must be a TinyLMConfig"):
        lm.TinyLM({"d_model": 64})


def test_the_table_lists_every_weight_matrix_once_with_its_shape():
    for seed in range(20):
        cfg = random_config(Rng(seed))
        m = lm.TinyLM(cfg)
        table = lm.linear_layers(cfg)
        paths = [e.path for e in table]
        assert len(paths) == len(set(paths)) == 2 + 7 * cfg.n_layers
        matrices = {n: mod for n, mod in m.named_modules() if isinstance(mod, (nn.Linear, nn.Embedding))}
        assert set(matrices) == set(paths)
        for e in table:
            assert tuple(matrices[e.path].weight.shape) == e.shape, e.path


def test_layer_types_and_parallel_styles_follow_megatron():
    table = lm.linear_layers(lm.TinyLMConfig(n_layers=2))
    by_path = {e.path: e for e in table}
    for i in range(2):
        for name, kind, style in [("attn.wq", "attention", "column"), ("attn.wk", "attention", "column"),
                                  ("attn.wv", "attention", "column"), ("attn.wo", "attention", "row"),
                                  ("mlp.w_gate", "mlp", "column"), ("mlp.w_up", "mlp", "column"),
                                  ("mlp.w_down", "mlp", "row")]:
            e = by_path[f"layers.{i}.{name}"]
            assert (e.layer_type, e.tp_style, e.layer) == (kind, style, i)
    assert (by_path["tok_emb"].layer_type, by_path["tok_emb"].tp_style) == ("embedding", "vocab")
    assert (by_path["lm_head"].layer_type, by_path["lm_head"].layer) == ("head", None)
    # a row-parallel layer closes a sub-block: its output is d_model again, ready for the residual
    assert all(e.shape[0] == lm.TinyLMConfig().d_model for e in table if e.tp_style == "row")


@pytest.mark.parametrize("tie", [True, False])
def test_iter_linears_yields_the_modules_and_skips_a_tied_head(tie):
    m = lm.TinyLM(lm.TinyLMConfig(n_layers=2, tie_embeddings=tie))
    got = [(e.path, mod) for e, mod in lm.iter_linears(m)]
    assert got[0][0] == "tok_emb" and got[-1][0] == ("layers.1.mlp.w_down" if tie else "lm_head")
    assert all(mod is m.get_submodule(p) for p, mod in got)
    assert [e.path for e, _ in lm.iter_linears(m, types=("mlp",))] == [
        f"layers.{i}.mlp.{n}" for i in range(2) for n in ("w_gate", "w_up", "w_down")]
    assert [e.path for e, _ in lm.iter_linears(m, skip_tied=False)][-1] == "lm_head"


def test_layer_type_of_every_parameter():
    m = lm.TinyLM(lm.TinyLMConfig(n_layers=2, tie_embeddings=False))
    expected = {"tok_emb.weight": "embedding", "lm_head.weight": "head", "norm.weight": "norm",
                "layers.1.attn_norm.weight": "norm", "layers.0.mlp_norm.weight": "norm",
                "layers.1.attn.wo.weight": "attention", "layers.0.mlp.w_up.weight": "mlp"}
    for name, kind in expected.items():
        assert lm.layer_type(name) == kind
    assert {lm.layer_type(n) for n, _ in m.named_parameters()} == {"embedding", "head", "norm", "attention", "mlp"}
    for bad in ("layers.x.attn.wq.weight", "attn.wq", "layers.0.attn.wz.weight", "rope_cos"):
        with pytest.raises(ValueError, match="is not a TinyLM parameter"):
            lm.layer_type(bad)
    with pytest.raises(TypeError, match="param_name must be a str"):
        lm.layer_type(3)


def test_the_table_also_describes_a_real_architecture():
    spec = specs.model("llama-2-7b")
    table = lm.linear_layers(spec)
    assert sum(e.shape[0] * e.shape[1] for e in table) + (2 * spec.n_layers + 1) * spec.d_model == spec.n_params
    with pytest.raises(TypeError, match="cfg must be a TinyLMConfig or a ModelSpec"):
        lm.linear_layers(object())
    with pytest.raises(TypeError, match="model must be a TinyLM"):
        list(lm.iter_linears(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="types must be some of"):
        list(lm.iter_linears(lm.TinyLM(lm.TinyLMConfig(n_layers=1)), types=("norm",)))


def test_from_dict_and_iter_linears_refuse_the_wrong_types():
    with pytest.raises(TypeError, match="d must be a dict of TinyLMConfig fields, got list"):
        lm.TinyLMConfig.from_dict([1])
    with pytest.raises(TypeError, match="types must be a tuple of layer types"):
        list(lm.iter_linears(lm.TinyLM(lm.TinyLMConfig(n_layers=1)), types="mlp"))


def test_configs_counts_and_tables_refuse_the_wrong_types():
    assert_refused(lambda: lm.TinyLMConfig(norm_eps=True), TypeError, "norm_eps", True, "a positive finite number")
    assert_refused(lambda: lm.TinyLMConfig(norm_eps=0.0), ValueError, "norm_eps", 0.0, "a positive finite number")
    assert_refused(lambda: lm.param_counts({"d_model": 3}), TypeError, "cfg", {"d_model": 3}, "a TinyLMConfig")
    assert_refused(lambda: random_config(3), TypeError, "rng", 3, "a labkit.rng.Rng")
    m = lm.TinyLM(lm.TinyLMConfig(n_layers=1))
    assert_refused(lambda: list(lm.iter_linears(m, skip_tied="yes")), TypeError, "skip_tied", "yes", "True or False")
