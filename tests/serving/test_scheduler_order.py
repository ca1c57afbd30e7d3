"""The queue orders inside a priority (fcfs, shortest_prompt, shortest_job) and the starvation bound under them:
the engine admits requests as a brute-force single-server replay that picks the least key by hand; no later
arrival overtakes an aged request; an aged request waits at most max_wait + one job + the jobs that arrived no
later than it, where a length order without the bound starves it."""
from collections import namedtuple

import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.serving import Engine, StepCost
from labkit.serving.config import QUEUE_ORDERS, EngineConfig
from labkit.tinylm import TinyLM, TinyLMConfig
from tests.refusals import assert_refused

Req = namedtuple("Req", "request_id arrival prompt max_tokens priority")
CFG = TinyLMConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=96)
STEP = StepCost(1.0, 0.0, 0.0)  # every step 1 s: a request of max_tokens m holds its slot for exactly m steps


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    return TinyLM(CFG).eval()


def one_slot(small, order, max_wait=None, policy="continuous"):
    return Engine(small, max_num_seqs=1, max_num_batched_tokens=64, num_blocks=64, block_size=4, policy=policy,
                  order=order, max_wait=max_wait, enable_prefix_caching=False, clock=STEP)


def brute_force_starts(trace, order, max_wait=None) -> dict[str, float]:
    """Start times of a single server that runs one request at a time for max_tokens steps and, whenever it is
    free, starts the arrived request with the least key, found by comparing every candidate's key."""
    def key(r, now):
        if max_wait is not None and now - r.arrival >= max_wait:
            return (float("-inf"), 0, r.arrival, r.request_id)
        length = {"fcfs": 0, "shortest_prompt": len(r.prompt), "shortest_job": r.max_tokens}[order]
        return (r.priority, length, r.arrival, r.request_id)

    now, todo, starts = 0.0, list(trace), {}
    while todo:
        here = [r for r in todo if r.arrival <= now]
        if not here:
            now = min(r.arrival for r in todo)
            continue
        best = here[0]
        for r in here[1:]:
            if key(r, now) < key(best, now):
                best = r
        starts[best.request_id] = now
        todo.remove(best)
        now += best.max_tokens
    return starts


requests = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 24), st.integers(1, 8), st.integers(0, 1)),
                    min_size=1, max_size=9)


@settings(max_examples=40, deadline=None)
@given(requests, st.sampled_from(QUEUE_ORDERS), st.one_of(st.none(), st.integers(1, 12)))
def test_one_slot_starts_requests_as_a_brute_force_choice_does(small, reqs, order, max_wait):
    trace = [Req(f"r{i}", float(a), [1 + (i + j) % 60 for j in range(p)], m, pr)
             for i, (a, p, m, pr) in enumerate(reqs)]
    done = one_slot(small, order, max_wait).run(trace)
    assert {s.request_id: s.first_scheduled for s in done} == brute_force_starts(trace, order, max_wait)


@settings(max_examples=30, deadline=None)
@given(requests, st.sampled_from(QUEUE_ORDERS), st.integers(1, 12), st.sampled_from(["static", "continuous",
                                                                                       "chunked"]),
       st.integers(1, 3), st.sampled_from(["recompute", "swap"]))
def test_no_later_arrival_is_admitted_before_an_aged_request(small, reqs, order, max_wait, policy, seqs, preemption):
    """Any batching policy, any number of slots, a pool small enough to preempt: once a request has waited
    max_wait, no request that arrived after it starts first."""
    trace = [Req(f"r{i}", float(a), [1 + (i + j) % 60 for j in range(p)], m, pr)
             for i, (a, p, m, pr) in enumerate(reqs)]
    need = max(-(-(len(r.prompt) + r.max_tokens) // 4) for r in trace)
    engine = Engine(small, max_num_seqs=seqs, max_num_batched_tokens=16, num_blocks=need + 2, block_size=4,
                    policy=policy, preemption=preemption, order=order, max_wait=float(max_wait), clock=STEP)
    done = engine.run(trace)
    for r in done:
        for s in done:
            if s.arrival > r.arrival and s.first_scheduled < r.first_scheduled:
                assert s.first_scheduled - r.arrival < max_wait, (r.request_id, s.request_id)


@settings(max_examples=30, deadline=None)
@given(requests, st.sampled_from(QUEUE_ORDERS), st.integers(1, 12))
def test_an_aged_request_waits_at_most_max_wait_one_job_and_the_jobs_ahead_of_it(small, reqs, order, max_wait):
    """Ahead of it: the requests that arrived no later (ties go by request id)."""
    trace = [Req(f"r{i}", float(a), [1 + (i + j) % 60 for j in range(p)], m, pr)
             for i, (a, p, m, pr) in enumerate(reqs)]
    done = one_slot(small, order, max_wait).run(trace)
    longest = max(r.max_tokens for r in trace)
    for s in done:
        earlier = sum(r.max_tokens for r in trace if r.arrival <= s.arrival and r.request_id != s.request_id)
        assert s.first_scheduled - s.arrival <= max_wait + longest + earlier


def starvation_trace():
    """A long request at 0 behind one running request, then a short one every 2 s for 60 s: two slots' worth of
    short work arrives per slot, so a length order always has a shorter request to run."""
    return ([Req("first", 0.0, [1, 2], 2, 0), Req("long", 0.0, [1] * 20, 20, 0)]
            + [Req(f"s{i}", 1.0 + 2 * i, [3, 4], 2, 0) for i in range(30)])


@pytest.mark.parametrize("order", ["shortest_prompt", "shortest_job"])
def test_a_length_order_starves_a_long_request_and_max_wait_bounds_it(small, order):
    trace = starvation_trace()
    long = {r.request_id: r for r in trace}["long"]
    bound = 10 + 20 + 2  # max_wait + the longest job + the one request that arrived with it
    starved = one_slot(small, order).run(trace)[1]
    assert starved.first_scheduled - long.arrival > bound  # waited out the whole stream of short requests
    fcfs = one_slot(small, "fcfs").run(trace)[1]
    assert fcfs.first_scheduled == 2.0  # right after the request ahead of it
    bounded = one_slot(small, order, max_wait=10.0).run(trace)[1]
    assert 10.0 <= bounded.first_scheduled - long.arrival <= bound


def test_shortest_job_preempts_the_longest_remaining_job_first(small):
    """Out of blocks, the victim is the LAST in the order: under shortest_job, the request with the most
    output still to come (under fcfs it would be the latest arrival)."""
    trace = [Req("long", 0.0, [5] * 4, 16, 0), Req("short", 0.1, [6] * 4, 10, 0)]
    victims = {}
    for order in ("fcfs", "shortest_job"):
        engine = Engine(small, num_blocks=5, block_size=4, order=order, enable_prefix_caching=False, clock=STEP)
        engine.run(trace)
        victims[order] = [v for h in engine.history for v in h["preempted"]]
    assert victims["fcfs"][0] == "short" and victims["shortest_job"][0] == "long"


def test_an_unknown_order_is_refused():
    assert_refused(lambda: EngineConfig(order="longest_first"), ValueError, "order", "longest_first", "one of")


def test_shortest_job_ranks_by_the_tokens_a_request_still_has_to_produce():
    """A request of max_tokens 16 that has produced 14 (2 to go) ranks before a fresh one of max_tokens 5; by
    max_tokens alone it would rank after. shortest_prompt ranks by the prompt, fcfs by nothing."""
    from labkit.kv_cache import BlockManager
    from labkit.serving import SamplingParams
    from labkit.serving.scheduler import Scheduler
    from labkit.serving.sequence import Sequence

    nearly_done = Sequence("nearly", [1] * 9, SamplingParams(max_tokens=16), arrival=1.0)
    nearly_done.output = [7] * 14
    fresh = Sequence("fresh", [1] * 3, SamplingParams(max_tokens=5), arrival=0.0)
    keys = {}
    for order in QUEUE_ORDERS:
        sched = Scheduler(BlockManager(16, 4), EngineConfig(order=order, max_num_batched_tokens=64))
        assert [sched.length(s) for s in (nearly_done, fresh)] == {"fcfs": [0, 0], "shortest_prompt": [9, 3],
                                                                   "shortest_job": [2, 5]}[order]
        keys[order] = sorted((nearly_done, fresh), key=lambda s: sched.order(s, now=2.0))[0].request_id
    assert keys == {"fcfs": "fresh", "shortest_prompt": "fresh", "shortest_job": "nearly"}
