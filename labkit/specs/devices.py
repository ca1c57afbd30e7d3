"""Device presets: spec-sheet devices and links from data/hardware.json, each entry naming its source
(notebook 01's roofline and ceilings, notebook 02's links, and the parallelism lab's interconnects).
Units: bytes, bytes/s, FLOP/s."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache

from .._checks import check_choice
from ..paths import HARDWARE_JSON


@dataclass(frozen=True)
class DeviceSpec:
    """A device or a link from its spec sheet. memory_bytes: capacity (0 for a link); bandwidth: memory (or
    one-direction link) bandwidth in bytes/s; peak_flops: dense FLOP/s by dtype name ("fp32", "bf16", ...)."""
    name: str
    kind: str
    memory_bytes: int
    bandwidth: float
    peak_flops: dict[str, float] = field(default_factory=dict)
    source: str = ""
    note: str = ""


@cache
def _devices() -> dict[str, DeviceSpec]:
    entries = json.loads(HARDWARE_JSON.read_text())["devices"]
    return {e["name"]: DeviceSpec(e["name"], e["kind"], int(e["memory_bytes"]), float(e["bandwidth"]),
                                  {k: float(v) for k, v in e.get("peak_flops", {}).items()},
                                  e["source"], e.get("note", "")) for e in entries}


def device(name: str) -> DeviceSpec:
    """The spec-sheet device or link called `name` ("h100-sxm", "h200", "pcie4-x16", ...)."""
    devices = _devices()
    return devices[check_choice("name", name, sorted(devices))]


def device_names(kind: str | None = None) -> list[str]:
    """Names of the devices in data/hardware.json, optionally only one kind ("gpu", "soc", "host", "link")."""
    return [n for n, d in _devices().items() if kind is None or d.kind == kind]
