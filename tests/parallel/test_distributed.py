"""The pool of real ranks: results in rank order, one torch thread per rank, a failing or dying rank ends
the group at once with an error naming it (never a hang), the pool restarts on the next run, and bad
input is refused before any process starts."""
import time

import pytest

from labkit.parallel import Pool, RankError, shared_pool
from labkit.parallel.distributed import MAX_WORLD, check_worker
from tests.parallel import workers
from tests.refusals import assert_refused


@pytest.mark.timeout(60)
def test_results_come_back_in_rank_order(pool2):
    assert pool2.run(workers.rank_and_sum, 10) == [(0, 2, 21.0), (1, 2, 21.0)]
    assert pool2.run(workers.threads) == [1, 1]


@pytest.mark.timeout(60)
def test_a_failing_rank_ends_the_group_naming_the_rank():
    with Pool(2, timeout=30) as pool:
        t0 = time.monotonic()
        with pytest.raises(RankError) as info:
            pool.run(workers.fail_on, 1)
        assert time.monotonic() - t0 < 10  # long before the 30 s collective timeout
        assert info.value.rank == 1 and "rank 1" in str(info.value)
        assert "ValueError: boom on 1" in str(info.value) and "boom on 1" in info.value.trace
        assert not pool.running
        assert pool.run(workers.rank_and_sum, 0) == [(0, 2, 1.0), (1, 2, 1.0)]  # restarted


@pytest.mark.timeout(60)
def test_a_dying_rank_is_reported():
    with Pool(2) as pool:
        with pytest.raises(RankError, match="rank 0 failed with exit: the process ended with exit code 3"):
            pool.run(workers.die_on, 0)


@pytest.mark.timeout(60)
def test_an_overrunning_task_times_out():
    with Pool(2) as pool:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] did not finish sleep within 1 s"):
            pool.run(workers.sleep, 30, timeout=1)
        assert time.monotonic() - t0 < 5 and not pool.running


def test_bad_input_is_refused_before_any_process_starts():
    assert_refused(lambda: Pool(MAX_WORLD + 1), ValueError, "world", MAX_WORLD + 1, f"in [1, {MAX_WORLD}]")
    assert_refused(lambda: Pool(2.0), TypeError, "world", 2.0, "an int")
    assert_refused(lambda: Pool(2, timeout=0), ValueError, "timeout", 0, "positive")
    with pytest.raises(TypeError, match="module-level function"):
        check_worker(lambda rank, world: 0)
    pool = Pool(2)
    with pytest.raises(TypeError, match="module-level function"):
        pool.run(lambda rank, world: 0)
    assert not pool.running


@pytest.mark.timeout(60)
def test_shared_pool_is_one_per_size():
    first = shared_pool(1)
    pids = first.run(workers.pid)
    again = shared_pool(1)
    assert again is first and again.running and again.run(workers.pid) == pids  # the same processes, reused
    assert_refused(lambda: shared_pool(0), ValueError, "world", 0, "in [1,")
