"""Buy or rent: when does a local machine pay for itself? Used by notebook 01_memory_wall's fact-check.

Money in any one currency (the claims use US dollars); time in days.
"""

from __future__ import annotations

import math

from .._checks import check_positive


def breakeven_days(local_cost: float, cloud_per_day: float, local_per_day: float = 0.0) -> float:
    """Days after which buying (`local_cost` once, then `local_per_day` for power and upkeep) has cost less
    than renting at `cloud_per_day`: local_cost / (cloud_per_day - local_per_day). Infinite when renting
    costs no more per day than running the local machine. Amounts are numbers: "5300" is a TypeError."""
    cost = check_positive("local_cost", local_cost, unit="money")
    cloud = check_positive("cloud_per_day", cloud_per_day, unit="money per day")
    upkeep = check_positive("local_per_day", local_per_day, unit="money per day", allow_zero=True)
    return math.inf if cloud <= upkeep else cost / (cloud - upkeep)
