"""The scheduler under random traces: requests and blocks are conserved, every request finishes, the policies
keep their rules, preemption takes the latest arrival, priorities and the starvation bound hold.

A small random TinyLM keeps these fast; the outputs of the committed one are checked in test_engine.py."""
from collections import Counter, namedtuple

import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.kv_cache import LargerThanPoolError
from labkit.serving import Engine, SamplingParams, StepCost
from labkit.serving.config import EngineConfig
from labkit.serving.scheduler import Scheduler
from labkit.serving.sequence import Status
from labkit.serving.mm import MultiModalInput
from labkit.kv_cache import BlockManager
from labkit.tinylm import TinyLM, TinyLMConfig, generate
from tests.refusals import assert_refused

Req = namedtuple("Req", "request_id arrival prompt max_tokens priority")
CFG = TinyLMConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=96)


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    return TinyLM(CFG).eval()


def check_invariants(engine: Engine, added: set[str]) -> None:
    bm, sch = engine.block_manager, engine.scheduler
    assert bm.num_free_blocks + bm.num_cached_blocks + bm.num_used_blocks == bm.num_blocks
    refs = Counter(b for s in bm.seq_ids for b in bm.block_table(s))
    assert all(bm.ref_count(b) == refs.get(b, 0) for b in range(bm.num_blocks))
    queues = [[s.request_id for s in q] for q in (sch.waiting, sch.running, sch.swapped)]
    finished = [r for r, s in engine.requests.items() if s.finished]
    everyone = [r for q in queues for r in q] + finished
    assert sorted(everyone) == sorted(added)  # each request in exactly one place: none lost, none doubled
    assert set(bm.seq_ids) == set(queues[1])  # only running requests hold blocks
    assert len(sch.running) <= sch.max_num_seqs
    assert all(s.status is Status.WAITING for s in sch.waiting) and all(s.status is Status.SWAPPED for s in sch.swapped)


def replay(engine, trace):
    added: set[str] = set()

    def progress(e):
        added.update(e.requests)
        check_invariants(e, added)
        policy = e.scheduler.policy  # static ignores the budget; a whole prompt above it runs alone
        if policy == "chunked" or (policy == "continuous" and len(e.history[-1]["batch"]) > 1):
            assert e.history[-1]["tokens"] <= e.scheduler.max_num_batched_tokens
    return engine.run(trace, progress=progress)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 20), st.integers(0, 30), st.integers(0, 2)),
                min_size=1, max_size=10),
       st.sampled_from(["static", "continuous", "chunked"]), st.sampled_from(["recompute", "swap"]),
       st.integers(0, 12), st.integers(1, 5), st.booleans())
def test_random_traces_conserve_requests_and_blocks(small, reqs, policy, preemption, extra_blocks, seqs, caching):
    prefixes = [[(5 * j + 1) % 64 for j in range(40)], [(3 * j + 2) % 64 for j in range(40)]]
    trace = [Req(f"r{i}", float(a), (prefixes[i % 2][:p // 2] + [(7 * i + j) % 64 for j in range(p)])[:p], m, pr)
             for i, (p, m, a, pr) in enumerate(reqs)]  # half of each prompt shared with other requests
    need = max(-(-(len(r.prompt) + r.max_tokens) // 4) for r in trace)  # the largest request's blocks
    engine = Engine(small, num_blocks=need + extra_blocks, block_size=4, policy=policy, preemption=preemption,
                    max_num_seqs=seqs, max_num_batched_tokens=max(seqs, 16), enable_prefix_caching=caching,
                    clock=StepCost(1.0, 0.0, 0.0))
    done = replay(engine, trace)
    assert all(s.finish_reason == "length" and s.num_output_tokens == s.params.max_tokens for s in done)
    assert [s.output for s in done] == [generate(small, r.prompt, r.max_tokens) for r in trace]
    assert engine.block_manager.num_used_blocks == 0 and engine.runner.host == {}
    assert all(len(s.token_times) == s.num_output_tokens and s.token_times == sorted(s.token_times) for s in done)
    assert all(s.token_times[0] >= s.arrival for s in done)


def test_static_batching_admits_only_when_the_batch_is_done(small):
    trace = [Req(f"r{i}", float(i), [1, 2, 3], 5 + 3 * i, 0) for i in range(6)]
    engine = Engine(small, policy="static", max_num_seqs=4, clock=StepCost(1.0, 0.0, 0.0))
    done = engine.run(trace)
    first = done[0].token_times[-1]
    assert all(s.first_scheduled >= first for s in done[1:])  # r1.. arrived while r0 ran: they waited
    batches = [set(r for r, _ in h["batch"]) for h in engine.history]
    for before, after in zip(batches, batches[1:]):
        assert after <= before or not (before & after)  # members only leave, or a whole new batch starts


def test_continuous_batching_admits_at_every_step(small):
    trace = [Req(f"r{i}", float(i), [1, 2, 3], 8, 0) for i in range(4)]
    engine = Engine(small, policy="continuous", clock=StepCost(1.0, 0.0, 0.0))
    done = engine.run(trace)
    assert [s.first_scheduled for s in done] == [0.0, 1.0, 2.0, 3.0]  # each joined the step it arrived
    assert [s.token_times[0] - s.arrival for s in done] == [1.0] * 4


def test_chunked_prefill_splits_a_long_prompt_to_the_budget(small):
    engine = Engine(small, policy="chunked", max_num_seqs=2, max_num_batched_tokens=8, clock=StepCost(1.0, 0, 0))
    engine.add_request(list(range(20)), SamplingParams(max_tokens=2, temperature=0), "long")
    engine.run_until_done()
    assert [h["tokens"] for h in engine.history] == [8, 8, 4, 1]


def test_chunked_prefill_never_stalls_a_decode(small):
    """A higher-priority long prompt arrives while a request decodes: the decode still gets a token every step
    (decodes are scheduled first, the chunks take what is left of the budget)."""
    engine = Engine(small, num_blocks=64, block_size=4, policy="chunked", max_num_seqs=4,
                    max_num_batched_tokens=16, clock=StepCost(1.0, 0, 0))
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=12, temperature=0), "decoder", priority=1)
    for _ in range(3):
        engine.step()
    engine.add_request(list(range(60)), SamplingParams(max_tokens=2, temperature=0), "urgent", priority=0)
    engine.run_until_done()
    times = engine.get("decoder").token_times
    assert [b - a for a, b in zip(times, times[1:])] == [1.0] * 11
    assert all(h["tokens"] <= 16 for h in engine.history)


def test_swap_in_after_another_request_cached_more_of_the_prompt(small):
    """A request swapped out mid-prefill comes back when another one has computed (and cached) more of the same
    prompt: only the blocks the host holds beyond the cache's are copied back (a regression: it crashed)."""
    prompt = [(5 * j + 1) % 64 for j in range(44)]
    engine = Engine(small, num_blocks=18, block_size=4, policy="chunked", preemption="swap", max_num_seqs=2,
                    max_num_batched_tokens=16, clock=StepCost(1.0, 0, 0))
    engine.add_request(prompt, SamplingParams(max_tokens=10, temperature=0), "a")
    engine.add_request(prompt + list(range(16)), SamplingParams(max_tokens=2, temperature=0), "b")
    engine.run_until_done()
    assert engine.stats()["preemptions"] > 0
    assert engine.get("a").output == generate(small, prompt, 10)
    assert engine.get("b").output == generate(small, prompt + list(range(16)), 2)
    assert engine.block_manager.num_used_blocks == 0 and engine.runner.host == {}


def test_preemption_takes_the_latest_arrival_and_everyone_finishes(small):
    for mode in ("recompute", "swap"):
        engine = Engine(small, num_blocks=6, block_size=4, policy="continuous", preemption=mode,
                        clock=StepCost(1.0, 0, 0))
        trace = [Req(f"r{i}", 0.0 + i * 0.1, [5] * 6, 14, 0) for i in range(3)]  # 5 blocks each at the end
        done = engine.run(trace)
        victims = [v for h in engine.history for v in h["preempted"]]
        assert victims and victims[0] == "r2", (mode, victims)
        assert all(s.num_output_tokens == 14 for s in done) and engine.block_manager.num_used_blocks == 0
        assert engine.stats()["preemptions"] == len(victims) == sum(s.num_preemptions for s in done)


@pytest.mark.parametrize("num_blocks", [6, 8, 10])
def test_every_victim_comes_after_every_request_that_ran_in_its_step(small, num_blocks):
    """Four requests fill a small pool: whoever reserves, the victims are taken from the END of the order
    (the latest arrivals here), never the most urgent request that waits behind the one reserving. Recompute:
    a step that preempts admits nobody, so every request in its batch was running before it (under swap a
    request swapped in later in the same step may be a later arrival)."""
    engine = Engine(small, num_blocks=num_blocks, block_size=4, policy="continuous", preemption="recompute",
                    clock=StepCost(1.0, 0, 0))
    done = engine.run([Req(f"r{i}", i * 0.1, [5] * 4, 14, 0) for i in range(4)])
    steps = [h for h in engine.history if h["preempted"]]
    assert steps and any(len(h["batch"]) >= 3 for h in steps)  # preemption with several requests running
    arrival = {s.request_id: s.arrival for s in done}
    for h in steps:
        ran = [arrival[r] for r, _ in h["batch"]]
        assert all(arrival[v] > max(ran) for v in h["preempted"]), h
    assert all(s.num_output_tokens == 14 for s in done)


def test_lower_priority_value_runs_first_and_max_wait_bounds_starvation(small):
    def trace():  # one low-priority request at 0, then a high-priority one every step, one running at a time
        return [Req("low", 0.0, [1, 2], 3, 5)] + [Req(f"hi{i}", float(i), [3, 4], 3, 0) for i in range(30)]

    starved = Engine(small, max_num_seqs=1, max_num_batched_tokens=8, clock=StepCost(1.0, 0, 0)).run(trace())
    low = starved[0]
    assert all(s.first_scheduled < low.first_scheduled for s in starved[1:] if s.arrival < low.first_scheduled)
    assert low.first_scheduled >= 30  # waited for every high-priority request
    bounded = Engine(small, max_num_seqs=1, max_num_batched_tokens=8, max_wait=5.0, clock=StepCost(1.0, 0, 0))
    low = bounded.run(trace())[0]
    assert 5.0 <= low.first_scheduled <= 5.0 + 3  # aged at 5 s; waits at most for the one running (3 steps)


def test_scheduler_refusals():
    bm = BlockManager(4, 4)
    assert_refused(lambda: EngineConfig(policy="fifo"), ValueError, "policy", "fifo", "one of")
    assert_refused(lambda: EngineConfig(preemption="drop"), ValueError, "preemption", "drop", "one of")
    assert_refused(lambda: EngineConfig(max_num_seqs=8, max_num_batched_tokens=4), ValueError,
                   "max_num_batched_tokens", 4, ">= max_num_seqs")
    assert_refused(lambda: EngineConfig(max_wait=0), ValueError, "max_wait", 0, "positive")
    config = EngineConfig(max_num_batched_tokens=64)
    assert_refused(lambda: Scheduler("bm", config), TypeError, "block_manager", "bm", "BlockManager")
    assert_refused(lambda: Scheduler(bm, {"policy": "static"}), TypeError, "config", "policy", "an EngineConfig")
    assert_refused(lambda: Scheduler(bm, EngineConfig()), ValueError, "config.max_num_batched_tokens", None, "resolve")
    assert_refused(lambda: Scheduler(bm, config).add("req"), TypeError, "seq", "req", "a labkit.serving.Sequence")


def test_a_request_larger_than_the_pool_is_refused_and_nothing_changes(small):
    engine = Engine(small, num_blocks=4, block_size=4, clock=StepCost())
    engine.add_request([1] * 8, SamplingParams(max_tokens=9, temperature=0), "fits")  # 16 slots: the last token
    with pytest.raises(LargerThanPoolError, match="request 'big': prompt 8 \\+ max_tokens 10 tokens need 17 KV slots"
                                                  " = 5 blocks of 4, the whole KV pool has 4"):
        engine.add_request([1] * 8, SamplingParams(max_tokens=10, temperature=0), "big")
    assert list(engine.requests) == ["fits"] and len(engine.scheduler.waiting) == 1
    engine.run_until_done()
    assert engine.get("fits").num_output_tokens == 9  # it filled all 4 blocks and finished


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(1, 10), st.integers(0, 2), st.integers(1, 8)),
                min_size=1, max_size=6),
       st.sampled_from(["static", "continuous", "chunked"]), st.sampled_from(["recompute", "swap"]),
       st.integers(0, 6), st.booleans())
def test_random_traces_with_images_conserve_requests_and_answer_from_their_own_images(small, reqs, policy,
                                                                                      preemption, extra, caching):
    """Prompts of text, then an image (one of three, over the same placeholder token 63), then text: conserved
    requests and blocks at every step, and each output is its own full forward with its image (test_mm)."""
    from tests.serving.test_mm import reference
    feats = [torch.randn(6, CFG.d_model, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    prompts = [([1 + i % 3] * pre + [63] * 6 + [9, 8, 7][:post % 3 + 1],
                (MultiModalInput(pre, 6, f"img{k}", feats[k]),)) for i, (pre, post, k, _) in enumerate(reqs)]
    need = max(-(-(len(p) + m) // 4) for (p, _), (*_, m) in zip(prompts, reqs))
    engine = Engine(small, num_blocks=need + extra, block_size=4, policy=policy, preemption=preemption,
                    max_num_seqs=3, max_num_batched_tokens=5 if policy == "chunked" else None,
                    enable_prefix_caching=caching, clock=StepCost())
    ids = [engine.add_request(p, SamplingParams(max_tokens=m, temperature=0), mm=mm)
           for (p, mm), (*_, m) in zip(prompts, reqs)]
    while engine.has_unfinished():
        engine.step()
        check_invariants(engine, set(ids))
    want = [reference(small, p, mm, m) for (p, mm), (*_, m) in zip(prompts, reqs)]
    assert [engine.get(i).output for i in ids] == want
    assert engine.block_manager.num_used_blocks == 0 and engine.runner.host == {}
