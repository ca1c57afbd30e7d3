"""Lab 01, the memory wall: footprints (the capacity wall), the roofline and decode ceilings (the
bandwidth wall), this machine's own measurements, offloading, cost, and a calculator."""

from . import calculator, cost, footprint, hardware, offload, roofline

__all__ = ["calculator", "cost", "footprint", "hardware", "offload", "roofline"]
