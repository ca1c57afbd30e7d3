"""Paged optimizer states replayed on lab 02's pool: faults every step only when the device is too small."""

from labkit.finetune import paged
from tests.refusals import assert_refused


def test_paged_states_fault_back_each_step_only_when_the_device_is_too_small():
    numels = [4096, 1024, 2048]
    big = paged.replay_paged_states(numels, [0, 1, 2], 65536, device_bytes=2**22, steps=3)
    assert big[0]["faults"] > 0 and big[1]["faults"] == big[2]["faults"] == 0
    small = paged.replay_paged_states(numels, [0, 1, 2], 65536, device_bytes=16 * 4096, steps=3)
    pages = 16 + 2 * sum(n * 4 // 4096 for n in numels)  # activations + m and v, in 4 KiB pages
    assert all(r["migrations"] == pages for r in small[1:])  # LRU over a cyclic scan: every page faults each step
    assert_refused(lambda: paged.replay_paged_states(numels, [3], 4096, 2**20), ValueError, "order", [3], "indices")


def test_state_bytes_per_value_must_be_a_positive_number():
    for bad in (-4.0, 0.0, float("nan"), float("inf")):
        assert_refused(lambda: paged.replay_paged_states([4096], [0], 4096, 2**20, state_bytes_per_value=bad),
                       ValueError, "state_bytes_per_value", bad, "positive")
    assert_refused(lambda: paged.replay_paged_states([4096], [0], 4096, 2**20, state_bytes_per_value="4"),
                   TypeError, "state_bytes_per_value", "4", "number")
