"""The paging loop: every page access of a trace, one at a time (notebook 02 reads `replay`; it is the lesson).

    for each accessed page:
        on the device?  a hit: the policy notes the use; the device reads the page
        on the host?    a fault: decide what moves (the page and what the prefetcher adds), move each one
                        to the lowest free frame or to a victim's frame (the victim goes back to the
                        host), then charge the time: fault latency once per batch, and every page in or
                        out at link bandwidth

The rules are written out in engine.py's docstring; the tables are those of state.py. The same loop writes the
fault log (faultlog.py) when its caller passes one. Compiled with numba when it is installed (jit.py);
`replay.py_func` is the same loop as plain Python. UnifiedMemory calls it.
"""

from __future__ import annotations

from .faultlog import HITS_BEFORE, OPENS, PAGES_IN, PAGES_OUT
from .jit import jit
from .policies import link, pick_victim, release_frame, take_free_frame, touch, unlink
from .prefetch import prefetch_candidates
from .state import (CLOCK, DEVICE, FAULT_ID, FRAME, FREE, HOST, IN_BATCH, LAST_USE, LOADED_BY, N_FREE, PAGE,
                    REFERENCED, TICK, TIER)
from .timeline import record_busy


@jit(inline=True)
def load_page(page, tick, pages, frames, state, eviction):
    """Move `page` (on the host) to the device: into the lowest free frame or, when none is free, into the
    frame of a victim that goes back to the host. Returns the pages evicted (0 or 1)."""
    evicted = 0
    if state[N_FREE] > 0:
        frame = take_free_frame(frames, state)
    else:
        frame = pick_victim(eviction, frames, state)
        victim = frames[frame, PAGE]
        pages[victim, TIER] = HOST
        pages[victim, FRAME] = -1
        if eviction != CLOCK:
            unlink(frame, frames, state)       # the frame re-enters the recency list below, with its new page
        evicted = 1
    pages[page, TIER] = DEVICE
    pages[page, FRAME] = frame
    frames[frame, PAGE] = page
    frames[frame, LAST_USE] = tick
    frames[frame, LOADED_BY] = state[FAULT_ID]
    frames[frame, REFERENCED] = 1
    if eviction != CLOCK:
        link(frame, eviction, frames, state)
    return evicted


@jit
def replay(trace, pages, frames, block_end, state, rules, costs, time_s, timeline, prefetched, counts, log=None,
           hits_before=0):
    """Replay the page numbers of `trace` in order. time_s: simulated seconds so far; timeline: when the link
    was busy (timeline.py); prefetched, counts: scratch space for the prefetchers. log: None, or the rows of a
    fault log (faultlog.py's log_buffer), one written per fault; numba compiles the loop once for None, without
    step 4, and once for a log. hits_before: hits since the last logged fault before this trace. Returns (hits,
    faults, fault batches, migrations, evictions, time_s at the end, hits since the last fault: with a log)."""
    hits = faults = batches = migrations = evictions = 0
    n_frames = len(frames)
    logged_hits, logged_batches = -hits_before, 0           # hits and batches as of the last logged fault
    for page in trace:
        state[TICK] += 1
        tick = state[TICK]

        if pages[page, TIER] == DEVICE:                      # ---- a hit
            hits += 1
            touch(pages[page, FRAME], tick, rules.eviction, frames, state)
            time_s += costs.hit_s                            # the device reads one page
            state[IN_BATCH] = 0                              # a hit ends the batch of faults
            continue

        faults += 1                                          # ---- a fault
        if state[IN_BATCH] % rules.fault_batch == 0:         # the first fault of a batch pays the latency
            batches += 1
            time_s += costs.fault_latency
        state[IN_BATCH] += 1

        # 1. what moves: the faulted page, then the prefetcher's pages (chosen from the tiers as they are now)
        n_prefetched = prefetch_candidates(page, pages, block_end, rules, n_frames - 1, counts, prefetched)
        # 2. move them, the faulted page first; what this fault loads is never its victim
        state[FAULT_ID] += 1
        evicted = load_page(page, tick, pages, frames, state, rules.eviction)
        for extra_page in prefetched[:n_prefetched]:
            evicted += load_page(extra_page, tick, pages, frames, state, rules.eviction)
        migrations += 1 + n_prefetched
        evictions += evicted

        # 3. the link carries every page in and every victim out, one after the other
        busy = (1 + n_prefetched + evicted) * costs.page_size / costs.link_bandwidth
        record_busy(timeline, time_s, time_s + busy)
        time_s += busy

        # 4. the fault log's row (faultlog.py), when the caller keeps one
        if log is not None:
            log[faults - 1, HITS_BEFORE] = hits - logged_hits    # hits since the previous fault
            log[faults - 1, OPENS] = batches - logged_batches    # 1 if this fault opened a batch
            log[faults - 1, PAGES_IN] = 1 + n_prefetched
            log[faults - 1, PAGES_OUT] = evicted
            logged_hits, logged_batches = hits, batches
    return hits, faults, batches, migrations, evictions, time_s, hits - logged_hits


@jit
def place(first, end, pages, frames, state, eviction):
    """alloc(): put pages [first, end) on the device, in free frames (the caller checked there are enough)."""
    state[FAULT_ID] += 1
    for page in range(first, end):
        load_page(page, state[TICK], pages, frames, state, eviction)


@jit
def release(first, end, pages, frames, state, eviction):
    """free(): pages [first, end) leave the pool; their device frames become free."""
    for page in range(first, end):
        if pages[page, TIER] == DEVICE:
            release_frame(pages[page, FRAME], eviction, frames, state)
            pages[page, FRAME] = -1
        pages[page, TIER] = FREE


@jit
def first_outside(trace, pages):
    """Index of the first page of `trace` outside every allocation (negative, past the table, or FREE); -1 if
    none: access_pages checks a whole trace before replaying any of it."""
    for index in range(len(trace)):
        page = trace[index]
        if page < 0 or page >= len(pages) or pages[page, TIER] == FREE:
            return index
    return -1
