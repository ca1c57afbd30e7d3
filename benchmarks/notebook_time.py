"""Wall time to execute each notebook top to bottom in a fresh kernel (what nbval does, minus comparing).

    python benchmarks/notebook_time.py [--busy N] [notebooks/00_setup.ipynb ...]

--busy N runs N busy-loop processes beside it (a learner's laptop with other programs running: N = 2 keeps
both cores of the course's machine busy); they are stopped when the timing ends.
"""

import argparse
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import nbformat

from labkit.course import timing
from labkit.course.classroom import execute
from labkit.paths import NOTEBOOKS


@contextmanager
def busy_loops(n: int):
    """`n` Python processes spinning on one core each, for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes to run beside (default 0)")
    parser.add_argument("notebooks", nargs="*")
    args = parser.parse_args(argv)
    if args.busy < 0:
        parser.error(f"--busy must be an int >= 0, got {args.busy}")
    paths = [Path(p) for p in args.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        with busy_loops(args.busy):
            seconds = timing.measure(lambda: execute(nb, cwd=path.parent, timeout=600), repeats=1, warmup=0).best
        print(f"{path.name}: {seconds:.1f} s (kernel start included; {args.busy} busy-loop processes beside)")


if __name__ == "__main__":
    main(sys.argv[1:])
