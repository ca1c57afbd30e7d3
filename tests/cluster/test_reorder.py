"""labkit.cluster.reorder: the peak of an order agrees with the liveness planner run on the reordered graph;
the orders it accepts are exactly the topological ones (every permutation of small random graphs checked by
hand); the memory-aware order is never worse than program order, and no order of a small graph beats the
brute-force minimum over all of them; the reordered decode graph gives the same logits."""
import itertools

import pytest
import torch
from hypothesis import given, settings, strategies as st

from labkit.cluster.buffers import Buffer, liveness, peak_live
from labkit.cluster.graph import capture_decode, op_kind as graph_kind
from labkit.cluster import reorder
from labkit.cluster.reorder import Usage, check_order, memory_aware_order, peak_floor, peak_of, reordered, usage
from labkit.tinylm import load_pretrained

from ..refusals import assert_refused

aten = torch.ops.aten


def random_graph(spec) -> tuple[torch.fx.GraphModule, tuple]:
    """A graph over x [4]: each step grows a value (repeat k times), shrinks one (sum to [1]), views one, or adds
    the sum of one value to another; the values nobody reads are the outputs."""
    g = torch.fx.Graph()
    values = [g.placeholder("x")]
    for kind, a, b, k in spec:
        p = values[a % len(values)]
        if kind == 0:
            n = g.call_function(aten.repeat.default, (p, [k]))
        elif kind == 1:
            n = g.call_function(aten.sum.dim_IntList, (p, [0], True))
        elif kind == 2:
            n = g.call_function(aten.view.default, (p, [-1]))
        else:
            s = g.call_function(aten.sum.default, (values[b % len(values)],))
            n = g.call_function(aten.add.Tensor, (p, s))
        values.append(n)
    g.output(tuple(n for n in values[1:] if not n.users) or (values[-1],))
    return torch.fx.GraphModule(torch.nn.Module(), g), (torch.arange(4.0),)


def topological_orders(gm) -> list[list[str]]:
    """Every permutation of the call_function nodes in which each node comes after the nodes it reads."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    out = []
    for perm in itertools.permutations(calls):
        seen = set()
        ok = True
        for n in perm:
            if any(a.op == "call_function" and a not in seen for a in n.all_input_nodes):
                ok = False
                break
            seen.add(n)
        if ok:
            out.append([n.name for n in perm])
    return out


def refused(u, order) -> bool:
    try:
        check_order(u, order)
    except ValueError:
        return True
    return False


def run(gm, inputs):
    with torch.no_grad():
        return gm(*[x.clone() for x in inputs])


specs = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(0, 9), st.integers(1, 6)),
                 min_size=1, max_size=6)


@settings(max_examples=30, deadline=None)
@given(specs)
def test_every_order_of_a_small_graph_against_brute_force(spec):
    gm, inputs = random_graph(spec)
    calls = [n.name for n in gm.graph.nodes if n.op == "call_function"]
    if len(calls) > 7:  # 7! = 5040 permutations at most
        return
    u = usage(gm, inputs)
    orders = topological_orders(gm)
    for perm in itertools.permutations(calls):
        assert refused(u, list(perm)) == (list(perm) not in orders)
    assert peak_of(u, list(u.nodes)) == peak_live(liveness(gm, inputs))
    for order in orders[:6] + orders[-6:]:  # the planner, run on the reordered graph, gives the same peak
        assert peak_of(u, order) == peak_live(liveness(reordered(gm, order), inputs))
    assert sorted(reorder.topological_orders(u)) == sorted(orders)
    best = min(peak_of(u, order) for order in orders)
    greedy = memory_aware_order(u)
    assert greedy in orders
    assert peak_floor(u) <= best <= peak_of(u, greedy) <= peak_of(u, list(u.nodes))
    want, got = run(gm, inputs), run(reordered(gm, greedy), inputs)
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def two_chains():
    """x -> a (x16) -> b (sum) and x -> c (x16) -> d (sum), written a, c, b, d: both big values alive at once."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.repeat.default, (x, [16]))
    c = g.call_function(aten.repeat.default, (x, [16]))
    b = g.call_function(aten.sum.dim_IntList, (a, [0], True))
    d = g.call_function(aten.sum.dim_IntList, (c, [0], True))
    g.output((g.call_function(aten.add.Tensor, (b, d)),))
    return torch.fx.GraphModule(torch.nn.Module(), g), (torch.arange(4.0),)


def test_branches_written_breadth_first_reach_the_brute_force_optimum():
    gm, inputs = reorder.branches(3, 16)
    u = usage(gm, inputs)
    orders = topological_orders(gm)
    greedy = memory_aware_order(u)
    assert peak_of(u, list(u.nodes)) == 3 * 256 + 4  # every branch's 64 floats alive, then the first sum
    assert peak_of(u, greedy) == min(peak_of(u, order) for order in orders) == 256 + 2 * 4
    assert peak_live(liveness(reordered(gm, greedy), inputs)) == peak_of(u, greedy)
    assert torch.equal(run(gm, inputs)[0], run(reordered(gm, greedy), inputs)[0])


def test_two_chains_reach_the_brute_force_optimum():
    gm, inputs = two_chains()
    u = usage(gm, inputs)
    best = min(peak_of(u, order) for order in topological_orders(gm))
    greedy = memory_aware_order(u)
    assert peak_of(u, list(u.nodes)) == 2 * 256 + 4  # both repeats (64 floats each) alive, then the first sum
    assert peak_of(u, greedy) == best == 256 + 2 * 4  # one repeat beside the first chain's sum, then its own
    assert peak_live(liveness(reordered(gm, greedy), inputs)) == best


@pytest.fixture(scope="module")
def decode():
    return capture_decode(load_pretrained()[0], cached=16)


def test_the_decode_graph_reordered_gives_the_same_logits_and_a_peak_the_planner_confirms(decode):
    gm, inputs = decode.graph_module, decode.inputs
    u = usage(gm, inputs)
    assert peak_of(u, list(u.nodes)) == peak_live(liveness(gm, inputs))
    order = memory_aware_order(u)
    new = reordered(gm, order)
    assert [n.name for n in new.graph.nodes if n.op == "call_function"] == order
    assert peak_live(liveness(new, inputs)) == peak_of(u, order) <= peak_of(u, list(u.nodes))
    floor = max(sum(n for n in u.creates[x].values()) + sum(
        sum(u.creates[y].get(b, 0) for y in u.nodes) for b in u.reads[x] - set(u.creates[x])) for x in u.nodes)
    assert peak_of(u, order) >= peak_floor(u) >= floor  # every node needs what it reads and what it makes at once
    assert peak_of(u, reorder.breadth_first_order(u)) >= peak_floor(u)
    assert torch.equal(run(new, decode.fresh_inputs()), run(gm, decode.fresh_inputs()))


def test_the_kv_cache_write_keeps_its_place_before_the_reads(decode):
    """fx has no edge from the in-place write into the cache to the later read of the cache (the views of it
    and the repeat-kv clone that copies it out): moving that read before the write is refused, though every data
    edge allows it (it would read the cache without the new token's keys)."""
    gm = decode.graph_module
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    w = next(i for i, n in enumerate(calls) if "copy_" in str(n.target))
    cache = calls[w].args[0]
    while cache.op != "placeholder":
        cache = cache.args[0]
    chain = []
    for n in calls[w + 1:]:  # the read: views of the cache input, up to the first op that reads its bytes
        if n.args and isinstance(n.args[0], torch.fx.Node) and (n.args[0] is cache or n.args[0] in chain):
            chain.append(n)
            if graph_kind(n) != "view":
                break
    assert chain and graph_kind(chain[-1]) == "copy"  # the repeat-kv clone of the keys
    order = calls[:w] + chain + [n for n in calls[w:] if n not in chain]
    at = {n: i for i, n in enumerate(order)}
    assert all(at[a] < at[n] for n in order for a in n.all_input_nodes if a.op == "call_function")  # data edges: fine
    with pytest.raises(ValueError, match="order must be a topological order: .* reads or must follow"):
        reordered(gm, [n.name for n in order])


def test_refusals(decode):
    gm, inputs = two_chains()
    u = usage(gm, inputs)
    assert_refused(lambda: usage("gm", inputs), TypeError, "gm", "gm", "GraphModule")
    assert_refused(lambda: peak_of("u", list(u.nodes)), TypeError, "usage", "u", "a Usage")
    assert_refused(lambda: reorder.branches(0), ValueError, "n", 0, "a positive int")
    assert_refused(lambda: reorder.topological_orders(usage(*reorder.branches(4)), limit=10), ValueError, "usage",
                   "a graph of 11 nodes", "at most 10 topological orders")
    assert_refused(lambda: check_order(u, list(u.nodes)[1:]), ValueError, "order", "4 names", "exactly once")
    assert_refused(lambda: check_order(u, list(reversed(u.nodes))), ValueError, "order",
                   "add_tensor before sum_dim_int_list", "a topological order: add_tensor reads or must follow")
    assert isinstance(u, Usage) and peak_of(u, list(u.nodes)) > 0  # still usable after the errors


def test_check_order_names_an_entry_that_is_not_a_node_name():
    gm, inputs = two_chains()
    u = usage(gm, inputs)
    names = list(u.nodes)
    assert_refused(lambda: check_order(u, [1] + names[1:]), TypeError, "order[0]", 1, "a node name (str)")
    assert_refused(lambda: check_order(u, names[:2] + [None] + names[3:]), TypeError, "order[2]", None, "str")
    assert check_order(u, tuple(names)) == names


def hand_usage(nodes, creates, reads, after, to_output=()) -> Usage:
    """A Usage written by hand: what each node creates (name -> bytes), reads and must follow."""
    return Usage(tuple(nodes), {n: dict(creates.get(n, {})) for n in nodes},
                 {n: frozenset(reads.get(n, ())) for n in nodes}, {n: frozenset(after.get(n, ())) for n in nodes},
                 frozenset(to_output))


def test_the_greedy_rule_counts_the_bytes_a_node_frees():
    """After p, q (creates 100, frees p's 1000: net -900) beats r (creates 50, frees nothing: net 50): p q r s,
    peak 1100, the brute-force optimum; counting only created bytes would run r first (p r q s, peak 1150)."""
    u = hand_usage("prqs", {"p": {"P": 1000}, "r": {"R": 50}, "q": {"Q": 100}, "s": {"S": 1}},
                   {"q": {"P"}, "s": {"Q", "R"}}, {"r": {"p"}, "q": {"p"}, "s": {"q", "r"}}, {"S"})
    assert memory_aware_order(u) == ["p", "q", "r", "s"]
    assert peak_of(u, ["p", "q", "r", "s"]) == 1100 == min(peak_of(u, o) for o in reorder.topological_orders(u))
    assert peak_of(u, ["p", "r", "q", "s"]) == 1150


def test_returned_buffers_live_to_the_output_and_the_floor_counts_them():
    """A (returned, created first) is alive at c whatever the order: the floor is A + B + C; the buffers of an
    order end one step past the last node for what the graph returns, at the last reader otherwise."""
    u = hand_usage("abc", {"a": {"A": 100}, "b": {"B": 10}, "c": {"C": 1}}, {"b": {"A"}, "c": {"B"}},
                   {"b": {"a"}, "c": {"b"}}, {"A", "C"})
    assert reorder.buffers_of(u, ["a", "b", "c"]) == [Buffer("A", 100, 0, 3), Buffer("B", 10, 1, 2),
                                                      Buffer("C", 1, 2, 3)]
    assert peak_floor(u) == 111 == peak_of(u, ["a", "b", "c"])  # at c: A, B (read there) and C
    alone = hand_usage("ab", {"a": {"A": 100}, "b": {"B": 10}}, {}, {"b": {"a"}}, {"A", "B"})
    assert reorder.buffers_of(alone, ["a", "b"]) == [Buffer("A", 100, 0, 2), Buffer("B", 10, 1, 2)]
    assert peak_floor(alone) == 110 == peak_of(alone, ["a", "b"])  # A is read by nobody, but returned
