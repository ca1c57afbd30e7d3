"""Rung 6's build (labkit.quant.kernels_c): the layout it reads holds every code, scale and offset where its
comment says, for both lane counts; the library is built once and found again; a build for 8 lanes (AVX2) gives the same
product as the native one; its threads give the same product; a weight laid out for another build is
refused; a machine without a working C compiler gets a reason and a clean refusal instead of a crash (the
other rungs and the ladder go on)."""
import platform

import numpy as np
import pytest
import torch

from labkit.quant import kernels as kk
from labkit.quant import kernels_c as kc
from labkit.quant import kernels_speed as ks

from .test_kernels import close, exact, layer

needs_c = pytest.mark.skipif(not kc.available()[0], reason=f"rung 6 is not built here: {kc.available()[1]}")


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
        y = kk.compiled_c(x, q)
    assert close(y, exact(x, q), 576)


@needs_c
def test_the_library_is_cached_per_source_and_compiler():
    path, why = kc._build(kc.compiler(), kc.FLAGS[-1])
    assert why == "" and path.is_file()
    again, _ = kc._build(kc.compiler(), kc.FLAGS[-1])
    assert again == path  # found, not rebuilt


@needs_c
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="-march=haswell is an x86 flag")
def test_an_avx2_build_gives_the_same_product(monkeypatch):
    q, x = layer(37, 448, 32, seed=7)  # 37 rows: a partial block of 8 and of 16 rows
    native = kk.pack_weight(q)
    y_native = kk.compiled_c(x, native)
    monkeypatch.setenv("LABKIT_CFLAGS", "-O3 -march=haswell -fopenmp")
    ok, how = kc.available()
    assert ok and how.endswith("8 float lanes"), how
    avx2 = kk.pack_weight(q)
    assert close(kk.compiled_c(x, avx2), exact(x, q), 448) and close(y_native, exact(x, q), 448)
    if native.lanes.lanes != 8:  # a weight laid out for the other build is refused, never misread
        with pytest.raises(RuntimeError, match="laid out for 16 lanes, rung 6 is built here for 8"):
            kk.compiled_c(x, native)


def test_no_compiler_gives_a_reason_and_a_clean_refusal(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert kc.compiler() is None
    ok, why = kc.available()
    assert not ok and "no C compiler" in why
    q, x = layer(8, 64, 32)
    with pytest.raises(RuntimeError, match="rung 6 .* not available on this machine: no C compiler"):
        kk.compiled_c(x, q)
    assert kk.available(kk.C_RUNG) == (False, why)
    run = ks.measure_ladder(16, 64, matrices=1, repeats=1, slow_repeats=1, threads=(1,), roof_bytes=4096)
    assert run.missing == {kk.C_RUNG: why} and kk.C_RUNG not in run.rungs
    assert any(line.startswith(kk.C_RUNG) and "not run here: no C compiler" in line for line in run.lines())
    assert close(kk.blocked(x, q), exact(x, q), 64)  # the other rungs go on


def test_a_compiler_that_fails_gives_its_complaint(monkeypatch, tmp_path):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'cc: error: no such CPU' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    ok, why = kc.available()
    assert not ok and "could not build int4_gemv.c" in why and "no such CPU" in why


def test_switched_off(monkeypatch):
    monkeypatch.setenv("LABKIT_C", "0")
    assert kc.available() == (False, "LABKIT_C=0 switches rung 6 off")


@needs_c
def test_a_weight_laid_out_without_rung_6_is_refused_once_it_is_built(monkeypatch):
    q, x = layer(8, 64, 32)
    monkeypatch.setenv("LABKIT_C", "0")
    w = kk.pack_weight(q)
    assert w.lanes is None
    monkeypatch.delenv("LABKIT_C")
    with pytest.raises(RuntimeError, match="laid out while rung 6 was not built here: lay it out again"):
        kk.compiled_c(x, w)
    assert close(kk.compiled_c(x, kk.pack_weight(q)), exact(x, q), 64)


@needs_c
def test_gemv_refuses_shapes_that_do_not_fit_the_layout():
    q, x = layer(20, 64, 32)
    w = kk.pack_weight(q)
    x_np = x.numpy()
    sums = x_np.reshape(1, -1, 32).sum(-1, dtype=np.float32)
    y = np.empty((1, 20), np.float32)
    with pytest.raises(ValueError, match=r"layout.words must be shape \(\d+, 12, \d+\)"):
        kc.gemv(np.zeros((1, 96), np.float32), np.zeros((1, 3), np.float32), w.lanes, 20, 1, y)  # K 96, laid out 64
    with pytest.raises(ValueError, match=r"y must be shape \(1, 20\)"):
        kc.gemv(x_np, sums, w.lanes, 20, 1, np.empty((1, 19), np.float32))
    with pytest.raises(ValueError, match="groups of a multiple of 8"):
        kc.gemv(x_np, np.zeros((1, 5), np.float32), w.lanes, 20, 1, y)
    with pytest.raises(ValueError, match=r"x \[M, K\] and x_sums \[M, G\]"):
        kc.gemv(x_np[0], sums, w.lanes, 20, 1, y)
    kc.gemv(x_np, sums, w.lanes, 20, 1, y)  # still usable
    assert close(torch.from_numpy(y), exact(x, q), 64)
