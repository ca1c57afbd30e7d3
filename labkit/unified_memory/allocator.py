"""A contiguous allocator (first-fit or best-fit) and why it fragments (notebook 02, section 6).

Each allocation needs one run of free bytes. After allocations and frees of mixed sizes the free space is
scattered in holes, and a large request fails although the holes add up to enough:

    capacity 0 ................................................................ 1024
             [ A 200 ][ hole 100 ][ C 200 ][ hole 100 ][ E 200 ][ hole 224 ]
             free = 424 bytes, largest hole 224: alloc(300) fails

A paged pool (labkit.unified_memory) maps any free pages to a contiguous *virtual* range, so it only needs
enough free pages in total.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._checks import check_choice, check_positive_int, check_type, fail


@dataclass(frozen=True)
class Block:
    offset: int   # bytes from the start of the arena
    size: int     # bytes


class ContiguousAllocator:
    """Free list of holes (offset, size), kept sorted and merged; `policy` "first_fit" takes the first
    hole that fits, "best_fit" the smallest one (ties: lowest offset)."""

    def __init__(self, capacity: int, policy: str = "first_fit"):
        capacity = check_positive_int("capacity", capacity, unit="bytes")
        check_choice("policy", policy, ("first_fit", "best_fit"))
        self.capacity, self.policy = capacity, policy
        self.holes: list[tuple[int, int]] = [(0, capacity)]
        self.blocks: set[Block] = set()

    def alloc(self, size: int) -> Block:
        """A block of `size` bytes; MemoryError (saying how much is free) when no hole is large enough."""
        size = check_positive_int("size", size, unit="bytes")
        fits = [i for i, (_, s) in enumerate(self.holes) if s >= size]
        if not fits:
            raise MemoryError(f"alloc({size}) failed: {self.free_bytes} bytes free but the largest hole is "
                              f"{self.largest_hole} bytes (fragmentation {self.fragmentation:.0%})")
        i = fits[0] if self.policy == "first_fit" else min(fits, key=lambda j: (self.holes[j][1], j))
        off, s = self.holes[i]
        if s == size:
            del self.holes[i]
        else:
            self.holes[i] = (off + size, s - size)
        block = Block(off, size)
        self.blocks.add(block)
        return block

    def free(self, block: Block) -> None:
        """Give `block` back; neighbouring holes merge."""
        check_type("block", block, Block)
        if block not in self.blocks:
            fail("block", block, "a live Block of this allocator")
        self.blocks.remove(block)
        self.holes.append((block.offset, block.size))
        self.holes.sort()
        merged = [self.holes[0]]
        for off, s in self.holes[1:]:
            o, t = merged[-1]
            if o + t == off:
                merged[-1] = (o, t + s)
            else:
                merged.append((off, s))
        self.holes = merged

    @property
    def free_bytes(self) -> int:
        return sum(s for _, s in self.holes)

    @property
    def largest_hole(self) -> int:
        return max((s for _, s in self.holes), default=0)

    @property
    def fragmentation(self) -> float:
        """1 - largest hole / free bytes: 0 when all free space is one hole."""
        return 0.0 if not self.free_bytes else 1 - self.largest_hole / self.free_bytes


def fragmenting_workload(allocator, sizes: list[int], free_every: int = 2) -> list[Block]:
    """Allocate `sizes` in order, then free every `free_every`-th block (0, k, 2k...). Returns the live
    blocks. Used by notebook 02 to make holes."""
    check_type("allocator", allocator, ContiguousAllocator)
    free_every = check_positive_int("free_every", free_every)
    if not isinstance(sizes, (list, tuple)):
        fail("sizes", sizes, "a list of allocation sizes in bytes", TypeError)
    blocks = [allocator.alloc(s) for s in sizes]
    for b in blocks[::free_every]:
        allocator.free(b)
    return [b for i, b in enumerate(blocks) if i % free_every]
