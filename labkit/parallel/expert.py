"""Expert parallelism: a mixture-of-experts SwiGLU MLP whose experts are split over real gloo ranks, tokens
dispatched to their experts' ranks and combined back with all_to_all_single (notebook 04, section 5).

    router: top-k of softmax(x @ router.T + skew bias), gates renormalised over the k picks (Mixtral)
    capacity: each expert takes at most C = ceil(capacity_factor * tokens * k / E) assignments of a rank's
              tokens, in token order; the rest are dropped (their gate's share of the output is lost)

    per rank: count rows for every destination -> all_to_all_single of the counts (one int per pair)
              -> all_to_all_single of the rows with input_split_sizes = my counts, output_split_sizes = what
              every rank sends me: the send matrix's column, i.e. the receive matrix is its transpose
              -> each local expert on its rows -> all_to_all_single back with the splits swapped -> combine

Routing and capacity are computed on each rank's own tokens, so the single-process reference is
moe_forward on the same chunks of tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._checks import check_int, check_number, check_positive, check_positive_int, check_type, fail
from .distributed import Pool, check_world, shared_pool


def make_experts(d_model: int, d_ff: int, n_experts: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random MoE weights: router [E, d], w_gate and w_up [E, d_ff, d], w_down [E, d, d_ff] (std 1/sqrt(in))."""
    d, f, e = (check_positive_int(n, v) for n, v in (("d_model", d_model), ("d_ff", d_ff), ("n_experts", n_experts)))
    g = torch.Generator().manual_seed(check_int("seed", seed))
    return {"router": torch.randn(e, d, generator=g) / math.sqrt(d),
            "w_gate": torch.randn(e, f, d, generator=g) / math.sqrt(d),
            "w_up": torch.randn(e, f, d, generator=g) / math.sqrt(d),
            "w_down": torch.randn(e, d, f, generator=g) / math.sqrt(f)}


def expert_mlp(params: dict, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert e's SwiGLU MLP on rows x [n, d]."""
    return F.silu(x @ params["w_gate"][e].T) * (x @ params["w_up"][e].T) @ params["w_down"][e].T


@dataclass(frozen=True)
class Routing:
    """Kept assignments of one batch: token index, expert, gate (one row each, token order), and how many
    assignments were dropped for capacity."""
    token: torch.Tensor
    expert: torch.Tensor
    gate: torch.Tensor
    dropped: int
    capacity: int


def check_params(params: dict, d_model: int | None = None) -> int:
    """The expert count of `params` (a dict as make_experts returns) after checking its keys and shapes:
    router [E, d], w_gate and w_up [E, f, d], w_down [E, d, f]; d must equal `d_model` when given."""
    keys = ("router", "w_gate", "w_up", "w_down")
    if not isinstance(params, dict) or any(not isinstance(params.get(k), torch.Tensor) for k in keys):
        fail("params", type(params).__name__ if not isinstance(params, dict) else sorted(params),
             f"a dict from make_experts with tensors {', '.join(keys)}", TypeError)
    r, g, u, w = (params[k] for k in keys)
    e, d = r.shape if r.dim() == 2 else (0, 0)
    f = g.shape[1] if g.dim() == 3 else 0
    if not e or g.shape != (e, f, d) or u.shape != (e, f, d) or w.shape != (e, d, f):
        fail("params", {k: tuple(params[k].shape) for k in keys}, "router [E, d], w_gate and w_up [E, f, d], "
             "w_down [E, d, f]")
    if d_model is not None and d != d_model:
        fail("x", f"[N, {d_model}]", f"[N, d] with d = the experts' d_model {d}")
    return e


def _check_routing(x: torch.Tensor, router: torch.Tensor, k: int, capacity_factor: float, skew: float) -> None:
    check_type("x", x, torch.Tensor)
    check_type("router", router, torch.Tensor)
    if x.dim() != 2 or router.dim() != 2 or router.shape[1] != x.shape[1]:
        fail("x", tuple(x.shape), f"[N, d] with d = the router's {tuple(router.shape)}[1]")
    check_int("k", k, 1, router.shape[0])
    check_positive("capacity_factor", capacity_factor)
    check_number("skew", skew)


def route(x: torch.Tensor, router: torch.Tensor, k: int, capacity_factor: float, skew: float = 0.0) -> Routing:
    """Top-k routing of x [N, d] with capacity. `skew` adds -skew * e to expert e's logit (0: as trained)."""
    _check_routing(x, router, k, capacity_factor, skew)
    n_exp = router.shape[0]
    logits = x @ router.T - skew * torch.arange(n_exp, dtype=x.dtype)  # [N, E]
    top, idx = logits.softmax(-1).topk(k, dim=-1)  # [N, k]
    gates = top / top.sum(-1, keepdim=True)
    capacity = math.ceil(capacity_factor * x.shape[0] * k / n_exp)
    token = torch.arange(x.shape[0]).repeat_interleave(k)  # token-major order: [N * k]
    expert, gate = idx.reshape(-1), gates.reshape(-1)
    onehot = F.one_hot(expert, n_exp)  # [N * k, E]
    position = (onehot.cumsum(0) * onehot).sum(-1) - 1  # place in its expert's queue
    keep = position < capacity
    return Routing(token[keep], expert[keep], gate[keep], int((~keep).sum()), capacity)


def moe_forward(x: torch.Tensor, params: dict, k: int, capacity_factor: float, skew: float = 0.0) -> torch.Tensor:
    """Single-process mixture of experts on x [N, d]: the reference of the expert-parallel version."""
    check_params(params, x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else None)
    r = route(x, params["router"], k, capacity_factor, skew)
    y = torch.zeros_like(x)
    for e in range(params["router"].shape[0]):
        rows = r.expert == e
        if rows.any():
            y.index_add_(0, r.token[rows], expert_mlp(params, e, x[r.token[rows]]) * r.gate[rows, None])
    return y


def _exchange(rows: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
    out = torch.empty((sum(recv), *rows.shape[1:]), dtype=rows.dtype)
    dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=recv, input_split_sizes=send)
    return out


def expert_worker(rank: int, world: int, x: torch.Tensor, params: dict, k: int, capacity_factor: float,
                  skew: float) -> dict:
    """One rank of expert_parallel_forward: its chunk of tokens in, its outputs and send counts out."""
    x = x.chunk(world)[rank]
    per_rank = params["router"].shape[0] // world
    r = route(x, params["router"], k, capacity_factor, skew)
    dest = r.expert // per_rank
    order = torch.argsort(dest * params["router"].shape[0] + r.expert, stable=True)  # by rank, then expert
    token, expert, gate = r.token[order], r.expert[order], r.gate[order]
    send_t = torch.bincount(dest, minlength=world)
    recv_t = torch.empty_like(send_t)
    dist.all_to_all_single(recv_t, send_t)  # counts first: how many rows each rank will send me
    send, recv = send_t.tolist(), recv_t.tolist()
    rows = _exchange(x[token], send, recv)
    ids = _exchange(expert, send, recv)
    out = torch.empty_like(rows)
    for e in ids.unique().tolist():
        sel = ids == e
        out[sel] = expert_mlp(params, e, rows[sel])
    back = _exchange(out, recv, send)  # the way back: splits swapped
    y = torch.zeros_like(x).index_add_(0, token, back * gate[:, None])
    return {"y": y, "send": send, "dropped": r.dropped, "load": int(sum(recv))}


@dataclass(frozen=True)
class ExpertRun:
    """An expert-parallel forward: output [N, d]; splits[i][j], rows rank i sent rank j; dropped
    assignments; rows each rank's experts processed; bytes each rank sent to other ranks: dispatch (its
    tokens' rows going to other ranks' experts) and combine (the rows it received from other ranks, sent
    back as outputs); bytes_sent is their sum."""
    y: torch.Tensor
    splits: list
    dropped: int
    load: list
    dispatch_bytes: list
    combine_bytes: list

    @property
    def bytes_sent(self) -> list:
        return [a + b for a, b in zip(self.dispatch_bytes, self.combine_bytes)]


def expert_parallel_forward(x: torch.Tensor, params: dict, k: int, capacity_factor: float, ep: int,
                            skew: float = 0.0, pool: Pool | None = None) -> ExpertRun:
    """The MoE of `params` on x [N, d] with its experts split over `ep` real ranks (rank r holds experts
    r*E/ep ..), each rank routing its N/ep tokens. Refuses an ep that does not divide E or N first."""
    n_exp = check_params(params)
    _check_routing(x, params["router"], k, capacity_factor, skew)
    check_world(ep, "ep")
    if n_exp % ep or x.shape[0] % ep:
        fail("ep", ep, f"a divisor of n_experts={n_exp} and of the {x.shape[0]} tokens")
    if pool is not None and pool.world != ep:
        fail("pool", pool, f"a Pool of world {ep} (= ep)")
    runs = (pool or shared_pool(ep)).run(expert_worker, x, params, k, float(capacity_factor), float(skew))
    width = x.shape[1] * x.element_size()
    splits = [r["send"] for r in runs]
    dispatch = [width * (sum(row) - row[i]) for i, row in enumerate(splits)]  # my tokens to others' experts
    combine = [width * (sum(col) - col[i]) for i, col in enumerate(zip(*splits))]  # what I received, sent back
    return ExpertRun(torch.cat([r["y"] for r in runs]), splits, sum(r["dropped"] for r in runs),
                     [r["load"] for r in runs], dispatch, combine)


def all_to_all_bytes(n_tokens: int, k: int, d_model: int, ep: int, bytes_per_element: int = 4) -> float:
    """Bytes each rank sends to other ranks, dispatch and combine together, with uniform routing and nothing
    dropped: each of its n_tokens/ep tokens goes to k experts, (ep-1)/ep of them on other ranks (dispatch);
    by symmetry it receives as many rows from the other ranks and sends their outputs back (combine)."""
    n, k, d, ep = (check_positive_int(a, v) for a, v in (("n_tokens", n_tokens), ("k", k), ("d_model", d_model),
                                                          ("ep", ep)))
    return 2 * n / ep * k * (ep - 1) / ep * d * check_positive("bytes_per_element", bytes_per_element)
