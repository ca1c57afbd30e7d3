"""Buy or rent: when does a local machine pay for itself? Used by notebook 01_memory_wall's fact-check.

Money in any one currency (the claims use US dollars); time in days.
"""

from __future__ import annotations

import math
import numbers


def _money(name: str, value, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or math.isinf(value) \
            or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite amount {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def breakeven_days(local_cost: float, cloud_per_day: float, local_per_day: float = 0.0) -> float:
    """Days after which buying (`local_cost` once, then `local_per_day` for power and upkeep) has cost less
    than renting at `cloud_per_day`: local_cost / (cloud_per_day - local_per_day). Infinite when renting
    costs no more per day than running the local machine."""
    cost = _money("local_cost", local_cost)
    cloud = _money("cloud_per_day", cloud_per_day)
    upkeep = _money("local_per_day", local_per_day, allow_zero=True)
    return math.inf if cloud <= upkeep else cost / (cloud - upkeep)
