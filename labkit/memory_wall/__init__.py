"""Lab 01, the memory wall: footprints (the capacity wall), the roofline and decode ceilings (the
bandwidth wall), this machine's own measurements, offloading, cost, a calculator, notebook 01's plots
(explore) and its exercises."""

from . import calculator, cost, exercises, explore, footprint, hardware, offload, roofline

__all__ = ["calculator", "cost", "exercises", "explore", "footprint", "hardware", "offload", "roofline"]
