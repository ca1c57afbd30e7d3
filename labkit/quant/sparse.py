"""2:4 structured sparsity, the format of NVIDIA's sparse tensor cores (notebook 03, "Sparse computation
accelerators"; Mishra et al., "Accelerating Sparse Deep Neural Networks", arXiv:2104.08378, 2021).

In every group of 4 consecutive weights along the input dimension, 2 are kept (here: the 2 largest in
magnitude; on a tie the lower position) and 2 are zero. Only the kept values are stored, each with a 2-bit
index that says where in its group of 4 it sat:

    dense row w[o, 0:8]      |  a  0  b  0 |  0  c  0  d |          groups of 4 along the input dim
    values  [out, in/2]      |  a  b       |  c  d       |          the 2 kept, in order (FP16 or INT4)
    indices [out, in/2]      |  0  2       |  1  3       |          2 bits each: the position in its group
    packed indices           byte = i0 | i1 << 2 | i2 << 4 | i3 << 6     4 indices (2 groups) per byte

    bits per weight = (value bits + 2) / 2:  FP16 values 9 bits (16/9 = 1.78x fewer bytes than dense FP16);
    INT4 values with an fp16 scale and zero per 32 kept values (5 bits each) 3.5 bits (1.43x fewer than 5)

A matmul reads each kept value's index to pick the activation it multiplies: half the multiplies of the
dense matmul (a sparse tensor core runs at twice its dense FLOP/s), the same result as the dense matmul of
the pruned weight. tensor_core_time puts both on lab 01's roofline.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

from .._checks import check_bool, check_positive_int, check_type, fail, is_int
from ..memory_wall import roofline
from ..specs import DeviceSpec
from ..tinylm import LAYER_TYPES, iter_linears
from .policy import quantize_model
from .quality import evaluate, retention
from .qtensor import QTensor, check_has_data, check_weight, quantize
from .threads import torch_threads

GROUP, KEEP = 4, 2  # N:M = 2:4
PRUNABLE = ("attention", "mlp")  # the matmuls of a decoder block (the embedding is a lookup, and tied)


def _check_width(w: torch.Tensor, name: str = "w") -> None:
    if w.shape[-1] % GROUP:
        fail(f"{name}.shape", tuple(w.shape), f"[out, in] with in a multiple of {GROUP} (2:4 keeps 2 of every "
             f"{GROUP} inputs)")


def mask_2_4(w: torch.Tensor) -> torch.Tensor:
    """bool [out, in]: True for the 2 largest |w| of each group of 4 consecutive inputs (ties: the lower
    position). w: a finite float matrix [out, in] with in a multiple of 4."""
    check_weight(w)
    _check_width(w)
    out, inp = w.shape
    groups = w.detach().abs().reshape(out, inp // GROUP, GROUP)  # [out, in/4, 4]
    order = torch.sort(-groups, dim=-1, stable=True).indices[..., :KEEP]  # stable: ties keep the lower position
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, order, True)
    return mask.reshape(out, inp)


def prune_2_4(w: torch.Tensor) -> torch.Tensor:
    """w with the 2 smallest |w| of each group of 4 set to 0 (mask_2_4), float32 [out, in]."""
    return torch.where(mask_2_4(w), w.detach().float(), torch.zeros((), dtype=torch.float32))


@dataclass
class Sparse24:
    """A 2:4 sparse matrix [out, in] in the compressed layout of the module docstring: values float32
    [out, in/2] (the kept weights, or, when `q` is set, the INT4 QTensor's dequantized values), indices uint8
    [out, in/2] (each pair strictly increasing in 0..3), shape (out, in). Checks its own consistency."""
    values: torch.Tensor
    indices: torch.Tensor
    shape: tuple[int, int]
    q: QTensor | None = None

    def __post_init__(self):
        shape = self.shape
        if not (isinstance(shape, tuple) and len(shape) == 2 and all(is_int(s) and s > 0 for s in shape)
                and shape[1] % GROUP == 0):
            fail("shape", shape, f"a tuple (out, in) of positive ints with in a multiple of {GROUP}")
        kept = (shape[0], shape[1] // 2)
        for name, t, ok, kind in (("values", self.values, torch.Tensor.is_floating_point, "a float"),
                                  ("indices", self.indices, lambda t: t.dtype == torch.uint8, "a uint8")):
            check_type(name, t, torch.Tensor, f"{kind} torch.Tensor")
            if not ok(t):
                fail(name, t.dtype, f"{kind} tensor", TypeError)
            check_has_data(name, t)
            if tuple(t.shape) != kept:
                raise ValueError(f"{name} must have shape {kept} for a 2:4 matrix of shape {shape}, "
                                 f"got {tuple(t.shape)}")
        pairs = self.indices.reshape(-1, KEEP).to(torch.int16)  # [out * in/4, 2]
        if int(pairs.max()) >= GROUP or not bool((pairs[:, 0] < pairs[:, 1]).all()):
            fail("indices", pairs[(pairs[:, 1] <= pairs[:, 0]) | (pairs.max(1).values >= GROUP)][0].tolist(),
                 "pairs of positions in 0..3, each pair strictly increasing")
        if self.q is not None:
            check_type("q", self.q, QTensor, "a labkit.quant.QTensor of the values, or None")
            if self.q.shape != kept:
                raise ValueError(f"q must have the values' shape {kept}, got {self.q.shape}")

    @property
    def columns(self) -> torch.Tensor:
        """int64 [out, in/2]: the input column of each kept value (its group's start + its index)."""
        group_start = torch.arange(self.shape[1] // GROUP).repeat_interleave(KEEP) * GROUP  # [in/2]
        return group_start + self.indices.to(torch.int64)

    def decompress(self) -> torch.Tensor:
        """The dense float32 matrix [out, in], zeros where nothing is kept: exactly the pruned weight."""
        dense = torch.zeros(self.shape, dtype=torch.float32)
        return dense.scatter_(1, self.columns, self.values.float())

    def packed_indices(self) -> torch.Tensor:
        """uint8 [out * in / 8]: the 2-bit indices, 4 per byte, the first in the lowest bits (row-major)."""
        i = self.indices.reshape(-1)
        if i.numel() % 4:  # an odd number of groups in all: pad with index 0
            i = torch.cat([i, torch.zeros(4 - i.numel() % 4, dtype=torch.uint8)])
        i = i.reshape(-1, 4)  # [bytes, 4]
        return i[:, 0] | (i[:, 1] << 2) | (i[:, 2] << 4) | (i[:, 3] << 6)

    def nbytes(self, value_bytes: int = 2) -> int:
        """Bytes stored: the kept values (INT4 codes with their fp16 scales and zeros when `q` is set, else
        `value_bytes` each: 2 for the FP16 of a sparse tensor core) plus the packed 2-bit indices."""
        check_positive_int("value_bytes", value_bytes)
        values = self.q.nbytes() if self.q is not None else value_bytes * self.values.numel()
        return values + self.packed_indices().numel()

    def bits_per_weight(self, value_bytes: int = 2) -> float:
        """Bits per weight of the dense matrix [out, in], indices (and scales) included."""
        return 8 * self.nbytes(value_bytes) / (self.shape[0] * self.shape[1])


def compress_2_4(w: torch.Tensor, bits: int | None = None, group_size: int | str = 32,
                 scheme: str = "asym") -> Sparse24:
    """Prune w [out, in] 2:4 by magnitude and store it compressed. bits=4 (or 8) also quantizes the kept
    values [out, in/2] with labkit.quant.quantize(values, bits, scheme, group_size): groups of `group_size`
    kept values, i.e. 2 * group_size dense positions."""
    mask = mask_2_4(w)
    out, inp = w.shape
    columns = mask.nonzero()[:, 1].reshape(out, inp // 2)  # row-major nonzero: in order along each row
    values = w.detach().float().gather(1, columns)
    indices = (columns % GROUP).to(torch.uint8)
    q = None
    if bits is not None:
        q = quantize(values, bits, scheme, group_size)
        values = q.dequantize()
    return Sparse24(values, indices, (out, inp), q)


def sparse_matmul(x: torch.Tensor, s: Sparse24) -> torch.Tensor:
    """y = x @ W.T for x [..., in] and a 2:4 matrix W [out, in], from the compressed layout alone: each kept
    value multiplies the activation its index points to (half the dense multiplies). Returns [..., out]."""
    check_type("x", x, torch.Tensor, "a float torch.Tensor")
    check_type("s", s, Sparse24, "a labkit.quant.sparse.Sparse24")
    if not x.is_floating_point():
        fail("x", x.dtype, "a float tensor", TypeError)
    check_has_data("x", x)
    if x.dim() < 1 or x.shape[-1] != s.shape[1]:
        raise ValueError(f"x must be [..., {s.shape[1]}] (s's input dimension), got shape {tuple(x.shape)}")
    picked = x.float()[..., s.columns]  # [..., out, in/2]: the activations each row's kept values meet
    return (picked * s.values.float()).sum(-1)


def sparsify_model(model: nn.Module, types: Sequence[str] = PRUNABLE, bits: int | None = None,
                   group_size: int | str = 32, scheme: str = "asym") -> tuple[nn.Module, dict]:
    """A copy of a TinyLM whose linear layers of `types` hold their 2:4-pruned weights (with bits=4, the
    INT4 round trip of the kept values: compress_2_4), as decompressed float32 matrices so that the usual
    matmul runs them (sparse_matmul gives the same result); everything else stays FP32. report, like
    labkit.quant.policy.quantize_model's: {"layers": [{name, type, params, bytes}] of the pruned layers
    (values in FP16, or INT4 with fp16 scales and zeros, plus the packed 2-bit indices), "sparse_bits" (their
    bits per weight), and for the whole model "bytes" (the other weights at 4 bytes), "fp32_bytes",
    "compression", "bits_per_weight"}."""
    if isinstance(types, str) or not isinstance(types, Sequence) or not types:
        fail("types", types, f"a non-empty sequence of layer types from {PRUNABLE}", TypeError)
    for t in types:
        if t not in PRUNABLE:
            fail("types", tuple(types), f"layer types from {PRUNABLE} (a tied embedding is a lookup, not a matmul)")
    entries = list(iter_linears(model, tuple(t for t in LAYER_TYPES if t in types)))  # TypeError unless a TinyLM
    for entry, module in entries:
        if not isinstance(module, nn.Linear):
            raise TypeError(f"model's {entry.path} must be an nn.Linear, got {type(module).__name__}: "
                            f"sparsify the floating-point model")
    model = copy.deepcopy(model)
    rows = []
    for entry, _ in entries:
        module = model.get_submodule(entry.path)
        s = compress_2_4(module.weight.detach(), bits, group_size, scheme)
        module.weight.data = s.decompress()
        rows.append({"name": entry.path, "type": entry.layer_type, "params": module.weight.numel(),
                     "bytes": s.nbytes()})
    pruned, sparse_bytes = sum(r["params"] for r in rows), sum(r["bytes"] for r in rows)
    params = sum(p.numel() for p in model.parameters())  # a tied lm_head counted once
    nbytes = sparse_bytes + 4 * (params - pruned)
    return model, {"layers": rows, "sparse_bits": 8 * sparse_bytes / pruned, "bytes": nbytes,
                   "fp32_bytes": 4 * params, "compression": 4 * params / nbytes, "bits_per_weight": 8 * nbytes / params}


def sparse_rows(model: nn.Module, tasks: list, text, base: dict, group_size: int = 32, scheme: str = "asym",
                threads: int | None = 1) -> dict[str, dict]:
    """The attention and MLP matmuls in INT4 (dense), 2:4 (FP16 values) and 2:4 + INT4 (`group_size`,
    `scheme`), each evaluated like a row of labkit.quant.quality.sweep (its keys, for quality.table) with its
    paired retention against `base`, the FP32 row of that sweep (the same `tasks` and `text`). Notebook 03,
    section 10."""
    check_type("base", base, dict, "a row of labkit.quant.quality.sweep (its FP32 row)")
    if "ok" not in base:
        fail("base", sorted(base), "a row of labkit.quant.quality.sweep (with 'ok')")
    policy = {t: "int4" for t in PRUNABLE}
    built = {f"attn+MLP INT4 g{group_size}": lambda: quantize_model(model, policy, group_size, scheme),
             "attn+MLP 2:4": lambda: sparsify_model(model),
             f"attn+MLP 2:4 + INT4 g{group_size}": lambda: sparsify_model(model, PRUNABLE, 4, group_size, scheme)}
    rows = {}
    with torch_threads(threads, "threads"):
        for name, build in built.items():
            m, report = build()
            r = evaluate(m, tasks, text)
            k = retention(r["ok"], base["ok"])
            rows[name] = {**r, "KiB": report["bytes"] / 2 ** 10, "bpw": report["bits_per_weight"],
                          "ratio": report["compression"], "retention": k, "gained": k.gained, "lost": k.lost,
                          "retained": k.retained, "low": k.low, "high": k.high}
    return rows


def tensor_core_time(device: DeviceSpec, batch: int, n: int, k: int, bits_per_weight: float = 16,
                     sparse: bool = False, act_bytes: int = 2, dtype: str = "bf16") -> dict:
    """One layer y[batch, n] = x[batch, k] @ w[n, k].T on `device` by lab 01's roofline: it reads the weights
    (n * k * bits_per_weight / 8 bytes: 9 for 2:4 FP16, 3.5 for 2:4 INT4, metadata included) and the
    activations in and out (act_bytes each) and does 2 * batch * n * k FLOP, or half with `sparse` (the
    zeros are skipped: a sparse tensor core does the same work per second on half the multiplies, its
    datasheet's "with sparsity" figure is twice the dense one). Time = FLOP / attainable FLOP/s at that
    intensity. Returns {"bytes", "flop", "intensity" (FLOP/byte), "seconds", "bound" ("memory" or
    "compute")}."""
    check_type("device", device, DeviceSpec, "a labkit.specs.DeviceSpec")
    if dtype not in device.peak_flops:
        fail("dtype", dtype, f"one of the dtypes {device.name} lists ({sorted(device.peak_flops)})")
    batch, n, k = (check_positive_int(name, v) for name, v in (("batch", batch), ("n", n), ("k", k)))
    bits = roofline.weight_bytes(1, bits_per_weight) * 8  # checks 0 < bits <= 32
    check_bool("sparse", sparse)
    act = check_positive_int("act_bytes", act_bytes)
    nbytes = n * k * bits / 8 + batch * (n + k) * act
    flop = 2 * batch * n * k / (2 if sparse else 1)
    peak = device.peak_flops[dtype]
    intensity = flop / nbytes
    rate = roofline.attainable_flops(intensity, peak, device.bandwidth)
    ridge = roofline.ridge_point(peak, device.bandwidth)
    return {"bytes": nbytes, "flop": flop, "intensity": intensity, "seconds": flop / rate,
            "bound": "memory" if intensity < ridge else "compute"}
