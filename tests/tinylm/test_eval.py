import math

import numpy as np
import pytest
import torch

from labkit.tinylm import corpus as data
from labkit.tinylm import accuracy_gap, perplexity, task_accuracy, task_correct

from ..refusals import assert_refused


class Uniform(torch.nn.Module):
    """A model that predicts every byte with probability 1/256: perplexity must be exactly 256."""

    def __init__(self):
        super().__init__()
        self.cfg = type("Cfg", (), {"max_seq_len": 64, "vocab_size": 256})()

    def forward(self, tokens):
        return torch.zeros(*tokens.shape, 256)


def test_uniform_model_has_perplexity_vocab_size():
    tokens = list(data.corpus("val", 1000))
    assert perplexity(Uniform(), tokens) == pytest.approx(256, rel=1e-12)


class Bigram(torch.nn.Module):
    """Logits depend on the current token only, so the exact perplexity of any sequence is known without
    any windowing: exp(mean over j >= 1 of -log p(t_j | t_{j-1}))."""

    def __init__(self, ctx=64):
        super().__init__()
        self.cfg = type("Cfg", (), {"max_seq_len": ctx, "vocab_size": 256})()
        self.table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def forward(self, tokens):
        return self.table[tokens]

    def exact_perplexity(self, tokens):
        logp = torch.log_softmax(self.table, -1)
        nll = [-logp[a, b].item() for a, b in zip(tokens[:-1], tokens[1:])]
        return math.exp(sum(nll) / len(nll))


@pytest.mark.parametrize("n", [2, 64, 65, 66, 200, 1000])
def test_every_token_after_the_first_is_scored_once(n):
    model, tokens = Bigram(), list(data.corpus("val", n))
    assert perplexity(model, tokens, batch_size=3) == pytest.approx(model.exact_perplexity(tokens), rel=1e-12)


def test_perplexity_of_one_window_matches_log_softmax(pretrained):
    model, _ = pretrained
    tokens = torch.tensor(list(data.corpus("val", model.cfg.max_seq_len + 1)))
    with torch.no_grad():
        logp = torch.log_softmax(model(tokens[None, :-1])[0].double(), -1)
    nll = -logp[torch.arange(len(tokens) - 1), tokens[1:]].mean().item()
    assert perplexity(model, tokens) == pytest.approx(math.exp(nll), rel=1e-9)


def test_perplexity_over_many_windows_matches_a_window_by_window_sum(pretrained):
    """perplexity batches windows of different lengths together; the reference scores each window alone with
    log_softmax and sums the log-likelihoods by hand. Task accuracy does not depend on the batch size."""
    model, _ = pretrained
    ctx = model.cfg.max_seq_len
    val = torch.tensor(list(data.corpus("val", 5 * ctx + 37)))
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(val) - 1, ctx):
            window = val[start:start + ctx + 1]
            logp = torch.log_softmax(model(window[None, :-1])[0].double(), -1)
            nll -= logp[torch.arange(len(window) - 1), window[1:]].sum().item()
            count += len(window) - 1
    assert count == len(val) - 1
    assert perplexity(model, val, batch_size=2) == pytest.approx(math.exp(nll / count), rel=1e-6)
    tasks = data.make_tasks("copy", 20) + data.make_tasks("recall", 20)
    assert task_accuracy(model, tasks, batch_size=7) == task_accuracy(model, tasks, batch_size=64)


def test_teacher_forced_accuracy_equals_greedy_generation(pretrained):
    model, tok = pretrained
    newline = tok.encode("\n")[0]
    tasks = [t for kind in data.TASK_KINDS for t in data.make_tasks(kind, 15, "test", seed=4)]
    by_generation = []
    for t in tasks:
        out = model.generate(tok.encode(t.prompt), len(t.answer) + 1, stop_token=newline)
        by_generation.append(tok.decode(out) == t.answer + "\n")
    assert task_correct(model, tasks) == by_generation
    assert any(by_generation)


def test_wrong_answers_score_zero(pretrained):
    model, _ = pretrained
    tasks = [data.Task(t.kind, t.prompt, t.answer + "9") for t in data.make_tasks("copy", 10)]
    assert task_accuracy(model, tasks) == {"copy": 0.0}


def test_bad_input_gets_clear_errors(pretrained):
    model, _ = pretrained
    with pytest.raises(ValueError, match="tokens must be a 1-D sequence of at least 2 token ids"):
        perplexity(model, [5])
    with pytest.raises(ValueError, match="tokens must be a 1-D sequence"):
        perplexity(model, torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        perplexity(model, [1, 2, 3], batch_size=0)
    with pytest.raises(ValueError, match="tasks must be a non-empty list of labkit.tinylm.corpus.Task, got \\[\\]"):
        task_accuracy(model, [])
    with pytest.raises(TypeError, match="tasks must be a non-empty list of labkit.tinylm.corpus.Task, got str"):
        task_accuracy(model, "1+1=")
    with pytest.raises(TypeError, match="tokens must be token ids or bytes, not str"):
        perplexity(model, "some text")
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        task_accuracy(model, data.make_tasks("copy", 2), batch_size=0)
    with pytest.raises(ValueError, match="every task needs a non-empty prompt"):
        task_accuracy(model, [data.Task("copy", "", "x")])
    nan_model = Uniform()
    nan_model.forward = lambda tokens: torch.full((*tokens.shape, 256), float("nan"))
    with pytest.raises(ValueError, match="non-finite logits"):
        perplexity(nan_model, [1, 2, 3])
    with pytest.raises(ValueError, match="does not fit the model's context"):
        task_accuracy(model, [data.Task("copy", "x" * 300, "y")])


def test_tokens_outside_the_vocabulary_or_not_ids_are_refused(pretrained):
    model, _ = pretrained
    assert_refused(lambda: perplexity(model, [1, 300]), ValueError, "tokens", "ids in [1, 300]",
                   "token ids in [0, 256)")
    assert_refused(lambda: perplexity(model, [-1, 3]), ValueError, "tokens", "ids in [-1, 3]", "token ids in [0, 256)")
    assert_refused(lambda: perplexity(model, [1.0, 2.0]), TypeError, "tokens", "a sequence of torch.float32",
                   "(ints)")
    assert_refused(lambda: perplexity(model, []), ValueError, "tokens", "shape (0,)", "at least 2 token ids")
    bad = data.Task("copy", "ab", 5)
    assert_refused(lambda: task_correct(model, [bad]), TypeError, "tasks", bad, "prompt and answer are str")


def test_a_model_that_is_not_a_tinylm_is_refused():
    for call in (lambda: perplexity(None, [1, 2, 3]), lambda: task_correct("model", [])):
        with pytest.raises(TypeError, match="model must be a TinyLM"):
            call()


def test_accuracy_gap_matches_the_spread_of_simulated_accuracies():
    """The standard error is the spread of a - b over many simulated evaluations (numpy binomial draws)."""
    rng = np.random.default_rng(0)
    for a, n_a, b, n_b in ((0.3, 200, 0.29, 200), (0.9, 50, 0.5, 400)):
        draws = rng.binomial(n_a, a, 20_000) / n_a - rng.binomial(n_b, b, 20_000) / n_b
        gap = accuracy_gap(a, n_a, b, n_b)
        assert gap["difference"] == pytest.approx(a - b) and gap["stderr"] == pytest.approx(draws.std(), rel=0.03)
    assert accuracy_gap(0.30, 200, 0.29, 200)["within_noise"] and not accuracy_gap(0.9, 50, 0.5, 400)["within_noise"]
    assert accuracy_gap(1.0, 10, 1.0, 10) == {"difference": 0.0, "stderr": 0.0, "within_noise": True}
    assert_refused(lambda: accuracy_gap(1.2, 10, 0.5, 10), ValueError, "a", 1.2, "a finite number in [0, 1]")
    assert_refused(lambda: accuracy_gap(0.5, 0, 0.5, 10), ValueError, "n_a", 0, "a positive int")
