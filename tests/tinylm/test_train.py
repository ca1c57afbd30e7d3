import pytest

from labkit.tinylm import corpus as data
from labkit.tinylm import train
from labkit.tinylm import perplexity
from labkit.tinylm import TinyLMConfig


def test_lr_schedule_warms_up_then_decays_to_min():
    lrs = [train.lr_at(s, 1000, 1e-3, 1e-5, 100) for s in range(1000)]
    assert lrs[0] == pytest.approx(1e-5) and lrs[99] == pytest.approx(1e-3)
    assert all(a <= b for a, b in zip(lrs[:100], lrs[1:100]))
    assert all(a >= b for a, b in zip(lrs[100:], lrs[101:]))
    assert train.lr_at(1000, 1000, 1e-3, 1e-5, 100) == pytest.approx(1e-5)


def test_a_short_run_learns_and_is_reproducible():
    cfg = TinyLMConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=64)
    kw = dict(cfg=cfg, steps=40, batch_size=8, warmup=5, train_bytes=20_000)
    val = data.corpus("val", 2048)
    untrained = train.train(**{**kw, "steps": 0})  # the initialised model
    a, b = train.train(**kw), train.train(**kw)
    assert perplexity(a, val) < 0.5 * perplexity(untrained, val)
    assert all((p == q).all() for p, q in zip(a.parameters(), b.parameters()))


def test_bad_recipe_is_refused():
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        train.train(steps=1, batch_size=0)
    with pytest.raises(ValueError, match="lr must be a finite number >= 0, got nan"):
        train.train(steps=1, lr=float("nan"))
    with pytest.raises(ValueError, match="train_bytes must be an int >= 258, got 100"):
        train.train(steps=1, train_bytes=100)
    with pytest.raises(SystemExit):
        train.main(["--steps", "0"])


def test_a_config_that_is_not_a_tinylmconfig_is_refused():
    with pytest.raises(TypeError, match="cfg must be a TinyLMConfig, got dict"):
        train.train(cfg={"d_model": 32}, steps=0)
