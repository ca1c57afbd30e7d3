"""The pool's tables: empty ones are consistent, growing keeps every row and adds FREE pages by whole blocks."""
import numpy as np

from labkit.unified_memory.state import (FRAME, FREE, HOST, LOADED_BY, N_FREE, NEWEST, OLDEST, PAGE, TIER, grown,
                                         new_frames, new_pages, new_state)


def test_empty_tables():
    frames, state, pages = new_frames(3), new_state(3), new_pages(2)
    assert frames.shape == (3, 6) and (frames[:, PAGE] == -1).all() and (frames[:, LOADED_BY] == -1).all()
    assert (state[OLDEST], state[NEWEST], state[N_FREE]) == (-1, -1, 3)
    assert pages.tolist() == [[FREE, -1], [FREE, -1]] and pages.dtype == np.int64


def test_growing_keeps_rows_and_rounds_to_blocks():
    pages, ends = new_pages(0), np.zeros(0, np.int64)
    pages, ends = grown(pages, ends, 10, 8)
    assert len(pages) == 1024 and len(ends) == 128  # at least 1024 rows, a whole number of blocks
    pages[3] = [HOST, -1]
    pages[5] = [1, 2]
    ends[0] = 10
    same = grown(pages, ends, 1000, 8)
    assert same[0] is pages and same[1] is ends  # room enough: unchanged
    bigger, bigger_ends = grown(pages, ends, 1025, 8)
    assert len(bigger) == 2048 and len(bigger_ends) == 256  # doubled
    assert len(grown(bigger, bigger_ends, 5001, 8)[0]) == 5008
    assert bigger[:1024].tolist() == pages.tolist() and (bigger[1024:, TIER] == FREE).all()
    assert (bigger[1024:, FRAME] == -1).all() and bigger_ends[0] == 10
