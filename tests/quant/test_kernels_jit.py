"""The compiled loops of the INT4 ladder equal their plain-Python selves (.py_func)."""
import pytest
import torch

from labkit.quant import kernels as kk
from labkit.quant import kernels_jit as kj

from .test_kernels import layer


def test_compiled_loops_equal_plain_python():
    if not kj.ENABLED:
        pytest.skip("numba is not in use")
    q, x = layer(20, 64, 16, seed=3)
    w = kk.pack_weight(q)
    x_even, x_odd = kk._split(x.numpy())
    x_sums = x.numpy().reshape(1, -1, 16).sum(-1)
    xq, x_scale = kk.quantize_activations(x, 16)
    xq_even, xq_odd = kk._split(xq.numpy())
    xq_sums = xq.numpy().reshape(1, -1, 16).sum(-1).astype("float32")
    for fn, args in ((kj.fused, (x_even, x_odd, w.packed, w.scale, w.zero)),
                     (kj.blocked, (x_even, x_odd, x_sums, w.packed, w.scale, w.zero, 3)),
                     (kj.integer, (xq_even, xq_odd, x_scale.numpy(), xq_sums, w.packed, w.scale, w.zero, 3))):
        a, b = torch.empty(1, 20).numpy(), torch.empty(1, 20).numpy()
        fn(*args, a)
        fn.py_func(*args, b)
        assert torch.allclose(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-5, atol=1e-5)
