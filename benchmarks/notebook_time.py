"""Wall time to execute each notebook top to bottom in a fresh kernel (what nbval does, minus comparing).

    python benchmarks/notebook_time.py [notebooks/00_setup.ipynb ...]
"""

import sys
from pathlib import Path

import nbformat

from labkit.course import timing
from labkit.course.classroom import execute
from labkit.paths import NOTEBOOKS


def main(paths: list[str]) -> None:
    paths = [Path(p) for p in paths] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        seconds = timing.measure(lambda: execute(nb, cwd=path.parent, timeout=600), repeats=1, warmup=0).best
        print(f"{path.name}: {seconds:.1f} s (kernel start included)")


if __name__ == "__main__":
    main(sys.argv[1:])
