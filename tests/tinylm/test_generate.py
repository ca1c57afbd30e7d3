"""Generation: cached equals uncached, seeded sampling, top-k, stop tokens; sample_top_k() against the softmax by a
chi-square test; bad arguments refused."""
import math

import pytest
import torch

from labkit.tinylm import corpus as data
from labkit import tinylm as lm
from labkit.tinylm.generate import sample_top_k

from ..refusals import assert_refused
from .models import small_model

# Upper 0.1% points of the chi-square distribution (Pearson & Hartley, Biometrika Tables, table 8), by degrees
# of freedom: a correct sampler exceeds them once in a thousand seeds, and the seeds here are fixed.
CHI2_CRITICAL_0_001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}


def softmax_by_hand(logits, temperature, top_k=None):
    """Probabilities from plain Python floats: exp((l - max) / T) over the top_k largest finite logits."""
    finite = sorted((x for x in logits if x != -math.inf), reverse=True)
    kth = finite[min(top_k, len(finite)) - 1] if top_k else -math.inf
    weights = [math.exp((x - finite[0]) / temperature) if x != -math.inf and x >= kth else 0.0 for x in logits]
    return [w / sum(weights) for w in weights]


@pytest.mark.parametrize("logits, temperature, top_k", [
    ([0.0, 0.1, -math.inf], 1.0, None),                       # the audit's case: ~475 / 525 per 1000
    ([1.0, -math.inf, 0.5, 2.0, -1.0, 0.0], 0.7, 4),          # a masked token, top-k and a temperature
    ([3.0, 3.0, -math.inf, -math.inf], 1e-300, None),         # the greedy limit splits a tie evenly
])
def test_sampled_frequencies_follow_the_softmax(logits, temperature, top_k):
    n = 20_000
    gen = torch.Generator().manual_seed(1234)
    x = torch.tensor(logits)
    counts = [0] * len(logits)
    for _ in range(n):
        counts[sample_top_k(x, temperature, top_k, gen)] += 1
    p = softmax_by_hand(logits, temperature, top_k)
    assert all(c == 0 for c, q in zip(counts, p) if q == 0), counts  # a masked token is never drawn
    drawn = [(c, q) for c, q in zip(counts, p) if q > 0]
    chi2 = sum((c - n * q) ** 2 / (n * q) for c, q in drawn)
    assert chi2 < CHI2_CRITICAL_0_001[len(drawn) - 1], (counts, [n * q for q in p], chi2)


def test_sample_refuses_what_it_cannot_draw_from():
    gen, x = torch.Generator().manual_seed(0), torch.tensor([0.0, 1.0])
    nan, inf = float("nan"), float("inf")
    assert_refused(lambda: sample_top_k(x, True, None, gen), TypeError, "temperature", True, "a finite number >= 0")
    assert_refused(lambda: sample_top_k(x, -1.0, None, gen), ValueError, "temperature", -1.0, "a finite number >= 0")
    assert_refused(lambda: sample_top_k(x, 1.0, 3, gen), ValueError, "top_k", 3, "an int in [1, 2]")
    assert_refused(lambda: sample_top_k(x, 1.0, None, 0), TypeError, "gen", 0, "a torch.Generator")
    assert_refused(lambda: sample_top_k([0.0, 1.0], 1.0, None, gen), TypeError, "logits", [0.0, 1.0], "a 1-D float")
    for bad in ([nan, 1.0], [inf, 1.0], [-inf, -inf]):
        assert_refused(lambda: sample_top_k(torch.tensor(bad), 1.0, None, gen), ValueError, "logits", bad,
                       "finite numbers or -inf")
    with pytest.raises(ValueError, match="logits must be a non-empty 1-D float tensor"):
        sample_top_k(torch.tensor([1, 2]), 1.0, None, gen)
    assert sample_top_k(torch.tensor([0.0, -inf, 5.0]), 0.0, None, gen) == 2


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
    assert_refused(lambda: m.generate([1], 3, temperature=True), TypeError, "temperature", True, "a finite number")
    assert_refused(lambda: m.generate([1], 3, use_cache="no"), TypeError, "use_cache", "no", "True or False")
    assert m.generate([1, 2], 3, temperature=1e-300) == m.generate([1, 2], 3)  # the greedy limit, no overflow
    assert len(m.generate([1, 2], 5)) == 5
