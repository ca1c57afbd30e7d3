"""Lab 02, unified memory: a paged pool of device and host memory (the pool and its settings, the paging
loop compiled with numba, eviction policies, prefetchers, the link timeline), allocation modes for shared
devices and the two-model experiment on them (tenants), a contiguous allocator, model layouts in pages, the
notebook's experiments (explore), the loop's measured speed (speed), the fact-checks of the source material's
claims (factcheck) and the exercises."""

from . import (allocator, config, engine, exercises, explore, factcheck, jit, layouts, loop, memory_modes, policies,
               prefetch, speed, state, tenants, timeline)
from .config import UMConfig
from .engine import Allocation, Stats, UnifiedMemory
from .memory_modes import MemoryMode, PoolConfig, configure_memory
from .prefetch import density_node
from .state import DEVICE, FREE, HOST

__all__ = ["allocator", "config", "engine", "exercises", "explore", "factcheck", "jit", "layouts", "loop",
           "memory_modes", "policies", "prefetch", "speed", "state", "tenants", "timeline", "DEVICE", "FREE", "HOST",
           "Allocation", "Stats", "UMConfig", "UnifiedMemory", "density_node", "MemoryMode", "PoolConfig",
           "configure_memory"]
