"""ModelRunner: swap space and block copies move the bytes exactly; execute runs them in the documented order."""
import pytest
import torch

from labkit.serving import ModelRunner
from labkit.serving.batch import StepInput
from tests.refusals import assert_refused

BS = 4


def filled(model, num_blocks=8):
    runner = ModelRunner(model, num_blocks, BS)
    g = torch.Generator().manual_seed(0)
    runner.k.copy_(torch.randn(runner.k.shape, generator=g))
    runner.v.copy_(torch.randn(runner.v.shape, generator=g))
    return runner


def block(t, b):
    return t[:, :, b * BS:(b + 1) * BS].clone()


def test_swap_out_then_in_restores_every_byte_into_new_blocks(model):
    runner = filled(model)
    before = [(block(runner.k, b), block(runner.v, b)) for b in (1, 3, 4)]
    runner.swap_out("a", [1, 3, 4])
    runner.k.zero_()
    runner.v.zero_()
    runner.swap_in("a", 1, [6, 2])  # host blocks 1 and 2 (block 0 was a prefix hit: not copied back)
    assert torch.equal(block(runner.k, 6), before[1][0]) and torch.equal(block(runner.v, 2), before[2][1])
    assert torch.equal(block(runner.k, 1), torch.zeros_like(before[0][0]))
    assert "a" not in runner.host


def test_copy_block(model):
    runner = filled(model)
    src = block(runner.k, 2)
    runner.copy_block(2, 5)
    assert torch.equal(block(runner.k, 5), src)


def test_execute_swaps_out_before_copies_and_swap_ins_land(model):
    runner = filled(model)
    saved = block(runner.k, 0)
    empty = torch.zeros(0, dtype=torch.long)
    # block 0 goes to host and block 7 is copied over it in the same step: the host copy must be the old bytes
    runner.execute(StepInput(empty, empty, empty, [], [], [], [], copies=[(7, 0)], swap_out=[("s", [0])]))
    assert torch.equal(runner.host["s"][0], saved)
    runner.execute(StepInput(empty, empty, empty, [], [], [], [], swap_in=[("s", 0, [3])]))
    assert torch.equal(block(runner.k, 3), saved)
    runner.execute(StepInput(empty, empty, empty, [], [], [], [], swap_out=[("t", [1])], drop=["t"]))
    assert runner.host == {}


def test_refusals(model):
    runner = filled(model)
    assert_refused(lambda: runner.swap_in("x", 0, [1]), ValueError, "key", "x", "a swapped-out sequence")
    runner.swap_out("a", [1])
    assert_refused(lambda: runner.swap_out("a", [2]), ValueError, "key", "a", "not swapped out already")
    with pytest.raises(ValueError, match="blocks must be within the 1 blocks .a. swapped out"):
        runner.swap_in("a", 0, [2, 3])
    assert "a" in runner.host  # a refused swap-in keeps the host copy
    assert_refused(lambda: ModelRunner(model, 4, 3), ValueError, "block_size", 3, "a positive power of two")
    assert_refused(lambda: ModelRunner("tinylm", 4, 4), TypeError, "model", "str", "a TinyLM")
    assert_refused(lambda: ModelRunner(model, 0, BS), ValueError, "num_blocks", 0, "a positive int")
    assert runner.nbytes() == 2 * 4 * runner.k.numel()


def test_execute_passes_embeds_only_to_a_step_that_has_them():
    from labkit.tinylm import TinyLM, TinyLMConfig

    class Recording(TinyLM):
        def forward(self, tokens, cache=None, **kwargs):
            self.calls.append(kwargs)
            return super().forward(tokens, cache, **kwargs)

    torch.manual_seed(0)
    model = Recording(TinyLMConfig(vocab_size=32, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=16,
                                   max_seq_len=16)).eval()
    model.calls = []
    runner = ModelRunner(model, 4, BS)
    tokens = torch.tensor([1, 2, 3])
    step = StepInput(tokens, torch.arange(3), torch.arange(3), [3], [3], [[0]], [0])
    plain = runner.execute(step)
    rows, values = torch.tensor([0, 1]), torch.randn(2, 8)
    step.embeds = (rows, values)
    with_images = runner.execute(step)
    assert model.calls == [{}, {"embeds": (rows, values)}]
    with torch.no_grad():
        want = model(tokens[None], embeds=(rows, values))[0, -1]
    assert torch.allclose(with_images[0], want, atol=1e-5) and not torch.allclose(plain, with_images)


def one_step():
    tokens = torch.tensor([1, 2, 3])
    return StepInput(tokens, torch.arange(3), torch.arange(3), [3], [3], [[0]], [0])


def pools_in_one_buffer(shape, gap=16):
    """K and V as views of one buffer, `gap` elements apart (as a rank's arena holds them)."""
    n = torch.Size(shape).numel()
    buffer = torch.zeros(2 * n + gap)
    return buffer, (buffer[:n].view(shape), buffer[n + gap:].view(shape))


def test_given_pools_are_the_runner_s_and_give_the_same_logits(model):
    plain = ModelRunner(model, 4, BS)
    buffer, pools = pools_in_one_buffer(plain.k.shape)
    runner = ModelRunner(model, 4, BS, pools=pools)
    assert runner.k.data_ptr() == pools[0].data_ptr() and runner.v.data_ptr() == pools[1].data_ptr()
    assert torch.equal(runner.execute(one_step()), plain.execute(one_step()))
    n = plain.k.numel()
    assert torch.equal(buffer[:n].view(plain.k.shape), plain.k) and torch.equal(buffer[n + 16:].view(plain.v.shape),
                                                                                plain.v)
    assert plain.k.abs().sum() > 0  # the step wrote K: the comparison above could fail


def test_bad_pools_are_refused(model):
    shape = ModelRunner(model, 4, BS).k.shape
    _, (k, v) = pools_in_one_buffer(shape)
    assert_refused(lambda: ModelRunner(model, 4, BS, pools=[k, v]), TypeError, "pools", "list", "a pair (k, v)")
    assert_refused(lambda: ModelRunner(model, 4, BS, pools=(k, v.double())), ValueError, "pools[1]",
                   f"torch.float64 {tuple(shape)}", "a contiguous torch.float32 tensor")
    assert_refused(lambda: ModelRunner(model, 4, BS, pools=(k, v.transpose(1, 2))), ValueError, "pools[1]",
                   f"torch.float32 {tuple(v.transpose(1, 2).shape)}", "a contiguous")
    assert_refused(lambda: ModelRunner(model, 4, BS, pools=(k, k)), ValueError, "pools", "two views sharing bytes",
                   "K and V pools that do not overlap")
