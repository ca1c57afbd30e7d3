"""Graph rearrangement: run a captured graph's independent nodes in another order to lower the peak of live
activation bytes (notebook 08, part 1, after the buffer planner).

    usage(gm, inputs)          Usage: what each node creates, which buffers it reads, what it must follow
    check_order, buffers_of    an order checked to be topological; its liveness intervals (buffers.Buffer)
    peak_of(usage, order)      the peak live bytes of running the nodes in `order` (buffers.peak_live's rule)
    memory_aware_order(usage)  a greedy list schedule: of the nodes whose inputs are ready, run the one that
                               adds the fewest bytes (created minus freed), ties in program order
    breadth_first_order(usage) level by level, as a scheduler that ignores memory would
    peak_floor(usage)          a bound no order can beat
    reordered(gm, order)       a new GraphModule running the same nodes in `order` (refused unless topological)
    branches, topological_orders   a small graph where the order matters; every order of a small graph

A topological order is any order in which every node runs after what it reads. The program order is one; a
decode step has many others (the q, k and v projections of a block are independent, so are the two halves of
a rotary application). They compute the same values, so the logits are the same bit for bit, but they can keep
different buffers alive at once, so the peak the planner reserves can differ:

    breadth-first:  grow0 grow1 sum0 sum1          memory-aware:  grow0 sum0 grow1 sum1
                    [grow0=====]                                  [grow0]
                          [grow1=====]                                  [grow1]
                    peak: both large values                       peak: one large value and a sum

Finding the order with the least peak is NP-hard in general (register sufficiency, Sethi 1975), so compilers
schedule greedily (XLA's list memory scheduler picks the ready instruction that frees the most bytes); SERENITY
(Ahn et al., MLSys 2020) searches exactly, with dynamic programming, on small irregular graphs.
tests/cluster/test_reorder.py compares the greedy order with every topological order of small random graphs.
On TinyLM's decode step no order beats the traced one: its peak already equals peak_floor (notebook 08).

Dependencies beyond the data edges: the decode step writes the new keys and values into its KV-cache inputs
in place (aten.copy_ into a slice of the input), and fx draws no edge from that write to the later reads. Every
node that touches a graph input that some node writes into (views of it, the write, reads of it) therefore
keeps its program order relative to the others; nothing else is constrained.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import check_positive_int, check_type, fail
from .buffers import Buffer, _copies, _Recorder, peak_live
from .graph import _root, _written, check_inputs


@dataclass(frozen=True)
class Usage:
    """A graph's nodes (call_function only, program order) and, for each: the activation buffers it creates
    (name -> bytes), the buffers it reads (through views), the nodes it must run after; `to_output`: the
    buffers the graph returns (alive to the end)."""
    nodes: tuple[str, ...]
    creates: dict[str, dict[str, int]]
    reads: dict[str, frozenset[str]]
    after: dict[str, frozenset[str]]
    to_output: frozenset[str]


def _check_gm(gm) -> torch.fx.GraphModule:
    return check_type("gm", gm, torch.fx.GraphModule, "a torch.fx.GraphModule (capture_decode(...).graph_module)")


def _dependencies(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, set[torch.fx.Node]]:
    """node -> the call_function nodes it must follow: the ones it reads, and, for nodes touching a graph
    input that is written in place, the previous such node (program order kept among them)."""
    written = {_written(n) for n in gm.graph.nodes} - {None}
    after, previous = {}, None
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        after[n] = {a for a in n.all_input_nodes if a.op == "call_function"}
        if _root(n) in written or any(_root(a) in written for a in n.all_input_nodes):
            if previous is not None:
                after[n].add(previous)
            previous = n
    return after


def usage(gm: torch.fx.GraphModule, inputs) -> Usage:
    """Run `gm` once on copies of `inputs` (labkit.cluster.buffers' recorder: storages, so views count as
    their base) and return what each node creates and reads and what it must follow."""
    _check_gm(gm)
    args = _copies(check_inputs(gm, inputs))
    rec = _Recorder(gm)
    with torch.no_grad():
        rec.run(*args)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    creates = {n.name: {} for n in calls}
    by_index = {i: n for n, i in rec.index.items()}
    for name, first in rec.first.items():
        creates[by_index[first].name][name] = rec.nbytes[name]
    reads = {n.name: set() for n in calls}
    to_output = set()
    for n, held in rec.holds.items():
        for user in n.users:
            if user.op == "output":
                to_output |= held
            elif user.name in reads:
                reads[user.name] |= held
    after = {n.name: frozenset(a.name for a in deps) for n, deps in _dependencies(gm).items()}
    return Usage(tuple(n.name for n in calls), creates, {k: frozenset(v) for k, v in reads.items()}, after,
                 frozenset(to_output))


def _check_usage(u) -> Usage:
    return check_type("usage", u, Usage, "a Usage (reorder.usage(gm, inputs))")


def check_order(u: Usage, order) -> list[str]:
    """`order` as a list, refused by name unless it holds every node of `u` once, each after what it must
    follow."""
    _check_usage(u)
    if isinstance(order, (list, tuple)):
        for i, name in enumerate(order):
            check_type(f"order[{i}]", name, str, "a node name (str)")
    if not isinstance(order, (list, tuple)) or sorted(order) != sorted(u.nodes):
        fail("order", f"{len(order) if isinstance(order, (list, tuple)) else order!r} names",
             f"every one of the graph's {len(u.nodes)} call_function nodes exactly once")
    seen = set()
    for name in order:
        missing = sorted(u.after[name] - seen)
        if missing:
            fail("order", f"{name} before {missing[0]}", f"a topological order: {name} reads or must follow "
                 f"{missing[0]}")
        seen.add(name)
    return list(order)


def buffers_of(u: Usage, order) -> list[Buffer]:
    """The liveness intervals (labkit.cluster.buffers.Buffer) of running `u`'s nodes in `order`: positions in
    that order; a buffer the graph returns lives one step past the last node (the output node)."""
    order = check_order(u, order)
    at = {name: i for i, name in enumerate(order)}
    last = {}
    for name in order:
        for b in u.reads[name]:
            last[b] = max(last.get(b, 0), at[name])
    out = []
    for name in order:
        for b, nbytes in u.creates[name].items():
            end = len(order) if b in u.to_output else max(last.get(b, at[name]), at[name])
            out.append(Buffer(b, nbytes, at[name], end))
    return out


def peak_of(u: Usage, order) -> int:
    """Peak live activation bytes of running the nodes in `order` (unaligned, as torch counts them)."""
    return peak_live(buffers_of(u, order))


def memory_aware_order(u: Usage) -> list[str]:
    """A greedy list schedule: repeatedly run, among the nodes whose dependencies have all run, the one whose
    net bytes (created minus freed: buffers it reads for the last time) are least; ties in program order.
    Returns the order, or the program order when the greedy one's peak is not lower."""
    _check_usage(u)
    position = {name: i for i, name in enumerate(u.nodes)}
    readers: dict[str, int] = {}
    for name in u.nodes:
        for b in u.reads[name]:
            readers[b] = readers.get(b, 0) + 1
    size = {b: n for name in u.nodes for b, n in u.creates[name].items()}
    waiting = {name: set(u.after[name]) for name in u.nodes}
    users: dict[str, list[str]] = {name: [] for name in u.nodes}
    for name, deps in u.after.items():
        for d in deps:
            users[d].append(name)
    ready = {name for name, deps in waiting.items() if not deps}
    order = []

    def net(name: str) -> int:
        freed = sum(size.get(b, 0) for b in u.reads[name] if readers[b] == 1 and b not in u.to_output)
        return sum(u.creates[name].values()) - freed

    while ready:
        pick = min(ready, key=lambda name: (net(name), position[name]))
        ready.remove(pick)
        order.append(pick)
        for b in u.reads[pick]:
            readers[b] -= 1
        for user in users[pick]:
            waiting[user].discard(pick)
            if not waiting[user]:
                ready.add(user)
    return order if peak_of(u, order) < peak_of(u, u.nodes) else list(u.nodes)


def reordered(gm: torch.fx.GraphModule, order) -> torch.fx.GraphModule:
    """A copy of `gm` whose call_function nodes run in `order` (names; refused unless every call_function node
    appears once, after the nodes it reads and, for in-place writes into inputs, in program order among the
    nodes touching that input). Inputs and constants first, the output last, as in `gm`."""
    _check_gm(gm)
    deps = _dependencies(gm)
    u = Usage(tuple(n.name for n in deps), {}, {}, {n.name: frozenset(a.name for a in d) for n, d in deps.items()},
              frozenset())
    order = check_order(u, order)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    by_name = {n.name: n for n in gm.graph.nodes}
    head = [n for n in gm.graph.nodes if n.op in ("placeholder", "get_attr")]
    tail = [n for n in gm.graph.nodes if n.op == "output"]
    for n in head + [by_name[name] for name in order] + tail:
        env[n] = graph.node_copy(n, lambda a: env[a])
    return torch.fx.GraphModule(gm, graph)


def breadth_first_order(u: Usage) -> list[str]:
    """The order of a scheduler that ignores memory: level by level (every node as soon as the nodes it
    follows have run, a whole level before the next), program order inside a level. Dependencies permitting,
    it starts every independent chain before finishing any."""
    _check_usage(u)
    level: dict[str, int] = {}
    for name in u.nodes:  # program order is topological
        level[name] = 1 + max((level[d] for d in u.after[name]), default=-1)
    position = {name: i for i, name in enumerate(u.nodes)}
    return sorted(u.nodes, key=lambda name: (level[name], position[name]))


def peak_floor(u: Usage) -> int:
    """A lower bound on the peak of every topological order: the most bytes that must be alive at one node x,
    whatever the order: what x reads and creates, and every buffer created before x (by a node x depends on)
    and read after it (by a node that depends on x, or returned by the graph)."""
    _check_usage(u)
    ancestors: dict[str, set[str]] = {}
    for name in u.nodes:
        ancestors[name] = set(u.after[name]).union(*(ancestors[d] for d in u.after[name]))
    descendants: dict[str, set[str]] = {name: set() for name in u.nodes}
    for name in u.nodes:
        for a in ancestors[name]:
            descendants[a].add(name)
    creator = {b: name for name in u.nodes for b in u.creates[name]}
    size = {b: n for name in u.nodes for b, n in u.creates[name].items()}
    readers: dict[str, set[str]] = {b: set() for b in size}
    for name in u.nodes:
        for b in u.reads[name]:
            if b in readers:
                readers[b].add(name)
    floor = 0
    for x in u.nodes:
        live = set(u.creates[x]) | (u.reads[x] & set(size))
        live |= {b for b in size if creator[b] in ancestors[x]
                 and (b in u.to_output or readers[b] & descendants[x])}
        floor = max(floor, sum(size[b] for b in live))
    return floor


def branches(n: int = 3, grow: int = 16) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor]]:
    """A graph where the order matters: `n` independent branches over x [4], each growing it `grow` times
    (aten.repeat) and then summing it to one number, written breadth-first (every branch's large value first,
    as a compiler batching the independent ops of a level would, e.g. the experts of a mixture-of-experts
    layer), then the sums added up: grow0..grow{n-1}, sum0..sum{n-1}, add1..add{n-1}. (gm, inputs)."""
    check_positive_int("n", n, "branches")
    check_positive_int("grow", grow, "times the input's 4 floats")
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    big = [g.create_node("call_function", aten.repeat.default, (x, [grow]), name=f"grow{i}") for i in range(n)]
    small = [g.create_node("call_function", aten.sum.dim_IntList, (b, [0], True), name=f"sum{i}")
             for i, b in enumerate(big)]
    total = small[0]
    for i, s in enumerate(small[1:], 1):
        total = g.create_node("call_function", aten.add.Tensor, (total, s), name=f"add{i}")
    g.output((total,))
    return torch.fx.GraphModule(torch.nn.Module(), g), (torch.arange(4.0),)


def topological_orders(u: Usage, limit: int = 100_000) -> list[list[str]]:
    """Every topological order of `u`'s nodes (brute force, for small graphs: refused past `limit` orders)."""
    _check_usage(u)
    check_positive_int("limit", limit, "orders")
    out: list[list[str]] = []

    def extend(order: list[str], done: set[str]) -> None:
        if len(order) == len(u.nodes):
            out.append(list(order))
            if len(out) > limit:
                fail("usage", f"a graph of {len(u.nodes)} nodes", f"at most {limit} topological orders (brute force)")
            return
        for name in u.nodes:
            if name not in done and u.after[name] <= done:
                order.append(name)
                done.add(name)
                extend(order, done)
                done.remove(name)
                order.pop()

    extend([], set())
    return out
