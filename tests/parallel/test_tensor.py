"""Tensor parallelism on real ranks: TP=2 logits equal the single-process model's within 1e-4 (another
summation order), greedy generation equals it token for token on the course's prompts, the collectives
move the bytes the formula says, the shards rebuild the weights, and degrees that do not divide are refused
naming the counts before any process starts."""
import pytest
import torch

from labkit.parallel import tensor as tp
from labkit.tinylm import TASK_KINDS, ByteTokenizer, TinyLMConfig, generate, linear_layers, make_tasks
from tests.refusals import assert_refused


@pytest.mark.timeout(60)
def test_tp2_logits_equal_the_single_process_model(tinylm, pool2):
    tokens = torch.tensor([ByteTokenizer().encode("The cat sat on the mat. 12+7=19")] * 2)
    with torch.no_grad():
        ref = tinylm(tokens)
    got = tp.tensor_parallel_logits(tinylm, tokens, 2, pool=pool2)
    assert got.shape == ref.shape and (got - ref).abs().max() < 1e-4


@pytest.mark.timeout(60)
def test_tp2_logits_of_tokens_from_every_rank_s_slice_of_the_vocabulary(tinylm, pool2):
    """Text is ASCII (ids < 128: rank 0's half of the embedding); ids of every range make rank 1's rows and
    rank 0's zeros for them count too."""
    tokens = torch.stack([torch.arange(0, 256, 8), torch.arange(255, -1, -8)])  # [2, 32], both halves
    with torch.no_grad():
        ref = tinylm(tokens)
    got = tp.tensor_parallel_logits(tinylm, tokens, 2, pool=pool2)
    assert got.shape == ref.shape and (got - ref).abs().max() < 1e-4


@pytest.mark.timeout(90)
def test_tp2_greedy_generation_equals_the_single_process_model(tinylm, pool2):
    tok = ByteTokenizer()
    for kind in TASK_KINDS:
        prompt = tok.encode(make_tasks(kind, 1)[0].prompt)[-64:]
        run = tp.tensor_parallel_generate(tinylm, prompt, 12, 2, pool=pool2)
        assert run["tokens"] == generate(tinylm, prompt, 12), kind
        assert len(run["seconds"]) == 11 and all(s > 0 for s in run["seconds"])
        cfg, steps = tinylm.cfg, len(prompt) + 11  # prefill + 11 decode steps, one token each
        assert run["comm"]["all_reduce"] * 4 == tp.all_reduce_bytes_per_token(cfg, 4) * steps
        assert run["comm"]["all_gather"] == cfg.vocab_size * steps


@pytest.mark.timeout(60)
def test_tp2_merges_given_embeddings_like_the_single_process_model(tinylm, pool2):
    tokens = torch.tensor([ByteTokenizer().encode("image here: ____ end")])
    embeds = (torch.arange(12, 16), torch.randn(4, tinylm.cfg.d_model))  # rows 12..15 get given vectors
    with torch.no_grad():
        ref = tinylm(tokens, embeds=embeds)
    got = tp.tensor_parallel_logits(tinylm, tokens, 2, pool=pool2, embeds=embeds)
    assert (got - ref).abs().max() < 1e-4
    assert (got - tp.tensor_parallel_logits(tinylm, tokens, 2, pool=pool2)).abs().max() > 1e-2


def test_check_split_is_the_same_on_every_machine_and_check_tp_adds_the_world_limit(tinylm):
    from labkit.parallel.distributed import MAX_WORLD
    big = TinyLMConfig(vocab_size=64 * MAX_WORLD, d_model=4 * 2 * MAX_WORLD, n_heads=2 * MAX_WORLD,
                       n_kv_heads=2 * MAX_WORLD, d_ff=2 * MAX_WORLD)
    assert tp.check_split(big, 2 * MAX_WORLD) == 2 * MAX_WORLD  # divides: fine on paper
    with pytest.raises(ValueError, match="tp"):
        tp.check_tp(big, 2 * MAX_WORLD)  # but more ranks than this machine runs
    with pytest.raises(ValueError, match="n_kv_heads"):
        tp.check_split(tinylm.cfg, 4)


def test_from_local_takes_a_model_that_holds_only_its_slices(tinylm):
    import copy
    for rank in range(2):
        full = tp.ShardedTinyLM(tinylm, rank, 2)
        local = copy.deepcopy(tinylm)
        for entry in linear_layers(tinylm.cfg):  # what a rank that read only its slices holds
            mod = local.get_submodule(entry.path)
            mod.weight = torch.nn.Parameter(tp.shard(mod.weight.detach(), entry.tp_style, rank, 2))
        sliced = tp.ShardedTinyLM.from_local(local, rank, 2)
        assert sliced.local is local and sliced.vocab_start == full.vocab_start
        for (name, a), (_, b) in zip(sliced.state_dict().items(), full.state_dict().items()):
            assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="slice"):
        tp.ShardedTinyLM.from_local(copy.deepcopy(tinylm), 0, 2)  # full weights are not a rank's slices
    with pytest.raises(TypeError, match="local"):
        tp.ShardedTinyLM.from_local("model", 0, 2)


def test_shards_rebuild_every_weight(tinylm):
    for entry in linear_layers(tinylm.cfg):
        w = tinylm.get_submodule(entry.path).weight.detach()
        parts = [tp.shard(w, entry.tp_style, r, 2) for r in range(2)]
        assert torch.equal(torch.cat(parts, dim=1 if entry.tp_style == "row" else 0), w)
    local = tp.shard_config(tinylm.cfg, 2)
    assert (local.n_heads, local.n_kv_heads, local.head_dim) == (2, 1, tinylm.cfg.head_dim)


def test_degrees_that_do_not_divide_are_refused(tinylm):
    tokens = torch.zeros(1, 4, dtype=torch.long)
    assert_refused(lambda: tp.tensor_parallel_logits(tinylm, tokens, 4), ValueError, "tp", 4,
                   "a divisor of n_kv_heads=2")
    assert_refused(lambda: tp.tensor_parallel_logits(tinylm, tokens, 3), ValueError, "tp", 3,
                   "a divisor of n_heads=4")
    from labkit.parallel.distributed import MAX_WORLD
    assert_refused(lambda: tp.tensor_parallel_logits(tinylm, tokens, MAX_WORLD + 1), ValueError, "tp",
                   MAX_WORLD + 1, f"in [1, {MAX_WORLD}]: this machine runs at most 4 ranks per CPU core")
    assert_refused(lambda: tp.tensor_parallel_logits("model", tokens, 2), TypeError, "model", "str", "a TinyLM")
    with pytest.raises(ValueError, match="replicate KV heads"):
        tp.check_tp(TinyLMConfig(), 4)
    with pytest.raises(ValueError) as info:  # TP=3: the query heads are the problem, not the KV heads
        tp.check_tp(TinyLMConfig(), 3)
    assert "KV" not in str(info.value) and "4 query heads" in str(info.value)
    assert_refused(lambda: tp.tensor_parallel_generate(tinylm, [1, 2], 300, 2), ValueError, "max_new_tokens",
                   300, "<= 254")


def test_predicted_step_seconds():
    from labkit.parallel.linkmodel import LinkModel
    cfg, link = TinyLMConfig(), LinkModel(1e-4, 1e9)
    expected = 1e-3 / 2 + 9 * link.collective("all_reduce", 512, 2) + link.collective("all_gather", 1024, 2)
    assert tp.predicted_step_seconds(cfg, 2, link, 1e-3) == pytest.approx(expected)
    assert tp.predicted_step_seconds(cfg, 1, link, 1e-3) == pytest.approx(1e-3)


def test_the_table_picks_each_parallel_layer_and_tinylm_runs_its_own_forward(tinylm):
    kinds = {"column": tp.ColumnParallelLinear, "row": tp.RowParallelLinear}
    for rank in range(2):
        sharded = tp.ShardedTinyLM(tinylm, rank, 2)
        assert type(sharded.local) is type(tinylm)  # TinyLM's forward, not a copy of its loop
        for entry in linear_layers(tinylm.cfg):
            layer = sharded.local.get_submodule(entry.path)
            want = kinds.get(entry.tp_style) or (tp.VocabParallelEmbedding if entry.layer_type == "embedding"
                                                 else tp.VocabParallelHead)
            assert type(layer) is want, entry.path
            inner = layer.embedding if entry.layer_type == "embedding" else layer.linear
            full = tinylm.get_submodule(entry.path).weight
            assert torch.equal(inner.weight, tp.shard(full.detach(), entry.tp_style, rank, 2)), entry.path
        assert sharded.local.tok_emb.embedding.weight is sharded.local.lm_head.linear.weight  # tied: one slice
    assert all(tinylm.get_submodule(e.path).weight.shape == e.shape for e in linear_layers(tinylm.cfg))  # a copy


def test_a_group_of_one_runs_in_process_and_equals_the_model_bitwise(tinylm):
    from labkit.tinylm import KVCache
    tokens = torch.tensor([ByteTokenizer().encode("The cat sat on the mat.")])
    one = tp.ShardedTinyLM(tinylm, 0, 1)  # no process group: a group of one moves nothing
    with torch.no_grad():
        assert torch.equal(one(tokens), tinylm(tokens))
        cache, ref = KVCache(tp.shard_config(tinylm.cfg, 1)), KVCache(tinylm.cfg)
        one(tokens, cache)
        tinylm(tokens, ref)
        assert torch.equal(one(tokens[:, :1], cache), tinylm(tokens[:, :1], ref))
    cfg, n = tinylm.cfg, 2 * tokens.shape[1] + 1  # tokens through the model: twice the sentence, then one
    assert one.comm == {"all_reduce": tp.all_reduce_bytes_per_token(cfg, 1) * n, "all_gather": cfg.vocab_size * n}
