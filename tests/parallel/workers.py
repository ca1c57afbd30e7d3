"""Worker functions the pool tests send to real ranks (spawned processes import them from here)."""
import os

import torch
import torch.distributed as dist


def rank_and_sum(rank, world, value):
    t = torch.tensor([float(value + rank)])
    dist.all_reduce(t)
    return rank, world, float(t)


def fail_on(rank, world, bad_rank):
    if rank == bad_rank:
        raise ValueError(f"boom on {rank}")
    t = torch.ones(1)
    dist.all_reduce(t)  # the other ranks block here until the group is ended
    return float(t)


def die_on(rank, world, bad_rank):
    if rank == bad_rank:
        os._exit(3)
    dist.barrier()


def threads(rank, world):
    return torch.get_num_threads()


def sleep(rank, world, seconds):
    import time
    time.sleep(seconds)


def pid(rank, world):
    """This rank's process id (to tell one pool's processes from another's)."""
    return os.getpid()
