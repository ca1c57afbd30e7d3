"""The alpha-beta model: the fit recovers known alpha and beta from noiseless and noisy times, collective
times follow the ring formulas, bus bandwidth is nccl-tests', spec links come from data/hardware.json."""
import numpy as np
import pytest

from labkit.parallel import linkmodel as lm
from tests.refusals import assert_refused


@pytest.mark.parametrize("op,n", [("all_reduce", 2), ("all_gather", 4), ("all_to_all", 3)])
def test_fit_recovers_alpha_and_beta(op, n):
    true = lm.LinkModel(2e-4, 1.5e9)
    sizes = np.geomspace(1e3, 6.4e7, 12)
    rng = np.random.default_rng(0)
    times = np.array([true.collective(op, s, n) for s in sizes])
    exact = lm.fit(op, sizes, times, n)
    assert exact.alpha == pytest.approx(2e-4, rel=1e-6) and exact.beta == pytest.approx(1.5e9, rel=1e-6)
    noisy = lm.fit(op, sizes, times * rng.uniform(0.9, 1.1, times.size), n)
    assert noisy.alpha == pytest.approx(2e-4, rel=0.25) and noisy.beta == pytest.approx(1.5e9, rel=0.25)


def test_collective_times_follow_the_ring():
    link = lm.LinkModel(1e-5, 1e9)
    assert link.collective("all_reduce", 1e9, 4) == pytest.approx(6 * 1e-5 + 1.5)
    assert link.collective("all_gather", 1e9, 4) == pytest.approx(3 * 1e-5 + 0.75)
    assert link.collective("all_reduce", 1e9, 1) == 0
    assert lm.bus_bandwidth("all_reduce", 1e9, 1.0, 8) == pytest.approx(1.75e9)


def test_spec_links():
    ib = lm.LinkModel.from_spec("ib-ndr-400")
    assert ib.beta == 50e9 and ib.alpha == lm.SPEC_LATENCY["ib-ndr-400"]
    assert lm.LinkModel.from_spec("nvlink4", alpha=1e-6).alpha == 1e-6
    assert_refused(lambda: lm.LinkModel.from_spec("h100-sxm"), ValueError, "name", "h100-sxm", "a link")


def test_bad_input_is_refused():
    assert_refused(lambda: lm.fit("all_reduce", [1, 2], [1.0], 2), ValueError, "sizes", [1.0, 2.0], "one per")
    assert_refused(lambda: lm.fit("all_reduce", [1, 2], [1.0, -1], 2), ValueError, "seconds", [1.0, -1.0],
                   "positive")
    assert_refused(lambda: lm.fit("all_reduce", [1, 2, 3], [3.0, 2.0, 1.0], 2), ValueError, "seconds", [3.0, 2.0, 1.0],
                   "grow with the size")
    assert_refused(lambda: lm.LinkModel(1e-6, 0), ValueError, "beta", 0, "positive")
    assert_refused(lambda: lm.fit("all_reduce", [1e3, 2e3], [1e-3, 2e-3], 1), ValueError, "n", 1,
                   "one rank sends nothing")
