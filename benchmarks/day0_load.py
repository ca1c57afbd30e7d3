"""Sharded loading (labkit.day0.loading), in one run: threaded against serial load time, bytes read per rank
against 1/TP of the weights plus the replicated tensors, and peak memory when slicing against loading whole
tensors.

    python benchmarks/day0_load.py [release folder]      (default: data/tinyvlm, else a random ~25 MB release)

Goal: report the threaded/serial ratio measured in the same run (median of interleaved repeats;
"unreliable on this run" when the repeats spread too much), and check bytes read per rank <= total/TP +
replicated. The files sit in the page cache after the first read, so the times are memory-to-memory copies
(plus BF16 conversion), not disk reads. Peak memory is measured per mode in a fresh process
(measure_load_memory): the peak resident set (exact), and its anonymous part (the copies the loader owns) and
file-backed part (the shards' pages mapped by safetensors) separately, each sampled; bytes read are computed
from the slices' shapes (requested, not measured). Copy the output into benchmarks/RESULTS.md.
"""

import sys
import tempfile
from pathlib import Path

import torch

from labkit.course import timing
from labkit.day0 import loading, peak, release
from labkit.day0.config import TextConfig, TinyVLMConfig, VisionConfig
from labkit.day0.model import TinyVLM, tp_plan
from labkit.paths import DATA

TP, REPEATS = 2, 5


def random_release(folder: Path) -> Path:
    """A random TinyVLM of ~25 MB (the size limit of the course's release) in 2 MB shards."""
    torch.manual_seed(0)
    cfg = TinyVLMConfig(TextConfig(d_model=256, n_layers=6, n_heads=8, n_kv_heads=4, d_ff=1024), VisionConfig())
    release.write_release(TinyVLM(cfg).state_dict(), cfg, folder, "2MB")
    return folder


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA / "tinyvlm"
    tmp = tempfile.TemporaryDirectory()
    if not (folder / "config.json").exists():
        folder = random_release(Path(tmp.name))
    rel = release.read_release(folder)
    plan = tp_plan(rel.config)
    total = sum(t.nbytes for n, t in rel.tensors.items() if plan[n] in ("column", "row", "vocab"))
    replicated = sum(t.nbytes for n, t in rel.tensors.items() if plan[n] == "replicated")
    print(f"release {folder}: {len(rel.files)} shards, {rel.total_size / 1e6:.1f} MB, TP={TP}")
    for rank in range(TP):
        stats = loading.load_rank(rel, rank, TP)[1]
        bound = total / TP + replicated
        print(f"rank {rank}: read {stats.bytes_read / 1e6:.2f} MB of {stats.files_opened} files; bound total/TP + "
              f"replicated = {bound / 1e6:.2f} MB ({'within' if stats.bytes_read <= bound else 'ABOVE'})")
    for dtype in (torch.float32, torch.bfloat16):
        runs = timing.interleave({t: (lambda t=t: loading.load_rank(rel, 0, TP, dtype=dtype, threads=t))
                                  for t in (1, 4)}, repeats=REPEATS)
        ratio = runs[1].median / runs[4].median
        noisy = max(runs[1].spread, runs[4].spread) > 0.5
        print(f"{str(dtype).removeprefix('torch.'):<9} serial {runs[1].median * 1e3:6.1f} ms, 4 threads "
              f"{runs[4].median * 1e3:6.1f} ms: threaded is {ratio:.2f}x as fast"
              f"{' (unreliable on this run)' if noisy else ''}")
    runs = {mode: [peak.measure_load_memory(rel, mode, 0, TP) for _ in range(3)] for mode in ("slices", "whole")}
    peaks = {mode: {k: sorted(getattr(r, k) for r in rs)[1] for k in ("total", "anonymous", "file", "kept")}
             for mode, rs in runs.items()}  # medians of 3 fresh processes, field by field
    print("peak memory of rank 0 above the trimmed baseline (median of 3 fresh processes; anonymous and file "
          "sampled):")
    for mode, p in peaks.items():
        print(f"  {mode:<6} total {p['total'] / 1e6:5.1f} MB; anonymous {p['anonymous'] / 1e6:5.1f} MB (kept "
              f"{p['kept'] / 1e6:.1f}); file-backed {p['file'] / 1e6:5.1f} MB (separate peaks: they need not add up)")
    for key in ("total", "anonymous", "file"):
        print(f"  whole / slices, {key}: {peaks['whole'][key] / max(peaks['slices'][key], 1):.2f}")
    notes = sorted({n for rs in runs.values() for r in rs for n in r.notes})
    print("  notes: " + ("; ".join(notes) if notes else "malloc_trim and clear_refs available"))
    tmp.cleanup()


if __name__ == "__main__":
    main()
