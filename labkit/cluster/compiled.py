"""torch.compile (inductor, the CPU backend) against eager TinyLM on the same decode loop, with the honest
verdict for a model this small (notebook 08, part 1; benchmarks/cluster_compile.py).

    compiler_available()          (ok, reason): inductor turns graphs into C++ and needs a working compiler
    compile_verdict(...)          the sentence, from interleaved timings
    compare_compile(model, ...)   CompileReport: compile seconds, eager vs compiled tokens/s (medians of
                                  interleaved repeats), kernels, graphs and graph breaks, max |logit diff|,
                                  and a verdict ("unreliable on this run" unless the repeats separate by
                                  the course's rule, labkit.course.evidence)
    inductor_kernels(gm, inputs)  the C++ kernels inductor launches for a captured graph, in order (to set
                                  against labkit.cluster.graph.fused_kernels)

Without a working C++ compiler the report carries the eager numbers, None for every compiled figure and the
reason.

What dynamo makes of TinyLM (torch 2.13): it gives up on TinyLM.forward itself (its isinstance check against
the runtime-checkable Cache protocol raises under tracing) and compiles what forward calls instead: the rotary
table slice, each Block, and the final norm + lm_head: 6 graphs and 5 graph breaks in one decode step, with
forward's Python running eagerly between them. Measured once on the course machine (2 cores, shared;
benchmarks/cluster_compile.py, the loop of 16 + 48 tokens; figures move by +-20%): about 27 s of compiling,
then 28 ms per loop against eager's 36 ms (36 / 28 = 1.29x), 137 generated kernels. The compile time is paid
back after compile_s / (eager_s - compiled_s) loops: 27 s / 8 ms = about 3,400 loops of 48 tokens, roughly
160,000 generated tokens.

Not every compiler that builds a program can build what inductor builds: a shared library (-shared -fPIC)
with OpenMP (-fopenmp) that includes Python.h. compiler_available() builds exactly that (a g++ without the
Python headers, a clang++ without libomp fail here), and compare_compile still turns any failure of the first
compiled loop into the eager-only report ("inductor failed: ...").
"""

from __future__ import annotations

import copy
import functools
import glob
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from .._checks import check_bool, check_positive, check_positive_int, check_type, fail
from ..course import evidence, timing
from ..tinylm import KVCache, TinyLM, compile_blocks_apart, corpus
from .graph import check_inputs


def _inductor_cxx() -> str | None:
    """The compiler inductor would pick (torch._inductor.cpp_builder), or None when it finds none."""
    try:
        from torch._inductor import cpp_builder
        return cpp_builder.get_cpp_compiler()
    except Exception:  # inductor raises when its search finds nothing
        return None


PROBE = """#include <Python.h>
#include <omp.h>
extern "C" int labkit_probe(void) {  // what inductor builds: an OpenMP loop in a shared library with Python.h
    int n = 0;
#pragma omp parallel reduction(+ : n)
    n += omp_get_num_threads() > 0;
    return n + (PY_VERSION_HEX > 0);
}
"""
WHAT = "an OpenMP shared library with Python.h, as inductor builds"


@functools.lru_cache(maxsize=None)
def _probe(path: str) -> tuple[bool, str]:
    """Build PROBE with `path` as inductor builds its kernels (cached: once per compiler and process)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write(PROBE)
        command = [path, src, "-shared", "-fPIC", "-fopenmp", f"-I{sysconfig.get_paths()['include']}", "-o", lib]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"{path} could not compile {WHAT} ({type(e).__name__}: {e})"
        if done.returncode or not os.path.isfile(lib):
            why = done.stderr.strip()[:200] or f"exit status {done.returncode}, no output file"
            return False, f"{path} could not compile {WHAT}: {why}"
    return True, f"{path} compiles C++ ({WHAT})"


def _find(compiler: str | None) -> tuple[str | None, bool, str]:
    """(path, works, reason) for `compiler` or inductor's choice."""
    if compiler is not None:
        check_type("compiler", compiler, str, "a C++ compiler's name or path, or None")
    name = compiler or _inductor_cxx() or next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    path = shutil.which(name) if name else None
    if path is None:
        return None, False, (f"no C++ compiler ({name!r} is not on PATH)" if name else "no C++ compiler found") + \
            ": torch.compile's CPU backend (inductor) generates C++ and needs one (install g++)"
    return (path, *_probe(path))


def compiler_available(compiler: str | None = None) -> tuple[bool, str]:
    """(True, what was found) when `compiler` (default: the one inductor would use, from
    torch._inductor.cpp_builder, else c++/g++/clang++ on PATH) exists and builds PROBE the way inductor builds
    its kernels (-shared -fPIC -fopenmp, the Python headers); (False, why not) otherwise. torch.compile on the
    CPU needs it. Cached per compiler path for the process."""
    return _find(compiler)[1:]


@contextmanager
def _inductor_env(compiler: str | None, fresh: bool, keep_in: str | None = None):
    """inductor configured to use `compiler`, with empty on-disk caches when `fresh` (a compile time measured
    on a warm cache says how fast the cache is, not the compiler); `keep_in`: a folder the fresh cache is made
    in and left in, to read the generated code back."""
    from torch._inductor import config
    from torch._inductor.utils import fresh_cache
    # torch keeps a fresh cache that saw an error: made inside a folder of ours, it goes with that folder
    with config.patch({"cpp.cxx": (compiler,)} if compiler else {}), \
            (nullcontext(keep_in) if keep_in or not fresh else tempfile.TemporaryDirectory()) as parent, \
            (fresh_cache(dir=parent, delete=keep_in is None) if fresh else nullcontext()):
        yield


def _decode_loop(fn, cfg, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """Prefill `prompt`, then feed `continuation` one token at a time through `fn(tokens, cache)`; the
    logits [1 + len(continuation), vocab] of every step (teacher-forced: eager and compiled do equal work)."""
    cache = KVCache(cfg)
    with torch.no_grad():
        out = [fn(torch.tensor([prompt]), cache)[0, -1]]
        for t in continuation:
            out.append(fn(torch.tensor([[t]]), cache)[0, -1])
    return torch.stack(out)  # [steps, vocab]


@dataclass(frozen=True)
class CompileReport:
    """Eager vs torch.compile on one decode loop (prompt_tokens prefilled, then new_tokens one at a time).
    Seconds are per loop (medians of interleaved repeats), tokens/s = new_tokens / seconds. Every compiled
    field is None when no compiler was available or inductor failed (`reason` says why)."""
    prompt_tokens: int
    new_tokens: int
    repeats: int
    compiler: str | None
    reason: str
    eager_s: float
    eager_tokens_per_s: float
    eager_spread: float
    compile_s: float | None = None
    compiled_s: float | None = None
    compiled_tokens_per_s: float | None = None
    compiled_spread: float | None = None
    speedup: float | None = None
    kernels: int | None = None
    graphs: int | None = None
    graph_breaks: int | None = None
    max_abs_diff: float | None = None
    reliable: bool = False
    verdict: str = ""


def compile_verdict(eager: timing.Timing, compiled: timing.Timing, compile_s: float,
                    new_tokens: int) -> tuple[bool, str]:
    """(reliable, sentence) from interleaved loop timings: "unreliable on this run (<why>)" unless the repeats
    separate by the course's rule (labkit.course.evidence: at least 4 each, no overlap), else the speed-up of
    the medians and after how many generated tokens the compile time is paid back: compile_s / (eager -
    compiled) loops (never, when slower)."""
    check_type("eager", eager, timing.Timing, "a labkit.course.timing.Timing")
    check_type("compiled", compiled, timing.Timing, "a labkit.course.timing.Timing")
    check_positive("compile_s", compile_s, "seconds", allow_zero=True)
    check_positive_int("new_tokens", new_tokens, "tokens per loop")
    c = evidence.compare("eager", eager, "compiled", compiled, " s")
    if not c.reliable:
        return False, c.unreliable()
    e, comp = eager.median, compiled.median
    if comp >= e:
        return True, (f"compiled is {e / comp:.2f}x eager (slower) after {compile_s:.0f} s of compiling: "
                      f"it never pays off for this model")
    loops = compile_s / (e - comp)  # loops until the seconds saved equal the seconds spent compiling
    return True, (f"compiled is {e / comp:.2f}x faster per token after {compile_s:.0f} s of compiling: pays off "
                  f"after about {loops * new_tokens:,.0f} generated tokens ({loops:,.0f} loops)")


def compare_compile(model: TinyLM, prompt_tokens: int = 16, new_tokens: int = 48, repeats: int = 5,
                    compiler: str | None = None, fresh_cache: bool = True) -> CompileReport:
    """Time eager `model` and `torch.compile(model)` (inductor, default mode) on the same decode loop:
    the prompt is the test corpus's first `prompt_tokens` tokens, the continuation the eager model's greedy
    one. compile_s = the first compiled loop (it compiles the prefill and the decode step) minus a compiled
    loop's median. graphs and graph_breaks come from torch._dynamo.explain of one decode step, kernels from
    torch._inductor.metrics.generated_kernel_count, max_abs_diff over every step's logits. `compiler`
    overrides inductor's C++ compiler (a name or path; one that does not work gives the eager-only report, and
    so does any error of the first compiled loop: reason "inductor failed: <its first line>"). Fewer than
    evidence.MIN_REPEATS (4) repeats run, but the verdict calls them unreliable.
    torch._dynamo is reset before and after, so nothing leaks into later code. About 30 s for the course
    TinyLM on 2 cores, nearly all of it compiling."""
    check_type("model", model, TinyLM, "a TinyLM")
    check_positive_int("prompt_tokens", prompt_tokens, "tokens")
    check_positive_int("new_tokens", new_tokens, "tokens")
    check_positive_int("repeats", repeats)
    check_bool("fresh_cache", fresh_cache)
    cfg = model.cfg
    if prompt_tokens + new_tokens > cfg.max_seq_len:
        fail("new_tokens", new_tokens, f"an int with prompt_tokens {prompt_tokens} + new_tokens <= "
             f"{cfg.max_seq_len} (the model's context)")
    path, ok, reason = _find(compiler)
    prompt = [t % cfg.vocab_size for t in corpus.corpus("test", prompt_tokens)]
    continuation = model.generate(prompt, new_tokens)[:-1]  # the last token is never fed back
    loops = {"eager": lambda: _decode_loop(model, cfg, prompt, continuation)}
    base = dict(prompt_tokens=prompt_tokens, new_tokens=new_tokens, repeats=repeats)
    if not ok:
        return _eager_only(loops["eager"], reason, base)
    from torch._inductor import metrics
    reference = loops["eager"]()
    compile_blocks_apart(model)
    torch._dynamo.reset()
    try:
        graphs, breaks = _explain(model, prompt)
        torch._dynamo.reset()
        metrics.reset()
        compiled = torch.compile(model)
        loops["compiled"] = lambda: _decode_loop(compiled, cfg, prompt, continuation)
        with _inductor_env(path if compiler else None, fresh_cache):
            t0 = time.perf_counter()
            try:
                logits = loops["compiled"]()
            except Exception as e:  # the compiler passed the probe, yet inductor could not build its code
                failed = _first_line(e)
            else:
                failed = None
                first = time.perf_counter() - t0
                kernels = metrics.generated_kernel_count
                times = timing.interleave(loops, repeats)
    finally:
        torch._dynamo.reset()
    if failed is not None:
        return _eager_only(loops["eager"], f"inductor failed: {failed}", base)
    base["reason"] = reason
    eager, comp = times["eager"], times["compiled"]
    report = CompileReport(compiler=path, eager_s=eager.median,
                           eager_tokens_per_s=new_tokens / eager.median, eager_spread=eager.spread,
                           compile_s=max(first - comp.median, 0.0), compiled_s=comp.median,
                           compiled_tokens_per_s=new_tokens / comp.median, compiled_spread=comp.spread,
                           speedup=eager.median / comp.median, kernels=kernels, graphs=graphs, graph_breaks=breaks,
                           max_abs_diff=float((logits - reference).abs().max()), **base)
    reliable, verdict = compile_verdict(eager, comp, report.compile_s, new_tokens)
    return CompileReport(**{**report.__dict__, "reliable": reliable, "verdict": verdict})


def _first_line(e: Exception) -> str:
    """The first non-empty line of an exception's message, after its type's name."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else '(no message)'}"[:300]


def _eager_only(eager_loop, reason: str, base: dict) -> CompileReport:
    """The report without compiled figures: eager timed alone, `reason` in the verdict."""
    eager = timing.interleave({"eager": eager_loop}, base["repeats"])["eager"]
    return CompileReport(compiler=None, reason=reason, eager_s=eager.median,
                         eager_tokens_per_s=base["new_tokens"] / eager.median, eager_spread=eager.spread,
                         verdict=f"eager only: {reason}", **base)


def _explain(model: TinyLM, prompt: list[int]) -> tuple[int, int]:
    """(graphs, graph breaks) torch._dynamo finds in one decode step after `prompt`."""
    cache = KVCache(model.cfg)
    with torch.no_grad():
        model(torch.tensor([prompt]), cache)
        explained = torch._dynamo.explain(model)(torch.tensor([[prompt[-1]]]), cache)
    return explained.graph_count, explained.graph_break_count


def inductor_kernels(gm: torch.fx.GraphModule, inputs, compiler: str | None = None) -> list[str]:
    """The names of the C++ kernels inductor launches, in order, for one run of `gm` (compiled with
    torch._inductor.compile into a fresh cache whose generated wrapper is read back). Names list the ops
    each kernel fused: 'cpp_fused_add_mean_mul_pow_rsqrt_2'. `inputs` must be like the traced ones
    (graph.check_inputs). RuntimeError when no compiler works or inductor fails ("inductor failed: ...")."""
    inputs = check_inputs(gm, inputs)
    path, ok, reason = _find(compiler)
    if not ok:
        raise RuntimeError(reason)
    from torch._inductor import compile as inductor_compile
    args = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    with tempfile.TemporaryDirectory() as tmp, _inductor_env(path if compiler else None, True, keep_in=tmp):
        try:
            inductor_compile(copy.deepcopy(gm), args)  # compile_fx rewrites the graph it is given
        except Exception as e:
            raise RuntimeError(f"inductor failed: {_first_line(e)}") from e
        wrappers = [open(p).read() for p in glob.glob(os.path.join(tmp, "**", "*.py"), recursive=True)]
    calls = [w.split("def call(", 1)[1] for w in wrappers if "def call(" in w and "cpp_fused" in w]
    if len(calls) != 1:
        raise RuntimeError(f"expected one generated wrapper with C++ kernels, found {len(calls)}")
    return re.findall(r"^\s+(cpp_fused_\w+)\(", calls[0], re.MULTILINE)
