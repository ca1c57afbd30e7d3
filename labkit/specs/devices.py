"""Device presets: spec-sheet devices and links from data/hardware.json, each entry naming its source
(notebook 01's roofline and ceilings, notebook 02's links, and the parallelism lab's interconnects).
Units: bytes, bytes/s, FLOP/s."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, Mapping

from .._checks import check_choice, check_positive, check_positive_int, check_type, fail
from ..paths import HARDWARE_JSON

KINDS = ("gpu", "soc", "host", "link")  # accelerators, systems on a chip, host memory, interconnects
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4")  # the keys peak_flops may use


@dataclass(frozen=True)
class DeviceSpec:
    """A device or a link from its spec sheet. kind: one of KINDS; memory_bytes: capacity in bytes (0 for a
    link, > 0 for everything else); bandwidth: memory (or one-direction link) bandwidth in bytes/s;
    peak_flops: dense FLOP/s by dtype name ("fp32", "bf16", ..., see DTYPES); source: where the
    figures come from (required). Validates itself: a wrong type raises TypeError, a wrong value ValueError."""
    name: str
    kind: str
    memory_bytes: int
    bandwidth: float
    peak_flops: Mapping[str, float] = field(default_factory=dict)
    source: str = ""
    note: str = ""

    def __post_init__(self):
        for f in ("name", "source"):
            if not check_type(f, getattr(self, f), str):
                fail(f, getattr(self, f), "a non-empty str")
        check_type("note", self.note, str)
        check_choice("kind", self.kind, KINDS)
        memory = check_positive_int("memory_bytes", self.memory_bytes, unit="bytes", allow_zero=True)
        if (self.kind == "link") != (memory == 0):
            fail("memory_bytes", self.memory_bytes, "0 for a link and > 0 for any other kind "
                 f"(kind is {self.kind!r})")
        check_type("peak_flops", self.peak_flops, Mapping, "a dict of dtype name -> FLOP/s")
        peaks = {check_choice("peak_flops key", k, DTYPES): check_positive(f"peak_flops[{k!r}]", v, unit="FLOP/s")
                 for k, v in self.peak_flops.items()}
        if self.kind == "link" and peaks:
            fail("peak_flops", dict(self.peak_flops), "empty for a link (a link computes nothing)")
        object.__setattr__(self, "memory_bytes", memory)
        object.__setattr__(self, "bandwidth", check_positive("bandwidth", self.bandwidth, unit="bytes/s"))
        object.__setattr__(self, "peak_flops", peaks)  # a validated copy of plain floats

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> "DeviceSpec":
        """A DeviceSpec from one entry of data/hardware.json. Refuses unknown keys (a typo would otherwise
        vanish) and capacities that are not whole bytes; JSON's 80e9 is read as the int 80_000_000_000."""
        check_type("entry", entry, Mapping, "a dict (one device of data/hardware.json)")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(entry) - known)
        if unknown:
            fail("entry", dict(entry), f"a dict with keys among {sorted(known)} (unknown: {unknown})")
        memory = entry.get("memory_bytes")
        if isinstance(memory, float) and memory.is_integer():
            memory = int(memory)
        return cls(**{**entry, "memory_bytes": memory})


@cache
def _devices() -> dict[str, DeviceSpec]:
    entries = json.loads(HARDWARE_JSON.read_text())["devices"]
    devices = {}
    for e in entries:
        d = DeviceSpec.from_dict(e)
        if d.name in devices:
            raise ValueError(f"{HARDWARE_JSON.name}: device {d.name!r} is listed twice")
        devices[d.name] = d
    return devices


def device(name: str) -> DeviceSpec:
    """The spec-sheet device or link called `name` ("h100-sxm", "h200", "pcie4-x16", ...)."""
    devices = _devices()
    if not isinstance(name, str):
        fail("name", name, f"one of {tuple(sorted(devices))}", TypeError)
    return devices[check_choice("name", name, sorted(devices))]


def device_names(kind: str | None = None) -> list[str]:
    """Names of the devices in data/hardware.json, optionally only one kind ("gpu", "soc", "host", "link")."""
    if kind is not None:
        if not isinstance(kind, str):
            fail("kind", kind, f"None or one of {KINDS}", TypeError)
        check_choice("kind", kind, KINDS)
    return [n for n, d in _devices().items() if kind is None or d.kind == kind]
