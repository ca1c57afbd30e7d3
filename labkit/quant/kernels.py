"""A ladder of INT4 batch-1 matrix-vector kernels over lab 03's own format, from naive to the memory roof
(notebook 03, section 8; benchmarks/int4_matmul.py). Every rung has one signature, rung(x, w) -> y:

    x   float32 [K] or [M, K] (M = 1 is the decode step; more rows are M products, one after another)
    w   a QTensor [N, K] (4 bits, integer or "channel"/"tensor" groups of even length), or the Int4Weight
        that pack_weight(q) prepares once (pass that when timing: a QTensor is packed on every call)
    y   float32 [N] or [M, N] = x @ w_hat.T

    1 dequantize   unpack and dequantize the whole matrix into a fresh FP32 copy, then one FP32 matmul:
                   writes and reads 8x the packed bytes (why nobody ships it)
    2 reference    QuantLinear's tiled reference path: dequantize 256 columns at a time in torch ops
                   (no full copy, but each tile is still written to memory and read back)
    3 fused        one compiled loop: unpack a byte's two codes, dequantize, multiply, accumulate in a
                   register; the weights are read once, no Python between them
    4 blocked      the loop of 3 spread over threads by tasks of output rows (prange); per group the sums
                   of nibble * x (low and high nibbles apart, each in its own SIMD register), then the scale
                   and zero point applied once: fewer float operations per weight
    5 integer      activations quantized to int8 per block of 32 (llama.cpp's Q8_0), int4 x int8 products
                   summed in integers, one float step per block; approximate (x is rounded)
    6 C            plain C (int4_gemv.c) built by this machine's compiler for its own CPU, on a layout with
                   output rows in the SIMD lanes: a broadcast x[k] meets 8 or 16 rows' codes at once, a shift
                   and a mask give the codes, a bit trick turns them into floats, nothing is summed across
                   lanes; OpenMP threads over blocks of rows. Only where a C compiler is (kernels_c), for groups
                   of a multiple of 8 inputs
    7 C int8       rung 5's arithmetic (llama.cpp's Q4_0 x Q8_0 idea) in C on rung 6's layout: the codes stay
                   bytes, and one instruction (VNNI's vpdpbusd, else AVX2's vpmaddubsw) multiplies 32 of them
                   (8 rows x 4 inputs) by 4 int8 inputs broadcast to every row; one float step per block of 32
                   inputs (8 or 16 for shorter groups).
                   Approximate as rung 5; where rung 6 is

RUNGS lists them in order (name -> function). The loops are in kernels_jit.py and int4_gemv.c.
with_rung(model, name) runs every QuantLinear of a quantized TinyLM through one rung (notebook 03 measures rung
5's error that way).
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from .._checks import check_int, check_type, fail
from .linear import QuantLinear
from .packing import pack_int4, unpack_int4
from .qtensor import QTensor, check_has_data
from . import kernels_c, kernels_jit as jit

ROWS_PER_TASK = 16  # output rows per parallel task of rungs 4 and 5
X_BLOCK = 32  # activation block of rung 5 (llama.cpp's Q8_0 block)


@dataclass(frozen=True, eq=False)
class Int4Weight:
    """A 4-bit QTensor laid out for the kernels (pack_weight): codes packed two per byte row by row,
    uint8 [N, K/2] ("adjacent": byte i = n[2i] | n[2i+1] << 4, n = code + 8); scale and zero point per
    group, float32 [N, G] (a symmetric weight has zero 0; "tensor" groups are repeated per row); the
    reference layer of rung 2; `lanes`: rungs 6-7's layout of the same weight, with the build it was laid out
    for (kernels_c.lay_out; None where they were not built when it was packed, or the group length is not a
    multiple of 8). `qtensor`: the weight it came from."""
    qtensor: QTensor
    packed: np.ndarray
    scale: np.ndarray
    zero: np.ndarray
    group_len: int
    reference: QuantLinear
    lanes: kernels_c.LaneLayout | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.qtensor.shape

    def __repr__(self) -> str:
        """Shapes and dtypes, never the values (a [FAIL] line shows it)."""
        (n, k), g = self.shape, self.scale.shape[1]
        return (f"Int4Weight([{n}, {k}], group_len={self.group_len}, packed [{n}, {k // 2}] uint8, "
                f"scale and zero [{n}, {g}] float32)")

    @property
    def nbytes(self) -> int:
        """Bytes the fused rungs read per product: packed codes + float32 scales and zero points."""
        return self.packed.nbytes + self.scale.nbytes + self.zero.nbytes


def pack_weight(q: QTensor) -> Int4Weight:
    """Lay a 4-bit QTensor out for the kernels (see Int4Weight; rung 6's layout too, which builds int4_gemv.c
    on the first call where a C compiler is). ValueError for other bits or an odd group length (a group would
    end in the middle of a byte)."""
    check_type("q", q, QTensor, "a labkit.quant.QTensor")
    n, k = q.shape
    if q.bits != 4:
        fail("q", q, "a 4-bit QTensor (q.bits == 4)")
    group_len = k if q.group_size in ("channel", "tensor") else q.group_len
    if group_len % 2:
        fail("q", q, f"groups of an even number of inputs (group length {group_len}; two codes share a byte)")
    packed = pack_int4(q.codes).reshape(n, k // 2).numpy()
    scale = q.scale.float().expand(n, -1).contiguous()
    zero = torch.zeros_like(scale) if q.zero is None else q.zero.float().expand(n, -1).contiguous()
    lanes = None  # rung 6's layout: where it is built, for groups of a multiple of 8 inputs
    if group_len % 8 == 0 and kernels_c.available()[0]:
        lanes = kernels_c.lay_out(q.codes.numpy(), scale.numpy(), zero.numpy())  # for this build, which it keeps
    return Int4Weight(q, packed, scale.numpy(), zero.numpy(), group_len, QuantLinear(q, backend="reference"), lanes)


def _weight(w) -> Int4Weight:
    if isinstance(w, Int4Weight):
        return w
    check_type("w", w, (QTensor, Int4Weight), "a labkit.quant.QTensor or an Int4Weight (pack_weight)")
    return pack_weight(w)


def _input(x, w: Int4Weight, finite: bool = True) -> torch.Tensor:
    """x as float32 [M, K] (a 1-D x is one row); `finite`: also refuse a NaN or inf (False where the rung's own
    loop refuses them)."""
    check_type("x", x, torch.Tensor, "a float32 torch.Tensor [K] or [M, K]")
    if x.dtype != torch.float32:
        fail("x", x.dtype, "a float32 tensor (cast with .float())", TypeError)
    check_has_data("x", x)
    k = w.shape[1]
    if x.dim() not in (1, 2) or x.shape[-1] != k or x.numel() == 0:
        fail("x", tuple(x.shape), f"a shape [{k}] or [M, {k}] (M >= 1) to multiply a weight [{w.shape[0]}, {k}]")
    if not x.is_cpu:
        fail("x", x.device, "a CPU tensor (the rungs are CPU kernels: move it with .cpu())")
    if x.dim() == 1 or x.requires_grad or not x.is_contiguous():  # a decode step's x [1, K] is none of these
        x = x.detach().reshape(-1, k).contiguous()
    if finite and not np.isfinite(x.numpy()).all():  # numpy's check: a tenth of torch's on a decode step's x
        fail("x", "a NaN or inf", "finite values")
    return x


def _ladder_rung(body: Callable[[torch.Tensor, Int4Weight], torch.Tensor], finite_checked: bool = False):
    """Give `body(x [M, K], w) -> y [M, N]` the rungs' signature: checks, 1-D in -> 1-D out. `finite_checked`:
    the body itself refuses a NaN or inf in x."""
    def rung(x: torch.Tensor, w) -> torch.Tensor:
        w = _weight(w)
        x2 = _input(x, w, finite=not finite_checked)
        y = body(x2, w)
        return y.reshape(-1) if x.dim() == 1 else y
    rung.__name__ = rung.__qualname__ = body.__name__
    rung.__doc__ = body.__doc__
    rung.body = body
    return rung


def _group_sums(x: np.ndarray, group_len: int) -> np.ndarray:
    """x [M, K] summed over each group of inputs: float32 [M, K / group_len] (rungs 4 and 6 apply the zero
    points through these)."""
    return x.reshape(x.shape[0], -1, group_len).sum(-1, dtype=np.float32)


def _in_range(y: np.ndarray, x: np.ndarray, rung: int, headroom: str) -> torch.Tensor:
    """y as a tensor, once it is finite. Rungs 4 and 6 take the zero point off after summing codes shifted to be
    positive (`headroom`), so a finite x whose exact product is finite can overflow float32 (3.4e38) on the way:
    refused, never returned as inf or NaN (rungs 1-3 sum the dequantized weights and handle such x)."""
    if not np.isfinite(y).all():
        fail("x", f"max |x| {float(np.abs(x).max()):.3g}",
             f"inputs small enough for rung {rung}, whose partial sums reach {headroom} times |scale| * sum |x| over "
             "a group and must stay below float32's 3.4e38 (rungs 1-3 have no such headroom: use one of them)")
    return torch.from_numpy(y)


def _split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [M, K] -> (x[:, 0::2], x[:, 1::2]), each contiguous [M, K/2]."""
    return np.ascontiguousarray(x[:, 0::2]), np.ascontiguousarray(x[:, 1::2])


@_ladder_rung
def dequantize_then_matmul(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """Rung 1: unpack and dequantize the whole [N, K] matrix to FP32, then x @ w_hat.T."""
    n, k = w.shape
    codes = unpack_int4(torch.from_numpy(w.packed).reshape(-1), n * k).reshape(n, -1, w.group_len)  # [N, G, g]
    w_hat = (codes.float() - torch.from_numpy(w.zero)[..., None]) * torch.from_numpy(w.scale)[..., None]
    return x @ w_hat.reshape(n, k).T


@_ladder_rung
def reference_tiles(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """Rung 2: QuantLinear's reference path (tiles of 256 columns dequantized in torch ops)."""
    return w.reference.forward_reference(x)


@_ladder_rung
def fused(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """Rung 3: one pass over the packed weights, unpack + dequantize + multiply-accumulate (kernels_jit.fused)."""
    x_even, x_odd = _split(x.numpy())
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    jit.fused(x_even, x_odd, w.packed, w.scale, w.zero, y)
    return torch.from_numpy(y)


@_ladder_rung
def blocked(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """Rung 4: rows split over the threads, scale and zero applied once per group (kernels_jit.blocked).
    Thread count: numba's (set it with threads(n)). Range: the nibble sums reach 15 |scale| sum |x| per group
    (ValueError naming x where that overflows float32)."""
    x_np = x.numpy()
    x_even, x_odd = _split(x_np)
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    jit.blocked(x_even, x_odd, _group_sums(x_np, w.group_len), w.packed, w.scale, w.zero, ROWS_PER_TASK, y)
    return _in_range(y, x_np, 4, "15")


def x_block(group_len: int) -> int:
    """Rung 5's activation block: 32 inputs when that divides the group, else the largest even divisor of
    32 that does (so that every block lies in one weight group)."""
    check_int("group_len", group_len, 2)
    return _x_block(group_len)


def _x_block(group_len: int) -> int:  # x_block without its check, for rung 7's call (an Int4Weight's is checked)
    return math.gcd(group_len, X_BLOCK)


def quantize_activations(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0-style int8 activations: x [M, K] in blocks of `block` -> (codes int8 [M, K], scale float32
    [M, K / block]) with scale = max|x| / 127 over the block (1 for an all-zero block) and codes =
    round(x / scale), so that x ~ codes * scale."""
    m, k = x.shape
    blocks = x.reshape(m, k // block, block)  # [M, B, block]
    amax = blocks.abs().amax(-1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    codes = torch.round(blocks / scale[..., None]).clamp_(-127, 127).to(torch.int8)
    return codes.reshape(m, k), scale


@_ladder_rung
def integer_dot(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """Rung 5: x quantized to int8 per block, int4 x int8 sums in integers, scaled once per block
    (kernels_jit.integer). Approximate: each x is rounded by up to 1/254 of its block's largest |x|."""
    xq, x_scale = quantize_activations(x, x_block(w.group_len))
    xq_np = xq.numpy()
    xq_even, xq_odd = _split(xq_np)
    xq_sums = xq_np.reshape(xq_np.shape[0], x_scale.shape[1], -1).sum(-1, dtype=np.int32).astype(np.float32)  # [M, B]
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    jit.integer(xq_even, xq_odd, x_scale.numpy(), xq_sums, w.packed, w.scale, w.zero, ROWS_PER_TASK, y)
    return torch.from_numpy(y)


def _lanes(w: Int4Weight, rung: int) -> kernels_c.LaneLayout:
    """w's layout for the C rungs, or why there is none (RuntimeError without a C compiler: kernels_c.available)."""
    if w.lanes is None:
        kernels_c.lanes()  # raises why rungs 6-7 are not built here, if they are not
        if w.group_len % 8:
            fail("w", w, f"groups of a multiple of 8 inputs for rung {rung} (it reads a row's codes 8 at a time, "
                         "from one group)")
        raise RuntimeError(f"w was laid out while rung {rung} was not built here: lay it out again with "
                           "kernels.pack_weight")
    return w.lanes


@_ladder_rung
def compiled_c(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """Rung 6: C vectorized by this machine's compiler, output rows in the SIMD lanes (int4_gemv.c, kernels_c).
    Thread count: torch's (set it with threads(n)). RuntimeError where no C compiler built it
    (kernels_c.available). Range: the bit trick's sums reach 32 |scale| sum |x| per group, and the offsets
    (24 + |zero|) |scale| sum |x| (ValueError naming x where that overflows float32)."""
    lanes = _lanes(w, 6)
    x_np = x.numpy()
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    kernels_c.gemv(x_np, _group_sums(x_np, w.group_len), lanes, w.shape[0], torch.get_num_threads(), y)
    return _in_range(y, x_np, 6, "32 (and the offsets 24 + |zero|)")


@functools.partial(_ladder_rung, finite_checked=True)  # the C loop finds a NaN or inf as it rounds x
def compiled_c_int8(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """Rung 7: rung 5's arithmetic (x rounded to int8 per block) in C on rung 6's layout, the codes multiplied
    as bytes (VNNI's vpdpbusd or AVX2's vpmaddubsw where the CPU has them: int4_gemv.c, int4_gemv_int8).
    Approximate as rung 5.
    Thread count: torch's. RuntimeError where no C compiler built it (kernels_c.available)."""
    lanes = _lanes(w, 7)
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    kernels_c.gemv_int8(x.numpy(), _x_block(w.group_len), w.scale.shape[1], lanes, w.shape[0], torch.get_num_threads(),
                        y)  # x rounded in C as quantize_activations rounds it
    return torch.from_numpy(y)


RUNGS: dict[str, Callable[[torch.Tensor, object], torch.Tensor]] = {
    "1 dequantize, then FP32 matmul": dequantize_then_matmul,
    "2 tiled reference path": reference_tiles,
    "3 fused loop (numba)": fused,
    "4 blocked, threads (numba)": blocked,
    "5 int8 x int4 (numba)": integer_dot,
    "6 C, compiler's SIMD, OpenMP": compiled_c,
    "7 C, int8 x int4 byte products": compiled_c_int8,
}
APPROXIMATE = ("5 int8 x int4 (numba)", "7 C, int8 x int4 byte products")  # round x to int8
EXACT = tuple(name for name in RUNGS if name not in APPROXIMATE)  # equal to the reference within float rounding
C_RUNGS = ("6 C, compiler's SIMD, OpenMP", "7 C, int8 x int4 byte products")  # only where a C compiler is


def available(name: str) -> tuple[bool, str]:
    """(True, "") when RUNGS[name] runs on this machine; (False, why not) for rungs 6-7 without a C compiler or
    with LABKIT_C=0 (weights packed from now on get no C layout; one packed before keeps its build)."""
    if name not in RUNGS:
        fail("name", name, f"one of {list(RUNGS)}")
    return kernels_c.available() if name in C_RUNGS else (True, "")


class threads:
    """with threads(n): torch and the compiled loops both use n threads; both counts are restored on exit,
    also after an error. n=None leaves them as they are."""

    def __init__(self, n: int | None):
        if n is not None:
            check_int("n", n, 1, jit.max_threads())
        self.n = n
        self._before: list[tuple[int, int]] = []  # one entry per block entered and not yet left (re-entrant)

    def __enter__(self) -> int:  # plain calls, no generators: the ladder times products inside the block
        self._before.append((torch.get_num_threads(), jit.get_threads()))
        if self.n is not None:
            try:
                torch.set_num_threads(self.n)
                jit.set_threads(self.n)
            except BaseException:
                self.__exit__()
                raise
        return jit.get_threads()

    def __exit__(self, *exc) -> None:
        torch_n, numba_n = self._before.pop()
        torch.set_num_threads(torch_n)
        jit.set_threads(numba_n)


class KernelLinear(nn.Module):
    """A QuantLinear's weight (and bias) multiplied by one rung: x [..., K] -> [..., N] (any leading dims,
    flattened into the rung's M rows)."""

    def __init__(self, layer: QuantLinear, rung: str):
        super().__init__()
        check_type("layer", layer, QuantLinear, "a labkit.quant.QuantLinear")
        if rung not in RUNGS:
            fail("rung", rung, f"one of {list(RUNGS)}")
        self.weight, self.rung, self.bias = pack_weight(layer.qweight), rung, layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.weight.shape
        y = RUNGS[self.rung](x.reshape(-1, k), self.weight).reshape(*x.shape[:-1], n)  # [M, N] -> [..., N]
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]} -> {self.weight.shape[0]}, rung {self.rung!r}"


def with_rung(model: nn.Module, rung: str) -> nn.Module:
    """A copy of `model` whose every QuantLinear (4 bits) computes through RUNGS[rung] (a KernelLinear);
    the model itself is left as it is. ValueError when it holds no 4-bit QuantLinear."""
    check_type("model", model, nn.Module, "a torch.nn.Module")
    if rung not in RUNGS:
        fail("rung", rung, f"one of {list(RUNGS)}")
    out = copy.deepcopy(model)
    names = [name for name, m in out.named_modules() if isinstance(m, QuantLinear) and m.bits == 4]
    if not names:
        fail("model", type(model).__name__, "a model with 4-bit QuantLinear layers (labkit.quant.quantize_model)")
    for name in names:
        out.set_submodule(name, KernelLinear(out.get_submodule(name), rung))
    return out
