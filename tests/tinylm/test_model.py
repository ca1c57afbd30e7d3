import math

import pytest
import torch
import torch.nn.functional as F

from labkit import tinylm as lm
from labkit.tinylm.model import RMSNorm, apply_rope, rope_tables

from .models import small_model


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


# --- the KV cache --------------------------------------------------------------------------------


# --- bad input -----------------------------------------------------------------------------------


def test_merge_embeds_writes_the_given_rows_and_nothing_else():
    from labkit.tinylm.model import merge_embeds
    x = torch.randn(2, 3, 4)
    rows, values = torch.tensor([1, 4]), torch.randn(2, 4)
    out = merge_embeds(x, (rows, values))
    expected = x.clone()
    expected[0, 1], expected[1, 1] = values[0], values[1]  # flattened row 4 = batch 1, time 1
    assert torch.equal(out, expected) and merge_embeds(x, None) is x
    for bad, error in [((rows, values[:1]), ValueError), ((torch.tensor([6, 0]), values), ValueError),
                       ((rows.float(), values), ValueError), ([rows, values], TypeError)]:
        with pytest.raises(error, match="embeds"):
            merge_embeds(x, bad)


def test_run_blocks_slices_compose_to_the_forward_loop():
    from labkit.tinylm.model import run_blocks
    m = small_model(n_layers=3)
    x = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        cos, sin, start = m.rope(x, None)
        h = m.tok_emb(x)
        for a, b in ((0, 1), (1, 3)):  # two pipeline stages' slices, one after the other
            h = run_blocks(m.layers, h, cos, sin, None, start, a, b)
        assert torch.equal(m.lm_head(m.norm(h)), m(x))
        holes = [None, m.layers[1], None]  # a stage's list: the blocks it does not own are never touched
        assert torch.equal(run_blocks(holes, h, cos, sin, None, 0, 1, 2), m.layers[1](h, cos, sin, None, 1, 0))


def test_attention_reads_its_head_counts_from_its_projections():
    m = small_model()
    attn, cfg = m.layers[0].attn, m.cfg
    x = torch.randn(2, 5, cfg.d_model)
    with torch.no_grad():
        q, k, v = attn.qkv(x)
        assert (q.shape == (2, cfg.n_heads, 5, cfg.head_dim)
                and k.shape == v.shape == (2, cfg.n_kv_heads, 5, cfg.head_dim))
        hd = cfg.head_dim  # keep query heads 2..3 and their KV head 1: a tensor-parallel rank's attention
        for name, rows in (("wq", slice(2 * hd, 4 * hd)), ("wk", slice(hd, 2 * hd)), ("wv", slice(hd, 2 * hd))):
            getattr(attn, name).weight = torch.nn.Parameter(getattr(attn, name).weight[rows])
        q2, k2, v2 = attn.qkv(x)
    assert torch.equal(q2, q[:, 2:]) and torch.equal(k2, k[:, 1:]) and torch.equal(v2, v[:, 1:])
