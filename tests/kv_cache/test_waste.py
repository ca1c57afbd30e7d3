"""Waste: utilization against a step-by-step brute force, the traces' stated properties, the ordering of the
schemes, and the block-size sweep against a BlockManager run."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from labkit.kv_cache import BlockManager, waste
from tests.refusals import assert_refused


def brute_force(trace, scheme, context, bs):
    held = reserved = 0
    for r in trace:
        final = r.prompt + r.output
        for t in range(1, r.output + 1):
            held += r.prompt + t
            reserved += {"max": context, "pow2": 2 ** int(np.ceil(np.log2(final))), "oracle": final,
                         "paged": -(-(r.prompt + t) // bs) * bs}[scheme]
    return held / reserved


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=8),
       scheme=st.sampled_from(waste.SCHEMES), log_bs=st.integers(0, 5))
def test_utilization_equals_a_step_by_step_count(lengths, scheme, log_bs):
    trace = [waste.Request(p, o) for p, o in lengths]
    assert waste.utilization(trace, scheme, 128, 2**log_bs) == pytest.approx(brute_force(trace, scheme, 128, 2**log_bs))


def test_paged_slots_are_what_a_block_manager_holds():
    r = waste.Request(5, 20)
    bm = BlockManager(64, 4)
    bm.allocate(0, [1] * r.prompt)
    held = []
    for _ in range(r.output):
        bm.append(0, 1)
        held.append(len(bm.block_table(0)) * 4)
    assert held == waste.reserved_slots(r, "paged", 256, 4).tolist()


@pytest.mark.parametrize("kind", list(waste.TRACES))
def test_traces_fit_their_context_and_order_the_schemes(kind):
    trace = waste.request_trace(kind, 300)
    assert len(trace) == 300 and all(1 <= r.prompt and 1 <= r.output and r.total <= waste.TRACES[kind] for r in trace)
    u = [row["utilization"] for row in waste.waste_table(trace, waste.TRACES[kind])]
    assert u == sorted(u) and u[-1] > 0.9
    assert waste.request_trace(kind, 300) == trace  # fixed seed


def test_block_size_sweep_trades_fragmentation_for_table_size():
    rows = waste.block_size_sweep(waste.request_trace("tinylm", 200))
    util = [r["utilization"] for r in rows]
    entries = [r["table entries/seq"] for r in rows]
    assert util[0] == 1.0 and util == sorted(util, reverse=True) and entries == sorted(entries, reverse=True)
    assert all(r["empty slots/seq"] < r["block_size"] for r in rows)


def test_bad_input_is_refused():
    assert_refused(lambda: waste.request_trace("alpaca"), ValueError, "kind", "alpaca", "one of")
    assert_refused(lambda: waste.utilization([waste.Request(1, 1)], "paged", 8, 3), ValueError, "block_size", 3,
                   "a positive power of two")
    assert_refused(lambda: waste.utilization([waste.Request(5, 5)], "max", 8), ValueError, "trace",
                   "a request of 10 tokens", "at most context=8")
    assert_refused(lambda: waste.waste_table([], 256), ValueError, "trace", [], "a non-empty list of Requests")
    assert_refused(lambda: waste.block_size_sweep([]), ValueError, "trace", [], "a non-empty list of Requests")
    assert_refused(lambda: waste.block_size_sweep([(1, 2)]), TypeError, "trace", [(1, 2)], "a list of Requests")
    assert_refused(lambda: waste.block_size_sweep([waste.Request(1, 1)], ()), ValueError, "sizes", (),
                   "a non-empty list of block sizes")
    assert_refused(lambda: waste.Request(-5, 3), ValueError, "prompt", -5, "a positive int")
    assert_refused(lambda: waste.Request(5, 0), ValueError, "output", 0, "a positive int")
    assert_refused(lambda: waste.Request(5, 2.5), TypeError, "output", 2.5, "a positive int")
