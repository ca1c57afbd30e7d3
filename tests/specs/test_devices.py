"""The device presets: every entry names its source, the figures match the spec sheets, and a DeviceSpec
refuses what no device has."""
import dataclasses
import json

import pytest

from labkit import specs
from labkit.paths import HARDWARE_JSON
from labkit.specs.devices import DTYPES, KINDS, DeviceSpec

from ..refusals import assert_refused

REQUIRED = ["h100-sxm", "h200", "a100-80gb", "mi300x", "rtx-4090", "m2-ultra", "ddr5-5600-2ch", "pcie4-x16",
            "pcie5-x16", "nvlink4", "nvlink-c2c"]


def test_every_device_names_its_source_and_the_required_ones_exist():
    for name in REQUIRED:
        d = specs.device(name)
        assert d.source and d.bandwidth > 0
        assert (d.kind == "link") == (d.memory_bytes == 0)
        assert d.kind in ("link", "host") or d.peak_flops["fp32"] > 0
    assert set(specs.device_names("link")) >= {"pcie4-x16", "pcie5-x16", "nvlink4"}


def test_the_presets_are_the_entries_of_hardware_json_in_order():
    entries = json.loads(HARDWARE_JSON.read_text())["devices"]
    assert specs.device_names() == [e["name"] for e in entries]
    for e in entries:
        d = specs.device(e["name"])
        assert (d.kind, d.memory_bytes, d.bandwidth) == (e["kind"], e["memory_bytes"], e["bandwidth"])
        assert type(d.memory_bytes) is int and d.peak_flops == e.get("peak_flops", {})
    assert sorted(n for k in KINDS for n in specs.device_names(k)) == sorted(specs.device_names())


def test_spec_sheet_figures():
    # H100 SXM datasheet: 80 GB HBM3 at 3.35 TB/s; BF16 1,979 TFLOPS with sparsity, so 989 dense.
    h100 = specs.device("h100-sxm")
    assert (h100.memory_bytes, h100.bandwidth, round(h100.peak_flops["bf16"] / 1e12)) == (80e9, 3.35e12, 989)
    # PCIe x16 per direction: lanes x GT/s x 128/130 / 8 bits.
    assert specs.device("pcie4-x16").bandwidth == pytest.approx(16 * 16e9 * 128 / 130 / 8, rel=2e-3)
    assert specs.device("pcie5-x16").bandwidth == pytest.approx(16 * 32e9 * 128 / 130 / 8, rel=2e-3)


def test_unknown_device_names_are_refused_with_the_list():
    assert_refused(lambda: specs.device("h100"), ValueError, "name", "h100", "one of (")
    with pytest.raises(ValueError, match="h100-sxm"):
        specs.device("h100")
    assert_refused(lambda: specs.device(None), TypeError, "name", None, "'h100-sxm'")
    assert_refused(lambda: specs.device_names("tpu"), ValueError, "kind", "tpu", "one of ('gpu'")
    assert_refused(lambda: specs.device_names(1), TypeError, "kind", 1, "None or one of")


GPU = {"name": "x", "kind": "gpu", "memory_bytes": 80 * 10**9, "bandwidth": 3e12, "peak_flops": {"bf16": 1e15},
       "source": "a datasheet"}


def test_a_device_from_a_dict_reads_json_numbers_as_whole_bytes():
    d = DeviceSpec.from_dict({**GPU, "memory_bytes": 80e9})
    assert d == DeviceSpec(**GPU) and type(d.memory_bytes) is int
    assert specs.device("h200") == DeviceSpec.from_dict(dataclasses.asdict(specs.device("h200")))


@pytest.mark.parametrize("change,error,name,value,expected", [
    ({"kind": "tpu"}, ValueError, "kind", "tpu", f"one of {KINDS}"),
    ({"memory_bytes": -1}, ValueError, "memory_bytes", -1, "a non-negative int (bytes)"),
    ({"memory_bytes": 80.5e9}, TypeError, "memory_bytes", 80.5e9, "a non-negative int (bytes)"),
    ({"memory_bytes": 0}, ValueError, "memory_bytes", 0, "0 for a link and > 0 for any other kind"),
    ({"kind": "link", "peak_flops": {}}, ValueError, "memory_bytes", 80 * 10**9, "0 for a link"),
    ({"bandwidth": 0}, ValueError, "bandwidth", 0, "a positive finite number (bytes/s)"),
    ({"bandwidth": "3e12"}, TypeError, "bandwidth", "3e12", "a positive finite number"),
    ({"peak_flops": {"bf16": -1.0}}, ValueError, "peak_flops['bf16']", -1.0, "a positive finite number (FLOP/s)"),
    ({"peak_flops": {"bfloat16": 1e15}}, ValueError, "peak_flops key", "bfloat16", f"one of {DTYPES}"),
    ({"peak_flops": [1e15]}, TypeError, "peak_flops", [1e15], "a dict of dtype name -> FLOP/s"),
    ({"source": ""}, ValueError, "source", "", "a non-empty str"),
    ({"name": 7}, TypeError, "name", 7, "str"),
    ({"note": None}, TypeError, "note", None, "str"),
])
def test_impossible_devices_are_refused(change, error, name, value, expected):
    assert_refused(lambda: DeviceSpec(**{**GPU, **change}), error, name, value, expected)


def test_a_link_computes_nothing_and_unknown_keys_are_refused():
    link = {**GPU, "kind": "link", "memory_bytes": 0}
    assert_refused(lambda: DeviceSpec(**link), ValueError, "peak_flops", {"bf16": 1e15}, "empty for a link")
    assert DeviceSpec(**{**link, "peak_flops": {}}).kind == "link"
    with pytest.raises(ValueError, match=r"entry must be a dict with keys among .*\(unknown: \['bandwith'\]\)"):
        DeviceSpec.from_dict({**GPU, "bandwith": 1e12})
    assert_refused(lambda: DeviceSpec.from_dict([1]), TypeError, "entry", [1], "a dict")


def test_the_peaks_are_a_validated_copy():
    peaks = {"bf16": 1e15}
    d = DeviceSpec(**{**GPU, "peak_flops": peaks})
    peaks["bf16"] = 0
    assert d.peak_flops == {"bf16": 1e15}
