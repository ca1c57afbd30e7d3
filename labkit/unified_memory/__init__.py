"""Lab 02, unified memory: a paged pool of device and host memory (the pool and its settings, the paging
loop compiled with numba, eviction policies, prefetchers, the link timeline; several links with a monitor
and a balancer: faultlog, links, balancing), allocation modes for shared devices and the two-model
experiment on them (tenants), a contiguous allocator, model layouts in pages, the notebook's experiments
(explore), the loop's measured speed (speed), the fact-checks of the source material's claims (factcheck)
and the exercises."""

from . import allocator, balancing, exercises, explore, factcheck, loop, policies, prefetch, speed, tenants
from .config import UMConfig
from .engine import UnifiedMemory
from .prefetch import density_node
from .state import DEVICE, HOST

__all__ = ["allocator", "balancing", "exercises", "explore", "factcheck", "loop", "policies", "prefetch", "speed",
           "tenants", "UMConfig", "UnifiedMemory", "density_node", "DEVICE", "HOST"]
