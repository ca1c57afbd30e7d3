import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.rng import Rng
from labkit.tinylm import ByteTokenizer
from labkit.tinylm import corpus as data
from labkit import tinylm as lm
from labkit.tinylm.model import RMSNorm, apply_rope, rope_tables


def small_model(seed=0, **overrides) -> lm.TinyLM:
    torch.manual_seed(seed)
    cfg = lm.TinyLMConfig(**{"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 96,
                             "max_seq_len": 64, **overrides})
    m = lm.TinyLM(cfg).eval()
    with torch.no_grad():  # larger weights than the init, so that attention is far from uniform
        for p in m.parameters():
            p.mul_(8 if p.dim() == 2 else 1)
    return m


# --- the committed model -------------------------------------------------------------------------

def test_pretrained_shape_serves_the_later_labs(pretrained):
    model, tok = pretrained
    cfg = model.cfg
    assert cfg.n_layers >= 4                                   # pipeline stages
    assert cfg.n_heads % 2 == 0 and cfg.n_kv_heads % 2 == 0    # tensor parallelism over 2 ranks
    assert cfg.n_kv_heads < cfg.n_heads                        # grouped-query attention
    for name, p in model.named_parameters():
        if p.dim() == 2:
            assert all(d % 32 == 0 for d in p.shape), (name, p.shape)  # INT4 groups of 32
    assert tok.vocab_size == cfg.vocab_size


def test_forward_shapes_and_gqa_shapes(pretrained):
    model, _ = pretrained
    cfg = model.cfg
    x = torch.randint(0, cfg.vocab_size, (3, 17))
    assert model(x).shape == (3, 17, cfg.vocab_size)
    attn = model.layers[0].attn
    assert attn.wq.weight.shape == (cfg.n_heads * cfg.head_dim, cfg.d_model)
    assert attn.wk.weight.shape == attn.wv.weight.shape == (cfg.n_kv_heads * cfg.head_dim, cfg.d_model)
    cache = lm.KVCache(cfg, batch_size=3)
    model(x, cache)
    assert cache.k.shape == (cfg.n_layers, 3, cfg.n_kv_heads, cfg.max_seq_len, cfg.head_dim)
    assert cache.length == 17
    assert cache.nbytes() == 2 * 4 * cfg.n_layers * 3 * cfg.n_kv_heads * cfg.max_seq_len * cfg.head_dim


# --- independent references ----------------------------------------------------------------------

def naive_forward(m: lm.TinyLM, tokens: torch.Tensor) -> torch.Tensor:
    """TinyLM written out with explicit loops over heads and positions: the reference for the model."""
    cfg = m.cfg
    B, T = tokens.shape
    hd, group = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    pos = torch.arange(T, dtype=torch.float64)

    def rope(x):  # x [T, hd]: rotate pairs (i, i + hd/2) by angle pos * theta^(-2i/hd)
        out = x.clone()
        for i in range(hd // 2):
            ang = (pos * cfg.rope_theta ** (-2 * i / hd)).float()
            a, b = x[:, i], x[:, i + hd // 2]
            out[:, i] = a * ang.cos() - b * ang.sin()
            out[:, i + hd // 2] = b * ang.cos() + a * ang.sin()
        return out

    def rms(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, eps=cfg.norm_eps)

    x = m.tok_emb.weight[tokens]
    for layer in m.layers:
        h = rms(x, layer.attn_norm.weight)
        a = layer.attn
        out = torch.zeros(B, T, cfg.n_heads * hd)
        for b in range(B):
            q = (h[b] @ a.wq.weight.T).view(T, cfg.n_heads, hd)
            k = (h[b] @ a.wk.weight.T).view(T, cfg.n_kv_heads, hd)
            v = (h[b] @ a.wv.weight.T).view(T, cfg.n_kv_heads, hd)
            for head in range(cfg.n_heads):
                kv = head // group  # query heads 0..group-1 share kv head 0, and so on
                qh, kh = rope(q[:, head]), rope(k[:, kv])
                for t in range(T):
                    scores = (kh[:t + 1] @ qh[t]) / math.sqrt(hd)
                    out[b, t, head * hd:(head + 1) * hd] = torch.softmax(scores, 0) @ v[:t + 1, kv]
        x = x + out @ a.wo.weight.T
        h = rms(x, layer.mlp_norm.weight)
        mlp = layer.mlp
        x = x + (F.silu(h @ mlp.w_gate.weight.T) * (h @ mlp.w_up.weight.T)) @ mlp.w_down.weight.T
    return rms(x, m.norm.weight) @ m.lm_head.weight.T


@pytest.mark.parametrize("tie", [True, False])
def test_forward_matches_naive_reference(tie):
    m = small_model(tie_embeddings=tie)
    x = torch.randint(0, 256, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(m(x), naive_forward(m, x), rtol=1e-4, atol=1e-4)


def test_rmsnorm_matches_torch():
    norm = RMSNorm(48, 1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(5, 48)
    torch.testing.assert_close(norm(x), F.rms_norm(x, (48,), norm.weight, eps=1e-5))


def test_rope_preserves_norms_and_depends_only_on_offsets():
    cos, sin = rope_tables(32, 64, 10000.0)
    q, k = torch.randn(32), torch.randn(32)

    def at(x, p):
        return apply_rope(x.view(1, 1, 1, 32), cos[p:p + 1], sin[p:p + 1]).view(32)

    assert torch.allclose(at(q, 9).norm(), q.norm(), atol=1e-5)
    # <R(m) q, R(n) k> depends on m - n only (Su et al., 2021)
    assert torch.allclose(at(q, 10) @ at(k, 3), at(q, 40) @ at(k, 33), atol=1e-4)


def test_param_counts_match_the_module():
    for seed in range(30):
        cfg = lm.random_config(Rng(seed))
        m = lm.TinyLM(cfg)
        by_type = {}
        for name, p in m.named_parameters():  # named_parameters lists a tied weight once
            kind = {"head": "embedding"}.get(lm.layer_type(name), lm.layer_type(name))  # counts: both matrices
            by_type[kind] = by_type.get(kind, 0) + p.numel()
        counts = lm.param_counts(cfg)
        assert {k: counts[k] for k in by_type} == by_type
        assert counts["total"] == sum(p.numel() for p in m.parameters())


# --- the KV cache --------------------------------------------------------------------------------

@given(st.lists(st.integers(1, 12), min_size=1, max_size=5))
@settings(max_examples=25, deadline=None)
def test_cached_chunks_give_the_same_logits_as_one_pass(chunks):
    m = small_model()
    T = sum(chunks)
    x = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        full = m(x)
        cache, parts, i = lm.KVCache(m.cfg, batch_size=2), [], 0
        for c in chunks:
            parts.append(m(x[:, i:i + c], cache))
            i += c
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-4, atol=1e-4)


def test_cached_generation_equals_uncached_token_for_token(pretrained):
    model, tok = pretrained
    prompts = ["The old sailor", "kv: abc=12 xyz=34 ? xyz=", "17+25=", data.corpus("test", 180).decode()]
    for p in prompts:
        ids = tok.encode(p)
        n = min(60, model.cfg.max_seq_len - len(ids))
        assert model.generate(ids, n, use_cache=True) == model.generate(ids, n, use_cache=False)
        sampled = dict(temperature=1.0, top_k=40, seed=3)
        assert model.generate(ids, n, use_cache=True, **sampled) == model.generate(ids, n, use_cache=False, **sampled)


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    m = small_model()
    p = [1, 2, 3]
    a = m.generate(p, 30, temperature=1.0, seed=5)
    assert a == m.generate(p, 30, temperature=1.0, seed=5)
    assert a != m.generate(p, 30, temperature=1.0, seed=6)
    assert m.generate(p, 30, temperature=2.0, top_k=1, seed=9) == m.generate(p, 30)


def test_top_k_only_draws_from_the_k_most_likely():
    m = small_model()
    p = [5, 6, 7]
    with torch.no_grad():
        allowed = set(torch.topk(m(torch.tensor([p]))[0, -1], 3).indices.tolist())
    firsts = {m.generate(p, 1, temperature=5.0, top_k=3, seed=s)[0] for s in range(60)}
    assert firsts <= allowed and len(firsts) > 1


def test_generation_stops_at_stop_token():
    m = small_model()
    out = m.generate([1, 2], 40)
    stop = out[5]
    cut = m.generate([1, 2], 40, stop_token=stop)
    assert cut == out[:out.index(stop) + 1]


# --- bad input -----------------------------------------------------------------------------------

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


def test_bad_generation_arguments_are_refused_and_model_still_works():
    m = small_model()
    ctx = m.cfg.max_seq_len
    with pytest.raises(ValueError, match=f"prompt length {ctx + 1} .* must be in \\[1, {ctx}\\]"):
        m.generate([1] * (ctx + 1), 1)
    with pytest.raises(ValueError, match="prompt length 60 \\+ max_new_tokens 10"):
        m.generate([1] * 60, 10)
    with pytest.raises(ValueError, match="prompt length 0"):
        m.generate([], 3)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0, got -0.5"):
        m.generate([1], 3, temperature=-0.5)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0, got nan"):
        m.generate([1], 3, temperature=float("nan"))
    with pytest.raises(ValueError, match="top_k must be an int in \\[1, 256\\], got 0"):
        m.generate([1], 3, top_k=0)
    with pytest.raises(ValueError, match="max_new_tokens must be a non-negative int, got -1"):
        m.generate([1], -1)
    with pytest.raises(ValueError, match="token ids must be in \\[0, 256\\)"):
        m(torch.tensor([[1, 999]]))
    with pytest.raises(ValueError, match="tokens must be a 2-D int64 tensor"):
        m(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="prompt must be a list of token ids"):
        m.generate("The old sailor", 3)
    with pytest.raises(TypeError, match="stop_token must be an int in \\[0, 255\\], got '\\\\n'"):
        m.generate([1], 3, stop_token="\n")
    with pytest.raises(TypeError, match="cache must implement labkit.tinylm.cache.Cache"):
        m(torch.tensor([[1]]), cache={})
    with pytest.raises(ValueError, match="cache was built for another config"):
        m(torch.tensor([[1]]), lm.KVCache(lm.TinyLMConfig()))
    with pytest.raises(ValueError, match="batch 0"):
        m(torch.zeros(0, 3, dtype=torch.long))
    assert len(m.generate([1, 2], 3, temperature=1e-300)) == 3  # overflows to the greedy limit
    assert len(m.generate([1, 2], 5)) == 5


def test_cache_overflow_is_refused_and_cache_left_consistent():
    m = small_model()
    cache = lm.KVCache(m.cfg, max_len=10)
    m(torch.tensor([[1] * 8]), cache)
    with pytest.raises(ValueError, match="sequence length 11 .cached 8 \\+ new 3, batch 1. must be in \\[1, 10\\]"):
        m(torch.tensor([[1] * 3]), cache)
    assert cache.length == 8
    m(torch.tensor([[1] * 2]), cache)
    assert cache.length == 10


def test_half_precision_cache_works_and_stays_close():
    m = small_model()
    x = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        full = m(x)
        cache = lm.KVCache(m.cfg, dtype=torch.bfloat16)
        m(x[:, :6], cache)
        tail = m(x[:, 6:], cache)
    assert cache.k.dtype == torch.bfloat16
    torch.testing.assert_close(tail, full[:, 6:], rtol=0.05, atol=0.5)
