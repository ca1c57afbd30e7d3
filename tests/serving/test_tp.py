"""labkit.serving.tp: the engine over two gloo ranks gives what the engine in one process gives (greedy tokens
equal, logits within float32 reordering noise), refuses a bad tp before any process starts, and turns a
rank's failure into RankError and a runner that refuses further calls. One Pool(2) for the module."""
import multiprocessing as mp
import time

import openai
import pytest
import torch

from labkit.parallel import Pool, RankError
from labkit.serving import Engine, ModelRunner, SamplingParams
from labkit.serving.batch import StepInput
from labkit.serving.launch import start_service
from labkit.parallel.tensor import ShardedTinyLM
from labkit.serving.tp import TPRunner, built_tp_engine, tp_engine
from labkit.tinylm import TASK_KINDS, generate, load_pretrained, make_tasks
from tests.refusals import assert_refused

GREEDY = SamplingParams(max_tokens=16, temperature=0)
ATOL = 1e-4
"""float32 logits of TP=2 against one process: the row-parallel layers add two half-sums where one process adds
one whole dot product, and the packed batch changes the matmul's blocking (COURSE.md, batch invariance);
measured: at most 1.8e-5 (TP=2 against one process or the plain forward) on logits up to ~17 in magnitude."""


@pytest.fixture(scope="module")
def pool():
    with Pool(2, timeout=20) as p:
        yield p


@pytest.fixture(scope="module")
def some(prompts):
    """Six task prompts of all three kinds and lengths (5 to 196 tokens)."""
    return prompts[::3]


@pytest.fixture(scope="module")
def reference(model, some):
    """labkit.tinylm.generate's greedy tokens for each prompt, run alone (the independent reference)."""
    return [generate(model, p, GREEDY.max_tokens) for p in some]


def packed(seqs: list[list[int]], done: list[int], block_size: int, blocks_each: int) -> StepInput:
    """One packed step: sequence i (its blocks i*blocks_each ..) computes seqs[i][done[i]:] after done[i]
    cached tokens; every sequence samples."""
    tokens, positions, slots, tables = [], [], [], []
    for i, (s, d) in enumerate(zip(seqs, done)):
        table = list(range(i * blocks_each, (i + 1) * blocks_each))
        tokens += s[d:]
        positions += range(d, len(s))
        slots += [table[p // block_size] * block_size + p % block_size for p in range(d, len(s))]
        tables.append(table)
    return StepInput(torch.tensor(tokens), torch.tensor(positions), torch.tensor(slots),
                     [len(s) - d for s, d in zip(seqs, done)], [len(s) for s in seqs], tables, list(range(len(seqs))))


def last_logits(model, seqs: list[list[int]]) -> torch.Tensor:
    """Each sequence alone through TinyLM's plain forward (no cache): its last token's logits [S, vocab]."""
    with torch.no_grad():
        return torch.stack([model(torch.tensor([s]))[0, -1] for s in seqs])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tp", [3, 0, "a"])
def test_bad_tp_is_refused_before_any_process_starts(model, tp):
    before = set(mp.active_children())
    error = TypeError if isinstance(tp, str) else ValueError
    expected = "an int" if tp in (0, "a") else "a divisor of n_heads=4"
    assert_refused(lambda: TPRunner(model, tp, 8, 16), error, "tp", tp, expected)
    assert_refused(lambda: tp_engine(model, tp), error, "tp", tp, expected)
    assert set(mp.active_children()) == before


@pytest.mark.timeout(60)
def test_other_bad_arguments_are_refused(model, pool):
    assert_refused(lambda: TPRunner(model, 2, 0, 16, pool), ValueError, "num_blocks", 0, "positive")
    assert_refused(lambda: TPRunner(model, 2, 8, 16, "pool"), TypeError, "pool", "pool", "a labkit.parallel.Pool")
    four = Pool(4)  # not started: the world is refused before it would be
    with pytest.raises(ValueError, match="pool must be a Pool of world 2"):
        TPRunner(model, 2, 8, 16, four)
    assert not four.running
    with pytest.raises(ValueError, match="pool must be None with tp=1"):
        tp_engine(model, 1, pool=pool)


@pytest.mark.timeout(60)
def test_packed_step_logits_match_one_process_and_the_plain_forward(model, some, pool):
    """A prefill of six prompts packed together, then a decode step of all six: the logits of TP=2, of the
    one-process ModelRunner and of each sequence alone through TinyLM's forward agree within ATOL."""
    bs, each = 16, 14  # 14 blocks of 16 hold the longest prompt (196) plus a token
    with TPRunner(model, 2, len(some) * each, bs, pool) as tp:
        one = ModelRunner(model, len(some) * each, bs)
        first = packed(some, [0] * len(some), bs, each)
        got, alone = tp.execute(first), one.execute(first)
        assert got.dtype == torch.float32 and got.shape == (len(some), model.cfg.vocab_size)
        torch.testing.assert_close(got, alone, rtol=0, atol=ATOL)
        torch.testing.assert_close(got, last_logits(model, some), rtol=0, atol=ATOL)
        longer = [s + [int(t)] for s, t in zip(some, got.argmax(-1))]
        decode = packed(longer, [len(s) for s in some], bs, each)
        got = tp.execute(decode)
        torch.testing.assert_close(got, one.execute(decode), rtol=0, atol=ATOL)
        torch.testing.assert_close(got, last_logits(model, longer), rtol=0, atol=ATOL)
        assert tp.cfg == model.cfg and tp.steps == 2
        assert tp.kv_bytes_per_rank == [one.nbytes() // 2] * 2  # each rank holds half the KV heads


@pytest.mark.timeout(60)
def test_two_runners_on_one_pool_keep_their_own_kv(model, some, pool):
    """Runner b writes other tokens into the same block ids between a's prefill and a's decode: a's decode
    still sees its own keys and values."""
    bs, each = 16, 14
    a, b = TPRunner(model, 2, 2 * each, bs, pool), TPRunner(model, 2, 2 * each, bs, pool)
    try:
        mine, other = some[3:5], some[:2]
        first = a.execute(packed(mine, [0, 0], bs, each))
        b.execute(packed(other, [0, 0], bs, each))
        longer = [s + [int(t)] for s, t in zip(mine, first.argmax(-1))]
        got = a.execute(packed(longer, [len(s) for s in mine], bs, each))
        torch.testing.assert_close(got, last_logits(model, longer), rtol=0, atol=ATOL)
    finally:
        a.close()
        b.close()
    with pytest.raises(RuntimeError, match="is closed .close.. was called"):
        a.execute(packed(mine, [0, 0], bs, each))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_blocks, preemption", [(None, "recompute"), (24, "recompute"), (24, "swap")])
def test_engine_on_two_ranks_gives_the_greedy_tokens_of_one_process(model, some, reference, pool, num_blocks,
                                                                     preemption):
    """Six requests together under continuous batching; with 24 blocks of 16 they do not all fit, so some are
    preempted (recomputed, or swapped out to each rank's host memory and back)."""
    kwargs = dict(num_blocks=num_blocks, preemption=preemption, max_num_seqs=8)
    engine = tp_engine(model, 2, pool=pool, **kwargs)
    try:
        assert isinstance(engine.runner, TPRunner) and engine.runner.num_blocks == engine.block_manager.num_blocks
        engine.warmup()  # a one-token forward on both ranks; leaves no block behind
        assert engine.stats()["kv_blocks_used"] == 0
        got = engine.generate(some, GREEDY)
        alone = Engine(model, **kwargs)
        assert got == alone.generate(some, GREEDY) == reference
        assert engine.stats()["preemptions"] == alone.stats()["preemptions"]
        assert (engine.stats()["preemptions"] > 0) == (num_blocks is not None)
        assert engine.stats()["kv_blocks_used"] == 0
    finally:
        engine.runner.close()


@pytest.mark.timeout(60)
def test_tp1_is_a_plain_engine(model, some, reference):
    engine = tp_engine(model, 1, max_num_seqs=4)
    assert type(engine.runner) is ModelRunner
    assert engine.generate(some[:2], GREEDY) == reference[:2]


@pytest.mark.timeout(60)
def test_a_failing_rank_is_a_rank_error_and_closes_the_runner(model, some, pool):
    """A step that swaps in a sequence no rank has swapped out makes the ranks raise: RankError names the
    rank; the runner (and another on the same pool, whose shards went with the group) refuse further calls."""
    bs, each = 16, 14
    runner, bystander = TPRunner(model, 2, 2 * each, bs, pool), TPRunner(model, 2, 2 * each, bs, pool)
    bad = packed(some[:2], [0, 0], bs, each)
    bad.swap_in = [("never-swapped-out", 0, [0])]
    with pytest.raises(RankError) as info:
        runner.execute(bad)
    error = info.value
    assert error.rank in (0, 1) and str(error).startswith(f"rank {error.rank} failed with ValueError")
    assert "swapped-out sequence" in error.message
    good = packed(some[:2], [0, 0], bs, each)
    with pytest.raises(RuntimeError, match=f"is closed .RankError: rank {error.rank} failed"):
        runner.execute(good)
    with pytest.raises(RuntimeError, match="is closed .its pool of 2 ranks was closed"):
        bystander.execute(good)
    with pytest.raises(TypeError, match="step must be a labkit.serving.batch.StepInput"):
        bystander.execute("step")


def shard_on_the_rank(rank: int, world: int, fail_on: int = -1) -> ShardedTinyLM:
    """A builder the ranks run (TPRunner.from_builder): each loads the committed checkpoint itself and keeps its
    shard, so nothing is sent from the engine process; rank `fail_on` raises instead."""
    if rank == fail_on:
        raise OSError(f"no weights for rank {rank}")
    return ShardedTinyLM(load_pretrained()[0], rank, world)


@pytest.mark.timeout(90)
def test_ranks_that_build_their_own_shard_give_the_tokens_of_one_process(model, some, reference, pool):
    engine = built_tp_engine(shard_on_the_rank, (), model.cfg, 2, pool=pool, max_num_seqs=8)
    try:
        assert isinstance(engine.runner, TPRunner) and engine.runner.cfg == model.cfg
        assert engine.generate(some, GREEDY) == reference
    finally:
        engine.runner.close()
    with pytest.raises(RankError, match="^rank 1 failed with OSError: no weights for rank 1"):
        TPRunner.from_builder(shard_on_the_rank, (1,), model.cfg, 2, 8, 16, pool)


def slow_shard(rank: int, world: int, seconds: float) -> ShardedTinyLM:
    """A builder whose rank 1 hangs (a load that never ends)."""
    if rank == 1:
        time.sleep(seconds)
    return shard_on_the_rank(rank, world)


@pytest.mark.timeout(90)
def test_a_rank_that_hangs_while_building_ends_the_group_within_the_timeout(model, pool):
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^ranks \[(0, )?1\] did not finish setup_worker within 5 s"):
        TPRunner.from_builder(slow_shard, (60,), model.cfg, 2, 8, 16, pool, timeout=5)
    assert not pool.running and time.monotonic() - t0 < 30  # the hung rank was killed, not waited for


@pytest.mark.timeout(60)
def test_builder_arguments_are_refused_before_any_process_starts(model):
    before = set(mp.active_children())
    with pytest.raises(TypeError, match="^build must be a module-level function"):
        TPRunner.from_builder(lambda rank, world: None, (), model.cfg, 2, 8, 16)
    assert_refused(lambda: TPRunner.from_builder(shard_on_the_rank, [], model.cfg, 2, 8, 16), TypeError,
                   "build_args", [], "a tuple")
    assert_refused(lambda: TPRunner.from_builder(shard_on_the_rank, (), "cfg", 2, 8, 16), TypeError, "cfg", "cfg",
                   "TinyLMConfig")
    assert_refused(lambda: TPRunner.from_builder(shard_on_the_rank, (), model.cfg, 3, 8, 16), ValueError, "tp", 3,
                   "a divisor of n_heads=4")
    with pytest.raises(ValueError, match="pool must be a Pool of world 2"):
        TPRunner.from_builder(shard_on_the_rank, (), model.cfg, 2, 8, 16, Pool(4))
    assert_refused(lambda: built_tp_engine(shard_on_the_rank, (), model.cfg, 1), ValueError, "tp", 1, "> 1")
    assert set(mp.active_children()) == before


@pytest.mark.timeout(150)
def test_the_service_with_tp_2_answers_as_with_tp_1(tok):
    """`python -m labkit.serving --tp 2` and `--tp 1` as subprocesses on free ports: the same greedy completions
    (a short and a long prompt, plain and streamed) through the openai client; both stop with exit code 0."""
    prompts = [make_tasks(TASK_KINDS[0], 1)[0].prompt, make_tasks("recall", 1)[0].prompt]
    texts = {}
    for tp in (1, 2):
        with start_service(args=["--tp", str(tp), "--max-num-seqs", "4"], timeout=90) as service:
            client = openai.OpenAI(base_url=service.url, api_key="any", max_retries=0, timeout=30)
            name = client.models.list().data[0].id
            texts[tp] = [client.completions.create(model=name, prompt=p, max_tokens=24, temperature=0).choices[0].text
                         for p in prompts]
            stream = client.completions.create(model=name, prompt=prompts[1], max_tokens=24, temperature=0, stream=True)
            texts[tp].append("".join(c.choices[0].text for c in stream if c.choices))
        assert service.returncode == 0
    assert all(texts[1]) and texts[2] == texts[1] and texts[1][2] == texts[1][1]


@pytest.mark.timeout(120)
def test_the_modules_example_an_engine_over_a_runner_it_did_not_size(model, some, reference, pool):
    """labkit.serving.tp's docstring example (a TPRunner of 256 blocks, then Engine(runner=runner)) runs: the
    engine takes the runner's pool instead of sizing its own (which would end in RankError, an IndexError on the
    ranks). Also a runner far smaller than the engine's default, which forces preemption."""
    for num_blocks in (256, 16):
        runner = TPRunner(model, tp=2, num_blocks=num_blocks, block_size=16, pool=pool)
        try:
            engine = Engine(runner=runner)
            assert engine.block_manager.num_blocks == num_blocks
            assert engine.generate(some, GREEDY) == reference
        finally:
            runner.close()
