"""UMConfig: the pool's settings are checked once, with TypeError for a wrong type and ValueError for a wrong
value, each message naming the setting; derived sizes are whole pages."""
import dataclasses

import pytest

from labkit.unified_memory import UMConfig

PS = 4096


def test_defaults_and_derived_sizes():
    c = UMConfig(10 * PS + 5, 3 * PS)
    assert (c.device_pages, c.host_pages, c.block_pages, c.leaf_pages) == (10, 3, 512, 16)
    assert (c.eviction, c.prefetch, c.fault_batch, c.fault_latency, c.link_bandwidth) == ("lru", None, 1, 30e-6, 25e9)
    assert c.hit_s == PS / 2e12
    assert UMConfig(PS, 0, link_bandwidth=10**9).link_bandwidth == 1e9 and \
        isinstance(UMConfig(PS, 0, link_bandwidth=10**9).link_bandwidth, float)
    assert "fault_batch" in UMConfig.names() and len(UMConfig.names()) == 13


@pytest.mark.parametrize("settings, error, message", [
    (dict(device_bytes=100), ValueError, r"device_bytes must be at least one page \(4096 bytes\), got 100"),
    (dict(device_bytes=4096.0), TypeError, "device_bytes must be a positive int"),
    (dict(host_bytes=-1), ValueError, "host_bytes must be a non-negative int"),
    (dict(page_size=0), ValueError, "page_size must be a positive int"),
    (dict(page_size=True), TypeError, "page_size must be a positive int"),
    (dict(eviction="lfu"), ValueError, "eviction must be one of"),
    (dict(eviction=None), TypeError, "eviction must be a str"),
    (dict(prefetch="next"), ValueError, "prefetch must be one of"),
    (dict(prefetch=1), TypeError, "prefetch must be a str or None"),
    (dict(link_bandwidth=0), ValueError, "link_bandwidth must be a positive finite number"),
    (dict(link_bandwidth="25e9"), TypeError, "link_bandwidth must be a positive finite number"),
    (dict(device_bandwidth=float("inf")), ValueError, "device_bandwidth"),
    (dict(fault_latency=-1e-6), ValueError, "fault_latency must be a non-negative"),
    (dict(fault_batch=0), ValueError, "fault_batch must be a positive int"),
    (dict(fault_batch=2.0), TypeError, "fault_batch must be a positive int"),
    (dict(prefetch_pages=0), ValueError, "prefetch_pages"),
    (dict(density_threshold=1.0), ValueError, r"density_threshold must be a finite number in \[0, 1\)"),
    (dict(density_threshold="0.5"), TypeError, "density_threshold"),
    (dict(block_bytes=PS + 1), ValueError, "block_bytes must be a multiple of page_size"),
    (dict(leaf_bytes=3 * PS), ValueError, "leaf_bytes must be a multiple of page_size .* that divides block_bytes"),
    (dict(leaf_bytes=PS // 2), ValueError, "leaf_bytes"),
])
def test_bad_settings_are_refused_by_name(settings, error, message):
    args = dict(device_bytes=4 * PS, host_bytes=4 * PS) | settings
    with pytest.raises(error, match=message):
        UMConfig(**args)


def test_replace_checks_again_and_unknown_settings_are_refused():
    c = UMConfig(4 * PS, 4 * PS)
    assert dataclasses.replace(c, fault_batch=256).fault_batch == 256
    with pytest.raises(ValueError, match="fault_batch"):
        dataclasses.replace(c, fault_batch=-1)
    with pytest.raises(TypeError):
        UMConfig(4 * PS, 4 * PS, batch=256)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.page_size = 1
