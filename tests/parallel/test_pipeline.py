"""Real pipelines: the course's GPipe and 1F1B over send/recv and torch.distributed.pipelining's give the
loss and gradients of the single-process model, on 2 and 4 stages; events are one forward and backward
per micro-batch per stage; the layer split is as even as possible; bad input is refused."""
import pytest
import torch

from labkit.parallel import pipeline as pl
from labkit.tinylm import KVCache
from tests.refusals import assert_refused


@pytest.fixture(scope="module")
def batch(tinylm):
    tokens = torch.randint(0, 256, (4, 17), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    tinylm.zero_grad()
    loss = pl.loss_fn(tinylm(x), y)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in tinylm.named_parameters()}
    tinylm.zero_grad()
    return x, y, loss.item(), grads


def _agree(run, loss, grads):
    assert run.loss == pytest.approx(loss, abs=1e-5)
    assert set(run.grads) == set(grads)
    assert max((run.grads[n] - grads[n]).abs().max().item() for n in grads) < 1e-5


@pytest.mark.timeout(90)
@pytest.mark.parametrize("stages", [2, 4])
def test_pipelines_give_the_single_process_gradients(stages, tinylm, batch, pool2, pool4):
    x, y, loss, grads = batch
    pool = pool2 if stages == 2 else pool4
    for schedule in ("gpipe", "1f1b"):
        run = pl.pipeline_step(tinylm, x, y, stages, 4, schedule, pool=pool)
        _agree(run, loss, grads)
        assert [sorted((k, i) for k, i, _, _ in ev) for ev in run.events] == \
            [sorted([("F", i) for i in range(4)] + [("B", i) for i in range(4)])] * stages
        assert run.peak_in_flight == ([4] * stages if schedule == "gpipe"
                                      else [min(stages - s, 4) for s in range(stages)])
        assert 0 <= run.bubble < 1
    lib_run = pl.pipeline_step(tinylm, x, y, stages, 4, "1f1b" if stages == 2 else "gpipe", library=True, pool=pool)
    _agree(lib_run, loss, grads)
    assert_refused(lambda: lib_run.bubble, ValueError, "bubble", True, "the course's schedule")


def test_split_layers():
    assert pl.split_layers(4, 2) == [(0, 2), (2, 4)]
    assert pl.split_layers(61, 4) == [(0, 16), (16, 31), (31, 46), (46, 61)]
    assert_refused(lambda: pl.split_layers(4, 5), ValueError, "stages", 5, "in [1, 4]")


def test_bad_input_is_refused(tinylm, batch):
    x, y, _, _ = batch
    assert_refused(lambda: pl.pipeline_step(tinylm, x, y, 2, 3), ValueError, "microbatches", 3,
                   "a divisor of the batch size 4")
    assert_refused(lambda: pl.pipeline_step(tinylm, x, y, 5, 2), ValueError, "stages", 5, "in [1, 4]")
    assert_refused(lambda: pl.pipeline_step(tinylm, x, y, 2, 2, "zb"), ValueError, "schedule", "zb", "one of")
    bad = x.clone()
    bad[0, 0] = tinylm.cfg.vocab_size
    assert_refused(lambda: pl.pipeline_step(tinylm, bad, y, 2, 2), ValueError, "tokens",
                   f"torch.int64 in [{int(bad.min())}, {tinylm.cfg.vocab_size}]", "token ids in [0, 255]")
    long = torch.zeros(4, tinylm.cfg.max_seq_len + 1, dtype=torch.long)
    assert_refused(lambda: pl.pipeline_step(tinylm, long, long, 2, 2), ValueError, "tokens",
                   (4, tinylm.cfg.max_seq_len + 1), f"max_seq_len={tinylm.cfg.max_seq_len}")


@pytest.mark.timeout(60)
def test_pipeline_generation_equals_the_single_process(tinylm, pool2):
    from labkit.tinylm import generate
    prompt = list(b"The cat sat on the ")
    run = pl.pipeline_generate(tinylm, prompt, 10, 2, pool=pool2)
    assert run["tokens"] == generate(tinylm, prompt, 10)
    assert len(run["seconds"]) == 9 and all(s > 0 for s in run["seconds"])
    assert_refused(lambda: pl.pipeline_generate(tinylm, prompt, 300, 2), ValueError, "max_new_tokens", 300,
                   "<= 237")


def test_predicted_decode_seconds():
    from labkit.parallel.linkmodel import LinkModel
    from labkit.tinylm import TinyLMConfig
    link = LinkModel(1e-4, 1e9)
    assert pl.predicted_decode_seconds(TinyLMConfig(), 1, link, 1e-3) == 1e-3
    assert pl.predicted_decode_seconds(TinyLMConfig(), 2, link, 1e-3) == pytest.approx(1e-3 + 2e-4 + 512e-9 + 8e-9)


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_stages_in_a_row_are_the_whole_model(stages, tinylm):
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    parts = [pl.Stage(tinylm, i, stages) for i in range(stages)]
    owned = [sorted({int(n.split(".")[1]) for n, _ in p.named_parameters() if n.startswith("layers.")}) for p in parts]
    assert owned == [list(range(a, b)) for a, b in pl.split_layers(tinylm.cfg.n_layers, stages)]
    with torch.no_grad():
        x = tokens
        for part in parts:
            x = part(x)
        assert torch.equal(x, tinylm(tokens))  # the same blocks in the same order: bitwise
        cache = KVCache(tinylm.cfg, max_len=16)  # a cached continuation, as pipeline_generate runs it
        for step in (tokens[:1, :8], tokens[:1, 8:9]):
            x = step
            for part in parts:
                x = part(x, cache)
            cache.advance(step.shape[1])
        ref = KVCache(tinylm.cfg, max_len=16)
        tinylm(tokens[:1, :8], ref)
        assert torch.equal(x, tinylm(tokens[:1, 8:9], ref))


def test_a_stage_runs_the_loop_tinylm_forward_runs(tinylm, monkeypatch):
    """The stage and the model call the one run_blocks (recorded by replacing it where both look it up), and the
    model's compile choice (compile_blocks_apart) changes neither the loop the stages run nor their result."""
    import copy

    from labkit.tinylm import compile_blocks_apart
    from labkit.tinylm import model as model_py
    model = compile_blocks_apart(copy.deepcopy(tinylm))
    assert model.run_blocks._torchdynamo_orig_callable is pl.run_blocks is model_py.run_blocks
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
    calls = []

    def recording(layers, x, cos, sin, cache, start, first, last):
        calls.append((first, last))
        return model_py.run_blocks(layers, x, cos, sin, cache, start, first, last)

    monkeypatch.setattr(pl, "run_blocks", recording)
    parts = [pl.Stage(model, i, 2) for i in range(2)]
    with torch.no_grad():
        x = tokens
        for part in parts:
            x = part(x)
        assert torch.equal(x, model(tokens))  # the same blocks in the same order: bitwise
    assert calls == pl.split_layers(model.cfg.n_layers, 2)  # the shared loop, once per stage over its slice
