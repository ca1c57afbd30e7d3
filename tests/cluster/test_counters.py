"""counters: the router's /metrics text, read back by Prometheus' own parser (prometheus_client, which
jupyter_server brings) as the independent reference."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from labkit.cluster.counters import ROUTER_METRICS, metrics_text
from labkit.cluster.registry import Registry

parser = pytest.importorskip("prometheus_client.parser")

STATS = [name.removesuffix("_total") for name, _, _ in ROUTER_METRICS]


@given(st.lists(st.integers(0, 10**6), min_size=len(STATS), max_size=len(STATS)), st.integers(0, 3))
def test_prometheus_reads_back_every_counter_and_each_replica_s(values, n_replicas):
    stats = dict(zip(STATS, values))
    registry = Registry(60.0)
    replicas = [registry.register(f"http://127.0.0.1:{8000 + i}/v1", "tinylm") for i in range(n_replicas)]
    for i, replica in enumerate(replicas):
        for _ in range(i):
            registry.begin(replica.id)
    if replicas:
        registry.mark_down(replicas[0].id, "refused")
    families = {f.name: f for f in parser.text_string_to_metric_families(metrics_text(stats, registry.replicas()))}
    for name, kind, _ in ROUTER_METRICS:
        family = families["labkit_router:" + name.removesuffix("_total")]  # the parser drops a counter's _total
        assert family.type == kind and [s.value for s in family.samples] == [stats[name.removesuffix("_total")]]
    routed = families["labkit_router:replica_routed"].samples
    outstanding = families["labkit_router:replica_outstanding"].samples
    assert [(s.labels, s.value) for s in routed] == [
        ({"replica": r.id, "url": r.url, "state": r.state}, r.routed) for r in replicas]
    assert [s.value for s in outstanding] == [r.outstanding for r in replicas] == list(range(n_replicas))
    assert not replicas or routed[0].labels["state"] == "down"


def test_a_missing_counter_is_a_key_error_naming_it():
    with pytest.raises(KeyError, match="answered"):
        metrics_text({"requests": 1}, [])
