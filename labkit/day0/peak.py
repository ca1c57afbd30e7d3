"""Peak memory of one rank's load, measured in a fresh process (notebook 07, section 3; benchmarks/day0_load.py):
slices read with labkit.day0.loading against whole tensors read and then cut, above a baseline taken after
the imports with glibc's freed heap returned first. Linux only (/proc/self/status, /proc/self/clear_refs)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass

from safetensors import safe_open

from .._checks import check_choice, check_positive
from .loading import as_release, check_rank, load_rank, rank_tensors
from .release import Release, read_release

PEAK_CHILD = ("import json, sys; from labkit.day0 import peak; "
              "print(json.dumps(peak.peak_here(*sys.argv[1:5])))")
SAMPLE_S = 0.0002
"""Seconds between two samples of RssAnon / RssFile while a load runs (peak_here)."""


@dataclass(frozen=True)
class LoadPeak:
    """One rank's load measured in a fresh process, bytes above a baseline taken after the imports and
    read_release, with glibc's freed heap returned first (malloc_trim):
        total      peak resident set (VmHWM, the kernel's own peak: exact)
        anonymous  the largest RssAnon sampled during the load: memory this process owns (the copies)
        file       the largest RssFile sampled: pages of the shards mapped by safetensors (page cache,
                   reclaimable; they count in the resident set while mapped)
        kept       bytes of the loaded tensors, held when the peak is read
    anonymous and file are sampled every SAMPLE_S seconds by a thread: lower bounds of their peaks.
    notes: what could not be done here (no malloc_trim, no clear_refs), empty when everything could."""
    mode: str
    total: int
    anonymous: int
    file: int
    kept: int
    notes: tuple[str, ...] = ()


def _status(*fields: str) -> dict[str, int]:
    """/proc/self/status memory fields in bytes (VmRSS: resident now, VmHWM: its peak, RssAnon, RssFile)."""
    with open("/proc/self/status") as f:
        found = {k: int(v.split()[0]) * 1024 for k, _, v in (line.partition(":") for line in f) if k in fields}
    return {k: found[k] for k in fields}


class _Sampler(threading.Thread):
    """The largest RssAnon and RssFile seen while it runs (every SAMPLE_S seconds)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.done, self.peak = threading.Event(), _status("RssAnon", "RssFile")

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            self.peak = {k: max(v, self.peak[k]) for k, v in _status("RssAnon", "RssFile").items()}

    def stop(self) -> dict[str, int]:
        self.done.set()
        self.join()
        end = _status("RssAnon", "RssFile")  # the end state counts too
        return {k: max(v, end[k]) for k, v in self.peak.items()}


def _baseline() -> list[str]:
    """Return freed heap to the system and reset the peak (VmHWM) to the current resident set; what could not
    be done, for LoadPeak.notes."""
    notes = []
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        notes.append("malloc_trim unavailable (not glibc): freed heap may sit in the baseline")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
    except OSError:
        notes.append("clear_refs refused: the peak includes what the imports used")
    return notes


def _load_whole(release: Release, wanted: dict) -> dict:
    """The whole-tensor loader: each shard opened once, each full tensor read into memory this process owns
    (get_tensor is a view of the mapping: the clone is the read), then the rank's slice copied out of it."""
    kept = {}
    for file in sorted({f for f, _ in wanted.values()}):
        with safe_open(str(release.folder / file), "pt") as f:
            for name in [n for n, (g, _) in wanted.items() if g == file]:
                whole = f.get_tensor(name).clone()
                spec = wanted[name][1]
                kept[name] = whole if spec == (slice(None),) else whole[spec].clone()
                del whole
    return kept


def peak_here(folder: str, mode: str, rank: str, tp: str) -> dict:
    """In this process: what rank `rank` of `tp` loading its part costs in memory ("slices": load_rank with
    one thread; "whole": _load_whole), as a LoadPeak's fields. measure_load_memory runs it in a fresh process."""
    release, rank, tp = read_release(folder), int(rank), int(tp)
    wanted = rank_tensors(release, rank, tp)
    check_choice("mode", mode, ("slices", "whole"))
    notes = _baseline()
    base = _status("VmRSS", "RssAnon", "RssFile")
    sampler = _Sampler()
    sampler.start()
    kept = load_rank(release, rank, tp, threads=1)[0] if mode == "slices" else _load_whole(release, wanted)
    seen = sampler.stop()
    total = _status("VmHWM")["VmHWM"] - base["VmRSS"]  # read while `kept` (the loaded part) is still held
    held = sum(t.numel() * t.element_size() for t in kept.values())
    return asdict(LoadPeak(mode, total, seen["RssAnon"] - base["RssAnon"], seen["RssFile"] - base["RssFile"], held,
                           tuple(notes)))


def measure_load_memory(folder, mode: str = "slices", rank: int = 0, tp: int = 2, timeout: float = 120.0) -> LoadPeak:
    """Peak memory of one rank's load ("slices" or "whole", see peak_here), measured in a fresh Python process
    (LoadPeak: total, anonymous and file-backed separately). safetensors maps the files, so every page a read
    touches counts as resident (file pages: reclaimable, but in the peak); a "row" slice touches every page of
    its tensor, so slicing saves fewer file pages than the bytes suggest; "whole" adds each full tensor's
    anonymous copy. Linux only (/proc). Notebook 07 and benchmarks/day0_load.py compare the modes."""
    release = as_release(folder)
    check_choice("mode", mode, ("slices", "whole"))
    rank, tp = check_rank(release, rank, tp)
    run = subprocess.run([sys.executable, "-c", PEAK_CHILD, str(release.folder.resolve()), mode, str(rank), str(tp)],
                         capture_output=True, text=True, timeout=check_positive("timeout", timeout))
    if run.returncode:
        raise RuntimeError(f"the measuring process failed: {run.stderr.strip()[-400:]}")
    fields = json.loads(run.stdout.strip().splitlines()[-1])
    return LoadPeak(**{**fields, "notes": tuple(fields["notes"])})


def measure_load_peak(folder, mode: str = "slices", rank: int = 0, tp: int = 2, timeout: float = 120.0) -> int:
    """measure_load_memory(...).total: the peak resident bytes (anonymous + file-backed) of one rank's load."""
    return measure_load_memory(folder, mode, rank, tp, timeout).total
