"""labkit.serving.sampling against an independent numpy/plain-Python implementation of the same rules, sampled
frequencies against the probabilities (chi-square), determinism, batch invariance and every refusal."""
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from labkit.serving.sampling import SamplingParams, make_generator, probabilities, sample, sample_batch
from ..refusals import assert_refused

INF = float("inf")


def reference(logits, T, top_k, top_p, min_p):
    """The documented chain, written from its definitions: numpy exp, Python sorting, O(V^2) sums.
    Returns (probabilities, the smallest distance of any kept/dropped decision to its threshold)."""
    x = np.asarray(logits, dtype=np.float64)
    V, margin = len(x), INF
    if T == 0:
        return np.eye(V)[int(np.argmax(x))], margin  # np.argmax: first index among ties
    z = (x - x.max()) / T
    if 0 < top_k < V:
        kth = sorted(z.tolist(), reverse=True)[top_k - 1]
        z = np.array([v if v >= kth else -INF for v in z])
    p = np.exp(z) / np.exp(z).sum()
    if top_p < 1:
        above = [sum(q for q in p if q > pj) for pj in p]  # mass of the tokens strictly more likely than j
        margin = min(abs(a - top_p) for a in above)
        p = np.where(np.array(above) < top_p, p, 0.0)
        p = p / p.sum()
    if min_p > 0:
        cut = min_p * p.max()
        margin = min([margin] + [abs(q - cut) / p.max() for q in p if q != p.max()])
        p = np.where(p >= cut, p, 0.0)
        p = p / p.sum()
    return p, margin


def params_of(T, k, top_p, min_p):
    return SamplingParams(temperature=T, top_k=k, top_p=top_p, min_p=min_p)


FIXED = [  # logits, (temperature, top_k, top_p, min_p)
    ([2.0, 1.0, 0.5, -1.0, 0.0], (1.0, 0, 1.0, 0.0)),
    ([2.0, 1.0, 0.5, -1.0, 0.0], (0.7, 3, 1.0, 0.0)),
    ([2.0, 1.0, 0.5, -1.0, 0.0], (1.3, 0, 0.9, 0.0)),
    ([2.0, 1.0, 0.5, -1.0, 0.0], (1.0, 0, 1.0, 0.3)),
    ([3.0, 3.0, 1.0, 1.0, 1.0, -INF], (2.0, 4, 0.95, 0.05)),
    ([0.3, -2.0, 1.7, 1.7, -INF, 0.0, 0.9], (0.5, 2, 0.5, 0.5)),
    ([0.3, -2.0, 1.7, 1.7, -INF, 0.0, 0.9], (0.0, 2, 0.5, 0.5)),
]


@pytest.mark.parametrize("logits, knobs", FIXED)
def test_probabilities_match_the_reference_on_fixed_logits(logits, knobs):
    expected, _ = reference(logits, *knobs)
    got = probabilities(torch.tensor(logits), params_of(*knobs))
    assert got.dtype == torch.float64 and got.shape == (len(logits),)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-15)


GRID = st.sampled_from([x / 2 for x in range(-12, 13)] + [-INF])  # small grid: plenty of exact ties
TEMPS = st.sampled_from([0.0, 1e-6, 1e-3, 2.0]) | st.floats(0.05, 2.0)


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 3).flatmap(lambda b: st.integers(1, 12).flatmap(
           lambda v: st.lists(st.lists(GRID, min_size=v, max_size=v), min_size=b, max_size=b))),
       T=TEMPS, k=st.integers(0, 14), top_p=st.sampled_from([1.0, 0.5]) | st.floats(0.01, 1.0),
       min_p=st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]))
def test_probabilities_match_the_reference_on_generated_logits(rows, T, k, top_p, min_p, dtype):
    assume(all(max(r) > -INF for r in rows))
    refs = [reference(r, T, k, top_p, min_p) for r in rows]
    assume(all(margin > 1e-9 for _, margin in refs))  # float rounding may flip a decision this close
    params = params_of(T, k, top_p, min_p)
    batch = probabilities(torch.tensor(rows, dtype=dtype), params)  # the grid is exact in every dtype
    for i, (expected, _) in enumerate(refs):
        np.testing.assert_allclose(batch[i].numpy(), expected, rtol=1e-9, atol=1e-12)
        assert torch.equal(probabilities(torch.tensor(rows[i], dtype=dtype), params), batch[i])
        assert math.isclose(batch[i].sum().item(), 1.0, rel_tol=1e-12)


def test_hand_built_cases():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    # 0.5 alone does not reach p = 0.7; 0.5 + 0.3 does: the crossing token (0.3) is kept, nothing after it
    got = probabilities(logits, SamplingParams(top_p=0.7))
    np.testing.assert_allclose(got.numpy(), [0.625, 0.375, 0, 0], atol=1e-12)
    # top-p (0.5 + 0.3 < 0.82: three kept) THEN min-p (0.15 >= 0.2 x 0.5 stays): three tokens. min-p first
    # (vLLM V1's order) would renormalise to 0.95 and top-p would keep two: the order matters.
    got = probabilities(logits, SamplingParams(top_p=0.82, min_p=0.2))
    np.testing.assert_allclose(got.numpy(), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], atol=1e-12)
    # exactly p: 0.5 + 0.25 reaches 0.75, so the set stops there ("reaches", not "exceeds": vLLM and HF keep
    # the tokens whose mass before them is below p). Powers of two: these sums are exact in float64.
    exact = torch.tensor([4.0, 2.0, 1.0, 1.0], dtype=torch.float64).log()
    np.testing.assert_allclose(probabilities(exact, SamplingParams(top_p=0.75)).numpy(), [2 / 3, 1 / 3, 0, 0],
                               atol=1e-12)
    ties = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert (probabilities(ties, SamplingParams(top_k=2)) > 0).all()  # tied with the 2nd: all four kept
    assert (probabilities(ties, SamplingParams(top_p=0.5)) > 0).all()  # the crossing token's ties too
    assert probabilities(torch.tensor([0.0, 7.0, 7.0]), SamplingParams(temperature=0)).tolist() == [0, 1, 0]
    extreme = torch.tensor([-INF, 1e308, -1e308], dtype=torch.float64)  # 1e308 - -1e308 overflows to -inf: fine
    assert probabilities(extreme, SamplingParams(temperature=1e-300)).tolist() == [0, 1, 0]


def test_sampled_frequencies_fit_the_probabilities():
    """Chi-square goodness of fit over 20,000 draws. Under the null the statistic follows chi-square with
    (categories - 1) degrees of freedom; its p-value is the regularised upper incomplete gamma Q(df/2, x/2)
    (torch.special.gammaincc). We refuse the fit below p = 1e-3, a 1-in-1000 false alarm for a correct sampler
    (the seed is fixed, so the verdict is too), and check that the same counts DO reject the unfiltered
    softmax: the test has the power to see a wrong distribution."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -INF, 0.2])
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.95, min_p=0.05)
    p = probabilities(logits, params)
    gen = make_generator(1234)
    n = 20_000
    counts = torch.bincount(torch.tensor([sample(logits, params, gen) for _ in range(n)]), minlength=8).double()
    assert (counts[p == 0] == 0).all() and 3 <= int((p > 0).sum()) < 7

    def p_value(q):
        live = q > 0
        chi2 = (((counts[live] - n * q[live]) ** 2) / (n * q[live])).sum()
        return torch.special.gammaincc(torch.tensor((int(live.sum()) - 1) / 2, dtype=torch.float64), chi2 / 2).item()

    assert p_value(p) > 1e-3
    assert p_value(torch.softmax(logits.double() / 0.8, -1)) < 1e-3


def test_the_same_seed_gives_the_same_tokens():
    logits = torch.linspace(-2, 2, 50)
    params = SamplingParams(temperature=1.5, top_p=0.9)

    def run(seed):
        gen = make_generator(seed)
        return [sample(logits, params, gen) for _ in range(40)]

    assert run(7) == run(7) and run(7) != run(8)
    assert run(2**64 - 1) != run(7)  # the whole of torch's seed range is usable


ROWS = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(top_p=0.9, seed=3), SamplingParams(temperature=1.3, min_p=0.1),
        SamplingParams(temperature=0), SamplingParams(temperature=2.0, top_k=20, top_p=0.8, min_p=0.01)]


def test_a_row_samples_the_same_tokens_alone_or_in_any_batch():
    steps = torch.randn(25, len(ROWS), 64, generator=torch.Generator().manual_seed(0))  # [step, row, vocab]
    alone = []
    for i, params in enumerate(ROWS):
        gen = make_generator(100 + i)
        alone.append([sample(steps[s, i], params, gen) for s in range(len(steps))])
    for order in (list(range(len(ROWS))), [5, 3, 1, 0, 4, 2]):
        gens = [None if ROWS[i].greedy else make_generator(100 + i) for i in order]
        batched = [sample_batch(step[order], [ROWS[i] for i in order], gens) for step in steps]
        for col, i in enumerate(order):
            assert [tokens[col] for tokens in batched] == alone[i]
    greedy = [i for i, p in enumerate(ROWS) if p.greedy]
    assert [alone[i] for i in greedy] == [steps[:, i].numpy().argmax(-1).tolist() for i in greedy]


def test_a_refused_batch_advances_no_generator():
    gen = make_generator(5)
    state = gen.get_state()
    with pytest.raises(TypeError):
        sample_batch(torch.zeros(2, 4), [SamplingParams(), SamplingParams()], [gen, None])
    assert torch.equal(gen.get_state(), state)
    assert sample_batch(torch.zeros(0, 4), [], []) == []


@pytest.mark.parametrize("field, value, error, expected", [
    ("max_tokens", 0, ValueError, "a positive int"), ("max_tokens", 2.0, TypeError, "a positive int"),
    ("max_tokens", True, TypeError, "a positive int"),
    ("temperature", -0.1, ValueError, "in [0, 2]"), ("temperature", 2.5, ValueError, "in [0, 2]"),
    ("temperature", float("nan"), ValueError, "finite"), ("temperature", "1", TypeError, "a finite number"),
    ("top_k", -1, ValueError, "an int >= 0"), ("top_k", 2.0, TypeError, "an int >= 0"),
    ("top_p", 0.0, ValueError, "(0, 1]"), ("top_p", 1.5, ValueError, "in [0, 1]"),
    ("top_p", None, TypeError, "a finite number"),
    ("min_p", -0.1, ValueError, "in [0, 1]"), ("min_p", 1.1, ValueError, "in [0, 1]"),
    ("min_p", "0", TypeError, "a finite number"),
    ("seed", -1, ValueError, "an int in [0, 18446744073709551615]"),
    ("seed", 1.0, TypeError, "an int in [0, 18446744073709551615]"),
    ("stop_token_ids", "ab", TypeError, "a tuple of token ids"), ("stop_token_ids", (1, -2), TypeError, "token ids"),
    ("stop_token_ids", [1.0], TypeError, "token ids"),
])
def test_sampling_params_refuse_each_bad_field(field, value, error, expected):
    assert_refused(lambda: SamplingParams(**{field: value}), error, field, value, expected)


SAMPLED, GREEDY = SamplingParams(), SamplingParams(temperature=0)
ROW = torch.zeros(4)


@pytest.mark.parametrize("call, error, name, value, expected", [
    (lambda: probabilities([0.0, 1.0], SAMPLED), TypeError, "logits", [0.0, 1.0], "a float tensor"),
    (lambda: probabilities(torch.tensor([1, 2]), SAMPLED), TypeError, "logits", torch.int64, "a float tensor"),
    (lambda: probabilities(torch.zeros(2, 2, 2), SAMPLED), ValueError, "logits", (2, 2, 2), "[batch, vocab]"),
    (lambda: probabilities(torch.zeros(0), SAMPLED), ValueError, "logits", (0,), "at least one token"),
    (lambda: probabilities(torch.tensor([0.0, float("nan")]), SAMPLED), ValueError, "logits", float("nan"), "not NaN"),
    (lambda: probabilities(torch.tensor([[0.0, 1.0], [INF, 0.0]]), SAMPLED), ValueError, "logits", INF, "+inf"),
    (lambda: probabilities(torch.tensor([[0.0, 1.0], [-INF, -INF]]), SAMPLED), ValueError, "logits", [-INF, -INF],
     "at least one entry"),
    (lambda: probabilities(ROW, {"temperature": 0}), TypeError, "params", {"temperature": 0}, "a SamplingParams"),
    (lambda: sample(torch.zeros(1, 4), GREEDY), ValueError, "logits", (1, 4), "a 1-D float tensor"),
    (lambda: sample(ROW, SAMPLED, None), TypeError, "generator", None, "a torch.Generator"),
    (lambda: sample(ROW, SAMPLED, 3), TypeError, "generator", 3, "at temperature 1"),
    (lambda: sample(ROW, None, None), TypeError, "params", None, "a SamplingParams"),
    (lambda: sample_batch(ROW, [GREEDY], [None]), ValueError, "logits", (4,), "a 2-D float tensor"),
    (lambda: sample_batch(torch.zeros(2, 4), None, [None]), TypeError, "params", None, "one entry per row"),
    (lambda: sample_batch(torch.zeros(2, 4), [GREEDY], [None, None]), ValueError, "params", 1, "one entry per row"),
    (lambda: sample_batch(torch.zeros(2, 4), [GREEDY] * 2, [None]), ValueError, "generators", 1, "of logits (2)"),
    (lambda: sample_batch(torch.zeros(2, 4), [GREEDY, 0.5], [None, None]), TypeError, "params[1]", 0.5, "Sampling"),
    (lambda: sample_batch(torch.zeros(2, 4), [GREEDY, SAMPLED], [None, None]), TypeError, "generators[1]", None,
     "make_generator"),
    (lambda: make_generator(-1), ValueError, "seed", -1, "an int in [0, 18446744073709551615]"),
    (lambda: make_generator("7"), TypeError, "seed", "7", "an int in [0, 18446744073709551615]"),
])
def test_bad_input_is_refused_naming_the_argument(call, error, name, value, expected):
    assert_refused(call, error, name, value, expected)
