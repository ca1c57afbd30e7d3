"""Collectives on simulated ranks: a list of tensors, one per rank, no processes (notebook 04, section 1).

Ring all-reduce (Patarasuk & Yuan 2009; what NCCL runs for large messages) is a reduce-scatter followed
by an all-gather. Each rank's tensor is cut into N chunks; at every step rank r sends one chunk to rank
r + 1 and receives one from rank r - 1:

    reduce-scatter, step s (s = 0 .. N-2): rank r sends chunk (r - s) mod N, the receiver adds it
    all-gather,     step s (s = 0 .. N-2): rank r sends chunk (r + 1 - s) mod N, the receiver copies it

    N = 3, chunks a b c, after reduce-scatter rank r owns the full sum of chunk (r + 1) mod N:
        rank 0: . b .        rank 1: . . c        rank 2: a . .       (then the all-gather spreads them)

Each rank sends 2(N-1) chunks of S/N bytes: 2(N-1)/N x S for all-reduce and (N-1)/N x S for all-gather
and reduce-scatter, whatever N is, which is why the ring is bandwidth-optimal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import check_choice, check_int, check_positive_int, check_type, fail

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class Transfer:
    """One chunk sent at one step of a ring collective: phase ("reduce-scatter" or "all-gather"), step,
    sender, receiver, chunk index and bytes."""
    phase: str
    step: int
    src: int
    dst: int
    chunk: int
    nbytes: int


def check_ranks(tensors, name: str = "tensors") -> list[torch.Tensor]:
    """A non-empty list of same-shape, same-dtype tensors, one per simulated rank."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)) or not tensors:
        fail(name, type(tensors).__name__, "a non-empty list of tensors, one per rank", TypeError)
    for t in tensors:
        check_type(f"each of {name}", t, torch.Tensor)
    shapes = [f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tensors]
    if len(set(shapes)) > 1:
        fail(name, shapes, "tensors of one shape and dtype (one per rank)")
    return list(tensors)


def ring_chunks(numel: int, n: int) -> list[tuple[int, int]]:
    """(start, end) of the n chunks a ring cuts `numel` elements into: sizes differ by at most one."""
    check_positive_int("numel", numel, allow_zero=True)
    check_positive_int("n", n)
    base, extra = divmod(numel, n)
    bounds, start = [], 0
    for i in range(n):
        end = start + base + (i < extra)
        bounds.append((start, end))
        start = end
    return bounds


def ring_schedule(n: int, numel: int, element_size: int = 4) -> list[Transfer]:
    """Every chunk a ring all-reduce of `numel` elements over `n` ranks sends, in order (2(n-1) steps)."""
    bounds = ring_chunks(numel, n)
    out = []
    for phase, shift in (("reduce-scatter", 0), ("all-gather", 1)):
        for s in range(n - 1):
            for r in range(n):
                c = (r + shift - s) % n
                out.append(Transfer(phase, s, r, (r + 1) % n, c, (bounds[c][1] - bounds[c][0]) * element_size))
    return out


def ring_all_reduce(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Simulated ranks, one tensor each: every output is the elementwise sum, computed chunk by chunk
    around the ring (reduce-scatter then all-gather, the steps of ring_schedule). Inputs are not changed."""
    tensors = check_ranks(tensors)
    n, shape = len(tensors), tensors[0].shape
    bufs = [t.detach().clone().reshape(-1) for t in tensors]  # flat copy per rank
    bounds = ring_chunks(bufs[0].numel(), n)
    for t in ring_schedule(n, bufs[0].numel(), bufs[0].element_size()):
        a, b = bounds[t.chunk]
        sent = bufs[t.src][a:b].clone()  # every send of one step happens before any receive is applied
        if t.phase == "reduce-scatter":
            bufs[t.dst][a:b] += sent
        else:
            bufs[t.dst][a:b] = sent
    return [b.reshape(shape) for b in bufs]


def reduce_scatter(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Simulated reduce-scatter along dim 0: rank r gets chunk r of the sum (dim 0 must divide by N)."""
    tensors = check_ranks(tensors)
    n = len(tensors)
    if tensors[0].dim() == 0 or tensors[0].shape[0] % n:
        fail("tensors", tuple(tensors[0].shape), f"tensors whose first dimension divides by the {n} ranks")
    return list(torch.stack(tensors).sum(0).chunk(n))


def all_gather(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Simulated all-gather: every rank gets the concatenation of all ranks' tensors along dim 0."""
    tensors = check_ranks(tensors)
    full = torch.cat([t.reshape(1) if t.dim() == 0 else t for t in tensors])
    return [full.clone() for _ in tensors]


def check_splits(splits, n: int, rows: list[int] | None = None) -> list[list[int]]:
    """An n x n matrix of non-negative ints: splits[i][j] rows go from rank i to rank j; when `rows` is
    given, row i must sum to rank i's rows (what all_to_all_single's input_split_sizes must satisfy)."""
    if not isinstance(splits, (list, tuple, torch.Tensor)) or len(splits) != n:
        fail("splits", splits, f"an {n} x {n} matrix (list of lists) of row counts", TypeError)
    out = [[check_int(f"splits[{i}][{j}]", int(v) if isinstance(v, torch.Tensor) else v, 0)
            for j, v in enumerate(row)] for i, row in enumerate(splits)]
    if any(len(row) != n for row in out):
        fail("splits", out, f"an {n} x {n} matrix (each rank sends a count to each of {n} ranks)")
    for i, want in enumerate(rows or []):
        if sum(out[i]) != want:
            fail(f"splits[{i}]", out[i], f"counts summing to rank {i}'s {want} rows")
    return out


def check_all_to_all(tensors, splits=None, name: str = "tensors") -> tuple[list[torch.Tensor], list[list[int]]]:
    """(tensors, splits) for an all_to_all over len(tensors) ranks, simulated or real: tensors of at least one
    dimension whose shapes past dim 0 and dtypes agree (row counts may differ), and splits[i][j] rows from
    rank i to rank j (even splits when None)."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)) or not tensors:
        fail(name, type(tensors).__name__, "a non-empty list of tensors, one per rank", TypeError)
    n = len(tensors)
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            fail(f"each of {name}", type(t).__name__, "a tensor with at least one dimension", TypeError)
    rows = {(tuple(t.shape[1:]), t.dtype) for t in tensors}
    if len(rows) > 1:
        fail(name, [f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tensors],
             "tensors whose shapes past dim 0 and dtypes agree (rows may differ)")
    if splits is None:
        for t in tensors:
            if t.shape[0] % n:
                fail(name, t.shape[0], f"row counts that divide by {n} ranks (or pass splits)")
        splits = [[t.shape[0] // n] * n for t in tensors]
    return list(tensors), check_splits(splits, n, [t.shape[0] for t in tensors])


def all_to_all(tensors: list[torch.Tensor], splits=None) -> list[torch.Tensor]:
    """Simulated all_to_all_single along dim 0: rank i sends splits[i][j] rows to rank j (even splits by
    default); rank j receives its rows from ranks 0..N-1 in rank order. The receive matrix is splits.T.
    Tensors may have different row counts (uneven splits)."""
    tensors, splits = check_all_to_all(tensors, splits)
    n = len(tensors)
    pieces = [list(t.split(row)) for t, row in zip(tensors, splits)]  # pieces[i][j]: rank i -> rank j
    return [torch.cat([pieces[i][j] for i in range(n)]) for j in range(n)]


def bytes_sent_per_rank(op: str, nbytes: float, n: int) -> float:
    """Bytes each rank sends in a bandwidth-optimal `op` over n ranks; `nbytes` is S, the size of the full
    (reduced or gathered) tensor for all_reduce / all_gather / reduce_scatter, and each rank's input for
    all_to_all: all_reduce 2(n-1)/n S, the others (n-1)/n S."""
    check_choice("op", op, OPS)
    check_positive_int("n", n)
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return factor * nbytes
