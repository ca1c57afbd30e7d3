"""Quantized KV: round-trip error within half a step of each group's range (brute-force bound), the residual
of per-channel groups exact, FP8 equal to torch's casts with the stated ranges, memory per element, KIVI's
measurement on data built with outlier channels / tokens, and TinyLM's keys (the finding itself)."""
import pytest
import torch

from labkit.kv_cache import quantized as q
from labkit.tinylm import corpus, perplexity
from tests.refusals import assert_refused


def test_per_token_error_is_within_half_a_step_of_each_tokens_range():
    x = torch.randn(2, 3, 40, 8, generator=torch.Generator().manual_seed(0))
    for fmt, levels in (("int8", 255), ("int4", 15), ("int2", 3)):
        err = (q.fake_quantize(x, fmt, "token") - x).abs()
        step = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / levels
        assert (err <= step / 2 * 1.0001 + 1e-7).all()


def test_per_channel_quantizes_whole_groups_and_keeps_the_residual_exact():
    x = torch.randn(2, 40, 8, generator=torch.Generator().manual_seed(1))
    out = q.fake_quantize(x, "int4", "channel", group=16)
    assert torch.equal(out[:, 32:], x[:, 32:]) and not torch.equal(out[:, :32], x[:, :32])
    g = x[:, 16:32]  # one group: per channel (last dim) over its 16 tokens
    step = (g.amax(1, keepdim=True) - g.amin(1, keepdim=True)) / 15
    assert ((out[:, 16:32] - g).abs() <= step / 2 * 1.0001 + 1e-7).all()


def test_fp8_is_a_plain_cast_with_the_stated_ranges():
    assert torch.finfo(q.FP8["fp8-e4m3"]).max == 448 and torch.finfo(q.FP8["fp8-e5m2"]).max == 57344
    x = torch.randn(3, 5, 8)
    assert torch.equal(q.fake_quantize(x, "fp8-e5m2"), x.to(torch.float8_e5m2).float())


def test_bits_per_element_counts_scales_and_zero_points():
    assert q.bits_per_element("int4", "token", head_dim=32) == 4 + 32 / 32
    assert q.bits_per_element("int2", "channel", group=32) == 2 + 1
    assert q.bits_per_element("fp8-e4m3") == 8


def test_kivi_table_sees_outlier_channels_and_outlier_tokens():
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(4, 64, 16, generator=gen)
    channels = base + torch.zeros(16).index_fill(0, torch.tensor([3, 9]), 20.0)  # two channels offset in all tokens
    tokens = base * torch.ones(64, 1).index_fill(0, torch.tensor([5, 40]), 20.0)  # two tokens large in all channels
    row = q.kivi_table(channels, tokens, ("int4",))[0]
    assert row["keys per channel"] > row["keys per token"] + 3
    assert row["values per token"] > row["values per channel"] + 3


def test_tinylm_keys_quantize_better_per_channel(pretrained):
    model, _ = pretrained
    tokens = torch.tensor(list(corpus.corpus("test", 2 * 256, seed=0))).view(2, 256)
    k, v = q.collect_kv(model, tokens)
    assert k.shape == (model.cfg.n_layers, 2, model.cfg.n_kv_heads, 256, model.cfg.head_dim)
    for row in q.kivi_table(k, v):
        assert row["keys per channel"] > row["keys per token"] + 2  # KIVI's key finding, on TinyLM


def test_a_quantized_kv_model_degrades_with_fewer_bits(pretrained):
    model, _ = pretrained
    text = corpus.corpus("test", 2048, seed=0)
    base = perplexity(model, text)
    int8 = perplexity(q.KVQuantModel(model, "int8"), text)
    int2 = perplexity(q.KVQuantModel(model, "int2"), text)
    assert abs(int8 / base - 1) < 0.01 and int2 > int8
    tokens = torch.tensor([list(text[:128])])
    errors = {f: q.attention_output_error(model, tokens, fmt=f) for f in ("fp8-e4m3", "int4", "int2")}
    assert all(a < b for a, b in zip(errors["fp8-e4m3"], errors["int2"]))
    assert not any(layer.attn._forward_hooks for layer in model.layers)


def test_bad_input_is_refused(pretrained):
    model, _ = pretrained
    assert_refused(lambda: q.fake_quantize(torch.zeros(2, 2), "int3"), ValueError, "fmt", "int3", "one of")
    assert_refused(lambda: q.KVQuantModel(model, "int4", key_axis="row"), ValueError, "key_axis", "row", "one of")
    assert_refused(lambda: q.bits_per_element("int4", "token", head_dim=0), ValueError, "head_dim", 0, "positive")
    k = torch.zeros(1, 2, 16, 8)
    assert_refused(lambda: q.kivi_table(k, k, group=32), ValueError, "k", "16 tokens", "at least one whole group")
    assert_refused(lambda: q.kivi_table(k, k[..., :4], group=8), ValueError, "v", (1, 2, 16, 4), "k's shape")
    assert_refused(lambda: q.kivi_table(k, k, group=0), ValueError, "group", 0, "a positive int")


def test_the_quality_sweep_rows_agree_with_their_retentions(pretrained):
    from labkit.quant.quality import quality_tasks
    from labkit.tinylm import corpus, task_correct
    model, _ = pretrained
    tasks = quality_tasks(4)
    settings = {name: q.KV_SETTINGS[name] for name in ("int8 per token", "int2 per token")}
    rows = q.quality_sweep(model, tasks, corpus.corpus("test", n_bytes=512, seed=0), settings)
    assert [r["setting"] for r in rows] == ["exact (FP32)", *settings] and rows[0]["retention"] is None
    base = sum(task_correct(model, tasks))
    for r in rows[1:]:
        ret = r["retention"]
        kept = sum(task_correct(q.KVQuantModel(model, **settings[r["setting"]]), tasks))
        assert r["tasks"] == f"{kept}/{len(tasks)}" and ret.retained == pytest.approx(kept / base)
        assert r["retained (95%)"] == f"{ret.retained:.1%} ({ret.low:.1%} to {ret.high:.1%})"
        assert ret.low <= ret.retained <= ret.high
    assert "retention" not in q.quality_table(rows) and "to" in q.quality_table(rows)
    words = q.retention_words(rows, "int8 per token", "int2 per token")
    lo8, hi2 = rows[1]["retention"].low, rows[2]["retention"].high
    assert ("retains more" in words) == (lo8 > hi2 or rows[2]["retention"].low > rows[1]["retention"].high)
    assert_refused(lambda: q.retention_words(rows, "exact (FP32)", "int2 per token"), ValueError, "a",
                   "exact (FP32)", "one of the quantized settings")


def test_keys_and_values_are_each_quantized_along_their_own_axis():
    """KIVI's setting (keys per channel, values per token): the cache returns exactly fake_quantize of each
    along its axis, never the keys' axis for the values."""
    from labkit.tinylm import TinyLMConfig
    cfg = TinyLMConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64, max_seq_len=64)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 2, 40, 16, generator=g), torch.randn(1, 2, 40, 16, generator=g) * 3
    cache = q.QuantizedKVCache(cfg, "int4", key_axis="channel", value_axis="token", group=8)
    qk, qv = cache.update(0, k, v)
    assert torch.equal(qk, q.fake_quantize(k, "int4", "channel", 8))
    assert torch.equal(qv, q.fake_quantize(v, "int4", "token", 8))
    assert not torch.equal(qv, q.fake_quantize(v, "int4", "channel", 8))
