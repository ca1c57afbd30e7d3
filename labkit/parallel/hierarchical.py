"""Topology-aware all-reduce (notebook 04, section 2, "Two levels: NVLink inside a node, InfiniBand across"):
the two-level all-reduce on simulated ranks and on real gloo subgroups, its alpha-beta cost against the flat
ring, and what it says about placing a tensor-parallel group inside a node or across nodes.

`nodes` x `per_node` ranks, rank = node * per_node + local:

    1. reduce-scatter inside each node (fast link):  local rank l keeps chunk l of its node's sum (S/per_node)
    2. all-reduce across nodes (slow link):          per_node rings at once, ring l sums chunk l over the nodes
    3. all-gather inside each node (fast link):      every rank gets every chunk

    2 nodes x 2 ranks        node 0: r0 r1        node 1: r2 r3
        1. r0 <-> r1 and r2 <-> r3     (chunk 0 ends on r0 and r2, chunk 1 on r1 and r3)
        2. r0 <-> r2 (chunk 0) and r1 <-> r3 (chunk 1), each over its own NIC
        3. r0 <-> r1 and r2 <-> r3

Only S/per_node bytes per rank cross the slow link, over per_node NICs at once. A flat ring over all
N = nodes x per_node ranks is a chain of 2(N-1) steps, each as slow as its slowest hop (the node boundary),
so it pays the slow link's alpha 2(N-1) times and moves 2(N-1)/N S per rank at the slow link's bandwidth.
(NCCL itself runs several rings or trees at once and mixes levels; the single flat ring is the textbook
baseline, the hierarchical one what Horovod's hierarchical all-reduce and NCCL's CollNet/NVLS do in spirit.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._checks import check_int, check_positive, check_positive_int, check_type, fail
from .collectives import check_ranks, ring_all_reduce
from .linkmodel import LinkModel


def check_layout(world: int, per_node: int) -> int:
    """The number of nodes when `world` ranks fill nodes of `per_node` (per_node must divide world)."""
    check_positive_int("world", world)
    check_positive_int("per_node", per_node)
    if world % per_node:
        fail("per_node", per_node, f"a divisor of the {world} ranks (every node holds the same number)")
    return world // per_node


def hierarchical_all_reduce(tensors: list[torch.Tensor], per_node: int) -> list[torch.Tensor]:
    """Simulated ranks, one tensor each, in nodes of `per_node`: every output is the elementwise sum, computed
    by the three steps of the module docstring (the cross-node step with the course's ring_all_reduce).
    Inputs are not changed."""
    tensors = check_ranks(tensors)
    nodes = check_layout(len(tensors), per_node)
    shape = tensors[0].shape
    flat = [t.detach().reshape(-1) for t in tensors]
    parts = [list(f.tensor_split(per_node)) for f in flat]  # parts[rank][chunk], sizes differ by at most 1
    owned = {}  # (node, local) -> its node's sum of chunk `local`, after step 1
    for node in range(nodes):
        members = range(node * per_node, (node + 1) * per_node)
        for local in range(per_node):
            owned[node, local] = torch.stack([parts[r][local] for r in members]).sum(0)
    for local in range(per_node):  # step 2: one ring per local index, across the nodes
        summed = ring_all_reduce([owned[node, local] for node in range(nodes)])
        for node in range(nodes):
            owned[node, local] = summed[node]
    return [torch.cat([owned[r // per_node, local] for local in range(per_node)]).reshape(shape)
            for r in range(len(tensors))]  # step 3: every rank gathers its node's chunks


# ---- real ranks ---------------------------------------------------------------------------------------------

_GROUPS: dict[tuple[int, int], tuple] = {}


def node_groups(per_node: int) -> tuple:
    """(this rank's intra-node group, its cross-node group) for nodes of `per_node` consecutive ranks of the
    current gloo group. Every rank creates every subgroup, in the same order (torch.distributed's rule);
    they are kept for the life of the process."""
    world = dist.get_world_size()
    nodes = check_layout(world, per_node)
    key = (world, per_node)
    if key not in _GROUPS:
        intra = [dist.new_group(list(range(n * per_node, (n + 1) * per_node))) for n in range(nodes)]
        inter = [dist.new_group(list(range(local, world, per_node))) for local in range(per_node)]
        _GROUPS[key] = (intra, inter)
    intra, inter = _GROUPS[key]
    rank = dist.get_rank()
    return intra[rank // per_node], inter[rank % per_node]


def hierarchical_all_reduce_gloo(t: torch.Tensor, per_node: int) -> torch.Tensor:
    """Sum `t` over every rank of the current group, in place, in three collectives on subgroups:
    reduce_scatter_single inside the node, all_reduce across nodes, all_gather_single inside the node
    (t is padded to a multiple of per_node elements on the way). Returns t."""
    check_type("t", t, torch.Tensor, "a torch.Tensor (this rank's own, summed in place)")
    if not t.is_contiguous():
        fail("t", f"a non-contiguous tensor of shape {tuple(t.shape)} and strides {t.stride()}",
             "a contiguous tensor (summed in place through a flat view: .contiguous() first)")
    check_positive_int("per_node", per_node)
    intra, inter = node_groups(per_node)
    flat = t.view(-1)
    chunk = -(-flat.numel() // per_node)  # ceil
    padded = torch.zeros(chunk * per_node, dtype=t.dtype)
    padded[:flat.numel()] = flat
    mine = torch.empty(chunk, dtype=t.dtype)
    dist.reduce_scatter_single(mine, padded, group=intra)
    dist.all_reduce(mine, group=inter)
    dist.all_gather_single(padded, mine, group=intra)
    flat.copy_(padded[:flat.numel()])
    return t


def hierarchical_worker(rank: int, world: int, per_node: int, inputs: list[torch.Tensor]) -> dict:
    """This rank's sum of inputs by the hierarchical all-reduce ("hierarchical") and by torch.distributed's
    flat all_reduce ("library")."""
    x = inputs[rank].clone()
    library = x.clone()
    dist.all_reduce(library)
    return {"hierarchical": hierarchical_all_reduce_gloo(x, per_node), "library": library}


def real_hierarchical(pool, inputs: list[torch.Tensor], per_node: int) -> list[dict]:
    """Run hierarchical_worker on the ranks of `pool` (rank r starts from inputs[r]), refusing a bad layout
    or inputs before any rank starts."""
    inputs = check_ranks(inputs, "inputs")
    if len(inputs) != pool.world:
        fail("inputs", len(inputs), f"{pool.world} tensors (one per rank of the pool)")
    check_layout(pool.world, per_node)
    return pool.run(hierarchical_worker, per_node, list(inputs))


# ---- cost ---------------------------------------------------------------------------------------------------

def flat_ring_seconds(nbytes: float, nodes: int, per_node: int, intra: LinkModel, inter: LinkModel) -> float:
    """One ring all-reduce of S = nbytes over nodes x per_node ranks: every step waits for its slowest hop,
    the inter-node link when nodes > 1 (the intra-node link otherwise)."""
    check_positive_int("nodes", nodes)
    check_positive_int("per_node", per_node)
    link = check_type("inter", inter, LinkModel) if nodes > 1 else check_type("intra", intra, LinkModel)
    return link.collective("all_reduce", nbytes, nodes * per_node)


def hierarchical_seconds(nbytes: float, nodes: int, per_node: int, intra: LinkModel, inter: LinkModel) -> dict:
    """The three steps' seconds for S = nbytes: {"reduce-scatter (intra)", "all-reduce (inter)",
    "all-gather (intra)"}; the cross-node rings run in parallel, one per NIC, on S/per_node each."""
    check_positive("nbytes", nbytes, unit="bytes", allow_zero=True)
    check_positive_int("nodes", nodes)
    check_positive_int("per_node", per_node)
    check_type("intra", intra, LinkModel)
    check_type("inter", inter, LinkModel)
    return {"reduce-scatter (intra)": intra.collective("reduce_scatter", nbytes, per_node),
            "all-reduce (inter)": inter.collective("all_reduce", nbytes / per_node, nodes),
            "all-gather (intra)": intra.collective("all_gather", nbytes, per_node)}


def placement_seconds(nbytes: float, group: int, nodes: int, intra: LinkModel, inter: LinkModel) -> dict:
    """An all-reduce of S = nbytes over a group of `group` ranks placed inside one node ("one node") or split
    evenly over `nodes` nodes, with a flat ring ("flat ring, N nodes") or hierarchically ("hierarchical,
    N nodes"): seconds of each (notebook 04 prices the planner's TP all-reduce with it)."""
    check_positive_int("group", group)
    check_int("nodes", nodes, low=2, unit="nodes to split the group over")
    if group % nodes:
        fail("nodes", nodes, f"a divisor of the group of {group} ranks")
    per = group // nodes
    return {"one node": intra.collective("all_reduce", nbytes, group),
            f"flat ring, {nodes} nodes": flat_ring_seconds(nbytes, nodes, per, intra, inter),
            f"hierarchical, {nodes} nodes": sum(hierarchical_seconds(nbytes, nodes, per, intra, inter).values())}


def tp_placement(spec, chosen, cluster, workload, nodes: int = 2) -> dict:
    """The planner's "tp all-reduce" line of the layout `chosen` (a planner.Plan of `spec` on `cluster` under
    `workload`) priced with its TP group inside one node, as the planner places it, and split over `nodes`
    nodes (flat ring, hierarchical): seconds per decode step, 2 all-reduces per layer of the hidden states of
    the sequences one rank serves (ceil(batch / ep) x d_model x act_bytes bytes)."""
    from .planner import Hardware, Plan, Workload  # noqa: F401 (types checked below)
    check_type("chosen", chosen, Plan)
    check_type("cluster", cluster, Hardware)
    check_type("workload", workload, Workload)
    if not chosen.fits:
        fail("chosen", str(chosen), f"a layout that fits (this one was rejected: {chosen.reason})")
    hidden = -(-workload.batch // chosen.ep) * spec.d_model * workload.act_bytes
    intra, inter = LinkModel.from_spec(cluster.intra), LinkModel.from_spec(cluster.inter)
    return {k: 2 * spec.n_layers * v for k, v in placement_seconds(hidden, chosen.tp, nodes, intra, inter).items()}
