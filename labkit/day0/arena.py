"""The pre-planned device arena, and why loading without one fragments (notebook 07, sections 3 and 4).

A rank knows from the release's headers the size of every tensor it will hold (labkit.day0.loading.placed_sizes)
and from the footprint (labkit.day0.plan) its KV cache and activations: it takes ONE buffer, every offset decided
before a byte is read:

    offset 0                                                                              total
    [ w0 |pad][ w1 |pad] ... [ w_n |pad][ KV cache region      |pad][ activations |pad]
    every region starts at a multiple of `alignment` (256 bytes: what cudaMalloc guarantees)

`Arena.place(name, tensor)` copies a weight into its slot and returns the arena's view of it (its dtype and
shape): the model's parameters live inside the buffer (labkit.day0.loading.load_rank(..., arena=...)), and the
service's KV pools are views of `kv_region()` (labkit.day0.serve). `discard(name)` undoes a placement (a load
that failed half-way leaves the arena as it found it).

Without a plan a loader allocates as it goes (a whole FP32 tensor read into a temporary, its BF16 copy, the
temporary freed): the temporaries leave holes, and the KV cache or the activations, large allocations made
last, fail although enough bytes are free. `replay_naive_load` replays that on lab 02's ContiguousAllocator,
`replay_planned` the plan; both return a `LoadReplay` (plain data for labkit.day0.explore's figure).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .._checks import check_choice, check_positive_int, check_type, fail, is_int
from ..unified_memory import allocator

ALIGNMENT = 256  # bytes: cudaMalloc's alignment; PyTorch's caching allocator rounds blocks to 512
FIT_POLICIES = ("first_fit", "best_fit")  # lab 02's ContiguousAllocator


def align(nbytes: int, alignment: int) -> int:
    """`nbytes` rounded up to a multiple of `alignment`."""
    return -(-nbytes // alignment) * alignment


def _alignment(alignment: Any) -> int:
    a = check_positive_int("alignment", alignment, unit="bytes")
    if a & (a - 1):
        fail("alignment", alignment, "a power of two (bytes)")
    return a


def tensor_sizes(tensors: Any) -> dict[str, int]:
    """{name: bytes}, order kept, from a dict name -> bytes (or -> an entry with .nbytes: Release.tensors),
    a list of (name, bytes or entry) pairs, or a list of entries with .name and .nbytes. File order for the
    replays: sorted(release.tensors.items(), key=lambda kv: (kv[1].file, kv[1].start))."""
    items = list(tensors.items()) if isinstance(tensors, Mapping) else tensors
    if not isinstance(items, (list, tuple)):
        fail("tensors", tensors, "a dict of name -> bytes or a list of entries with .name and .nbytes", TypeError)
    sizes: dict[str, int] = {}
    for item in items:
        name, value = item if isinstance(item, tuple) and len(item) == 2 else (getattr(item, "name", None), item)
        if not isinstance(name, str) or not name:
            fail("tensors", name, "entries named by non-empty strings", TypeError)
        if name in sizes:
            fail("tensors", name, "distinct tensor names (this one is listed twice)")
        nbytes = value if is_int(value) else getattr(value, "nbytes", value)
        sizes[name] = check_positive_int(f"tensors[{name!r}]", nbytes, unit="bytes")
    return sizes


@dataclass(frozen=True)
class Region:
    """`nbytes` bytes at `offset` (bytes from the start of the arena)."""
    name: str
    offset: int
    nbytes: int

    end = property(lambda self: self.offset + self.nbytes, doc="first byte after the region")


@dataclass(frozen=True)
class ArenaPlan:
    """Where everything goes: the weights in the order given, then the KV cache, then the activations;
    `total` bytes in all (every region padded up to `alignment`)."""
    weights: tuple[Region, ...]
    kv: Region
    activations: Region
    alignment: int
    total: int

    def region(self, name: str) -> Region:
        """The weight called `name` (ValueError naming the plan's tensors otherwise)."""
        found = next((r for r in self.weights if r.name == name), None)
        if found is not None:
            return found
        fail("name", name, f"a tensor of this arena plan ({len(self.weights)} tensors, e.g. "
             f"{[r.name for r in self.weights[:3]]})")

    weight_bytes = property(lambda self: sum(r.nbytes for r in self.weights), doc="bytes of the weights")
    padding = property(lambda self: self.total - self.weight_bytes - self.kv.nbytes - self.activations.nbytes,
                       doc="bytes lost to alignment")


def plan_arena(tensors: Any, kv_bytes: int, activation_bytes: int, alignment: int = ALIGNMENT) -> ArenaPlan:
    """The layout of one rank's arena: `tensors` ({name: bytes as placed}, or release entries with .name and
    .nbytes) back to back in the order given, then `kv_bytes` of KV cache, then `activation_bytes`."""
    sizes, a = tensor_sizes(tensors), _alignment(alignment)
    kv = check_positive_int("kv_bytes", kv_bytes, unit="bytes", allow_zero=True)
    act = check_positive_int("activation_bytes", activation_bytes, unit="bytes", allow_zero=True)
    regions, offset = [], 0
    for name, n in sizes.items():
        regions.append(Region(name, offset, n))
        offset += align(n, a)
    kv_region, act_region = Region("kv_cache", offset, kv), Region("activations", offset + align(kv, a), act)
    return ArenaPlan(tuple(regions), kv_region, act_region, a, act_region.offset + align(act, a))


class Arena:
    """One uint8 buffer of `plan.total` bytes on `device`; weights are placed into it by name, once each.
    Thread-safe: a loader's threads may place different tensors at the same time."""

    def __init__(self, plan: ArenaPlan, device: str | torch.device = "cpu"):
        self.plan = check_type("plan", plan, ArenaPlan)
        self.buffer = torch.empty(plan.total, dtype=torch.uint8, device=device)
        self._slots = {r.name: r for r in plan.weights}
        self._placed: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    nbytes = property(lambda self: self.buffer.numel(), doc="bytes of the buffer (plan.total)")

    def _view(self, region: Region) -> torch.Tensor:
        return self.buffer[region.offset:region.end]

    def place(self, name: str, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Copy `tensor` into its slot, converted to `dtype` on the copy (default: its own), and return the
        arena's view of it (that dtype, its shape). Refuses a name not in the plan, a tensor whose bytes in
        that dtype differ from the plan's, and a second placement (discard(name) first)."""
        check_type("name", name, str)
        check_type("tensor", tensor, torch.Tensor, "a torch.Tensor")
        dtype = tensor.dtype if dtype is None else check_type("dtype", dtype, torch.dtype, "a torch.dtype or None")
        slot = self._slots.get(name) or self.plan.region(name)  # the latter raises, naming the plan's tensors
        itemsize = dtype.itemsize
        nbytes = tensor.numel() * itemsize
        if nbytes != slot.nbytes:
            fail("tensor", f"{name} {tuple(tensor.shape)} {dtype} ({nbytes} bytes)",
                 f"{slot.nbytes} bytes, the size planned for {name}")
        if slot.offset % itemsize:
            fail("tensor", f"{name} {dtype}", f"an element size dividing its offset {slot.offset}")
        with self._lock:
            if name in self._placed:
                fail("name", name, "a tensor not placed yet (each goes into the arena once; discard(name) first)")
            self._placed[name] = None  # reserved: the copy below runs outside the lock
        try:
            view = self._view(slot).view(dtype).view(tensor.shape).copy_(tensor.detach())
        except BaseException:
            with self._lock:
                del self._placed[name]  # not placed: it may be placed again
            raise
        with self._lock:
            self._placed[name] = view
        return view

    def discard(self, name: str) -> None:
        """Undo the placement of `name`: its slot may be placed again (its bytes are left as they are; views
        handed out earlier still alias them). Refuses a name that is not placed."""
        check_type("name", name, str)
        with self._lock:
            if self._placed.get(name) is None:
                fail("name", name, "a tensor placed in this arena")
            del self._placed[name]

    def missing(self) -> list[str]:
        """Names of the plan not placed yet, in plan order."""
        return [r.name for r in self.plan.weights if r.name not in self._placed]

    def kv_region(self) -> torch.Tensor:
        """The KV cache's bytes (uint8 view; `.view(dtype)` it into cache tensors)."""
        return self._view(self.plan.kv)

    def activation_region(self) -> torch.Tensor:
        """The activations' bytes (uint8 view)."""
        return self._view(self.plan.activations)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s bytes lie inside this arena's buffer."""
        check_type("tensor", tensor, torch.Tensor, "a torch.Tensor")
        start, first = self.buffer.data_ptr(), tensor.data_ptr()
        return start <= first and first + tensor.numel() * tensor.element_size() <= start + self.nbytes


@dataclass(frozen=True)
class AllocEvent:
    """One allocator call: op "alloc", "free" or "fail" of `size` bytes at `offset` (-1: failed); after it."""
    step: int
    op: str
    name: str
    offset: int
    size: int
    free_bytes: int
    largest_hole: int


@dataclass(frozen=True)
class LoadReplay:
    """A load replayed on `capacity` bytes, then the KV cache (`kv_bytes`) and the activations, one allocation
    each: whether all fit (`kv_offset`: where the KV cache went), the allocation that failed (`failed`, None
    if none did, of `failed_size` bytes), free bytes, largest hole and holes (offset, bytes) just before it
    (or before the last allocation), the peak of live bytes, every allocator call in order (`events`)."""
    layout: str
    capacity: int
    kv_bytes: int
    fits: bool
    kv_offset: int | None
    free_bytes: int
    largest_hole: int
    holes: tuple[tuple[int, int], ...]
    failed: str | None
    failed_size: int | None
    peak_bytes: int
    events: tuple[AllocEvent, ...]

    @property
    def fragmented(self) -> bool:
        """An allocation failed although at least its size was free: fragmentation, not capacity."""
        return self.failed_size is not None and self.free_bytes >= self.failed_size


class _Replay:
    """Allocator calls recorded as Events (the replays' one bookkeeping)."""

    def __init__(self, capacity: int, policy: str):
        self.mem, self.events, self.peak, self.full = allocator.ContiguousAllocator(capacity, policy), [], 0, False

    def _log(self, op: str, name: str, offset: int, size: int) -> None:
        self.events.append(AllocEvent(len(self.events), op, name, offset, size,
                                      self.mem.free_bytes, self.mem.largest_hole))

    def alloc(self, name: str, size: int):
        """The block, or None (and `full` set) when no hole fits."""
        try:
            block = self.mem.alloc(size)
        except MemoryError:
            self._log("fail", name, -1, size)
            self.full = True
            return None
        self._log("alloc", name, block.offset, size)
        self.peak = max(self.peak, self.mem.capacity - self.mem.free_bytes)
        return block

    def free(self, name: str, block) -> None:
        self.mem.free(block)
        self._log("free", name, block.offset, block.size)

    def finish(self, layout: str, kv_bytes: int, activation_bytes: int) -> LoadReplay:
        """The KV cache, then the activations (unless the load already failed), and the result."""
        state = (self.mem.free_bytes, self.mem.largest_hole, tuple(self.mem.holes))
        block = None if self.full else self.alloc("kv_cache", kv_bytes)
        if activation_bytes and not self.full:
            state = (self.mem.free_bytes, self.mem.largest_hole, tuple(self.mem.holes))  # before it
            self.alloc("activations", activation_bytes)
        failed = (self.events[-1].name, self.events[-1].size) if self.full else (None, None)
        return LoadReplay(layout, self.mem.capacity, kv_bytes, not self.full,
                          None if block is None else block.offset, *state, *failed, self.peak, tuple(self.events))


def replay_naive_load(tensors: Any, kv_bytes: int, capacity: int, activation_bytes: int = 0, loaded: Any = None,
                      stored_bytes: int = 4, loaded_bytes: int = 2, in_flight: int = 1, alignment: int = ALIGNMENT,
                      policy: str = "first_fit") -> LoadReplay:
    """Load `tensors` ({name: bytes as stored}, in file order) the way a loader without a plan does, on a
    ContiguousAllocator of `capacity` bytes: for each group of `in_flight` tensors (reader threads), allocate
    each whole stored tensor (a temporary), then each copy as kept (`loaded`: {name: bytes}, e.g. a rank's
    slices from labkit.day0.loading.placed_sizes; default the whole tensor converted from stored_bytes to
    loaded_bytes per element, 4 -> 2: FP32 -> BF16), then free the temporaries; finally the KV cache and the
    activations, one allocation each. Every size is rounded up to `alignment`. A load that runs out early
    stops there (`failed` names the tensor)."""
    sizes, a = tensor_sizes(tensors), _alignment(alignment)
    kv = check_positive_int("kv_bytes", kv_bytes, unit="bytes")
    act = check_positive_int("activation_bytes", activation_bytes, unit="bytes", allow_zero=True)
    capacity = check_positive_int("capacity", capacity, unit="bytes")
    stored = check_positive_int("stored_bytes", stored_bytes, unit="bytes per element")
    ratio = check_positive_int("loaded_bytes", loaded_bytes, unit="bytes per element") / stored
    in_flight = check_positive_int("in_flight", in_flight, unit="tensors")
    check_choice("policy", policy, FIT_POLICIES)
    if loaded is None:
        for name, n in sizes.items():
            if n % stored:
                fail(f"tensors[{name!r}]", n, f"a multiple of stored_bytes={stored} (whole elements)")
        kept = {name: int(n * ratio) for name, n in sizes.items()}
    else:
        kept = tensor_sizes(loaded)
        if set(kept) != set(sizes):
            fail("loaded", sorted(set(kept) ^ set(sizes))[:3], "sizes for exactly the names of tensors")
    run, names = _Replay(capacity, policy), list(sizes)
    for start in range(0, len(names), in_flight):
        group = names[start:start + in_flight]  # comprehensions stop allocating after the first failure
        temps = [(n, run.alloc(f"{n} (read)", align(sizes[n], a))) for n in group if not run.full]
        _ = [run.alloc(n, align(kept[n], a)) for n in group if not run.full]
        if run.full:
            break
        for n, block in temps:
            run.free(f"{n} (read)", block)
    return run.finish("naive", align(kv, a), align(act, a))


def replay_planned(plan: ArenaPlan, capacity: int | None = None, policy: str = "first_fit") -> LoadReplay:
    """The same tensors through the plan: each weight's padded slot allocated in plan order (they land at
    the plan's offsets: nothing is freed in between, no temporaries live in the arena), then the KV and
    activation regions. `capacity` defaults to plan.total, where they fit exactly."""
    check_type("plan", plan, ArenaPlan)
    if not plan.kv.nbytes:
        fail("plan", "an ArenaPlan with kv_bytes=0", "a plan with a KV region to allocate")
    capacity = plan.total if capacity is None else check_positive_int("capacity", capacity, unit="bytes")
    run = _Replay(capacity, check_choice("policy", policy, FIT_POLICIES))
    for r in plan.weights:
        if run.alloc(r.name, align(r.nbytes, plan.alignment)) is None:
            break
    return run.finish("planned", align(plan.kv.nbytes, plan.alignment), align(plan.activations.nbytes, plan.alignment))
