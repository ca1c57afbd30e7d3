"""The three overlaps lab 04 teaches, on 2 real gloo ranks, each against the same work without overlap.

    python benchmarks/parallel_overlap.py [repeats]

(a) pipeline sends during compute, (b) a TP all-reduce under another micro-batch's matmuls, (c) bucketed
gradient all-reduces for several bucket sizes, all from labkit.parallel.overlap_cases, bigger than the
notebook's. Each case runs `repeats` rounds (default 9), the two modes in alternating order, and a direction is
stated only when the repeats separate (labkit.course.evidence); otherwise the line says "unreliable on this
run". On 2 cores gloo's threads compete with the matmuls, so overlap may not pay here: the script reports
what it measures. Run it alone (flock /tmp/heavy.lock). Copy the output into benchmarks/RESULTS.md.
"""

import statistics
import sys

from labkit.parallel import Pool, overlap_cases


def _line(label: str, seconds: dict) -> str:
    med = {m: statistics.median(seconds[m]) * 1e3 for m in overlap_cases.MODES}
    return (f"{label:<34} sequential {med['sequential']:7.1f} ms  overlapped {med['overlapped']:7.1f} ms  "
            f"{overlap_cases.verdict(seconds)}")


def main(repeats: int = 9) -> None:
    with Pool(2) as pool:
        run = overlap_cases.run_case("pipeline", pool=pool, repeats=repeats, microbatches=8, rows=512, width=512,
                                     depth=4)
        print(_line("(a) pipeline, 8 x 1 MB activations", run["seconds"]))
        run = overlap_cases.run_case("tp", pool=pool, repeats=repeats, layers=8, rows=512, width=512, depth=2)
        print(_line("(b) TP, 2 micro-batches x 8 layers", run["seconds"]))
        for per_bucket in (1, 2, 4, 8, 16):
            run = overlap_cases.run_case("buckets", pool=pool, repeats=repeats, layers=16, rows=256, width=512,
                                         depth=3, bucket_layers=per_bucket)
            kb = run["ranks"][0]["bucket_bytes"] // 1024
            print(_line(f"(c) buckets of {kb:>5} KB ({run['ranks'][0]['buckets']:>2} buckets)", run["seconds"]))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
