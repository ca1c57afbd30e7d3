import math

import pytest
import torch

from labkit.tinylm import corpus as data
from labkit.tinylm import perplexity, task_accuracy, task_correct


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


def test_eval_is_deterministic(pretrained):
    model, _ = pretrained
    val = data.corpus("val", 4096)
    tasks = data.make_tasks("copy", 20) + data.make_tasks("recall", 20)
    assert perplexity(model, val) == perplexity(model, val)
    assert task_accuracy(model, tasks) == task_accuracy(model, tasks)
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


def test_a_model_that_is_not_a_tinylm_is_refused():
    for call in (lambda: perplexity(None, [1, 2, 3]), lambda: task_correct("model", [])):
        with pytest.raises(TypeError, match="model must be a TinyLM"):
            call()
