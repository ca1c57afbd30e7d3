"""Rungs 6 and 7's build (labkit.quant.kernels_c): the layout they read holds every code, scale and offset where its
comment says, for both lane counts; the library is built once and found again; builds for AVX2 with 8 lanes and
with AVX-512's 16 give the same product as the native one, and a build without SIMD (rung 7's plain-C path) the
same as the AVX2 one; threads give the same product; rung 7 stays exact at the int16 limit of its byte products;
a weight keeps the build it was laid out for, and a layout alone for another build is refused; a layout refuses
arrays the C loops cannot read, and its arrays cannot be resized under it; a machine without a working C compiler
gets a reason and a clean refusal instead of a crash (the other rungs and the ladder go on)."""
import copy
import ctypes
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from labkit.quant import kernels as kk
from labkit.quant import kernels_c as kc
from labkit.quant import kernels_speed as ks
from labkit.quant.qtensor import quantize

from .builds import X86, X86_BUILDS
from .test_kernels import close, exact, int8_exact, layer

needs_c = pytest.mark.skipif(not kc.available()[0], reason=f"rungs 6-7 are not built here: {kc.available()[1]}")


@pytest.mark.parametrize("lanes", [8, 16])
def test_the_layout_against_its_definition(lanes):
    rng = np.random.default_rng(lanes)
    n, k, groups = 2 * lanes + 3, 48, 3  # a partial last block of rows; groups of 16 inputs = 2 words
    codes = rng.integers(-8, 8, size=(n, k), dtype=np.int8)
    scale = rng.random((n, groups), dtype=np.float32) + 0.5
    zero = rng.integers(-8, 8, size=(n, groups)).astype(np.float32)
    out = kc.lay_out(codes, scale, zero, lanes)
    assert out.words.shape == (3, k // 8, lanes) and out.words.dtype == np.uint32 and out.lanes == lanes
    assert out.scale.shape == out.offset.shape == (3, groups, lanes)
    for row in range(3 * lanes):  # row = b * lanes + l; input i = 8j + t sits in nibble t of word j, lane l
        b, lane = divmod(row, lanes)
        for i in range(k):
            nibble = (int(out.words[b, i // 8, lane]) >> 4 * (i % 8)) & 15
            assert nibble == (codes[row, i] + 8 if row < n else 0)
        for g in range(groups):
            if row < n:
                assert out.scale[b, g, lane] == scale[row, g]
                assert out.offset[b, g, lane] == np.float32(scale[row, g] * (np.float32(24) + zero[row, g]))
            else:
                assert out.scale[b, g, lane] == out.offset[b, g, lane] == 0


@needs_c
@pytest.mark.parametrize("threads", [1, 2])
def test_threads_give_the_same_product(threads):
    q, _ = layer(50, 4 * 128 + 64, 64, seed=5)  # 50 rows: a partial last block
    x = torch.randn(3, 4 * 128 + 64, generator=torch.Generator().manual_seed(6))
    with kk.threads(min(threads, kk.jit.max_threads())):
        y, y_int8 = kk.compiled_c(x, q), kk.compiled_c_int8(x, q)
    assert close(y, exact(x, q), 576) and close(y_int8, int8_exact(x, q, 32), 576)


@needs_c
def test_the_library_is_cached_per_source_and_compiler():
    path, why = kc._build(kc.compiler(), kc.FLAGS[-1])
    assert why == "" and path.is_file()
    again, _ = kc._build(kc.compiler(), kc.FLAGS[-1])
    assert again == path  # found, not rebuilt


def _build_or_skip(monkeypatch, flags: str) -> str:
    """Builds rungs 6-7 with `flags` ($LABKIT_CFLAGS) and returns available()'s line; skips, naming the
    instructions, where this CPU lacks them (the build itself must succeed everywhere)."""
    monkeypatch.setenv("LABKIT_CFLAGS", flags)
    ok, how = kc.available()
    if not ok and "built for instructions this CPU lacks" in how:
        pytest.skip(f"this CPU cannot run {flags}: it lacks {how.split('lacks (')[-1].rstrip(')')}")
    assert ok, how
    return how


@needs_c
@pytest.mark.skipif(not X86, reason="x86 flags")
@pytest.mark.parametrize("name, flags, lanes, path", X86_BUILDS, ids=[b[0] for b in X86_BUILDS])
def test_every_x86_build_gives_the_same_product(monkeypatch, name, flags, lanes, path):
    q, x = layer(37, 448, 32, seed=7)  # 37 rows: a partial block of 8 and of 16 rows
    xx = torch.cat([x, -x])  # two rows
    native = kk.pack_weight(q)  # this run's own build (make test-builds runs this file under each build)
    y_native, native_build = kk.compiled_c(x, native), native.lanes.library
    how = _build_or_skip(monkeypatch, flags)
    assert how.endswith(f"{lanes} float lanes, rung 7 in {path}"), how
    here = kc.build()  # the structured description says the same as the line, and what the library reports
    assert (here.flags, here.lanes, here.int8_path, here.openmp) == (tuple(flags.split()), lanes, path,
                                                                    "-fopenmp" in flags)
    assert str(here) == how and here.lanes == kc.lanes()
    w = kk.pack_weight(q)
    assert w.lanes.lanes == lanes
    assert close(kk.compiled_c(x, w), exact(x, q), 448) and close(y_native, exact(x, q), 448)
    assert close(kk.compiled_c_int8(x, w), int8_exact(x, q, 32), 448)
    assert close(kk.compiled_c_int8(xx, w), int8_exact(xx, q, 32), 448)
    # a weight keeps the build it was laid out for, whatever was built since
    assert close(kk.compiled_c(x, native), y_native, 448) and native.lanes.library is native_build
    assert close(kk.compiled_c_int8(x, native), int8_exact(x, q, 32), 448)


@needs_c
@pytest.mark.skipif(not X86, reason="x86 flags")
@pytest.mark.parametrize("lanes", [8, 16])
def test_the_byte_product_paths_give_the_same_bits(monkeypatch, lanes):
    # the same flags but for rung 7's instructions: the int32 sums are exact on every path, so y is equal to the bit
    q, x = layer(37, 448, 32, seed=12)
    x = torch.cat([x, -3 * x])
    ys = {}
    for flags in ("-O3 -march=haswell -fopenmp", "-O3 -march=haswell -fopenmp -DLABKIT_EMULATE_VNNI",
                  "-O3 -march=haswell -fopenmp -mavxvnni"):
        monkeypatch.setenv("LABKIT_CFLAGS", f"{flags} -DLANES={lanes}")
        ok, how = kc.available()
        if ok:
            ys[how.split("rung 7 in ")[1]] = kk.compiled_c_int8(x, kk.pack_weight(q))
        else:
            assert how.endswith("this CPU lacks (avxvnni)" if "-mavxvnni" in flags else "this CPU lacks (avx2)"), how
    if len(ys) < 2:
        pytest.skip("this CPU runs fewer than two of rung 7's byte-product paths")
    first = next(iter(ys.values()))
    assert all(torch.equal(y, first) for y in ys.values()), list(ys)
    assert close(first, int8_exact(x, q, 32), 448)


@needs_c
def test_a_layout_alone_for_other_lanes_is_refused(monkeypatch):
    q, x = layer(37, 448, 32, seed=7)
    lanes = kc.lanes()
    alone = kc.lay_out(q.codes.numpy(), q.scale.numpy(), q.zero.numpy(), 24 - lanes)  # 16 or 8: the other count
    y = np.empty((1, 37), np.float32)
    with pytest.raises(RuntimeError, match=f"laid out for {24 - lanes} lanes, rungs 6 and 7 are built here for "
                                           f"{lanes}"):
        kc.gemv_int8(x.numpy(), 32, 14, alone, 37, 1, y)
    kc.gemv_int8(x.numpy(), 32, 14, kc.lay_out(q.codes.numpy(), q.scale.numpy(), q.zero.numpy(), lanes), 37, 1, y)
    assert close(torch.from_numpy(y), int8_exact(x, q, 32), 448)


@needs_c
def test_two_cpus_get_two_libraries(monkeypatch, tmp_path):
    # the same source, compiler and flags (-march=native) on two CPUs: what the flags target differs, and so does
    # the library's name in a folder both share
    monkeypatch.setattr(kc, "_folders", lambda: [tmp_path])
    cc, flags = kc.compiler(), ("-O3",)
    libraries = []
    for cpu in ("#define __AVX2__ 1", "#define __AVX2__ 1\n#define __AVX512F__ 1"):
        monkeypatch.setattr(kc, "target", lambda cc, flags, cpu=cpu: cpu)
        lib, why = kc._build(cc, flags)
        assert why == "" and lib.is_file()
        libraries.append(lib)
    assert libraries[0] != libraries[1] and sorted(tmp_path.glob("*.so")) == sorted(libraries)


@needs_c
@pytest.mark.skipif(not (X86 and Path("/proc/cpuinfo").exists()), reason="x86 Linux: /proc/cpuinfo's flags")
def test_what_native_targets_follows_this_cpu():
    flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split()[2:])
    native = kc.target(kc.compiler(), ("-O3", "-march=native"))
    for macro, flag in (("__AVX2__", "avx2"), ("__AVX512F__", "avx512f"), ("__AVX512VNNI__", "avx512_vnni"),
                        ("__AVXVNNI__", "avx_vnni")):
        if "clang" in kc.compiler() and macro == "__AVXVNNI__":
            continue
        assert (f"#define {macro} 1" in native) == (flag in flags), (macro, flag)


@needs_c
@pytest.mark.skipif(not X86, reason="x86 flags")
def test_a_library_for_instructions_this_cpu_lacks_is_refused(monkeypatch):
    # built here for another CPU (as a library in a shared folder would be): refused before its vector code runs,
    # and the other rungs go on
    for name, flags, _, _ in X86_BUILDS[::-1]:  # the widest first
        monkeypatch.setenv("LABKIT_CFLAGS", flags)
        ok, how = kc.available()
        if not ok:
            break
    else:
        pytest.skip("this CPU runs every x86 build in the table")
    assert f"{flags}: built for instructions this CPU lacks (" in how, how
    q, x = layer(8, 64, 32)
    assert kk.pack_weight(q).lanes is None
    with pytest.raises(RuntimeError, match="lacks"):
        kk.compiled_c_int8(x, q)
    assert close(kk.blocked(x, q), exact(x, q), 64)


@needs_c
def test_the_plain_c_path_gives_the_same_int8_product(monkeypatch):
    # without -march=native (and with -mno-avx2 on x86, for compilers that default to AVX2) no SIMD macro is
    # defined: rung 7 runs its plain-C loop on any CPU
    q, x = layer(37, 448, 64, seed=8)
    x = torch.cat([x, -x])  # two rows
    y_simd = kk.compiled_c_int8(x, q)
    monkeypatch.setenv("LABKIT_CFLAGS", "-O3 -fopenmp" + (" -mno-avx2" if X86 else ""))
    ok, how = kc.available()
    assert ok and how.endswith("rung 7 in plain C"), how
    y_plain = kk.compiled_c_int8(x, kk.pack_weight(q))
    assert close(y_plain, int8_exact(x, q, 32), 448) and close(y_simd, y_plain, 448)


@needs_c
@pytest.mark.parametrize("sign", [1, -1])
def test_rung_7_at_the_int16_limit(sign):
    # every nibble 15 (code 7) and every x at +-127 after rounding: a block of 32 inputs sums to
    # 4 words * 2 * (15 * 127 * 2) = 30,480 in int16 before vpmaddwd, just under 32,767
    n, k = 24, 128
    w = torch.full((n, k), 7.0)
    w[:, ::32] = -8.0  # one code -8 per group so that the asymmetric scale is 1 and the zero point 0
    q = quantize(w, 4, "asym", 32)
    assert int(q.codes.max()) == 7
    x = torch.full((1, k), float(sign))
    assert close(kk.compiled_c_int8(x, q), int8_exact(x, q, 32), k)
    assert close(kk.compiled_c_int8(x, q), exact(x, q), k)  # +-1 rounds to +-127 * (1 / 127) exactly


def test_no_compiler_gives_a_reason_and_a_clean_refusal(monkeypatch):
    monkeypatch.delenv("LABKIT_C", raising=False)  # make test-builds runs this file with LABKIT_C=0 too
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert kc.compiler() is None
    ok, why = kc.available()
    assert not ok and "no C compiler" in why
    q, x = layer(8, 64, 32)
    for rung in (kk.compiled_c, kk.compiled_c_int8):
        with pytest.raises(RuntimeError, match="rungs 6 and 7 .* not available on this machine: no C compiler"):
            rung(x, q)
    assert all(kk.available(name) == (False, why) for name in kk.C_RUNGS)
    run = ks.measure_ladder(16, 64, matrices=2, repeats=1, slow_repeats=1, threads=(1,), roof_bytes=4096)
    assert run.missing == {name: why for name in kk.C_RUNGS} and not set(kk.C_RUNGS) & set(run.rungs)
    for name in kk.C_RUNGS:
        assert any(line.startswith(name) and "not run here: no C compiler" in line for line in run.lines())
    assert close(kk.blocked(x, q), exact(x, q), 64)  # the other rungs go on


def test_a_compiler_that_fails_gives_its_complaint(monkeypatch, tmp_path):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'cc: error: no such CPU' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.delenv("LABKIT_C", raising=False)
    monkeypatch.setenv("CC", str(cc))
    ok, why = kc.available()
    assert not ok and "no build of int4_gemv.c runs here" in why and "no such CPU" in why and kc.build() is None


def test_switched_off(monkeypatch):
    monkeypatch.setenv("LABKIT_C", "0")
    assert kc.available() == (False, "LABKIT_C=0 switches rungs 6 and 7 off") and kc.build() is None


@needs_c
def test_switched_off_after_packing_the_weight_keeps_its_build(monkeypatch):
    q, x = layer(8, 64, 32)
    w = kk.pack_weight(q)
    monkeypatch.setenv("LABKIT_C", "0")
    assert not kk.available("7 C, int8 x int4 byte products")[0] and kk.pack_weight(q).lanes is None
    assert close(kk.compiled_c(x, w), exact(x, q), 64) and close(kk.compiled_c_int8(x, w), int8_exact(x, q, 32), 64)


@needs_c
def test_a_weight_laid_out_without_rung_6_is_refused_once_it_is_built(monkeypatch):
    q, x = layer(8, 64, 32)
    monkeypatch.setenv("LABKIT_C", "0")
    w = kk.pack_weight(q)
    assert w.lanes is None
    monkeypatch.delenv("LABKIT_C")
    with pytest.raises(RuntimeError, match="laid out while rung 6 was not built here: lay it out again"):
        kk.compiled_c(x, w)
    with pytest.raises(RuntimeError, match="laid out while rung 7 was not built here: lay it out again"):
        kk.compiled_c_int8(x, w)
    assert close(kk.compiled_c(x, kk.pack_weight(q)), exact(x, q), 64)


def test_a_layout_refuses_arrays_the_c_loops_cannot_read():
    rng = np.random.default_rng(3)
    codes = rng.integers(-8, 8, size=(8, 64), dtype=np.int8)
    scale = rng.random((8, 2), dtype=np.float32)
    good = kc.lay_out(codes, scale, np.zeros_like(scale), 8)
    assert good.library is None and good.addresses == tuple(a.ctypes.data for a in (good.words, good.scale,
                                                                                     good.offset))
    with pytest.raises(ValueError, match="cannot resize"):  # it would free the values at good.addresses[0]
        good.words.resize(10 ** 6)
    with pytest.raises(TypeError, match="words must be a numpy array of uint32, got list"):
        kc.LaneLayout(good.words.tolist(), good.scale, good.offset)
    with pytest.raises(ValueError, match=r"words must be a C-contiguous uint32 array .*got \(dtype\('int64'\)"):
        kc.LaneLayout(good.words.astype(np.int64), good.scale, good.offset)
    with pytest.raises(ValueError, match="scale must be a C-contiguous float32 array"):
        kc.LaneLayout(good.words, good.scale[:, :, ::2], good.offset)
    with pytest.raises(ValueError, match="scale and offset must be one shape"):
        kc.LaneLayout(good.words, good.scale, good.offset[:, :1].copy())
    with pytest.raises(ValueError, match="scale and offset must be one shape"):
        kc.LaneLayout(good.words[:, :, :4].copy(), good.scale, good.offset)
    assert copy.copy(good) is good


@needs_c
def test_a_layout_takes_only_a_library_kernels_c_loaded_for_its_lanes():
    q, _ = layer(20, 64, 32)
    mine = kc.lay_out(q.codes.numpy(), q.scale.numpy(), q.zero.numpy())
    with pytest.raises(ValueError, match="library must be a library loaded by kernels_c"):
        kc.LaneLayout(mine.words, mine.scale, mine.offset, ctypes.CDLL(mine.library._name))  # no argument types
    other = kc.lay_out(q.codes.numpy(), q.scale.numpy(), q.zero.numpy(), 24 - mine.lanes)  # 16 or 8
    with pytest.raises(ValueError, match=f"library must be a build for the layout's {other.lanes} lanes"):
        kc.LaneLayout(other.words, other.scale, other.offset, mine.library)


@needs_c
def test_a_layout_for_this_build_keeps_it():
    q, x = layer(20, 64, 32)
    layout = kc.lay_out(q.codes.numpy(), q.scale.numpy(), q.zero.numpy())
    assert layout.lanes == kc.lanes() and layout.library is kc._loaded()
    assert kk.pack_weight(q).lanes.library is kc._loaded()
    copied, pickled = copy.deepcopy(layout), pickle.loads(pickle.dumps(layout))
    assert copied.library is layout.library and pickled.library is None  # a pickle may go to another process
    del layout
    for again in (copied, pickled):  # the original gone: each reads its own arrays
        assert again.addresses == tuple(a.ctypes.data for a in (again.words, again.scale, again.offset))
        y = np.empty((1, 20), np.float32)
        kc.gemv_int8(x.numpy(), 32, 2, again, 20, 1, y)
        assert close(torch.from_numpy(y), int8_exact(x, q, 32), 64)


@needs_c
def test_gemv_refuses_shapes_that_do_not_fit_the_layout():
    q, x = layer(20, 64, 32)
    w = kk.pack_weight(q)
    x_np = x.numpy()
    sums = x_np.reshape(1, -1, 32).sum(-1, dtype=np.float32)
    y = np.empty((1, 20), np.float32)
    with pytest.raises(ValueError, match=rf"layout.words must be shape \({-(-20 // w.lanes.lanes)}, 12, "
                                         rf"{w.lanes.lanes}\)"):
        kc.gemv(np.zeros((1, 96), np.float32), np.zeros((1, 3), np.float32), w.lanes, 20, 1, y)  # K 96, laid out 64
    with pytest.raises(ValueError, match=r"y must be shape \(1, 20\)"):
        kc.gemv(x_np, sums, w.lanes, 20, 1, np.empty((1, 19), np.float32))
    with pytest.raises(ValueError, match="groups must be a count of groups of a multiple of 8"):
        kc.gemv(x_np, np.zeros((1, 5), np.float32), w.lanes, 20, 1, y)
    with pytest.raises(ValueError, match=r"x \[M, K\] and x_sums \[M, G\]"):
        kc.gemv(x_np[0], sums, w.lanes, 20, 1, y)
    with pytest.raises(ValueError, match=r"x_sums must be a C-contiguous float32 array, got \(dtype\('float64'\)"):
        kc.gemv(x_np, sums.astype(np.float64), w.lanes, 20, 1, y)
    read_only = y.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="y must be a C-contiguous float32 array that can be written, got .*read-only"):
        kc.gemv(x_np, sums, w.lanes, 20, 1, read_only)
    with pytest.raises(TypeError, match="y must be a float32 numpy array, got Tensor"):
        kc.gemv(x_np, sums, w.lanes, 20, 1, torch.from_numpy(y))
    kc.gemv(x_np, sums, w.lanes, 20, 1, y)  # still usable
    assert close(torch.from_numpy(y), exact(x, q), 64)


@needs_c
def test_gemv_int8_refuses_shapes_that_do_not_fit_the_layout():
    q, x = layer(20, 64, 32)
    w = kk.pack_weight(q)
    x_np = x.numpy()
    y = np.empty((1, 20), np.float32)
    with pytest.raises(ValueError, match="block must be 8, 16 or 32 inputs"):
        kc.gemv_int8(x_np, 64, 2, w.lanes, 20, 1, y)  # one block of 64 inputs
    with pytest.raises(ValueError, match="block must be 8, 16 or 32 inputs"):
        kc.gemv_int8(x_np, 32, 4, w.lanes, 20, 1, y)  # groups of 16 inputs: a block of 32 spans two
    blocks = -(-20 // w.lanes.lanes)  # 3 blocks of 8 rows, 2 of 16: whatever this machine built
    with pytest.raises(ValueError, match=rf"layout.scale must be shape \({blocks}, 4, {w.lanes.lanes}\) for x "
                                         rf"\(1, 64\), got \({blocks}, 2, {w.lanes.lanes}\)"):
        kc.gemv_int8(x_np, 16, 4, w.lanes, 20, 1, y)  # 4 groups, laid out with 2
    with pytest.raises(ValueError, match=r"y must be shape \(1, 20\)"):
        kc.gemv_int8(x_np, 32, 2, w.lanes, 20, 1, np.empty((1, 21), np.float32))
    y2 = np.full((2, 20), 7.0, np.float32)
    for bad in (np.nan, np.inf, -np.inf):  # found by the C loop as it rounds x, in any row; y is left as it was
        x_bad = np.concatenate([x_np, x_np])
        x_bad[1, 63] = bad
        with pytest.raises(ValueError, match="x must be finite values"):
            kc.gemv_int8(x_bad, 32, 2, w.lanes, 20, 1, y2)
        assert (y2 == 7).all()
    with pytest.raises(ValueError, match=r"x must be a C-contiguous float32 array, got \(dtype\('float64'\)"):
        kc.gemv_int8(x_np.astype(np.float64), 32, 2, w.lanes, 20, 1, y)
    with pytest.raises(ValueError, match=r"x must be a C-contiguous float32 array, got \(dtype\('float32'\), "
                                         "'strided'"):
        kc.gemv_int8(np.repeat(x_np, 2, axis=1)[:, ::2], 32, 2, w.lanes, 20, 1, y)
    read_only = y.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="y must be a C-contiguous float32 array that can be written"):
        kc.gemv_int8(x_np, 32, 2, w.lanes, 20, 1, read_only)
    lib = w.lanes.library  # the C function's own guard: its buffer for x's rounded block holds 32
    assert lib.int4_gemv_int8(x_np.ctypes.data, *w.lanes.addresses, 1, 20, 64, 1, 64, 1, y.ctypes.data) == 3
    with pytest.raises(ValueError, match="groups must be a count of groups that divides"):
        kc.gemv_int8(x_np, 8, 3, w.lanes, 20, 1, y)
    kc.gemv_int8(x_np, 32, 2, w.lanes, 20, 1, y)  # still usable
    assert close(torch.from_numpy(y), int8_exact(x, q, 32), 64)


@needs_c
def test_rung_7_rounds_x_as_quantize_activations_does():
    # the C loop rounds x itself: the same int8 codes and scales as the torch ops rung 5 uses, ties included
    # (2.5 and -0.5 times a block's scale round to even)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(9))
    x[0, :32] = torch.arange(32) - 15.5  # amax 15.5: x / scale has halves only if scale divides exactly
    x[1, :32] = 0  # an all-zero block
    x[2, :32] = torch.tensor([127.0, 2.5, -0.5, 1.5] * 8)  # scale 1: the ties 2.5 -> 2, -0.5 -> 0, 1.5 -> 2
    q, _ = layer(24, 256, 32, seed=10)
    y = kk.compiled_c_int8(x, q)
    assert torch.equal(y, kk.compiled_c_int8(x, q))  # deterministic
    assert close(y, int8_exact(x, q, 32), 256) and close(y, kk.integer_dot(x, q), 256)


def test_lay_out_refuses_what_the_layout_cannot_hold():
    rng = np.random.default_rng(4)
    codes = rng.integers(-8, 8, size=(8, 64), dtype=np.int8)
    scale = rng.random((8, 2), dtype=np.float32)
    zero = np.zeros_like(scale)
    bad = codes.copy()
    bad[3, 5] = 8  # one past 4 bits: its nibble would carry into input 6's
    with pytest.raises(ValueError, match=r"codes must be 4-bit codes in -8..7, got \(-8, 8\)"):
        kc.lay_out(bad, scale, zero, 8)
    bad[3, 5] = -9
    with pytest.raises(ValueError, match=r"codes must be 4-bit codes in -8..7, got \(-9, 7\)"):
        kc.lay_out(bad, scale, zero, 8)
    with pytest.raises(ValueError, match="codes must be int8 codes .N, K., N >= 1 and K a multiple of 8"):
        kc.lay_out(codes[:, :60], scale[:, :1], zero[:, :1], 8)
    with pytest.raises(ValueError, match="codes must be int8 codes"):
        kc.lay_out(codes.astype(np.int16), scale, zero, 8)
    with pytest.raises(TypeError, match="codes must be a numpy array of int8 codes"):
        kc.lay_out(torch.from_numpy(codes), scale, zero, 8)
    for lanes in (0, 4, 32):
        with pytest.raises(ValueError, match=f"lanes must be 8 or 16 .*got {lanes}"):
            kc.lay_out(codes, scale, zero, lanes)
    with pytest.raises(ValueError, match=r"scale must be \[8, G\] with G groups dividing K = 64, got \(8, 3\)"):
        kc.lay_out(codes, rng.random((8, 3), dtype=np.float32), zero, 8)
    with pytest.raises(ValueError, match=r"zero must be scale's shape \(8, 2\), got \(8, 1\)"):
        kc.lay_out(codes, scale, zero[:, :1], 8)
    out = kc.lay_out(codes, scale, zero, 8)  # the neighbours of the code that was refused keep their nibbles
    assert all((int(out.words[0, 0, 3]) >> 4 * t) & 15 == codes[3, t] + 8 for t in range(8))
