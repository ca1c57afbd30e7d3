"""Wall time to execute each notebook top to bottom in a fresh kernel (what nbval does, minus comparing).

    python benchmarks/notebook_time.py [notebooks/00_setup.ipynb ...]
"""

import sys
import time
from pathlib import Path

import nbformat

from labkit.course.classroom import execute

ROOT = Path(__file__).resolve().parent.parent


def main(paths: list[str]) -> None:
    paths = [Path(p) for p in paths] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        t0 = time.perf_counter()
        execute(nb, cwd=path.parent, timeout=600)
        print(f"{path.name}: {time.perf_counter() - t0:.1f} s (kernel start included)")


if __name__ == "__main__":
    main(sys.argv[1:])
