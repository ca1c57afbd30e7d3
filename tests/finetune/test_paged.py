"""Paged optimizer states replayed on lab 02's pool: faults every step only when the device is too small; StepOrder
records the parameters each step of a real optimizer updated, from outside it."""
import pytest
import torch

from labkit.finetune import optim8bit, paged
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
        assert_refused(lambda bad=bad: paged.replay_paged_states([4096], [0], 4096, 2**20, state_bytes_per_value=bad),
                       ValueError, "state_bytes_per_value", bad, "positive")
    assert_refused(lambda: paged.replay_paged_states([4096], [0], 4096, 2**20, state_bytes_per_value="4"),
                   TypeError, "state_bytes_per_value", "4", "number")


@pytest.mark.parametrize("make", [torch.optim.AdamW, optim8bit.AdamW8bit])
def test_step_order_records_the_parameters_each_step_updated_in_param_group_order(make):
    """Two groups; the parameters whose value a step changed, found by comparing them before and after, are the
    ones StepOrder lists (a parameter without a gradient is skipped), and a closure's gradients count."""
    ps = [torch.nn.Parameter(torch.randn(5)) for _ in range(4)]
    opt = make([{"params": ps[:2]}, {"params": ps[2:], "lr": 1e-2}], weight_decay=0.0)
    watch = paged.StepOrder(opt)
    assert watch.order == []
    for used in ([0, 2, 3], [1, 3]):
        before = [p.detach().clone() for p in ps]

        def closure(used=used):
            opt.zero_grad(set_to_none=True)
            loss = sum(ps[i].square().sum() for i in used)
            loss.backward()
            return loss

        opt.step(closure)
        changed = [i for i, (a, p) in enumerate(zip(before, ps)) if not torch.equal(a, p)]
        assert watch.order == changed == used
    watch.remove()
    ps[0].grad = torch.ones(5)
    opt.step()
    assert watch.order == [1, 3]  # removed: the last step is not recorded
    with pytest.raises(TypeError, match="optimizer must be Optimizer, got list"):
        paged.StepOrder(ps)
