
import pytest
import torch

from labkit.tinylm import corpus as data
from labkit import tinylm as lm

from .models import small_model


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
