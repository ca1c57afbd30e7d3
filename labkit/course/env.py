"""Environment check and notebook set-up (notebook 00; every notebook's first cell calls `setup`)."""

from __future__ import annotations

import os
import platform
import random
import sys
from importlib import metadata

import labkit

from .._checks import check_int


def setup(min_version: str = "0.1.0", seed: int = 0, threads: int | None = 1) -> None:
    """Check labkit's version, fix every seed, set torch's thread count and plot defaults; prints one line.

    `threads`: torch's intra-op threads for the notebook, 1 by default, at most this machine's cores; None
    leaves the count as it is (torch's default in a fresh kernel: one per core), for the labs that measure
    the machine on every core (01's roofline, 03's INT4 matmul, which also times one thread itself).
    Why one: TinyLM's matmuls are far too small to split, and a split kernel waits at every step for its
    slowest thread. On a 2-core laptop busy with other work, lab 05's TinyLM generated 8-10 tokens/s on
    torch's 2 threads against about 200 on one."""
    import matplotlib
    import numpy as np
    import torch

    from packaging.version import InvalidVersion, Version

    try:
        needed = Version(min_version)
    except (InvalidVersion, TypeError):
        raise ValueError(f"min_version must be a version string such as '0.1.0', got {min_version!r}") from None
    check_int("seed", seed, 0, 2**32 - 1)
    if threads is not None:
        check_int("threads", threads, 1, os.cpu_count() or 1,
                  f"torch threads: this machine has {os.cpu_count() or 1} cores; None keeps torch's count")
    if Version(labkit.__version__) < needed:
        raise RuntimeError(f"this notebook needs labkit >= {min_version}, found {labkit.__version__}; "
                           f"run `make lab` from the repository root to update")
    if threads is not None:
        torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    matplotlib.rcParams.update({"figure.figsize": (7, 3.5), "figure.dpi": 90, "axes.grid": True,
                                "axes.spines.top": False, "axes.spines.right": False})
    print(f"labkit {labkit.__version__} ready; seed {seed}")


def requirements() -> list[tuple[str, str]]:
    """(distribution, version specifier) for every dependency labkit declares for this Python."""
    from packaging.requirements import Requirement

    out = []
    for line in metadata.requires("labkit") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            out.append((req.name, str(req.specifier)))
    return out


def check_environment() -> list[dict]:
    """One row per dependency: package, required, installed (None if missing), ok."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    rows = [{"package": "python", "required": ">=3.10", "installed": platform.python_version(),
             "ok": sys.version_info >= (3, 10)}]
    for name, spec in requirements():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        ok = installed is not None and SpecifierSet(spec).contains(Version(installed).public, prereleases=True)
        rows.append({"package": name, "required": spec, "installed": installed, "ok": ok})
    return rows


def environment_table(rows: list[dict] | None = None) -> str:
    """The environment check as a text table: [OK] or [FAIL] per package, with versions."""
    rows = check_environment() if rows is None else rows
    lines = [f"{'':6} {'package':<12} {'required':<12} installed"]
    for r in rows:
        mark = "[OK]" if r["ok"] else "[FAIL]"
        lines.append(f"{mark:6} {r['package']:<12} {r['required']:<12} {r['installed'] or 'missing'}")
    return "\n".join(lines)


def total_memory_bytes() -> int | None:
    """Physical memory of this machine in bytes (Linux, macOS); None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def machine_info() -> dict:
    """Cores, memory (bytes and GiB = 2**30 bytes), platform, Python, torch threads, GPU if any."""
    import torch

    memory = total_memory_bytes()
    return {
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_bytes": memory,
        "memory_GiB": None if memory is None else round(memory / 2**30, 1),
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
