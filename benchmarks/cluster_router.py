"""Lab 08's router, measured in one run: 2 replicas against 1 through the router on the same trace,
prefix affinity against round robin (and least outstanding) on a trace with shared prefixes, and failover
(a replica killed, a replica hung) with every request accounted for.

    python benchmarks/cluster_router.py [--requests 96] [--concurrency 16] [--max-tokens 32] [--repeats 6]

Every cluster is a router (`python -m labkit.cluster`) and TinyLM replicas (`python -m labkit.serving --register
...`, 1 torch thread each) started by labkit.cluster.launch; the client is openai.AsyncOpenAI with max_retries=0
(labkit.cluster.load.run_load), streaming, greedy. The clusters of one comparison are all up at once and take turns
(an idle replica blocks on its queue and costs no CPU); each repeat uses a trace of its own seed, so no repeat is
served from a cache an earlier one warmed. Ratios are medians over the repeats, with each repeat's ratio beside
them; a goal is met when enough repeats' ratios reach it (labkit.course.evidence.against_goal, the sign test: all 6 of
6, 12 of 15).
The CPU seconds every process of a cluster spent, over the run's wall time, say how many cores the run kept busy: on
2 cores, 2 replicas, the router and the client share them.
"""

import argparse
import os
import statistics
import threading
import time

from labkit.cluster.explore import cpu_seconds
from labkit.course import evidence
from labkit.cluster.launch import Cluster
from labkit.cluster.load import prefix_counts, prefix_hit_rate, run_load, shared_prefix_trace

SCALING_GOAL = 1.5


def pids(cluster: Cluster) -> list[int]:
    return [cluster.router.pid] + [r.pid for r in cluster.replicas if r is not None and r.returncode is None]


def measured(cluster: Cluster, bodies: list[dict], concurrency: int) -> dict:
    """One load run through `cluster`'s router: tokens/s, latency, prefix hit rate, cores kept busy, router CPU."""
    before, counts = {p: cpu_seconds(p) for p in pids(cluster)}, prefix_counts(cluster.router.root)
    client0 = time.process_time()
    result = run_load(cluster.url, bodies, concurrency=concurrency)
    cpu = {p: cpu_seconds(p) - c for p, c in before.items()}
    client = time.process_time() - client0
    assert result.sent == result.answered + result.failed == len(bodies), result.errors()
    router = cpu.pop(cluster.router.pid)
    return {"tokens_per_s": result.tokens_per_s, "p50": result.latency_p50, "p99": result.latency_p99,
            "hit_rate": prefix_hit_rate(cluster.router.root, since=counts), "failed": result.failed,
            "cores": (sum(cpu.values()) + router + client) / result.wall_s,
            "replica_cores": sum(cpu.values()) / result.wall_s, "router_cores": router / result.wall_s,
            "client_cores": client / result.wall_s, "router_cpu_per_request": router / len(bodies)}


def scaling(args) -> None:
    print(f"\n1. one replica against two, round robin: {args.requests} requests of distinct prompts, "
          f"{args.concurrency} in flight, {args.max_tokens} tokens each")
    runs = {1: [], 2: []}
    with Cluster(1, policy="round_robin") as one, Cluster(2, policy="round_robin") as two:
        for r in range(args.repeats):
            bodies = shared_prefix_trace(args.requests, 1, 96, seed=10 + r, max_tokens=args.max_tokens)
            for n, cluster in ((1, one), (2, two)):
                runs[n].append(measured(cluster, bodies, args.concurrency))
    ratios = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(runs[1], runs[2])]
    ratio = statistics.median(b["tokens_per_s"] for b in runs[2]) / statistics.median(
        a["tokens_per_s"] for a in runs[1])
    for n in (1, 2):
        med = {k: statistics.median(m[k] for m in runs[n]) for k in runs[n][0]}
        print(f"   {n} replica(s): {med['tokens_per_s']:,.0f} tokens/s, latency p50 {med['p50']:.2f} s, "
              f"p99 {med['p99']:.2f} s; cores busy {med['cores']:.2f} of {os.cpu_count()} (replicas "
              f"{med['replica_cores']:.2f}, router {med['router_cores']:.2f}, client {med['client_cores']:.2f})")
    print(f"   2 / 1 = {ratio:.2f}x (per repeat {', '.join(f'{x:.2f}' for x in ratios)}): "
          f"{evidence.against_goal('2 / 1', ratios, SCALING_GOAL).verdict()}")


def prefixes(args) -> None:
    n_prefixes, per_prefix = 6, max(2, args.requests // 6)
    print(f"\n2. routing policies, 3 replicas each: {n_prefixes} shared prefixes of 160 characters x {per_prefix} "
          f"questions, {args.concurrency} in flight")
    policies = ("round_robin", "least_outstanding", "prefix_affinity")
    runs: dict[str, list[dict]] = {p: [] for p in policies}
    clusters = {}
    try:
        for p in policies:
            clusters[p] = Cluster(3, policy=p)
        for r in range(args.repeats):
            bodies = shared_prefix_trace(n_prefixes, per_prefix, 160, seed=100 + r, max_tokens=args.max_tokens)
            for p in policies:
                runs[p].append(measured(clusters[p], bodies, args.concurrency))
    finally:
        for cluster in clusters.values():
            cluster.stop()
    for p in policies:
        med = {k: statistics.median(m[k] for m in runs[p]) for k in runs[p][0]}
        each = ", ".join(f"{m['hit_rate']:.1%}" for m in runs[p])
        print(f"   {p:17s} hit rate {med['hit_rate']:.1%} (per repeat {each}), {med['tokens_per_s']:,.0f} tokens/s, "
              f"p50 {med['p50']:.2f} s, p99 {med['p99']:.2f} s, router CPU {med['router_cpu_per_request'] * 1e3:.1f} "
              f"ms/request")
    wins = [a["hit_rate"] > b["hit_rate"] for a, b in zip(runs["prefix_affinity"], runs["round_robin"])]
    print(f"   prefix affinity's hit rate above round robin's in {sum(wins)} of {len(wins)} repeats")


def removal_time(cluster: Cluster, url: str, t0: float, timeout: float = 10.0) -> tuple[float, float]:
    """(s until the router stopped routing to `url`, s until it removed it), polled every 10 ms from t0."""
    down = gone = None
    while time.monotonic() - t0 < timeout and gone is None:
        state = {r["url"]: r["state"] for r in cluster.router.replicas()}
        if down is None and state.get(url) != "up":
            down = time.monotonic() - t0
        if url not in state:
            gone = time.monotonic() - t0
        time.sleep(0.01)
    return down, gone


def failover(args) -> None:
    n = 4 * args.requests // 3
    print(f"\n3. failover, 3 replicas, heartbeat timeout 1 s: {n} streamed requests, {args.concurrency} in flight, "
          f"one replica killed (SIGKILL) and later one hung (SIGSTOP) while they run")
    with Cluster(3, policy="round_robin", heartbeat_timeout=1.0) as cluster:
        for how, victim in (("SIGKILL", 0), ("SIGSTOP", 1)):
            bodies = shared_prefix_trace(n, 1, 96, seed=200 + victim, max_tokens=args.max_tokens)
            stats0, out = cluster.router.stats(), {}
            worker = threading.Thread(target=lambda: out.update(result=run_load(cluster.url, bodies,
                                                                                args.concurrency)))
            worker.start()
            time.sleep(1.0)
            url, t0 = cluster.replicas[victim].url, time.monotonic()
            if how == "SIGKILL":
                cluster.kill(victim)
            else:
                cluster.pause(victim)
            down, gone = removal_time(cluster, url, t0)
            worker.join(120)
            result, stats = out["result"], cluster.router.stats()
            delta = {k: stats[k] - stats0.get(k, 0) for k in ("requests", "answered", "failed", "retried")}
            print(f"   {how}: stopped routing to it after {down:.2f} s, removed after {gone:.2f} s; client: "
                  f"sent {result.sent}, answered {result.answered}, failed {result.failed} "
                  f"{result.errors() or ''}; router: {delta}")
            assert result.sent == result.answered + result.failed == n
            t1 = time.monotonic()
            cluster.restart(victim)
            print(f"   restarted: listed again after {time.monotonic() - t1:.2f} s (a new process: torch import, "
                  f"load, warm-up, registration)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=evidence.MIN_GOAL_REPEATS)
    parser.add_argument("--only", choices=("scaling", "prefixes", "failover"), default=None)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; replicas run 1 torch thread each")
    for name, part in (("scaling", scaling), ("prefixes", prefixes), ("failover", failover)):
        if args.only in (None, name):
            part(args)


if __name__ == "__main__":
    main()
