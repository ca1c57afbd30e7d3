"""The paging loop compiled (numba) and uncompiled (plain Python, LABKIT_JIT=0) gives identical counters,
time and placement; alloc/free through place/release keep the tables consistent."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from labkit.unified_memory import UnifiedMemory, jit, loop
from labkit.unified_memory.faultlog import log_buffer

PS = 4096
CASES = [(e, p, b) for e in ("lru", "clock", "fifo") for p in (None, "sequential", "density") for b in (1, 3)]
SCRIPT = """
import json, sys
import numpy as np
from labkit.unified_memory import UnifiedMemory, jit, loop

def run(eviction, prefetch, fault_batch):
    um = UnifiedMemory(24 * 4096, 200 * 4096, eviction=eviction, prefetch=prefetch, fault_batch=fault_batch,
                       prefetch_pages=3, block_bytes=16 * 4096, leaf_bytes=2 * 4096)
    a = um.alloc(150 * 4096)
    b = um.alloc(40 * 4096)
    rng = np.random.default_rng(3)
    um.access_pages(np.concatenate([np.tile(np.arange(150), 2), rng.integers(0, 150, 400)]) + a.first_page)
    um.free(b)
    um.access_pages(rng.integers(0, 150, 300) + a.first_page)
    pages = np.arange(a.first_page, a.first_page + 150)
    return {"stats": um.stats.as_dict(), "where": um.where(pages).tolist(), "frames": um.frame_of(pages).tolist(),
            "link": um.timeline.tolist()}

cases = json.loads(sys.argv[1])
print(json.dumps({"compiled": jit.ENABLED, "replay_type": type(loop.replay).__name__,
                  "results": [run(*c) for c in cases]}))
"""


def run_script(jit_flag):
    env = dict(os.environ, LABKIT_JIT=jit_flag)
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CASES)], env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def uncompiled():
    return run_script("0")


def test_plain_python_and_numba_agree_exactly(uncompiled):
    assert uncompiled["compiled"] is False and uncompiled["replay_type"] == "function"
    compiled = run_script("1") if not jit.ENABLED else None
    if compiled is None:  # this process compiles: compare with it directly
        namespace = {}
        exec(SCRIPT.split("cases = json")[0], namespace)
        results = [namespace["run"](*c) for c in CASES]
        assert type(loop.replay).__name__ == "CPUDispatcher"
    else:
        results = compiled["results"]
    for case, mine, theirs in zip(CASES, results, uncompiled["results"]):
        assert mine == theirs, case  # floats too: the same operations in the same order
    assert len({json.dumps(r["stats"]) for r in results}) > 6  # the cases differ from each other


def test_py_func_is_the_same_loop():
    def pool():
        um = UnifiedMemory(5 * PS, 30 * PS, eviction="clock", prefetch="density", block_bytes=8 * PS,
                           leaf_bytes=2 * PS)
        return um, um.alloc(20 * PS)
    trace = np.random.default_rng(0).integers(0, 20, 200)
    results = []
    for fn in (loop.replay, loop.replay.py_func):
        um, a = pool()
        pages, log = trace + a.first_page, log_buffer(len(trace))
        out = fn(pages, um.pages, um.frames, um.block_end, um.state, um.rules, um.costs, 0.0, um.timeline,
                 um._prefetched, um._counts, log, 3)
        results.append((out, um.pages.tolist(), log[:out[1]].tolist()))
    assert results[0] == results[1]
    assert results[0][0][1] > 20  # faults: the device holds 5 of 20 pages
    assert results[0][2][0][0] >= 3  # the first fault's hits before it count the 3 given


def test_place_and_release_keep_pages_and_frames_mirrored():
    um = UnifiedMemory(6 * PS, 2 * PS, eviction="lru")
    a, b = um.alloc(3 * PS), um.alloc(4 * PS)  # a: 2 host + 1 device; b: all 4 on the device
    assert um.where(np.arange(3) + a.first_page).tolist() == [0, 0, 1]
    assert um.frame_of(np.arange(4) + b.first_page).tolist() == [1, 2, 3, 4]
    um.free(a)
    c = um.alloc(2 * PS)  # the host has room again: both on the host
    um.access(c)           # two faults take the lowest free frames: 0 (a's), then 5
    assert um.frame_of(np.arange(2) + c.first_page).tolist() == [0, 5]
    held = um.frames[um.frames[:, 0] >= 0, 0]
    assert sorted(held.tolist()) == sorted(np.flatnonzero(um.pages[:, 0] == 1).tolist())
