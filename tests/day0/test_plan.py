"""Reading the release on paper: parameter counts against the real model's tensors, per-rank bytes against the
tensor-parallel split and a real KV cache, the image-token budget against a transcription of vLLM's profiler,
the parallel degrees against the course's runtime check, and lab 04's planner on the cluster and scaled up."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.day0 import plan as P
from labkit.day0.config import TinyVLMConfig, small_config
from labkit.day0.loading import placed_sizes
from labkit.day0.model import TinyVLM, tp_plan
from labkit.day0.release import write_release
from labkit.parallel.tensor import check_split, shard, shard_config
from labkit.tinylm import KVCache
from tests.refusals import assert_refused

CONFIGS = [small_config(), small_config(qk_norm=False), small_config(tie_embeddings=False, d_ff=96),
           small_config(n_heads=8, n_kv_heads=4, d_model=64), TinyVLMConfig()]


def numel(module):
    return sum(p.numel() for p in module.parameters())  # tied weights counted once


@pytest.mark.parametrize("cfg", CONFIGS)
def test_counts_match_the_models_tensors(cfg):
    with torch.device("meta"):
        m = TinyVLM(cfg)
    counts = P.param_counts(cfg)
    assert counts["decoder"] == numel(m.language_model)
    assert counts["vision_tower"] == numel(m.vision_tower)
    assert counts["projector"] == numel(m.multi_modal_projector)
    assert counts["total"] == numel(m)
    f = P.footprint(cfg, dtype_bytes=2)
    assert f["decoder_weights"] == 2 * numel(m.language_model)
    assert f["encoder_weights"] == 2 * (numel(m.vision_tower) + numel(m.multi_modal_projector))


def rank_bytes_by_split(cfg, tp, element=2):
    """One rank's decoder bytes from the model's own tp_plan and the runtime's shard()."""
    with torch.device("meta"):
        state = TinyVLM(cfg).state_dict()
    total = 0
    for name, style in tp_plan(cfg).items():
        if style == "encoder":
            continue
        t = state[name]
        total += (t.numel() if style == "replicated" else shard(t, style, 0, tp).numel()) * element
    return total


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("tp", [1, 2])
def test_per_rank_bytes_match_the_split_and_a_real_cache(cfg, tp):
    seqs, context = 3, 40
    f = P.footprint(cfg, dtype_bytes=2, max_num_seqs=seqs, max_seq_len=context, tp=tp)
    assert f["decoder_weights"] == rank_bytes_by_split(cfg, tp)
    cache = KVCache(shard_config(cfg.text_config, tp), batch_size=seqs, max_len=context, dtype=torch.bfloat16)
    assert f["kv_cache"] == cache.k.nbytes + cache.v.nbytes
    t = cfg.text_config  # by hand: residual + normed copy + three d_ff/tp wide MLP tensors per token, logits
    assert f["activations"] == context * (2 * t.d_model + 3 * t.d_ff // tp) * 2 + seqs * t.vocab_size * 4
    assert f["rank_total"] == f["decoder_weights"] + f["kv_cache"] + f["activations"]
    assert f["total"] == tp * f["rank_total"] + f["encoder_total"]
    assert f["encoder_total"] == f["encoder_weights"] + f["encoder_cache"] + f["encoder_activations"]


def test_planned_bytes_match_the_release_headers(tmp_path):
    cfg = small_config()
    torch.manual_seed(0)
    write_release(TinyVLM(cfg).state_dict(), cfg, tmp_path, max_shard_size="40KB")
    for rank in range(2):
        sizes = placed_sizes(tmp_path, rank, 2, torch.bfloat16)
        assert sum(sizes.values()) == P.footprint(cfg, tp=2)["decoder_weights"]


def vllm_profiled_items(max_tokens_per_mm_item, max_num_batched_tokens, max_num_reqs, max_mm_items_per_req):
    """vLLM V1, transcribed: vllm/v1/core/encoder_cache_manager.py compute_encoder_budget (scheduler's
    max_num_encoder_input_tokens and encoder_cache_size default to max_num_batched_tokens), then
    vllm/v1/worker/gpu_model_runner.py profile_run's dummy item count."""
    encoder_compute_budget = max(max_num_batched_tokens, max_tokens_per_mm_item)
    encoder_cache_size = max(max_num_batched_tokens, max_tokens_per_mm_item)
    encoder_budget = min(encoder_compute_budget, encoder_cache_size)
    max_num_mm_items_encoder_budget = -(-encoder_budget // max_tokens_per_mm_item)  # cdiv
    max_num_mm_items_decoder_budget = max_num_reqs * max_mm_items_per_req
    return encoder_budget, min(max_num_mm_items_encoder_budget, max_num_mm_items_decoder_budget)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(1, 600), st.sampled_from(CONFIGS))
def test_image_budget_is_vllms(seqs, batched, cfg):
    b = P.image_budget(cfg, max_num_seqs=seqs, max_num_batched_tokens=batched)
    budget, items = vllm_profiled_items(cfg.tokens_per_image, batched, seqs, cfg.max_images_per_prompt)
    assert (b["encoder_cache_tokens"], b["profiled_images"]) == (budget, items)
    assert b["tokens_per_image"] == cfg.vision_config.num_patches
    assert b["per_request"] == cfg.max_images_per_prompt * cfg.vision_config.num_patches
    f = P.footprint(cfg, max_num_seqs=seqs, max_num_batched_tokens=batched)
    assert f["encoder_cache"] == items * cfg.tokens_per_image * cfg.text_config.d_model * 2


@pytest.mark.parametrize("cfg", CONFIGS + [small_config(vocab_size=270, d_ff=60)])
def test_parallel_degrees_agree_with_the_runtime(cfg):
    """The same rows on every machine: divisibility only (how many ranks a machine can start is lab 04's
    check_world, not the model's)."""
    rows = P.parallel_options(cfg, max_tp=16)
    assert [r["tp"] for r in rows] == list(range(1, 17))
    for r in rows:
        try:
            check_split(cfg.text_config, r["tp"])
            runs, rule = True, ""
        except ValueError as e:
            runs, rule = False, str(e)
        assert r["works"] == runs, r
        if not runs:  # the runtime's own words (one rule), its fields named text_config.<field>
            assert r["why"].replace("text_config.", "") in rule.replace("a divisor of", "must divide"), (r, rule)
            field = r["why"].split("text_config.")[1].split("=")[0]
            assert getattr(cfg.text_config, field) % r["tp"]  # the field named is one that does not divide
            assert_refused(lambda: P.check_parallel(cfg, r["tp"]), ValueError, "tp", r["tp"], f"text_config.{field}")
        else:
            assert P.check_parallel(cfg, r["tp"]) == r["tp"]


def test_the_cluster_plan():
    cfg = small_config()
    plans = P.plan_cluster(cfg, devices=2)
    kept = [p for p in plans if p.fits]
    assert {(p.tp, p.pp, p.dp) for p in kept} == {(1, 1, 2), (1, 2, 1), (2, 1, 1)}
    tp1 = next(p for p in kept if p.tp == 1 and p.pp == 1)  # the planner's weights miss only QK-norm
    qk = 2 * 2 * cfg.text_config.head_dim * cfg.text_config.n_layers
    assert tp1.memory["weights"] + qk == P.footprint(cfg)["decoder_weights"]
    four = P.plan_cluster(cfg, devices=4)  # the planner allows TP=4 over 2 KV heads; the runtime does not
    tp4 = [p for p in four if p.tp == 4]
    assert tp4 and all(not p.fits and "text_config.n_kv_heads" in p.reason for p in tp4)
    per_device = min(sum(p.memory.values()) for p in kept)
    memory = math.ceil(per_device / 0.9)
    tight = P.plan_cluster(cfg, devices=2, memory_bytes=memory)
    assert [p for p in tight if p.fits] and all(sum(p.memory.values()) <= 0.9 * memory for p in tight if p.fits)
    assert all(p.reason.startswith("needs ") and sum(p.memory.values()) > 0.9 * memory for p in tight if not p.fits)
    assert len([p for p in tight if p.fits]) < len(kept)
    assert not any(p.fits for p in P.plan_cluster(cfg, devices=2, memory_bytes=int(per_device // 2)))


def test_scaled_up_keeps_the_shape_and_plans_on_real_gpus():
    cfg = TinyVLMConfig()
    spec = P.scaled_up(cfg)
    t = cfg.text_config
    assert spec.n_heads * t.n_kv_heads == spec.n_kv_heads * t.n_heads and spec.head_dim == 128
    assert spec.d_ff % 256 == 0 and spec.d_ff / spec.d_model == pytest.approx(t.d_ff / t.d_model, rel=0.02)
    layer = 2 * 8192 * 8192 + 2 * 8192 * spec.n_kv_heads * 128 + 3 * 8192 * spec.d_ff + 2 * 8192
    assert spec.n_params == 80 * layer + t.vocab_size * 8192 + 8192
    h100, h200 = P.plan_scaled(spec, device_name="h100-sxm"), P.plan_scaled(spec, device_name="h200")
    assert not any(p.fits for p in h100) and h200[0].fits and h200[0].tp == 8  # the KV cache decides
    moe = P.scaled_up(cfg, n_kv_heads=8, n_experts=8, experts_per_token=2)
    assert moe.n_experts == 8 and moe.active_params < moe.n_params
    assert any(p.fits and p.ep > 1 for p in P.plan_scaled(moe, nodes=2, batch=16, context=4096))


def test_bad_inputs_are_refused_by_name():
    cfg = small_config()
    assert_refused(lambda: P.footprint(cfg, tp=3), ValueError, "tp", 3, "text_config.n_heads")
    assert_refused(lambda: P.footprint(cfg, dtype_bytes=0), ValueError, "dtype_bytes", 0, "positive")
    assert_refused(lambda: P.footprint(cfg, max_seq_len=65), ValueError, "max_seq_len", 65, "[1, 64]")
    assert_refused(lambda: P.footprint(cfg, max_num_seqs=0), ValueError, "max_num_seqs", 0, "positive int")
    with pytest.raises(TypeError, match=r"^cfg must be a labkit.day0.TinyVLMConfig, got TextConfig"):
        P.footprint(cfg.text_config)
    assert_refused(lambda: P.check_parallel(cfg, True), TypeError, "tp", True, "positive int")
    assert_refused(lambda: P.plan_cluster(cfg, memory_bytes=-1), ValueError, "memory_bytes", -1, "positive int")
    assert_refused(lambda: P.plan_cluster(cfg, device_name="ddr5-5600-2ch"), ValueError, "device_name",
                   "ddr5-5600-2ch", "a device that computes")
    assert_refused(lambda: P.scaled_up(cfg, d_model=8000), ValueError, "head_dim", 128, "a divisor of d_model=8000")
    assert_refused(lambda: P.plan_scaled(P.scaled_up(cfg), device_name="nvlink4"), ValueError, "device_name",
                   "nvlink4", "one of")
