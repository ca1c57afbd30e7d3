import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from labkit.course import Timing
from labkit.memory_wall import hardware

from ..refusals import assert_refused


def test_measure_bandwidth_reports_bytes_per_second_for_read_and_copy():
    got = hardware.measure_bandwidth(nbytes=8 * 2**20, repeats=3, progress=False)
    assert set(got) == {"read", "copy", "read_threads", "threads", "array_bytes", "repeats", "timings"}
    assert got["array_bytes"] == 8 * 2**20 and got["repeats"] == 3
    # A sanity range only (real memory moves 100 MB/s to 100 TB/s): a factor of 2 passes it, so the accounting
    # of bytes and FLOP is pinned exactly below, against fake timings and torch's own FLOP counter.
    assert all(1e8 < got[k] < 1e14 for k in ("read", "copy", "read_threads"))
    assert got["threads"] == torch.get_num_threads()
    # each figure is the median of its rounds (copy counts the bytes read and the bytes written)
    t = got["timings"]
    assert set(t) == {"read", "copy", "read_threads"} and all(isinstance(v, Timing) and len(v.times) == 3
                                                              for v in t.values())
    assert got["read"] == 8 * 2**20 / t["read"].median and got["copy"] == 2 * 8 * 2**20 / t["copy"].median
    assert got["read_threads"] == 8 * 2**20 / t["read_threads"].median


def test_measure_memory_times_every_kernel_the_same_number_of_rounds():
    got = hardware.measure_memory(nbytes=4 * 2**20, rows=64, cols=32, n_matrices=3, repeats=4, progress=False)
    assert set(got["timings"]) == {"read", "copy", "read_threads", "gemv"}
    assert all(len(t.times) == 4 for t in got["timings"].values())
    g = got["gemv"]
    assert g["weight_bytes"] == 64 * 32 * 4 and g["n_matrices"] == 3 and g["intensity"] == 0.5
    assert g["seconds"] == pytest.approx(got["timings"]["gemv"].median / 3)
    assert g["bytes_per_s"] == pytest.approx(64 * 32 * 4 / g["seconds"])
    assert got["read_threads"] == 4 * 2**20 / got["timings"]["read_threads"].median


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_measure_flops_reports_flop_per_second(dtype):
    flops = hardware.measure_flops(dtype, n=128, repeats=2, progress=False)
    assert 1e7 < flops < 1e16  # a sanity range; the accounting is pinned by the next test


def fake_timing(counted: list, seconds: tuple[float, ...]):
    """A stand-in for labkit.course's measure: runs the kernel once under torch's FLOP counter (recording
    what it counts) and reports `seconds` as the timed repeats, so the rate is known exactly."""
    def measure(fn, repeats=5, warmup=1, calls=1, bar=None):
        with FlopCounterMode(display=False) as counter:
            fn()
        counted.append(counter.get_total_flops())
        return Timing(seconds)
    return measure


@pytest.mark.parametrize("n", [16, 96])
def test_measure_flops_is_the_flop_torch_counts_over_the_median_time(monkeypatch, n):
    # torch's FlopCounterMode counts an n x n by n x n product as 2 n^3 FLOP: a rate of n^3 / time fails here
    counted = []
    monkeypatch.setattr(hardware, "measure", fake_timing(counted, (0.25, 0.5, 4.0)))  # median 0.5 s
    got = hardware.measure_flops(torch.float32, n=n, repeats=3, progress=False)
    assert counted == [2 * n**3] and got == counted[0] / 0.5


def test_measure_gemv_rates_are_the_counted_flop_and_the_weight_bytes_over_the_median(monkeypatch):
    counted = []
    monkeypatch.setattr(hardware, "measure", fake_timing(counted, (0.3, 0.6, 0.9)))  # median 0.6 s per sweep
    got = hardware.measure_gemv(64, 32, n_matrices=3, repeats=3, progress=False)
    flop = counted[0] / 3  # torch's count for one matrix-vector product of the sweep
    assert flop == 2 * 64 * 32 and got["seconds"] == pytest.approx(0.2)
    assert got["flops_per_s"] == pytest.approx(flop / 0.2) and got["bytes_per_s"] == pytest.approx(64 * 32 * 4 / 0.2)


def test_measure_bandwidth_counts_bytes_read_and_for_the_copy_bytes_written_too(monkeypatch):
    # fake timings per kernel: each figure must be the bytes that kernel moves over its median, where by hand
    # a sum reads the array once and a copy reads it and writes another as large (STREAM's convention)
    seconds = {"read": 0.01, "copy": 0.04, "read_threads": 0.002}

    def interleave(fns, repeats=1, warmup=0, calls=1):
        for fn in fns.values():
            fn()
        return {name: Timing((seconds[name],)) for name in fns}

    monkeypatch.setattr(hardware, "interleave", interleave)
    nbytes = 4 * 2**20
    got = hardware.measure_bandwidth(nbytes=nbytes, repeats=2, progress=False)
    assert got["read"] == nbytes / 0.01 and got["read_threads"] == nbytes / 0.002
    assert got["copy"] == 2 * nbytes / 0.04


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_link_bandwidth_is_none_without_a_gpu():
    assert hardware.measure_link_bandwidth(progress=False) is None
    assert_refused(lambda: hardware.measure_flops(device="cuda"), ValueError, "device", "cuda",
                   "'cpu' when no GPU is available")


def test_measure_gemv_reports_consistent_rates():
    got = hardware.measure_gemv(64, 32, n_matrices=2, repeats=3, progress=False)
    assert got["weight_bytes"] == 64 * 32 * 4 and got["n_matrices"] == 2
    assert got["intensity"] == 0.5  # 2 FLOP per 4-byte weight
    assert got["flops_per_s"] == pytest.approx(got["bytes_per_s"] * got["intensity"])
    assert got["seconds"] == pytest.approx(got["timing"].median / 2) and len(got["timing"].times) == 3


def test_measure_decode_times_prefill_and_cached_steps(pretrained):
    model, _ = pretrained
    got = hardware.measure_decode(model, prompt_len=8, new_tokens=4, repeats=3)
    assert got["prefill_s"] > 0 and got["tokens_per_s"] == pytest.approx(1 / got["decode_s_per_token"])
    assert got["prefill_s"] == got["timings"]["prefill"].median and len(got["timings"]["decode"].times) == 3
    assert got["decode_s_per_token"] == pytest.approx(got["timings"]["decode"].median / 4)
    with pytest.raises(ValueError, match="prompt_len \\+ new_tokens must be <= 256, got 250 \\+ 10"):
        hardware.measure_decode(model, prompt_len=250, new_tokens=10)


def test_measure_decode_leaves_the_model_as_it_was(pretrained):
    model, _ = pretrained
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.arange(10).unsqueeze(0)
    with torch.no_grad():
        logits = model(x)
    hardware.measure_decode(model, prompt_len=4, new_tokens=3, repeats=2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(model(x), logits)


# (function, keyword arguments, error, argument named, bad value, what the message says was expected)
REFUSED = [
    (hardware.measure_bandwidth, {"nbytes": 1000}, ValueError, "nbytes", 1000, "an int >= 1048576 (bytes)"),
    (hardware.measure_bandwidth, {"nbytes": 2.5e8}, TypeError, "nbytes", 2.5e8, "an int >= 1048576"),
    (hardware.measure_bandwidth, {"nbytes": True}, TypeError, "nbytes", True, "an int >= 1048576"),
    (hardware.measure_bandwidth, {"repeats": 0}, ValueError, "repeats", 0, "a positive int"),
    (hardware.measure_bandwidth, {"progress": "no"}, TypeError, "progress", "no", "True or False"),
    (hardware.measure_flops, {"dtype": torch.int8}, ValueError, "dtype", torch.int8, "one of (torch.float32"),
    (hardware.measure_flops, {"dtype": "float32"}, TypeError, "dtype", "float32", "a torch.dtype"),
    (hardware.measure_flops, {"n": 8}, ValueError, "n", 8, "an int >= 16"),
    (hardware.measure_flops, {"n": 64.0}, TypeError, "n", 64.0, "an int >= 16"),
    (hardware.measure_flops, {"repeats": -1}, ValueError, "repeats", -1, "a positive int"),
    (hardware.measure_flops, {"device": 0}, TypeError, "device", 0, "str"),
    (hardware.measure_link_bandwidth, {"nbytes": 10}, ValueError, "nbytes", 10, "an int >= 1048576"),
    (hardware.measure_link_bandwidth, {"repeats": 1.5}, TypeError, "repeats", 1.5, "a positive int"),
    (hardware.measure_gemv, {"dtype": torch.float16}, ValueError, "dtype", torch.float16, "one of (torch.float32"),
    (hardware.measure_gemv, {"rows": 0}, ValueError, "rows", 0, "a positive int"),
    (hardware.measure_gemv, {"cols": "4096"}, TypeError, "cols", "4096", "a positive int"),
    (hardware.measure_gemv, {"n_matrices": -2}, ValueError, "n_matrices", -2, "a positive int"),
    (hardware.measure_gemv, {"repeats": 0}, ValueError, "repeats", 0, "a positive int"),
    (hardware.measure_gemv, {"progress": 1}, TypeError, "progress", 1, "True or False"),
    (hardware.measure_memory, {"nbytes": 10}, ValueError, "nbytes", 10, "an int >= 1048576"),
    (hardware.measure_memory, {"repeats": 0}, ValueError, "repeats", 0, "a positive int"),
    (hardware.measure_memory, {"rows": 0}, ValueError, "rows", 0, "a positive int"),
    (hardware.measure_memory, {"n_matrices": 2.0}, TypeError, "n_matrices", 2.0, "a positive int"),
    (hardware.measure_memory, {"progress": None}, TypeError, "progress", None, "True or False"),
]


@pytest.mark.parametrize("fn,kwargs,error,name,value,expected", REFUSED,
                         ids=[f"{r[0].__name__}-{r[3]}-{r[4]!r}" for r in REFUSED])
def test_bad_settings_are_refused_before_anything_is_measured(fn, kwargs, error, name, value, expected):
    assert_refused(lambda: fn(**kwargs), error, name, value, expected)


@pytest.mark.parametrize("kwargs,error,name,value,expected", [
    ({"prompt_len": 0}, ValueError, "prompt_len", 0, "a positive int (tokens)"),
    ({"new_tokens": 2.0}, TypeError, "new_tokens", 2.0, "a positive int (tokens)"),
    ({"repeats": 0}, ValueError, "repeats", 0, "a positive int"),
])
def test_measure_decode_refuses_bad_settings(pretrained, kwargs, error, name, value, expected):
    model, _ = pretrained
    assert_refused(lambda: hardware.measure_decode(model, **kwargs), error, name, value, expected)
    assert_refused(lambda: hardware.measure_decode("tinylm"), TypeError, "model", "tinylm", "a labkit.tinylm.TinyLM")
