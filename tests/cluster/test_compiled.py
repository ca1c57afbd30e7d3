"""labkit.cluster.compiled: the compiler probe, torch.compile against eager on a tiny TinyLM (same logits,
real kernel and graph counts, nothing left behind in torch._dynamo), the eager-only report without a working
compiler, the verdict's arithmetic, and the kernels inductor really launches against graph.fused_kernels."""
import os
import re
import shutil
import tempfile

import pytest
import torch

from labkit.cluster.compiled import (CompileReport, compare_compile, compile_verdict, compiler_available,
                                     inductor_kernels)
from labkit.cluster.graph import capture_decode, fused_kernels, fusion_groups
from labkit.course.timing import Timing
from labkit.tinylm import TinyLM, TinyLMConfig

from ..refusals import assert_refused

HAVE_COMPILER = compiler_available()[0]
needs_compiler = pytest.mark.skipif(not HAVE_COMPILER, reason="no working C++ compiler: inductor cannot run")
COMPILED_FIELDS = ("compile_s", "compiled_s", "compiled_tokens_per_s", "compiled_spread", "speedup", "kernels",
                   "graphs", "graph_breaks", "max_abs_diff")


def tiny(n_layers=1) -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(TinyLMConfig(vocab_size=64, d_model=32, n_layers=n_layers, n_heads=2, n_kv_heads=1, d_ff=48,
                               max_seq_len=32)).eval()


def fake_compiler(folder, name: str, refuse: tuple[str, ...], error: str) -> str:
    """A compiler script in `folder`: g++ itself, except that any of the `refuse` flags makes it print `error`
    and fail; every call appends a line to `folder`/`name`.log."""
    script = folder / name
    cases = "|".join(refuse)
    script.write_text(f"#!/bin/sh\necho \"$*\" >> {folder / name}.log\n"
                      f"for a in \"$@\"; do case \"$a\" in {cases}) echo \"{error}\" >&2; exit 1;; esac; done\n"
                      f"exec {shutil.which('g++')} \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def calls(compiler: str) -> int:
    with open(compiler + ".log") as f:
        return len(f.readlines())


needs_gxx = pytest.mark.skipif(not (HAVE_COMPILER and shutil.which("g++")), reason="the fakes wrap a working g++")


@needs_gxx
def test_the_probe_builds_what_inductor_builds(tmp_path):
    """A g++ that builds a program but not an OpenMP shared library (no omp.h, say) is no use to inductor."""
    no_omp = fake_compiler(tmp_path, "no-omp", ("-shared", "-fopenmp"), "fatal error: omp.h: No such file")
    ok, reason = compiler_available(no_omp)
    assert not ok and "omp.h" in reason and no_omp in reason
    assert calls(no_omp) == 1
    assert compiler_available(no_omp) == (ok, reason) and calls(no_omp) == 1  # cached: not run again
    plain = fake_compiler(tmp_path, "plain", ("-never",), "")
    assert compiler_available(plain)[0] and calls(plain) == 1


def test_compiler_probe():
    ok, reason = compiler_available()
    assert isinstance(reason, str) and reason
    if shutil.which("g++"):
        assert ok == compiler_available(shutil.which("g++"))[0]  # inductor's default is g++ where it exists
    missing = compiler_available("/nonexistent/c++")
    assert missing[0] is False and "/nonexistent/c++" in missing[1] and "inductor" in missing[1]
    if shutil.which("true"):  # exits 0 and writes nothing: not a compiler
        fake = compiler_available("true")
        assert fake[0] is False and "could not compile" in fake[1]


@needs_compiler
@pytest.mark.timeout(240)
def test_compiled_matches_eager_and_leaves_dynamo_clean():
    model = tiny()
    report = compare_compile(model, prompt_tokens=4, new_tokens=6, repeats=3)
    assert isinstance(report, CompileReport)
    assert report.compiler and report.max_abs_diff < 1e-4  # fusion reorders float ops: equal within rounding
    assert report.kernels > 0 and report.graphs >= 1 and report.graph_breaks >= 0
    assert report.compile_s > 0 and report.compiled_s > 0 and report.eager_s > 0
    assert report.speedup == pytest.approx(report.eager_s / report.compiled_s)
    assert report.compiled_tokens_per_s == pytest.approx(6 / report.compiled_s)
    assert ("unreliable on this run" in report.verdict) == (not report.reliable)
    assert "unreliable on this run" in report.verdict or re.search(r"compiled is [\d.]+x", report.verdict)
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    for code in (type(model).forward.__code__, type(model.layers[0]).forward.__code__):
        assert _debug_get_cache_entry_list(code) == []  # torch._dynamo.reset dropped every compiled frame


@needs_gxx
@pytest.mark.timeout(120)
def test_an_inductor_failure_gives_the_eager_report(tmp_path, monkeypatch):
    """A compiler that passes the probe (no optimisation flags) but crashes on inductor's -O3 builds: the
    eager-only report with inductor's first line, no traceback, and no cache folder left behind."""
    broken = fake_compiler(tmp_path, "broken", ("-O1", "-O2", "-O3"), "internal compiler error: Segmentation fault")
    assert compiler_available(broken)[0]
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where torch makes its fresh cache folders
    report = compare_compile(tiny(), prompt_tokens=3, new_tokens=3, repeats=3, compiler=broken)
    assert report.reason.startswith("inductor failed: ") and "CppCompileError" in report.reason
    assert report.verdict == f"eager only: {report.reason}" and report.compiler is None and not report.reliable
    assert all(getattr(report, f) is None for f in COMPILED_FIELDS) and report.eager_s > 0
    assert calls(broken) > 1  # inductor did call it
    assert [n for n in os.listdir(temp) if not n.startswith("torchinductor_")] == []  # its default dir may stay
    with pytest.raises(RuntimeError, match="^inductor failed: "):
        decode = capture_decode(tiny(), cached=1)
        inductor_kernels(decode.graph_module, decode.inputs, compiler=broken)


def test_without_a_compiler_the_eager_numbers_and_the_reason():
    report = compare_compile(tiny(), prompt_tokens=3, new_tokens=4, repeats=2, compiler="/nonexistent/c++")
    assert report.compiler is None and "/nonexistent/c++" in report.reason
    assert all(getattr(report, f) is None for f in COMPILED_FIELDS)
    assert report.eager_s > 0 and report.eager_tokens_per_s == pytest.approx(4 / report.eager_s)
    assert report.verdict.startswith("eager only: ") and not report.reliable


def test_verdict_arithmetic():
    eager, fast = Timing((0.10, 0.11, 0.12, 0.11)), Timing((0.05, 0.06, 0.055, 0.055))
    slow = Timing((0.2, 0.21, 0.22, 0.21))
    ok, text = compile_verdict(eager, fast, compile_s=22.0, new_tokens=48)
    loops = 22.0 / (0.11 - 0.055)
    assert ok and text.startswith("compiled is 2.00x faster per token after 22 s of compiling")
    assert f"{loops * 48:,.0f} generated tokens" in text
    ok, text = compile_verdict(eager, slow, compile_s=22.0, new_tokens=48)
    assert ok and "never pays off" in text and "0.52x" in text
    ok, text = compile_verdict(eager, Timing((0.09, 0.115, 0.2, 0.1)), compile_s=22.0, new_tokens=48)
    assert not ok and text.startswith("unreliable on this run (the repeats of eager") and "overlap" in text
    near = Timing((0.100, 0.101, 0.102, 0.101)), Timing((0.097, 0.098, 0.0985, 0.098))  # 1.03x, not "1.0x"
    assert "1.03x faster" in compile_verdict(*near, compile_s=1.0, new_tokens=4)[1]
    three = Timing((0.10, 0.11, 0.12)), Timing((0.05, 0.06, 0.055))  # clear, but 3 repeats: 10% by chance
    for one, other in ((Timing((0.10,)), Timing((0.05,))), three):
        ok, text = compile_verdict(one, other, 1.0, 4)
        assert not ok and text.startswith("unreliable on this run (") and "repeats: two equal things" in text


@needs_compiler
@pytest.mark.timeout(240)
def test_inductor_launches_the_kernels_fused_kernels_predicts():
    """One kernel per predicted group of groups, and each kernel's name (the ops inductor fused into it) holds
    the ops that define its label."""
    decode = capture_decode(tiny(), cached=3)
    predicted = fused_kernels(fusion_groups(decode.graph_module))
    launched = inductor_kernels(decode.graph_module, decode.inputs)
    assert len(launched) == len(predicted), (launched, predicted)
    needs = {"rmsnorm": ("mean", "pow", "rsqrt"), "rotary": ("cat", "neg"), "swiglu": ("silu",),
             "cache write": ("copy",), "repeat kv": ("clone",)}
    for name, label in zip(launched, predicted):
        for part, ops in needs.items():
            assert (part in label) == all(f"_{op}" in name for op in ops), (name, label)


def test_bad_input_is_refused_by_name():
    model = tiny()
    assert_refused(lambda: compare_compile("tinylm"), TypeError, "model", "tinylm", "a TinyLM")
    assert_refused(lambda: compare_compile(model, prompt_tokens=0), ValueError, "prompt_tokens", 0, "a positive int")
    assert_refused(lambda: compare_compile(model, new_tokens=40), ValueError, "new_tokens", 40, "<= 32")
    assert_refused(lambda: compare_compile(model, repeats=1.5), TypeError, "repeats", 1.5, "a positive int")
    assert_refused(lambda: compare_compile(model, fresh_cache=1), TypeError, "fresh_cache", 1, "True or False")
    assert_refused(lambda: compiler_available(3), TypeError, "compiler", 3, "a C++ compiler")
    assert_refused(lambda: compile_verdict(Timing((1.0,)), 2, 1.0, 4), TypeError, "compiled", 2, "Timing")
    assert_refused(lambda: inductor_kernels("gm", ()), TypeError, "gm", "gm", "GraphModule")
    decode = capture_decode(model, cached=1)
    assert_refused(lambda: inductor_kernels(decode.graph_module, decode.inputs[:1]), ValueError, "inputs",
                   "1 values", "3 values")
    with pytest.raises(RuntimeError, match="/nonexistent/c"):
        decode = capture_decode(model, cached=1)
        inductor_kernels(decode.graph_module, decode.inputs, compiler="/nonexistent/c++")
