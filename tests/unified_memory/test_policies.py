"""The eviction policies on their own, called from Python on a small frame table: the recency list stays in
(last_use, page) order for LRU and load order for FIFO (checked against sorted()), victims skip the current
fault's pages, clock gives a second chance, free frames are taken lowest first."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.unified_memory import policies
from labkit.unified_memory.state import (CLOCK, FAULT_ID, FIFO, HAND, LAST_USE, LOADED_BY, LRU, N_FREE, NEWER, NEWEST,
                                         OLDER, OLDEST, PAGE, REFERENCED, new_frames, new_state)


def walk(frames, state):
    """Frames from the oldest end to the newest, following NEWER; checks OLDER mirrors it."""
    out, frame, previous = [], state[OLDEST], -1
    while frame >= 0:
        assert frames[frame, OLDER] == previous
        out.append(int(frame))
        previous, frame = frame, frames[frame, NEWER]
    assert state[NEWEST] == previous
    return out


def filled(keys, eviction):
    """A full frame table: frame f holds page keys[f][1] with last_use keys[f][0], linked in frame order."""
    frames, state = new_frames(len(keys)), new_state(len(keys))
    for frame, (last_use, page) in enumerate(keys):
        frames[frame, PAGE], frames[frame, LAST_USE] = page, last_use
        policies.link(frame, eviction, frames, state)
    state[N_FREE] = 0
    return frames, state


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 50)), min_size=1, max_size=30, unique_by=lambda k: k[1]),
       st.lists(st.integers(0, 29), max_size=20))
def test_lru_list_is_sorted_by_last_use_then_page_and_fifo_keeps_arrival_order(keys, touched):
    frames, state = filled(keys, LRU)
    assert walk(frames, state) == sorted(range(len(keys)), key=lambda f: keys[f])
    fifo_frames, fifo_state = filled(keys, FIFO)
    assert walk(fifo_frames, fifo_state) == list(range(len(keys)))
    tick = 100
    for f in touched:
        f %= len(keys)
        tick += 1
        policies.touch(f, tick, LRU, frames, state)
        policies.touch(f, tick, FIFO, fifo_frames, fifo_state)
    last = {f: (frames[f, LAST_USE], frames[f, PAGE]) for f in range(len(keys))}
    assert walk(frames, state) == sorted(last, key=last.get)
    assert walk(fifo_frames, fifo_state) == list(range(len(keys)))  # hits do not reorder FIFO
    victim = policies.pick_victim(LRU, frames, state)
    assert victim == min(last, key=last.get)


def test_victims_skip_the_pages_of_the_current_fault():
    frames, state = filled([(1, 10), (2, 11), (3, 12)], LRU)
    state[FAULT_ID] = 7
    frames[0, LOADED_BY] = 7  # the oldest came with this fault
    assert policies.pick_victim(LRU, frames, state) == 1
    frames[:, REFERENCED] = [0, 0, 1]
    state[HAND] = 0
    assert policies.pick_victim(CLOCK, frames, state) == 1 and state[HAND] == 2  # frame 0 skipped, bit kept


def test_clock_second_chance_and_the_hand():
    frames, state = filled([(0, 10), (0, 11), (0, 12), (0, 13)], CLOCK)
    frames[:, REFERENCED] = [1, 0, 1, 1]
    state[HAND] = 2
    assert policies.pick_victim(CLOCK, frames, state) == 1  # 2, 3, 0 had bits: cleared; 1 is the victim
    assert frames[:, REFERENCED].tolist() == [0, 0, 0, 0] and state[HAND] == 2
    frames[:, REFERENCED] = 1
    assert policies.pick_victim(CLOCK, frames, state) == 2  # all set: a full turn clears them, back to 2


def test_free_frames_are_taken_lowest_first():
    frames, state = new_frames(5), new_state(5)
    got = []
    for _ in range(5):
        f = policies.take_free_frame(frames, state)
        frames[f, PAGE] = 100 + f
        policies.link(f, LRU, frames, state)
        got.append(int(f))
    assert got == [0, 1, 2, 3, 4] and state[N_FREE] == 0
    for f in (3, 1):
        policies.release_frame(f, LRU, frames, state)
    assert state[N_FREE] == 2 and walk(frames, state) == [0, 2, 4]
    assert policies.take_free_frame(frames, state) == 1
    frames[1, PAGE] = 7
    assert policies.take_free_frame(frames, state) == 3


def test_no_victim_is_an_error_not_an_endless_search():
    """A fault that has loaded every frame leaves nothing to evict (the prefetchers stop at device_pages - 1
    pages so that it never happens); the search must end with an error, for every policy, compiled or not."""
    for eviction in (LRU, FIFO, CLOCK):
        frames, state = filled([(1, 10), (2, 11), (3, 12)], eviction)
        state[FAULT_ID] = 4
        frames[:, LOADED_BY] = 4
        for pick in (policies.pick_victim, policies.pick_victim.py_func):
            with pytest.raises(RuntimeError, match="no eviction victim"):
                pick(eviction, frames, state)
