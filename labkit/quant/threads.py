"""Run torch on a given number of threads for a while (notebook 03, sections 6 to 8).

On a 2-core laptop that also runs a browser, a torch kernel on 2 threads waits at every step for its slower
thread, the one sharing a core with the other program: the quality sweep took 4-5x longer, GPTQ up to 10x
and the INT4 matmul up to 16x, while the same work on 1 thread slowed down far less. So the sweep, the
sensitivity and GPTQ run on one thread by default (their results are the same on any thread count: the
tests check it), and the matmul timings measure both.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from .._checks import check_positive_int


@contextmanager
def torch_threads(n: int | None, name: str = "n") -> Iterator[int]:
    """Inside the block torch uses `n` threads (None: leave the count as it is); the previous count is
    restored on exit, also after an error. Yields the count in force. `name`: the argument a refusal
    names (a caller's own, e.g. "threads")."""
    before = torch.get_num_threads()
    if n is not None:
        check_positive_int(name, n)
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
