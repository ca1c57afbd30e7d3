"""The router's counters as Prometheus text (GET /metrics on labkit.cluster.router's app; notebook 08, sections 3
and 4 read them through labkit.cluster.launch.RouterProcess.stats()).

    labkit_router:requests_total 12            one line per ROUTER_METRICS entry, from Router.stats()
    labkit_router:replica_routed_total{replica="replica-1",url="http://127.0.0.1:P/v1",state="up"} 7
    labkit_router:replica_outstanding{replica="replica-1",url="...",state="up"} 1     per replica

The counters satisfy requests == answered + failed + refused + in_flight (labkit.cluster.forward.Ticket).
"""

from __future__ import annotations

PREFIX = "labkit_router:"

# name (after "labkit_router:"), type, help; the value is stats[name without "_total"]
ROUTER_METRICS = [line.split(None, 2) for line in """
requests_total      counter  Generation requests received.
answered_total      counter  Requests answered in full (a stream: to its [DONE]).
failed_total        counter  Requests that failed (503, an in-band error, a client that left).
refused_total       counter  Requests refused as the client's error (4xx from the router or passed on from a replica).
retried_total       counter  Forwards retried on another replica before any byte reached the client.
inband_errors_total counter  Streams that ended with an in-band error event.
removals_total      counter  Replicas removed by the heartbeat timeout.
in_flight           gauge    Requests being handled now.
replicas_healthy    gauge    Replicas up.
replicas_registered gauge    Replicas registered (up or down).
""".strip().splitlines()]

# name, type, the Replica attribute, help
REPLICA_METRICS = (("replica_routed_total", "counter", "routed", "Forwards sent to a replica."),
                   ("replica_outstanding", "gauge", "outstanding", "Forwards in flight."))


def metrics_text(stats: dict, replicas: list) -> str:
    """`stats` (Router.stats(): a number for each ROUTER_METRICS name without "_total") and each of `replicas`'
    (labkit.cluster.registry.Replica) routed / outstanding, in Prometheus' text format."""
    lines = []
    for short, kind, text in ROUTER_METRICS:
        name = PREFIX + short
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {stats[short.removesuffix('_total')]}"]
    for short, kind, key, text in REPLICA_METRICS:
        name = PREFIX + short
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{replica="{r.id}",url="{r.url}",state="{r.state}"}} {getattr(r, key)}' for r in replicas]
    return "\n".join(lines) + "\n"
