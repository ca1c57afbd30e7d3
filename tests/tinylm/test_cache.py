"""The KV-cache contract: the contiguous cache, and an independent cache that plugs into the same model."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit import tinylm as lm
from labkit.tinylm.cache import BatchedCache

from ..refusals import assert_refused

from .models import small_model


class ListCache:
    """An independent implementation of the contract: per layer, a Python list of [B, Hkv, 1, hd] slices,
    concatenated on every update. Nothing shared with KVCache."""

    def __init__(self, max_len):
        self.slices, self.length, self.max_len, self.updates = {}, 0, max_len, []

    def update(self, layer, k, v):
        self.updates.append((layer, k.shape[2]))
        ks, vs = self.slices.setdefault(layer, ([], []))
        ks.extend(k.split(1, dim=2))
        vs.extend(v.split(1, dim=2))
        return torch.cat(ks, 2), torch.cat(vs, 2)

    def advance(self, n_tokens):
        self.length += n_tokens


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



def test_any_object_with_the_contract_plugs_into_the_model():
    m = small_model()
    x = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(x)
        other, contiguous = ListCache(m.cfg.max_seq_len), lm.KVCache(m.cfg, batch_size=2)
        assert isinstance(other, lm.Cache) and isinstance(contiguous, lm.Cache)
        a = torch.cat([m(x[:, :7], other), m(x[:, 7:8], other), m(x[:, 8:], other)], 1)
        b = torch.cat([m(x[:, :7], contiguous), m(x[:, 7:8], contiguous), m(x[:, 8:], contiguous)], 1)
    torch.testing.assert_close(a, full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # attention called update once per layer per forward, with the new tokens only
    assert other.updates == [(layer, t) for t in (7, 1, 12) for layer in range(m.cfg.n_layers)]
    assert other.length == contiguous.length == 20


def test_the_model_refuses_what_is_not_a_cache():
    m = small_model()
    with pytest.raises(TypeError, match="cache must implement labkit.tinylm.cache.Cache"):
        m(torch.tensor([[1]]), cache=object())


def test_kv_cache_refuses_bad_updates_and_stays_consistent():
    cfg = lm.TinyLMConfig(n_layers=2, max_seq_len=8)
    cache = lm.KVCache(cfg, batch_size=1, max_len=4)
    k = torch.ones(1, cfg.n_kv_heads, 3, cfg.head_dim)
    cache.update(0, k, k)
    cache.advance(3)
    with pytest.raises(ValueError, match="cached 3 \\+ new 3 positions must be <= max_len 4"):
        cache.update(1, k, k)
    with pytest.raises(ValueError, match="k and v must be \\[batch 1, n_kv_heads 2, T, head_dim 32\\]"):
        cache.update(0, torch.ones(2, cfg.n_kv_heads, 1, cfg.head_dim), torch.ones(2, cfg.n_kv_heads, 1, cfg.head_dim))
    with pytest.raises(ValueError, match="layer must be an int in \\[0, 1\\], got 2"):
        cache.update(2, k[:, :, :1], k[:, :, :1])
    with pytest.raises(ValueError, match="n_tokens must be an int in \\[1, 1\\], got 2"):
        cache.advance(2)
    assert cache.length == 3 and torch.equal(cache.k[0, :, :, :3], k)
    with pytest.raises(ValueError, match="max_len must be an int in \\[1, 8\\], got 9"):
        lm.KVCache(cfg, max_len=9)
    with pytest.raises(TypeError, match="batch_size must be a positive int, got 1.0"):
        lm.KVCache(cfg, batch_size=1.0)
    with pytest.raises(TypeError, match="cfg must be a TinyLMConfig"):
        lm.KVCache({"n_layers": 2})


def test_rewind_forgets_positions_and_refuses_to_go_forward():
    m = small_model()
    cache = lm.KVCache(m.cfg)
    x = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        first = m(x, cache)
        cache.rewind(5)
        again = m(x[:, 5:], cache)
    torch.testing.assert_close(again, first[:, 5:], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="length must be an int in \\[0, 12\\], got 13"):
        cache.rewind(13)
    assert cache.length == 12


def test_a_dtype_that_is_not_a_torch_dtype_is_refused():
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        lm.KVCache(lm.TinyLMConfig(n_layers=1), dtype="float16")


def test_a_cache_that_would_truncate_or_misplace_keys_is_refused():
    cfg = lm.TinyLMConfig(n_layers=1)
    for dtype in (torch.int8, torch.bool):  # an int8 cache turned every key into garbage (the argmax changed)
        assert_refused(lambda: lm.KVCache(cfg, dtype=dtype), ValueError, "dtype", dtype, "a floating-point")
    assert_refused(lambda: lm.KVCache(cfg, device=3.5), TypeError, "device", 3.5, "a torch.device or a str")
    cache = lm.KVCache(cfg)
    k = torch.zeros(1, cfg.n_kv_heads, 1, cfg.head_dim)
    assert_refused(lambda: cache.update(0, [1], k), TypeError, "k", [1], "a float tensor")
    with pytest.raises(TypeError, match="v must be a float tensor"):
        cache.update(0, k, k.long())
    assert cache.length == 0 and cache.update(0, k, k)[0].shape == (1, cfg.n_kv_heads, 1, cfg.head_dim)


class ListBatch:
    """The simplest BatchedCache: each sequence's keys and values in a plain tensor per layer, attention by an
    explicit softmax per sequence (independent of labkit.serving's paged implementation)."""

    def __init__(self, cfg, seqs):
        self.cfg, self.seqs = cfg, seqs  # [(seq_id, start, n)] in packed order
        self.kv: dict = {}

    def positions(self, n_tokens):
        return torch.cat([torch.arange(a, a + n) for _, a, n in self.seqs])

    def attend(self, layer, q, k, v):
        out, i = torch.empty_like(q), 0
        group = self.cfg.n_heads // self.cfg.n_kv_heads
        for sid, start, n in self.seqs:
            ks, vs = self.kv.get((sid, layer), (k[0, :, :0], v[0, :, :0]))
            ks, vs = torch.cat([ks, k[0, :, i:i + n]], 1), torch.cat([vs, v[0, :, i:i + n]], 1)  # [Hkv, start+n, hd]
            self.kv[(sid, layer)] = (ks, vs)
            scores = q[0, :, i:i + n] @ ks.repeat_interleave(group, 0).transpose(1, 2) / ks.shape[-1] ** 0.5
            visible = torch.arange(start + n)[None, :] <= (start + torch.arange(n))[:, None]  # [n, start+n]
            weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
            out[0, :, i:i + n] = weights @ vs.repeat_interleave(group, 0)
            i += n
        return out

    def advance(self, n_tokens):
        pass


def test_a_packed_batch_equals_each_sequence_alone(pretrained):
    """TinyLM's BatchedCache path: two sequences prefilled in one packed row, then decoded together with a
    third, give each the logits of its own uncached forward."""
    model, _ = pretrained
    a, b, c = [5, 6, 7, 8, 9], [40, 41, 42], [70, 71, 72, 73]
    assert isinstance(ListBatch(model.cfg, []), BatchedCache)
    cache = ListBatch(model.cfg, [("a", 0, 4), ("b", 0, 3)])
    with torch.no_grad():
        packed = model(torch.tensor([a[:4] + b]), cache)[0]
        assert torch.allclose(packed[3], model(torch.tensor([a[:4]]))[0, -1], atol=1e-4)
        assert torch.allclose(packed[6], model(torch.tensor([b]))[0, -1], atol=1e-4)
        cache.seqs = [("a", 4, 1), ("c", 0, 4)]
        packed = model(torch.tensor([a[4:] + c]), cache)[0]
        assert torch.allclose(packed[0], model(torch.tensor([a]))[0, -1], atol=1e-4)
        assert torch.allclose(packed[4], model(torch.tensor([c]))[0, -1], atol=1e-4)


def test_a_packed_batch_must_be_one_row_within_the_context(pretrained):
    model, _ = pretrained
    cache = ListBatch(model.cfg, [("a", model.cfg.max_seq_len - 1, 2)])
    with pytest.raises(ValueError, match="a packed batch must be tokens \\[1, N\\] with positions in"):
        model(torch.tensor([[1, 2]]), cache)
    with pytest.raises(ValueError, match="a packed batch must be tokens"):
        model(torch.tensor([[1], [2]]), ListBatch(model.cfg, [("a", 0, 1)]))
