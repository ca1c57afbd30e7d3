"""The builds of lab 03's C rungs (labkit/quant/int4_gemv.c) that the kernel tests run under, beside the one this
machine picks for itself: `make test-builds` (CI runs it after `make test`) runs those tests once per build this
host can execute, whatever its CPU, so that no expectation holds only for the build a maintainer's CPU gets.

    .venv/bin/python -m tests.quant.builds           # every build this host runs (about 15 s each)
    .venv/bin/python -m tests.quant.builds --list    # the builds, and which this host runs or why not
    .venv/bin/python -m tests.quant.builds --other-lanes-flags   # what make test-portable builds the rungs with

A build is an environment: $LABKIT_CFLAGS (lanes, instruction set, OpenMP), $CC (another compiler) or
LABKIT_C=0 (no C rungs). Whether this CPU runs one is the library's own answer (kernels_c.available: it names
the instructions the CPU lacks), asked in a fresh process with that environment."""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ("tests/quant/test_kernels.py", "tests/quant/test_kernels_c.py", "tests/quant/test_kernels_speed.py")
X86 = platform.machine() in ("x86_64", "AMD64")

# Every x86 build of rungs 6-7: (name, flags, lanes, rung 7's path). tests/quant/test_kernels_c.py compiles each on
# every x86 host and runs it where the CPU has its instructions.
X86_BUILDS = [
    ("plain C", "-O3 -fopenmp -mno-avx2", 8, "plain C"),  # -mno-avx2 for compilers that default to AVX2
    ("plain C, 16 lanes", "-O3 -fopenmp -mno-avx2 -DLANES=16", 16, "plain C"),
    ("AVX2", "-O3 -march=haswell -fopenmp", 8, "AVX2 vpmaddubsw + vpmaddwd"),
    ("AVX2, 16 lanes", "-O3 -march=haswell -fopenmp -DLANES=16", 16, "AVX2 vpmaddubsw + vpmaddwd"),
    ("VNNI emulated", "-O3 -march=haswell -fopenmp -DLABKIT_EMULATE_VNNI", 8,
     "vpdpbusd emulated in AVX2 (a test build)"),
    ("VNNI emulated, 16 lanes", "-O3 -march=haswell -fopenmp -DLABKIT_EMULATE_VNNI -DLANES=16", 16,
     "vpdpbusd emulated in AVX2 (a test build)"),
    ("AVX-VNNI", "-O3 -march=haswell -mavxvnni -fopenmp", 8, "AVX-VNNI vpdpbusd"),
    ("AVX-512, no VNNI", "-O3 -march=x86-64-v4 -fopenmp", 16, "AVX2 vpmaddubsw + vpmaddwd"),
    ("AVX-512 VNNI", "-O3 -march=x86-64-v4 -mavx512vnni -fopenmp", 16, "AVX-512 VNNI vpdpbusd"),
    ("AVX-512 VNNI, 8 lanes", "-O3 -march=x86-64-v4 -mavx512vnni -fopenmp -DLANES=8", 8, "AVX-512 VNNI vpdpbusd"),
]


def builds() -> list[tuple[str, dict[str, str]]]:
    """(name, environment) of every build the kernel tests run under here, beside this machine's own."""
    out = [(name, {"LABKIT_CFLAGS": flags}) for name, flags, _, _ in X86_BUILDS] if X86 else [
        ("plain C", {"LABKIT_CFLAGS": "-O3 -fopenmp"}), ("16 lanes", {"LABKIT_CFLAGS": "-O3 -fopenmp -DLANES=16"})]
    out.append(("this CPU's own, the other lane count", {"LABKIT_CFLAGS": other_lanes_flags()}))
    if shutil.which("clang"):
        out.append(("clang, this CPU's own", {"CC": "clang"}))
    out.append(("no C rungs (LABKIT_C=0)", {"LABKIT_C": "0"}))
    return out


def other_lanes_flags() -> str:
    """$LABKIT_CFLAGS for this CPU's own instructions with the lane count it would not choose (16 where it builds
    8, 8 where it builds 16): `make test-portable` runs the notebooks with it, so that a stored output that depends
    on the lanes fails on every machine. "" where rungs 6-7 are not built here."""
    from labkit.quant import kernels_c

    here = kernels_c.build()
    if here is None:
        return ""
    return " ".join([*(f for f in here.flags if not f.startswith("-DLANES=")), f"-DLANES={24 - here.lanes}"])


def runs_here(env: dict[str, str]) -> tuple[bool, str]:
    """Whether this host runs a build (kernels_c.available in a process with that environment), and its line."""
    if env.get("LABKIT_C") == "0":
        return True, "LABKIT_C=0"
    code = "from labkit.quant import kernels_c; ok, how = kernels_c.available(); print(int(ok), how)"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    ok, _, how = done.stdout.strip().partition(" ")
    return ok == "1", how or done.stderr.strip()[-300:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the builds and whether this host runs each")
    parser.add_argument("--other-lanes-flags", action="store_true", help="print other_lanes_flags() and stop")
    args = parser.parse_args(argv)
    if args.other_lanes_flags:
        print(other_lanes_flags())
        return 0
    failed, ran = [], 0
    for name, env in builds():
        ok, how = runs_here(env)
        settings = " ".join(f"{k}={v!r}" for k, v in env.items())
        print(f"{'runs' if ok else 'not here':>8}  {name:<40} {settings}\n          {how}", flush=True)
        if not ok or args.list:
            if not ok and "lacks" not in how:  # a build every CPU of this kind must run failed to build
                failed.append(name)
            continue
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *TESTS],
                              env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        print("          " + (done.stdout.strip().splitlines() or ["(no output)"])[-1], flush=True)
        ran += 1
        if done.returncode:
            failed.append(name)
            print(done.stdout[-6000:], done.stderr[-2000:], sep="\n")
    print(f"kernel tests under {ran} builds: {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
