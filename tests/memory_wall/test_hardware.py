import pytest
import torch

from labkit.memory_wall import hardware


def test_measure_bandwidth_reports_bytes_per_second_for_read_and_copy():
    got = hardware.measure_bandwidth(nbytes=8 * 2**20, repeats=2, progress=False)
    assert set(got) == {"read", "copy", "read_threads", "threads", "array_bytes", "repeats"}
    assert got["array_bytes"] == 8 * 2**20 and got["repeats"] == 2
    # Any real memory system lies between 100 MB/s and 100 TB/s; a unit slip (bits, GiB, per-element) would not.
    assert all(1e8 < got[k] < 1e14 for k in ("read", "copy", "read_threads"))
    assert got["threads"] == torch.get_num_threads()


@pytest.mark.parametrize("kwargs", [{"nbytes": 1000}, {"nbytes": 2.5e8}, {"repeats": 0}, {"nbytes": True}])
def test_measure_bandwidth_refuses_bad_sizes(kwargs):
    with pytest.raises(ValueError, match="nbytes|repeats"):
        hardware.measure_bandwidth(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_measure_flops_reports_flop_per_second(dtype):
    flops = hardware.measure_flops(dtype, n=128, repeats=2, progress=False)
    assert 1e7 < flops < 1e16


@pytest.mark.parametrize("kwargs,match", [({"dtype": torch.int8}, "dtype"), ({"n": 8}, "n must"),
                                          ({"repeats": -1}, "repeats")])
def test_measure_flops_refuses_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hardware.measure_flops(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_link_bandwidth_is_none_without_a_gpu():
    assert hardware.measure_link_bandwidth(progress=False) is None
    with pytest.raises(ValueError, match="device"):
        hardware.measure_flops(device="cuda")


def test_measure_gemv_reports_consistent_rates():
    got = hardware.measure_gemv(64, 32, n_matrices=2, repeats=2, progress=False)
    assert got["weight_bytes"] == 64 * 32 * 4
    assert got["intensity"] == 0.5  # 2 FLOP per 4-byte weight
    assert got["flops_per_s"] == pytest.approx(got["bytes_per_s"] * got["intensity"])
    assert got["seconds"] > 0
    with pytest.raises(ValueError, match="dtype"):
        hardware.measure_gemv(dtype=torch.float16)


def test_measure_decode_times_prefill_and_cached_steps(pretrained):
    model, _ = pretrained
    got = hardware.measure_decode(model, prompt_len=8, new_tokens=4, repeats=1)
    assert got["prefill_s"] > 0 and got["tokens_per_s"] == pytest.approx(1 / got["decode_s_per_token"])
    with pytest.raises(ValueError, match="prompt_len \\+ new_tokens"):
        hardware.measure_decode(model, prompt_len=250, new_tokens=10)
