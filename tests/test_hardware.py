import pytest
import torch

from labkit import hardware


def test_measure_bandwidth_reports_bytes_per_second_for_read_and_copy():
    got = hardware.measure_bandwidth(nbytes=8 * 2**20, repeats=2, progress=False)
    assert set(got) == {"read", "copy", "array_bytes", "repeats"}
    assert got["array_bytes"] == 8 * 2**20 and got["repeats"] == 2
    # Any real memory system lies between 100 MB/s and 100 TB/s; a unit slip (bits, GiB, per-element) would not.
    assert 1e8 < got["read"] < 1e14 and 1e8 < got["copy"] < 1e14


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
