"""Lab 04, parallelism (notebook 04): collectives on simulated and real ranks, the alpha-beta model of a
link, tensor parallelism (the course's Megatron split and DTensor's), pipeline schedules and real
pipelines, expert parallelism with all-to-all, overlap of communication with compute, and a planner.

    collectives  simulated ranks: ring_all_reduce, reduce_scatter, all_gather, all_to_all, bytes sent
    distributed  Pool: N gloo processes kept up across cells, timeouts, RankError
    gloo         the ring over real point-to-point sends, torch.distributed's collectives, timing them
    linkmodel    LinkModel (alpha + bytes / beta), fit, bus bandwidth
    hierarchical two-level all-reduce (simulated, gloo subgroups), its cost against the flat ring, TP placement
    tensor       ShardedTinyLM, tensor_parallel_logits, tensor_parallel_generate    dtensor  the library's
    decode       TinyLM's decode step: one process, TP ranks, the alpha-beta prediction (DecodeReport)
    schedule     GPipe / 1F1B operations, bubble_fraction, simulate                  pipeline real stages
    expert       route, moe_forward, expert_parallel_forward                         overlap  async all-reduce
    planner      Hardware, Workload, plan, best, min_devices
    overlap_cases  pipeline sends, TP all-reduce under another micro-batch, bucketed gradients (real ranks)
    explore      plots and the plan explorer widget                                  exercises the notebook's
"""

from . import (collectives, decode, dtensor, exercises, expert, explore, gloo, hierarchical, linkmodel, overlap,
               overlap_cases, pipeline, planner, schedule, tensor)
from .collectives import ring_all_reduce
from .distributed import Pool, RankError, shared_pool
from .linkmodel import LinkModel, bus_bandwidth
from .planner import USABLE, Hardware, Plan, Workload, plan
from .schedule import bubble_fraction, megatron_bubble
from .tensor import tensor_parallel_generate, tensor_parallel_logits

__all__ = ["collectives", "decode", "dtensor", "exercises", "expert", "explore", "gloo", "hierarchical", "linkmodel",
           "overlap", "overlap_cases", "pipeline", "planner", "schedule", "tensor", "ring_all_reduce", "Pool",
           "RankError", "shared_pool", "LinkModel", "bus_bandwidth", "Hardware", "Plan", "Workload", "plan", "USABLE",
           "bubble_fraction", "megatron_bubble", "tensor_parallel_generate", "tensor_parallel_logits"]
