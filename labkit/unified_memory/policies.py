"""Eviction policies: which device frame to empty when a fault finds none free (notebook 02, section 2).
Compiled with the paging loop (jit.py); they read and write the frame table of state.py.

    LRU    the page with the smallest (last_use, page): least recently used, ties by page number
    FIFO   the page loaded longest ago, used or not
    CLOCK  second chance: a hand sweeps the frames; a set reference bit is cleared and the frame skipped,
           the first frame whose bit is already clear is the victim

LRU and FIFO keep the full frames in one doubly linked list, oldest <-> newest (columns OLDER and NEWER),
so the victim is at the oldest end and a hit moves its frame to the newest end, both in O(1):

    OLDEST -> [f3] <-> [f0] <-> [f7] <-> [f2] <- NEWEST         LRU: ordered by (last_use, page)
              victim                     a hit moves here       FIFO: ordered by load

Pages loaded by the fault being served (LOADED_BY == state[FAULT_ID]) are never victims.
"""

from __future__ import annotations

from .jit import jit
from .state import (CLOCK, FAULT_ID, FREE_HINT, HAND, LAST_USE, LOADED_BY, LRU, N_FREE, NEWER, NEWEST, OLDER,
                    OLDEST, PAGE, REFERENCED)


@jit(inline=True)
def join(older, newer, frames, state):
    """Make `older` and `newer` neighbours in the recency list (-1 for either: that end of the list)."""
    if older >= 0:
        frames[older, NEWER] = newer
    else:
        state[OLDEST] = newer
    if newer >= 0:
        frames[newer, OLDER] = older
    else:
        state[NEWEST] = older


@jit(inline=True)
def unlink(frame, frames, state):
    """Take `frame` out of the recency list."""
    join(frames[frame, OLDER], frames[frame, NEWER], frames, state)
    frames[frame, OLDER] = -1
    frames[frame, NEWER] = -1


@jit(inline=True)
def comes_after(frame, other, frames):
    """LRU order: the key (last_use, page) of `frame` is larger than that of `other`."""
    if frames[frame, LAST_USE] != frames[other, LAST_USE]:
        return frames[frame, LAST_USE] > frames[other, LAST_USE]
    return frames[frame, PAGE] > frames[other, PAGE]


@jit(inline=True)
def link(frame, eviction, frames, state):
    """Put `frame` into the recency list: FIFO at the newest end; LRU in (last_use, page) order, found by
    stepping back from the newest end past every larger key (no step, except for the pages of one fault
    that share a tick and arrive out of page order: the faulted page comes before its prefetched pages)."""
    before = state[NEWEST]  # the frame that will precede `frame`
    if eviction == LRU:
        while before >= 0 and comes_after(before, frame, frames):
            before = frames[before, OLDER]
    after = frames[before, NEWER] if before >= 0 else state[OLDEST]
    join(before, frame, frames, state)
    join(frame, after, frames, state)


@jit(inline=True)
def touch(frame, tick, eviction, frames, state):
    """A hit on the page in `frame` at `tick`: set its reference bit; LRU moves it to the newest end."""
    frames[frame, REFERENCED] = 1
    if eviction == LRU:
        frames[frame, LAST_USE] = tick
        if state[NEWEST] != frame:
            unlink(frame, frames, state)
            link(frame, eviction, frames, state)


@jit(inline=True)
def pick_victim(eviction, frames, state):
    """The frame to empty (every frame is full). Skips the frames the current fault has loaded.

    Bounded by construction: the clock hand goes round at most twice (the first round clears every
    reference bit), the list walk visits each frame once. A fault that loaded every frame leaves no victim
    (the prefetchers stop at device_pages - 1 pages so that this never happens): RuntimeError, not a hang."""
    this_fault = state[FAULT_ID]
    n_frames = len(frames)
    if eviction == CLOCK:
        for _ in range(2 * n_frames):
            frame = state[HAND]
            state[HAND] = (frame + 1) % n_frames
            if frames[frame, LOADED_BY] == this_fault:
                continue                                  # came with this fault: not a candidate
            if frames[frame, REFERENCED]:
                frames[frame, REFERENCED] = 0             # second chance
                continue
            return frame
        raise RuntimeError("no eviction victim: the fault being served loaded every device frame")
    frame = state[OLDEST]                                 # LRU, FIFO: the oldest end of the list
    while frame >= 0 and frames[frame, LOADED_BY] == this_fault:
        frame = frames[frame, NEWER]
    if frame < 0:
        raise RuntimeError("no eviction victim: the fault being served loaded every device frame")
    return frame


@jit(inline=True)
def take_free_frame(frames, state):
    """The lowest free frame, now taken (the caller puts a page in it)."""
    frame = state[FREE_HINT]
    while frame < len(frames) and frames[frame, PAGE] >= 0:  # bounded: N_FREE > 0 says one is free
        frame += 1
    if frame == len(frames):
        raise RuntimeError("no free device frame although the free count says there is one")
    state[FREE_HINT] = frame + 1
    state[N_FREE] -= 1
    return frame


@jit(inline=True)
def release_frame(frame, eviction, frames, state):
    """Empty `frame` (its page was freed): out of the list, free again."""
    if eviction != CLOCK:
        unlink(frame, frames, state)
    frames[frame, PAGE] = -1
    state[N_FREE] += 1
    state[FREE_HINT] = min(state[FREE_HINT], frame)
