"""int4_gemv.c for the CPUs and compilers this machine is not (labkit.quant.kernels_c's source): it compiles
without a warning (-Wall -Wextra -Werror) under GCC and clang, with and without OpenMP, for x86-64 (every build
of its paths, whether this CPU runs them or not) and aarch64 (cross-compiled); the aarch64 build, run under
qemu-user through a small harness (int4_harness.c), computes rungs 6 and 7 equal to the float64 references on cases
laid out by kernels_c.lay_out, for 8 and 16 lanes and with and without OpenMP. The tools come from Debian's archive
(.ci/run installs them: clang, libomp-dev, gcc-aarch64-linux-gnu, qemu-user); where one is missing its tests skip,
naming the package."""
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from labkit.quant import kernels_c as kc
from labkit.quant.qtensor import quantize

from .builds import X86, X86_BUILDS
from .test_kernels import close, exact, int8_exact, layer

HARNESS = Path(__file__).with_name("int4_harness.c")
AARCH64_GCC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"


def tool(name: str, package: str):
    """A skip mark for tests that need `name` on PATH (Debian's `package`)."""
    return pytest.mark.skipif(shutil.which(name) is None, reason=f"{name} is not installed (apt-get install {package})")


def compile_cleanly(cc: list[str], flags: str, tmp_path: Path) -> None:
    """cc compiles int4_gemv.c to an object with `flags`, no warning."""
    done = subprocess.run([*cc, *flags.split(), "-Wall", "-Wextra", "-Werror", "-c", str(kc.SOURCE),
                           "-o", str(tmp_path / "int4_gemv.o")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr, f"{' '.join(cc)} {flags}:\n{done.stderr}"


def omp_flags(cc: str) -> list[str]:
    """With and without OpenMP, where `cc` links an OpenMP program (clang needs libomp, which a learner's macOS
    often lacks: then its build is tested without)."""
    links = subprocess.run([cc, "-fopenmp", "-x", "c", "-", "-o", os.devnull], input="int main(void) { return 0; }",
                           capture_output=True, text=True, timeout=60).returncode == 0
    return [" -fopenmp", ""] if links or cc != "clang" else [""]


X86_FLAGS = sorted({flags.replace(" -fopenmp", "") for _, flags, _, _ in X86_BUILDS} | {"-O3", "-O3 -march=native"})


@pytest.mark.skipif(not X86, reason="x86-64 builds run on an x86-64 host")
@pytest.mark.parametrize("cc", [pytest.param("gcc", marks=tool("gcc", "gcc")),
                                pytest.param("clang", marks=tool("clang", "clang"))])
def test_every_x86_build_compiles_without_a_warning(cc, tmp_path):
    # every instruction set with OpenMP where cc has it; without OpenMP the source differs in one macro
    # (PARALLEL_FOR), whatever the instruction set: a plain and a native build check that path
    omp = omp_flags(cc)
    for flags in X86_FLAGS:
        compile_cleanly([cc], flags + omp[0], tmp_path)
    if len(omp) > 1:
        for flags in ("-O3", "-O3 -march=native"):
            compile_cleanly([cc], flags, tmp_path)


@tool(AARCH64_GCC, "gcc-aarch64-linux-gnu")
def test_the_aarch64_build_compiles_without_a_warning(tmp_path):
    for flags in ("-O3", "-O3 -DLANES=16", "-O3 -mcpu=neoverse-n1", "-O3 -mcpu=neoverse-v1"):  # Graviton 2, 3
        for omp in (" -fopenmp", ""):
            compile_cleanly([AARCH64_GCC], flags + omp, tmp_path)


@tool("clang", "clang")
def test_the_aarch64_build_compiles_with_clang_as_on_a_mac(tmp_path):
    # Apple's clang targets arm64 without OpenMP unless libomp is installed
    for flags in ("-O3 -mcpu=apple-m1", "-O3 -mcpu=apple-m1 -fopenmp", "-O3 -DLANES=16"):
        compile_cleanly(["clang", "--target=aarch64-linux-gnu"], flags, tmp_path)


def write_case(path: Path, x: torch.Tensor, q, block: int, lanes: int) -> int:
    """The harness's case file for x [M, K] against QTensor q (groups of a multiple of 8 inputs); returns N."""
    layout = kc.lay_out(q.codes.numpy(), q.scale.numpy(), q.zero.numpy(), lanes)
    m, k = x.shape
    groups = q.scale.shape[1]
    x_np = np.ascontiguousarray(x.numpy(), np.float32)
    sums = x_np.reshape(m, groups, -1).sum(-1, dtype=np.float32)
    with open(path, "wb") as f:
        f.write(np.array([m, q.codes.shape[0], k, groups, block, lanes], np.int64).tobytes())
        for a in (x_np, sums, layout.words, layout.scale, layout.offset):
            f.write(np.ascontiguousarray(a).tobytes())
    return q.codes.shape[0]


def cases():
    """(x, q, block): partial row blocks, 1-3 rows, groups of 8 to 128 inputs, and rung 7's int16 limit."""
    for n, groups, group, m, seed in ((37, 14, 32, 1, 7), (50, 4, 128, 3, 5), (8, 3, 16, 2, 1), (21, 8, 8, 1, 2)):
        q, _ = layer(n, groups * group, group, seed=seed)
        x = torch.randn(m, groups * group, generator=torch.Generator().manual_seed(seed + 1))
        yield x, q, min(group, 32)
    w = torch.full((24, 128), 7.0)
    w[:, ::32] = -8.0
    yield torch.full((1, 128), -1.0), quantize(w, 4, "asym", 32), 32


@tool(AARCH64_GCC, "gcc-aarch64-linux-gnu")
@tool(QEMU, "qemu-user")
@pytest.mark.parametrize("flags", ["-O3 -fopenmp", "-O3", "-O3 -fopenmp -DLANES=16"])
def test_the_aarch64_build_under_qemu_equals_the_reference(flags, tmp_path):
    binary = tmp_path / "int4_harness"
    built = subprocess.run([AARCH64_GCC, *flags.split(), "-static", str(HARNESS), str(kc.SOURCE), "-o", str(binary)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    build = subprocess.run([QEMU, str(binary)], capture_output=True, text=True, timeout=60).stdout.split(maxsplit=1)
    lanes = int(build[0])
    assert lanes == (16 if "LANES=16" in flags else 8) and build[1].strip() == "plain C", build
    for i, (x, q, block) in enumerate(cases()):
        n = write_case(tmp_path / f"case{i}", x, q, block, lanes)
        ran = subprocess.run([QEMU, str(binary), str(tmp_path / f"case{i}"), str(tmp_path / f"out{i}")],
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        out = np.fromfile(tmp_path / f"out{i}", np.float32, count=2 * x.shape[0] * n)
        status = np.fromfile(tmp_path / f"out{i}", np.int32, offset=out.nbytes)
        y6, y7 = (torch.from_numpy(a.reshape(x.shape[0], n)) for a in np.split(out, 2))
        assert status.tolist() == [0]
        assert close(y6, exact(x, q), x.shape[1]), (flags, i)
        assert close(y7, int8_exact(x, q, block), x.shape[1]), (flags, i)
