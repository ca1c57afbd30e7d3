"""The engine on the committed TinyLM: every request's output under batching equals running it alone
(labkit.tinylm.generate, the contiguous cache: an independent path), whatever the policy, preemption or
arrival order; seeded sampling is batch-independent; aborts free blocks; bad requests change nothing."""
from collections import namedtuple

import pytest
import torch

from labkit.kv_cache import LargerThanPoolError
from labkit.serving import Engine, EngineConfig, ModelRunner, SamplingParams, StepCost
from labkit.serving.sequence import Status
from labkit.tinylm import generate
from tests.refusals import assert_refused

Req = namedtuple("Req", "request_id arrival prompt max_tokens priority")
GREEDY = SamplingParams(max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def alone(model, prompts):
    return [generate(model, p, GREEDY.max_tokens) for p in prompts]


@pytest.mark.parametrize("policy, preemption, num_blocks", [
    ("static", "recompute", None), ("continuous", "recompute", None), ("chunked", "recompute", None),
    ("continuous", "recompute", 16), ("continuous", "swap", 16), ("chunked", "swap", 16), ("static", "swap", 16)])
def test_batched_outputs_equal_each_request_alone(model, prompts, alone, policy, preemption, num_blocks):
    trace = [Req(f"r{i}", 0.5 * (i % 7), p, GREEDY.max_tokens, i % 3) for i, p in enumerate(prompts)]
    engine = Engine(model, policy=policy, preemption=preemption, num_blocks=num_blocks,
                    max_num_batched_tokens=48 if policy == "chunked" else None, clock=StepCost())
    done = engine.run(trace)
    assert [s.output for s in done] == alone
    assert engine.block_manager.num_used_blocks == 0 and engine.runner.host == {}
    if num_blocks:
        assert engine.stats()["preemptions"] > 0  # the small pool did force preemption


def test_batched_logits_match_alone_within_float32_tolerance(model, prompts):
    """The logits of a request's last prompt token, in a packed step with 17 others, against the lone forward.
    Not bit for bit: the packed matmuls reduce in another order (COURSE.md)."""
    engine = Engine(model, clock=StepCost())
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=1, temperature=0))
    sched = engine.scheduler.schedule(engine.now)
    logits = engine.runner.execute(engine._step_input(sched))
    with torch.no_grad():
        ref = torch.stack([model(torch.tensor([s.seq.tokens]))[0, -1] for s in sched.scheduled])
    diff = (logits - ref).abs().max().item()
    assert diff < 1e-4, diff
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))


def test_seeded_sampling_gives_the_same_tokens_alone_and_batched(model, prompts):
    params = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, seed=11)
    one = Engine(model, clock=StepCost()).generate([prompts[3]], params)[0]
    many = Engine(model, clock=StepCost()).generate(prompts[:8], [SamplingParams(max_tokens=10)] * 3 + [params]
                                                     + [SamplingParams(max_tokens=10)] * 4)
    assert many[3] == one and len(one) == 10


def test_stop_tokens_and_lengths_finish_requests(model, prompts, alone):
    stop = alone[0][2]
    engine = Engine(model, clock=StepCost())
    a = engine.add_request(prompts[0], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(stop,)))
    b = engine.add_request(prompts[1], SamplingParams(max_tokens=3, temperature=0))
    engine.run_until_done()
    assert engine.get(a).output == alone[0][:alone[0].index(stop) + 1] and engine.get(a).finish_reason == "stop"
    assert engine.get(b).output == alone[1][:3] and engine.get(b).finish_reason == "length"


def test_abort_frees_blocks_in_every_state(model, prompts):
    engine = Engine(model, num_blocks=16, preemption="swap", max_num_seqs=4, clock=StepCost())
    ids = [engine.add_request(p, SamplingParams(max_tokens=30, temperature=0)) for p in prompts[6:12]]
    while not engine.scheduler.swapped:
        engine.step()
    states = {engine.get(i).status for i in ids}
    assert {Status.RUNNING, Status.SWAPPED, Status.WAITING} <= states
    for i in ids:
        assert engine.abort(i) and engine.get(i).finish_reason == "abort"
    assert not engine.abort(ids[0]) and not engine.abort("nobody")
    assert engine.has_unfinished()  # one more step carries the dropped host copies to the runner
    engine.run_until_done()
    assert engine.block_manager.num_used_blocks == 0 and engine.runner.host == {} and not engine.has_unfinished()
    assert engine.generate([prompts[0]], GREEDY)[0] == generate(model, prompts[0], 12)  # still serves


def test_warmup_and_stats(model):
    engine = Engine(model, clock=StepCost())
    engine.warmup()
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0 and stats["running"] == 0
    assert set(stats) >= {"running", "waiting", "swapped", "kv_usage", "prefix_cache_queries", "prefix_cache_hits",
                          "preemptions", "steps", "generated_tokens"}


def test_prefix_cache_hits_count_tokens(model, prompts):
    engine = Engine(model, block_size=16, clock=StepCost())
    long = prompts[6]
    engine.generate([long], GREEDY)
    engine.generate([long], GREEDY)
    assert engine.stats()["prefix_cache_hits"] == (len(long) - 1) // 16 * 16


def test_clocks(model, prompts):
    cost = StepCost(0.01, 0.001, 0.0)
    engine = Engine(model, clock=cost)
    engine.generate([prompts[0]], SamplingParams(max_tokens=3, temperature=0))
    seq = engine.get("req-0")
    assert seq.token_times == pytest.approx([0.01 + 0.001 * len(prompts[0]), 0.021 + 0.001 * len(prompts[0]),
                                             0.032 + 0.001 * len(prompts[0])])
    wall = Engine(model)
    assert_refused(lambda: wall.run([]), ValueError, "clock", "wall", "an offline clock")
    assert_refused(lambda: wall.advance_to(1.0), ValueError, "clock", "wall", "an offline clock")
    measured = Engine(model, clock="measured")
    measured.advance_to(5.0)
    measured.generate([prompts[0]], SamplingParams(max_tokens=2, temperature=0))
    assert 5.0 < measured.get("req-0").token_times[0] < measured.get("req-0").token_times[1]


def test_bad_requests_are_refused_and_change_nothing(model, prompts):
    engine = Engine(model, num_blocks=8, clock=StepCost())
    ctx = model.cfg.max_seq_len
    assert_refused(lambda: engine.add_request([]), ValueError, "prompt", [], "at least one token")
    assert_refused(lambda: engine.add_request("hi"), TypeError, "prompt", "hi", "a list of token ids")
    assert_refused(lambda: engine.add_request([1, 300]), ValueError, "prompt", 300, "the model's vocabulary")
    assert_refused(lambda: engine.add_request([1] * 250, SamplingParams(max_tokens=10)), ValueError, "max_tokens",
                   10, f"<= {ctx - 250}")
    assert_refused(lambda: engine.add_request([1], "greedy"), TypeError, "params", "greedy", "SamplingParams")
    assert_refused(lambda: engine.add_request([1], priority=0.5), TypeError, "priority", 0.5, "an int")
    with pytest.raises(LargerThanPoolError, match="the whole KV pool has 8"):
        engine.add_request([1] * 100, SamplingParams(max_tokens=100))
    engine.add_request([1], request_id="x")
    assert_refused(lambda: engine.add_request([2], request_id="x"), ValueError, "request_id", "x", "a new request id")
    assert list(engine.requests) == ["x"] and len(engine.scheduler.waiting) == 1
    assert_refused(lambda: engine.get("y"), ValueError, "request_id", "y", "a request this engine was given")
    assert_refused(lambda: Engine(), TypeError, "model", None, "exactly one of the two")
    assert_refused(lambda: Engine(model, clock="fast"), ValueError, "clock", "fast", '"wall", "measured"')
    engine.run_until_done()
    assert engine.get("x").num_output_tokens == 16


def test_release_forgets_finished_requests_and_history_is_bounded(model, prompts):
    engine = Engine(model, clock=StepCost(), history_limit=3)
    rid = engine.add_request(prompts[0], SamplingParams(max_tokens=5, temperature=0))
    assert_refused(lambda: engine.release(rid), ValueError, "request_id", rid, "a finished request")
    engine.run_until_done()
    assert engine.release(rid).num_output_tokens == 5 and rid not in engine.requests
    assert len(engine.history) == 3 and engine.steps == 5 and engine.stats()["requests"] == 1
    assert_refused(lambda: Engine(model, history_limit=0), ValueError, "history_limit", 0, "a positive int")


def test_a_prompt_as_long_as_the_context_is_refused_naming_the_prompt(model):
    ctx = model.cfg.max_seq_len
    assert_refused(lambda: Engine(model).add_request([1] * ctx), ValueError, "prompt", f"{ctx} tokens",
                   f"at most {ctx - 1} tokens")


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_identical_prompts_together_share_blocks_and_equal_alone(model, prompts, policy):
    long = prompts[6]  # a recall prompt: several full blocks
    engine = Engine(model, policy=policy, max_num_batched_tokens=64 if policy == "chunked" else None, clock=StepCost())
    outs = engine.generate([long] * 4 + [long[:40]], GREEDY)
    assert outs == [generate(model, long, 12)] * 4 + [generate(model, long[:40], 12)]
    # static batching allocates the whole batch in one step: blocks enter the prefix cache only once computed
    assert (engine.stats()["prefix_cache_hits"] > 0) == (policy != "static")
    assert engine.block_manager.num_used_blocks == 0


def test_generated_ids_never_take_a_callers_id(model):
    engine = Engine(model, clock=StepCost())
    engine.add_request([1, 2], request_id="req-1")
    assert [engine.add_request([1, 2]) for _ in range(2)] == ["req-0", "req-2"]


def test_a_bad_trace_is_refused_before_anything_runs(model, prompts):
    engine = Engine(model, clock=StepCost())
    trace = [Req("a", 0.0, prompts[0], 2, 0), Req("b", 5.0, prompts[1], 2, 0), Req("a", 6.0, prompts[2], 2, 0)]
    assert_refused(lambda: engine.run(trace), ValueError, "trace", "request id 'a' twice (or already in this engine)",
                   "distinct new request ids")
    assert_refused(lambda: engine.run([1, 2]), TypeError, "trace[0]", 1, "a request with request_id")
    assert engine.requests == {} and engine.now == 0.0
    with pytest.raises(TypeError, match="model must be a TinyLM"):
        Engine("x")
    with pytest.raises(TypeError, match="runner must be a model runner"):
        Engine(runner=object())
    assert_refused(lambda: engine.run([], progress="print"), TypeError, "progress", "print", "a function")
    assert_refused(lambda: engine.replay(trace), ValueError, "trace",  # on the call, not at the first step
                   "request id 'a' twice (or already in this engine)", "distinct new request ids")
    assert_refused(lambda: StepCost(overhead=-1.0), ValueError, "overhead", -1.0, "a non-negative finite number")
    assert_refused(lambda: StepCost(per_token=float("nan")), ValueError, "per_token", float("nan"), "non-negative")


def test_replays_stepped_in_turns_give_what_each_gives_alone(model, prompts, alone):
    """Engine.replay, one step per next(), as benchmarks/serving_batching.py drives two policies in turns on one
    thread: each engine's outputs and step count are those of its own run()."""
    trace = [Req(f"r{i}", 0.3 * i, p, GREEDY.max_tokens, 0) for i, p in enumerate(prompts)]
    engines = {p: Engine(model, policy=p, max_num_seqs=4, clock=StepCost()) for p in ("static", "continuous")}
    steps = {p: e.replay(trace) for p, e in engines.items()}
    turns = []
    while steps:
        p = min(steps, key=lambda p: engines[p].steps)  # the one behind goes next
        if next(steps[p], None) is None:
            del steps[p]
        else:
            turns.append(p)
    assert turns[:4] == ["static", "continuous"] * 2
    for p, engine in engines.items():
        single = Engine(model, policy=p, max_num_seqs=4, clock=StepCost())
        assert [s.output for s in single.run(trace)] == [engine.requests[r.request_id].output for r in trace] == alone
        assert single.steps == engine.steps and single.now == engine.now


def test_generate_is_all_or_nothing(model, prompts):
    engine = Engine(model, clock=StepCost())
    with pytest.raises(ValueError, match="prompt must be token ids in"):
        engine.generate([prompts[0], [1, 999]], GREEDY)
    assert engine.requests == {} and not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0
    assert engine.generate([prompts[0]], GREEDY) == [generate(model, prompts[0], 12)]


def test_the_naive_image_cache_is_a_flag_of_the_engine(model):
    assert Engine(model, clock=StepCost()).block_manager.hash_mm
    assert not Engine(model, clock=StepCost(), hash_mm=False).block_manager.hash_mm
    assert_refused(lambda: Engine(model, hash_mm="no"), TypeError, "hash_mm", "no", "True or False")


@pytest.mark.parametrize("num_blocks, block_size", [(64, 8), (64, 32), (1024, 8), (8, 16)])
def test_an_engine_over_a_runner_uses_the_runners_pool(model, prompts, num_blocks, block_size):
    """The engine builds its block manager from the runner's pool, not its own defaults (512 blocks of 16), which
    would give wrong outputs or an IndexError past the pool."""
    engine = Engine(runner=ModelRunner(model, num_blocks, block_size), clock=StepCost())
    assert (engine.block_manager.num_blocks, engine.block_manager.block_size) == (num_blocks, block_size)
    assert (engine.config.num_blocks, engine.config.block_size) == (num_blocks, block_size)
    some = prompts[:6]
    long = SamplingParams(max_tokens=30, temperature=0)
    assert engine.generate(some, long) == [generate(model, p, 30) for p in some]
    assert engine.block_manager.num_used_blocks == 0


def test_a_config_that_disagrees_with_the_runners_pool_is_refused(model):
    runner = ModelRunner(model, 64, 8)
    assert_refused(lambda: Engine(runner=runner, num_blocks=512), ValueError, "num_blocks", 512,
                   "the runner's pool (64 blocks of 8 tokens)")
    assert_refused(lambda: Engine(runner=runner, config=EngineConfig(block_size=16)), ValueError, "block_size", 16,
                   "the runner's pool (64 blocks of 8 tokens)")
    assert Engine(runner=runner, num_blocks=64, block_size=8).block_manager.num_blocks == 64


class BrokenRunner(ModelRunner):
    """A ModelRunner whose forward raises on the steps listed in `fail_on` (1-based)."""

    def __init__(self, model, num_blocks, block_size, fail_on):
        super().__init__(model, num_blocks, block_size)
        self.fail_on, self.calls = set(fail_on), 0

    def execute(self, step):
        self.calls += 1
        if self.calls in self.fail_on:
            raise IndexError("index_copy_(): index 128 is out of bounds")
        return super().execute(step)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_a_runner_failure_ends_that_steps_requests_and_the_engine_goes_on(model, prompts, preemption):
    """After a runner's IndexError the step's requests end with "error", their blocks are freed and the engine
    keeps working, rather than later steps raising again (also with swapped requests: a small pool forces
    preemption)."""
    engine = Engine(runner=BrokenRunner(model, 12, 16, fail_on={6}), preemption=preemption, clock=StepCost())
    ids = [engine.add_request(p, GREEDY) for p in prompts[:6]]
    with pytest.raises(IndexError):
        engine.run_until_done()
    failed = [engine.get(i) for i in ids if engine.get(i).finish_reason == "error"]
    assert failed and all("IndexError" in s.error for s in failed)
    engine.run_until_done()  # the others go on
    assert all(engine.get(i).finished for i in ids)
    for i, p in zip(ids, prompts[:6]):
        if engine.get(i).finish_reason != "error":
            assert engine.get(i).output == generate(model, p, GREEDY.max_tokens)
    assert engine.block_manager.num_used_blocks == 0 and engine.runner.host == {}
    assert engine.generate([prompts[0]], GREEDY) == [generate(model, prompts[0], GREEDY.max_tokens)]


def test_generate_takes_its_requests_out_when_a_step_fails(model, prompts):
    engine = Engine(runner=BrokenRunner(model, 64, 16, fail_on={2}), clock=StepCost())
    with pytest.raises(IndexError):
        engine.generate(prompts[:6], GREEDY)
    assert engine.requests == {} and not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0
    assert engine.generate(prompts[:2], GREEDY) == [generate(model, p, GREEDY.max_tokens) for p in prompts[:2]]
