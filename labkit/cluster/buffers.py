"""Activation buffers of a captured graph: when each one lives, an arena plan that reuses memory, and the peak
torch itself measures (notebook 08, part 1; the liveness intervals are an exercise).

    liveness(gm, inputs)        Buffer(name, nbytes, first, last) for every activation: created by node
                                `first`, last read by node `last` (indices in execution order, inclusive)
    plan_buffers(buffers)       offsets in one arena: greedy by size, best-fit gaps (TFLite's and XLA's
                                heap simulators), so buffers that are never alive together share bytes
    check_plan(buffers, plan)   refuses a plan where two live buffers share a byte, naming both
    measured_peak(gm, inputs)   torch's own accounting (profiler memory events), freeing at last use or not
    allocator_peak(fn)          the same accounting around any call

        bytes ^     +-----+                   a plan: a buffer is a box [first, last] x [offset, offset+size);
              |  +--+  c  |  +----+           no two boxes may overlap. peak_live_bytes is the tallest
              |  | a  +---+  | d  |           column of live bytes: no plan does better; no_reuse_bytes
              |  +-----+ b   +----+           stacks every box: the arena without reuse.
              +---------------------> step

What counts: only storages a node creates. Views and aliases (view, transpose, getitem, the tensor copy_
returns) share their base's storage and extend its life; graph inputs (tokens, the KV cache that copy_ writes
into in place) and constants (weights, rotary tables) are not activations.
"""

from __future__ import annotations

import os

from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils import _pytree as pytree

from .._checks import check_bool, check_int, check_positive_int, check_type, fail
from .graph import check_inputs


def _round_up(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


@dataclass(frozen=True, order=True)
class Buffer:
    """One activation: `nbytes` of storage created by node `first`, read for the last time by node `last`."""
    name: str
    nbytes: int
    first: int
    last: int

    def __post_init__(self):
        check_type("name", self.name, str)
        check_positive_int("nbytes", self.nbytes, "bytes")
        check_positive_int("first", self.first, "node index", allow_zero=True)
        check_int("last", self.last, self.first, None, "node index, >= first")

    def overlaps(self, other: "Buffer") -> bool:
        """Alive at a common step (a node reads one while it writes the other counts)."""
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class BufferPlan:
    """offsets: buffer name -> byte offset in the arena. Sizes are rounded up to the plan's alignment, and all
    three totals are in those rounded bytes (alignment=1: the bytes torch's accounting reports)."""
    offsets: dict[str, int]
    arena_bytes: int
    no_reuse_bytes: int
    peak_live_bytes: int
    alignment: int

    def __post_init__(self):
        self._check()

    def _check(self) -> None:
        """Refuse, by name, fields that are not what plan_buffers makes (check_plan runs it again: offsets is a
        dict, changeable after construction)."""
        check_positive_int("alignment", self.alignment, "bytes")
        check_type("offsets", self.offsets, dict, "a dict of buffer name -> byte offset")
        for name, offset in self.offsets.items():
            check_type("offsets", name, str, "a dict keyed by buffer name (str)")
            check_positive_int(f"offsets[{name!r}]", offset, "bytes", allow_zero=True)
        for field in ("arena_bytes", "no_reuse_bytes", "peak_live_bytes"):
            check_positive_int(field, getattr(self, field), "bytes", allow_zero=True)

    def size(self, buffer: Buffer) -> int:
        """The buffer's bytes rounded up to the plan's alignment."""
        return _round_up(buffer.nbytes, self.alignment)


class _Recorder(torch.fx.Interpreter):
    """Runs the graph and notes which storages each node's value holds (garbage_collect_values=False keeps
    every value alive, so a storage's address names it for the whole run)."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm, garbage_collect_values=False)
        self.owner: dict[int, str | None] = {}  # storage address -> buffer name (None: input or constant)
        self.first: dict[str, int] = {}
        self.nbytes: dict[str, int] = {}
        self.holds: dict[torch.fx.Node, set[str]] = {}
        self.index = {n: i for i, n in enumerate(gm.graph.nodes)}

    def run_node(self, n: torch.fx.Node):
        result = super().run_node(n)
        tensors = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        held = set()
        for i, t in enumerate(tensors):
            storage = t.untyped_storage()
            if storage.nbytes() == 0:
                continue
            key = storage.data_ptr()
            if key not in self.owner:
                name = None if n.op in ("placeholder", "get_attr") else n.name + (f"[{i}]" if len(tensors) > 1 else "")
                self.owner[key] = name
                if name is not None:
                    self.first[name], self.nbytes[name] = self.index[n], storage.nbytes()
            if self.owner[key] is not None:
                held.add(self.owner[key])
        self.holds[n] = held
        return result


def _copies(inputs: tuple) -> tuple:
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)  # the graph writes into the cache


def liveness(gm: torch.fx.GraphModule, inputs) -> list[Buffer]:
    """The activation buffers of one run of `gm` on `inputs` (not modified: the run gets copies), in creation
    order. A buffer lives from the node that creates its storage to the last node that reads it or any view
    of it; a value nothing reads dies at once. The graph's output lives to the output node."""
    args = _copies(check_inputs(gm, inputs))
    rec = _Recorder(gm)
    with torch.no_grad():
        rec.run(*args)
    last = dict(rec.first)
    for n, held in rec.holds.items():
        for user in n.users:
            for name in held:
                last[name] = max(last[name], rec.index[user])
    return [Buffer(name, rec.nbytes[name], rec.first[name], last[name]) for name in rec.first]


def _check_buffers(buffers) -> list[Buffer]:
    if not isinstance(buffers, (list, tuple)) or not all(isinstance(b, Buffer) for b in buffers):
        fail("buffers", buffers, "a list of Buffer (liveness(gm, inputs))", TypeError)
    seen = set()
    for b in buffers:
        if b.name in seen:
            fail("buffers", b.name, "a list of Buffer with unique names (a repeated name)")
        seen.add(b.name)
    return list(buffers)


def peak_live(buffers: list[Buffer], alignment: int = 1) -> int:
    """The most bytes (each size rounded up to `alignment`) alive at one step: no plan can use less."""
    _check_buffers(buffers)
    check_positive_int("alignment", alignment, "bytes")
    events = sorted([(b.first, _round_up(b.nbytes, alignment)) for b in buffers]
                    + [(b.last + 1, -_round_up(b.nbytes, alignment)) for b in buffers])  # frees first
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def plan_buffers(buffers: list[Buffer], alignment: int = 64) -> BufferPlan:
    """Offsets for every buffer in one arena: largest first (ties: earliest, then name), each into the
    smallest gap left between the already placed buffers it is alive with, else above them all."""
    _check_buffers(buffers)
    check_positive_int("alignment", alignment, "bytes")
    plan = BufferPlan({}, 0, 0, 0, alignment)
    placed: list[tuple[int, int, Buffer]] = []  # (offset, size, buffer)
    for b in sorted(buffers, key=lambda b: (-b.nbytes, b.first, b.name)):
        size, end, best = plan.size(b), 0, None
        for offset, other_size, _ in sorted(p for p in placed if p[2].overlaps(b)):
            gap = offset - end
            if gap >= size and (best is None or gap < best[0]):
                best = (gap, end)
            end = max(end, offset + other_size)
        offset = end if best is None else best[1]
        placed.append((offset, size, b))
        plan.offsets[b.name] = offset
    arena = max((o + s for o, s, _ in placed), default=0)
    return BufferPlan(plan.offsets, arena, sum(s for _, s, _ in placed), peak_live(buffers, alignment), alignment)


def check_plan(buffers: list[Buffer], plan: BufferPlan) -> None:
    """Raise ValueError naming two buffers alive at a common step whose bytes overlap in the arena (or a
    buffer the plan has no offset for, or one beyond arena_bytes)."""
    _check_buffers(buffers)
    check_type("plan", plan, BufferPlan, "a BufferPlan (plan_buffers(buffers))")
    plan._check()
    for b in buffers:
        offset = plan.offsets.get(b.name)
        if offset is None or offset + plan.size(b) > plan.arena_bytes:
            fail("plan", f"{b.name} at offset {offset}", f"a plan placing every buffer inside its "
                 f"{plan.arena_bytes}-byte arena")
    spans = sorted((plan.offsets[b.name], plan.offsets[b.name] + plan.size(b), b) for b in buffers)
    for i, (lo, hi, b) in enumerate(spans):
        for lo2, hi2, c in spans[i + 1:]:
            if lo2 >= hi:
                break
            if b.overlaps(c):
                fail("plan", f"{b.name} [{lo}, {hi}) and {c.name} [{lo2}, {hi2}), both alive at step "
                     f"{max(b.first, c.first)}", "a plan where no two live buffers share a byte")


class _FreeAtLastUse(torch.fx.Interpreter):
    """fx's Interpreter frees a value after its last reader; this one also drops a value nothing reads (the
    attention's unused log-sum-exp) as soon as its node ran, as liveness() assumes."""

    def run_node(self, n: torch.fx.Node):
        result = super().run_node(n)
        return None if self.garbage_collect_values and not n.users and n.op != "output" else result


def allocator_peak(fn) -> int:
    """Peak bytes torch's CPU allocator held above its level at the start while `fn()` ran, from the
    profiler's memory events (ProfilerActivity.CPU, profile_memory=True: every allocation and free, in order,
    in the bytes asked for: the CPU allocator does not round them)."""
    if not callable(fn):
        fail("fn", fn, "a callable taking no arguments", TypeError)
    # kineto (the profiler's C++ side) writes "USDT: profiler_start/stop" lines to stderr below level 6: in a
    # notebook they would land in the cell's output. It reads the level when a profile starts.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for nbytes in memory_events(prof):
        live += nbytes
        peak = max(peak, live)
    return peak


def memory_events(prof: profile) -> list[int]:
    """The bytes of every allocation (+) and free (-) a finished profile saw, in the order they happened. torch has
    no public API for them in order (prof.events() sums memory per operator): this reads the profiler's private
    kineto_results, and tests/cluster/test_buffers.py's test_the_profiler_still_lists_memory_events_in_order
    fails, naming the torch version, the day torch changes it."""
    return [event.nbytes() for event in prof.profiler.kineto_results.events() if event.name() == "[memory]"]


def measured_peak(gm: torch.fx.GraphModule, inputs, reuse: bool = True) -> int:
    """Peak activation bytes of one run of `gm` (after a warm-up run) by torch's own accounting
    (allocator_peak). reuse=True frees each value after its last use (torch.fx.Interpreter with
    garbage_collect_values=True); False keeps every value to the end of the run. Inputs and weights exist
    before the run, so they are not counted; scratch an op allocates and frees inside itself is."""
    check_bool("reuse", reuse)
    inputs = check_inputs(gm, inputs)
    with torch.no_grad():
        _FreeAtLastUse(gm, garbage_collect_values=reuse).run(*_copies(inputs))  # warm-up
        args = _copies(inputs)
        return allocator_peak(lambda: _FreeAtLastUse(gm, garbage_collect_values=reuse).run(*args))
