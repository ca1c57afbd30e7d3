"""Lab 02, unified memory: a paged pool of device and host memory (the paging engine, eviction policies,
prefetchers), allocation modes for shared devices, a contiguous allocator, model layouts in pages, and the
notebook's experiments."""

from . import allocator, engine, explore, layouts, memory_modes
from .engine import DEVICE, FREE, HOST, Allocation, Stats, UnifiedMemory, density_node
from .memory_modes import MemoryMode, PoolConfig, configure_memory

__all__ = ["allocator", "engine", "explore", "layouts", "memory_modes", "DEVICE", "FREE", "HOST", "Allocation", "Stats",
           "UnifiedMemory", "density_node", "MemoryMode", "PoolConfig", "configure_memory"]
