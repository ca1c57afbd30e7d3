"""What a unified memory pool remembers, as plain numpy tables the compiled paging loop reads and writes
(notebook 02). UnifiedMemory (engine.py) owns one of each; the loop (loop.py), the eviction policies
(policies.py) and the prefetchers (prefetch.py) receive them.

    pages[page, column]     int64, one row per virtual page
        TIER                FREE (-1, not allocated), HOST (0) or DEVICE (1)
        FRAME               the device frame holding the page (-1: not on the device)
    frames[frame, column]   int64, one row per device frame
        PAGE                the virtual page in the frame (-1: the frame is free)
        LAST_USE            LRU key: tick of the page's last access or load
        LOADED_BY           number of the fault (or alloc) that loaded the page
        REFERENCED          clock's reference bit (0 or 1)
        OLDER, NEWER        neighbours in the recency list of LRU and FIFO (-1: none)
    block_end[block]        end page (exclusive) of the allocation in that 2 MiB block
    state[slot]             int64 scalars carried from call to call: TICK, FAULT_ID, ... below

One row holds everything about a page or a frame, so a random access touches one cache line per table.
Settings reach the loop as two named tuples of numbers: Rules (policies, prefetch, fault batching) and
Costs (the time model). The loop takes numbers, so the policies have codes (LRU, CLOCK, FIFO, ...).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

FREE, HOST, DEVICE = -1, 0, 1                 # tier of a virtual page
LRU, CLOCK, FIFO = 0, 1, 2                    # eviction policies
NO_PREFETCH, SEQUENTIAL, DENSITY = 0, 1, 2    # prefetchers
EVICTION = {"lru": LRU, "clock": CLOCK, "fifo": FIFO}
PREFETCH = {None: NO_PREFETCH, "sequential": SEQUENTIAL, "density": DENSITY}

TIER, FRAME = 0, 1                                          # columns of pages
PAGE, LAST_USE, LOADED_BY, REFERENCED, OLDER, NEWER = range(6)  # columns of frames

TICK = 0        # accesses so far: access number k has tick k
FAULT_ID = 1    # number of the latest fault or alloc: frames with LOADED_BY == FAULT_ID came with it
HAND = 2        # clock's hand: the next frame it looks at
OLDEST = 3      # the recency list's ends (frames; -1: the list is empty)
NEWEST = 4
FREE_HINT = 5   # every frame below it is taken: the lowest free frame is at or above it
N_FREE = 6      # free frames
IN_BATCH = 7    # faults since the last hit (fault batching)
N_SLOTS = 8

Rules = namedtuple("Rules", "eviction prefetch prefetch_pages block_pages leaf_pages density_threshold fault_batch")
Costs = namedtuple("Costs", "page_size hit_s fault_latency link_bandwidth")


def new_frames(device_pages: int) -> np.ndarray:
    """The frame table of an empty device: every frame free, out of the list, never loaded."""
    frames = np.full((int(device_pages), 6), -1, np.int64)
    frames[:, LAST_USE] = frames[:, REFERENCED] = 0
    return frames


def new_state(device_pages: int) -> np.ndarray:
    """The scalars of an empty pool: tick 0, no fault yet, hand at frame 0, empty list, all frames free."""
    state = np.zeros(N_SLOTS, np.int64)
    state[OLDEST] = state[NEWEST] = -1
    state[N_FREE] = device_pages
    return state


def new_pages(n_pages: int) -> np.ndarray:
    """A page table of n_pages FREE pages."""
    pages = np.empty((int(n_pages), 2), np.int64)
    pages[:, TIER], pages[:, FRAME] = FREE, -1
    return pages


def grown(pages: np.ndarray, block_end: np.ndarray, n_pages: int, block_pages: int):
    """(pages, block_end) with room for at least n_pages virtual pages (new pages FREE, a whole number of
    blocks); amortized doubling, so a sequence of allocations copies each row O(1) times."""
    if n_pages <= len(pages):
        return pages, block_end
    size = -(-max(n_pages, 2 * len(pages), 1024) // block_pages) * block_pages
    bigger, bigger_ends = new_pages(size), np.zeros(size // block_pages, np.int64)
    bigger[:len(pages)] = pages
    bigger_ends[:len(block_end)] = block_end
    return bigger, bigger_ends
