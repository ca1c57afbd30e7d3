"""The ladder's timing (labkit.quant.kernels_speed): every rung, torch's kernel and the roof on each thread
count, the figures derived from the medians as their definitions say, the verdicts drawn by lab 01's rules
(never a wall-clock assertion), and refusals."""
from types import SimpleNamespace

import pytest

from labkit.course import Timing, timing
from labkit.quant import kernels
from labkit.quant import kernels_speed as ks
from labkit.quant.kernels_jit import max_threads

# the rungs this machine runs: rungs 6-7 only where a C compiler built them (make test-builds runs this file with
# LABKIT_C=0 as well)
RAN = [name for name in kernels.RUNGS if kernels.available(name)[0]]


def test_a_small_run_has_every_case_and_consistent_figures():
    run = ks.measure_ladder(32, 64, matrices=2, repeats=2, slow_repeats=1, threads=(1,), roof_bytes=4096)
    names = RAN + [ks.TORCH, ks.ROOF]
    assert set(run.timings) == {ks.case(n, 1) for n in names}
    assert all(len(run.timings[ks.case(n, 1)].times) == (1 if n in ks.SLOW else 2) for n in names)
    w_bytes = 32 * 64 // 2 + 2 * 4 * 32 * 2  # packed codes + float32 scale and zero per group of 32
    assert run.weight_bytes["3 fused loop (numba)"] == w_bytes
    name = "4 blocked, threads (numba)"
    assert run.bytes_per_s(name, 1) == pytest.approx(w_bytes / run.seconds(name, 1))
    assert run.flops_per_s(name, 1) == pytest.approx(2 * 32 * 64 / run.seconds(name, 1))
    assert run.roof_share(name, 1) == pytest.approx(run.bytes_per_s(name, 1) / (4096 / run.seconds(ks.ROOF, 1)))
    assert run.best(1) == min(RAN, key=lambda r: run.seconds(r, 1))
    assert len(run.lines()) == 1 + len(kernels.RUNGS) + 1
    assert set(run.verdicts(1)) == {"vs torch", "roof"}
    rung, roof = run.timings[ks.case(name, 1)].times, run.timings[ks.case(ks.ROOF, 1)].times
    assert run.roof_shares(name, 1) == pytest.approx([w_bytes / a / (4096 / b) for a, b in zip(rung, roof)])


def test_no_call_reads_the_matrix_the_call_before_it_read(monkeypatch):
    # rung 7 after rung 6 on the same 4096x4096 matrix ran 11% faster (part of it still in the cache)
    read = []  # (case, matrix) in the order the calls ran
    for name in kernels.RUNGS:
        def record(x, w, name=name):
            read.append((name, id(w.reference)))
        monkeypatch.setitem(kernels.RUNGS, name, record)
    monkeypatch.setattr(kernels.QuantLinear, "forward_int4pack",
                        lambda layer, x: read.append((ks.TORCH, id(layer))))
    threads = (1, 2) if max_threads() >= 2 else (1,)
    ks.measure_ladder(32, 64, matrices=3, repeats=4, slow_repeats=2, threads=threads, roof_bytes=4096)
    matrices = [m for _, m in read]
    assert len(set(matrices)) == 3 and {n for n, _ in read} == set(RAN) | {ks.TORCH}
    assert all(a != b for a, b in zip(matrices, matrices[1:]))


def test_a_sample_of_a_fast_case_is_one_product_per_matrix(monkeypatch):
    # one setting of the thread count per sample (a setting per product added 3-5% to a 4096x4096 one); the
    # sample is divided by the products in it, the roof's and the slow rungs' samples are one call each
    calls = {}
    for name in kernels.RUNGS:
        monkeypatch.setitem(kernels.RUNGS, name, lambda x, w, name=name: calls.update({name: calls.get(name, 0) + 1}))
    clock = iter(range(10 ** 6))  # each perf_counter() call one second later: every sample lasts 1 s
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))  # timing's alone
    run = ks.measure_ladder(32, 64, matrices=3, repeats=4, slow_repeats=2, threads=(1,), roof_bytes=4096)
    assert set(calls) == set(RAN)
    for name in RAN:
        slow = name in ks.SLOW
        assert calls[name] == (2 + 1 if slow else (4 + 2) * 3)  # (repeats + warmup) samples, products in each
        assert run.timings[ks.case(name, 1)].times == ((1.0,) * 2 if slow else (1 / 3,) * 4)
    assert run.timings[ks.case(ks.TORCH, 1)].times == (1 / 3,) * 4
    assert run.timings[ks.case(ks.ROOF, 1)].times == (1.0,) * 4


def fake(times=(1e-3, 1.05e-3, 1.1e-3, 1.15e-3, 1.2e-3)):
    names = list(kernels.RUNGS) + [ks.TORCH, ks.ROOF]
    timings = {ks.case(n, 1): Timing(times) for n in names}
    timings[ks.case(ks.TORCH, 1)] = Timing(tuple(3 * t for t in times))
    return timings, {n: 1000 for n in names[:-1]}


def test_the_best_rung_is_judged_against_torch():
    timings, nbytes = fake()
    timings[ks.case("4 blocked, threads (numba)", 1)] = Timing((0.5e-3, 0.525e-3, 0.55e-3, 0.575e-3, 0.6e-3))
    run = ks.LadderRun(timings, nbytes, 32, 64, (1,), 4096)
    assert run.best(1) == "4 blocked, threads (numba)"
    v = run.verdicts(1)["vs torch"]
    assert v.reliable and v.ratio == pytest.approx(3.3e-3 / 0.55e-3)


def test_refusals():
    timings, nbytes = fake()
    with pytest.raises(ValueError, match="timings must be"):
        ks.LadderRun({k: v for k, v in list(timings.items())[1:]}, nbytes, 32, 64, (1,))
    with pytest.raises(ValueError, match="weight_bytes must be"):
        ks.LadderRun(timings, {}, 32, 64, (1,))
    with pytest.raises(ValueError, match="missing must be names of rungs"):
        ks.LadderRun(timings, nbytes, 32, 64, (1,), missing={"7 a rung that is not": "why"})
    with pytest.raises(ValueError, match="n must be"):
        ks.measure_ladder(0, 64)
    with pytest.raises(ValueError, match="matrices must be at least 2 .* got 1"):
        ks.measure_ladder(32, 64, matrices=1)
    with pytest.raises(ValueError, match="n must be an int in"):
        ks.measure_ladder(32, 64, threads=(max_threads() + 1,))
