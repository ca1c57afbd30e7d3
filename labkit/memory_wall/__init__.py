"""Lab 01, the memory wall: footprints (the capacity wall), the roofline and decode ceilings (the
bandwidth wall), this machine's own measurements and the verdicts they can carry (verdicts: medians,
interleaved ratios, "unreliable" on a busy machine; notebooks 00, 01 and 03 use them), offloading (offload;
transfer sweeps where "30-50% of the time on transfers" holds), cost, a calculator, the fact-check of the
source material's claims (factcheck; local_claims for local deployment), notebook 01's plots (explore) and its
exercises."""

from . import (calculator, exercises, explore, factcheck, footprint, hardware, local_claims, offload, roofline,
               transfer, verdicts)

__all__ = ["calculator", "exercises", "explore", "factcheck", "footprint", "hardware", "local_claims", "offload",
           "roofline", "transfer", "verdicts"]
