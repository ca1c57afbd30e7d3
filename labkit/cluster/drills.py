"""Notebook 08's runs against real processes, one call each, so that a cell reads as one step of the story
(sections 2-4; the processes come from labkit.cluster.launch, the load from labkit.cluster.load):

    answer(client, prompt, ...)              one completion through the router as a line: the text, or the
                                             refusal ("503 no_healthy_replica: ...")
    policy_run(policy, trace, warm_up)       PolicyRun: a fresh cluster with `policy`, warmed up, then the trace:
                                             the table row, requests per replica, the router's CPU per run
    kill_under_load(cluster, trace)          KillReport: SIGKILL a replica half-way through a streamed run, wait
                                             for its removal, restart it; every request counted twice
    hang_under_load(cluster, trace)          HangReport: SIGSTOP a replica under non-streamed requests, wait for
                                             its removal, SIGCONT it, wait until it registers again

Event times in the reports are seconds since the fault (the router's registry and this process read the same
CLOCK_MONOTONIC on one machine).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai

from .._checks import check_choice, check_fraction, check_int, check_positive, check_positive_int, check_type
from .explore import cpu_seconds
from .launch import Cluster
from .load import LoadResult, prefix_counts, prefix_hit_rate, run_load
from .policies import ROUTING_POLICIES


def answer(client: openai.OpenAI, prompt: str, model: str = "tinylm", max_tokens: int = 4) -> str:
    """One greedy /v1/completions request: repr of the text, or "STATUS code: message" when it is refused."""
    check_type("client", client, openai.OpenAI, "an openai.OpenAI client")
    try:
        reply = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return f"{e.status_code} {body.get('code')}: {body.get('message', e.message)}"
    return repr(reply.choices[0].text)


def _id_of(cluster: Cluster, i: int) -> str:
    """The registry id of replica process i."""
    url = cluster.replicas[i].url
    return next(r["id"] for r in cluster.router.replicas() if r["url"] == url)


def _up(cluster: Cluster) -> list[str]:
    return [r["id"] for r in cluster.router.replicas() if r["state"] == "up"]


def _relative(events: list[dict], t0: float) -> list[dict]:
    """Events in time order with "time" in seconds since t0 (time.monotonic())."""
    return [{**e, "time": e["time"] - t0} for e in sorted(events, key=lambda e: e["time"])]


# --- section 3: one policy on a fresh cluster -----------------------------------------------------------------


@dataclass
class PolicyRun:
    """The trace through a fresh 3-replica cluster routing by `policy`: the load result, the prefix-cache hit
    rate (prompt tokens served from the replicas' caches / looked up, over the trace's run), the requests each
    replica got, and (requests, streamed chunks, router CPU s) for the trace's run and each extra run."""
    policy: str
    result: LoadResult
    hit_rate: float
    per_replica: list[int]
    costs: list[tuple[int, int, float]]

    def row(self) -> dict:
        """The notebook's table row (explore.plot_policies and explore.policy_verdict take these)."""
        return {"policy": self.policy, "tokens/s": self.result.tokens_per_s, "p50 ms": 1e3 * self.result.latency_p50,
                "p99 ms": 1e3 * self.result.latency_p99, "hit rate %": 100 * self.hit_rate,
                "requests per replica": "/".join(map(str, self.per_replica))}


def _costed(cluster: Cluster, bodies: list[dict], concurrency: int) -> tuple[LoadResult, tuple[int, int, float]]:
    """A streamed run and its (requests, chunks relayed, router CPU s): about one chunk per token."""
    cpu = cpu_seconds(cluster.router.pid)
    result = run_load(cluster.url, bodies, concurrency=concurrency)
    used = cpu_seconds(cluster.router.pid)
    return result, (result.sent, sum(r.tokens for r in result.records), None if cpu is None else used - cpu)


def policy_run(policy: str, trace: list[dict], warm_up: list[dict], extra: list[list[dict]] = (),
               replicas: int = 3, concurrency: int = 6) -> PolicyRun:
    """Start a router with `policy` and `replicas` new replicas (empty prefix caches), send `warm_up` (3 in
    flight: a replica's first forwards are slow), then `trace` and every run of `extra`, streamed, `concurrency`
    in flight. RuntimeError if a request of `trace` fails."""
    check_choice("policy", policy, ROUTING_POLICIES)
    check_positive_int("concurrency", concurrency, unit="requests in flight")
    with Cluster(replicas, policy=policy, heartbeat_timeout=1.0) as cluster:
        run_load(cluster.url, warm_up, concurrency=3)
        before = prefix_counts(cluster.router.root)
        routed = {r["id"]: r["routed"] for r in cluster.router.replicas()}
        result, cost = _costed(cluster, trace, concurrency)
        if result.failed:
            raise RuntimeError(f"{result.failed} of {result.sent} requests failed under {policy}: {result.errors()}")
        hit = prefix_hit_rate(cluster.router.root, since=before)
        per_replica = [r["routed"] - routed[r["id"]] for r in cluster.router.replicas()]
        costs = [cost] + [_costed(cluster, bodies, concurrency)[1] for bodies in extra]
    return PolicyRun(policy, result, hit, per_replica, costs)


# --- section 4: failover --------------------------------------------------------------------------------------


@dataclass
class KillReport:
    """A replica SIGKILLed under load: its id, when (s after the run started), how long until the registry
    removed it (s), the client's LoadResult, the router's counters after the run, the replicas up after the
    removal and after the restart, the registry's events (s since the kill) and the heartbeat timeout (s)."""
    victim: str
    killed_at: float
    removed_after: float
    result: LoadResult
    stats: dict
    up_after_kill: list[str]
    up_after_restart: list[str]
    events: list[dict]
    heartbeat_timeout: float

    def counts(self) -> list[dict]:
        """Two table rows, the run counted by the client and by the router: sent, answered, failed, retried and
        in-band errors (the last two only the router knows)."""
        r, s = self.result, self.stats
        return [{"counted by": "the client", "sent": r.sent, "answered": r.answered, "failed": r.failed,
                 "retried": "-", "in-band errors": "-"},
                {"counted by": "the router", "sent": s["requests"], "answered": s["answered"], "failed": s["failed"],
                 "retried": s["retried"], "in-band errors": s["inband_errors"]}]

    def marks(self) -> dict[str, float]:
        """{"SIGKILL", "down", "removed": s since the run started}: the failover plot's dashed lines."""
        mine = {e["kind"]: e["time"] for e in self.events
                if e["id"] == self.victim and e["kind"] in ("down", "removed")}
        return {"SIGKILL": self.killed_at} | {kind: self.killed_at + t for kind, t in mine.items()}

    def spans(self) -> list[dict]:
        """Every request as {"start", "end", "status"} (s since the run started)."""
        return [{"start": r.start, "end": r.end, "status": r.status} for r in self.result.records]


def _wait(done, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.01)


def kill_under_load(cluster: Cluster, trace: list[dict], i: int = 0, concurrency: int = 6, after: float = 0.5,
                    timeout: float = 30.0) -> KillReport:
    """Run `trace` through `cluster` (streamed, `concurrency` in flight); once `after` of it is answered,
    SIGKILL replica process i; wait for the run to end and for the registry to remove the replica; restart it
    (a new process, a new id) and wait until the router lists it. TimeoutError if a step takes over `timeout` s."""
    check_type("cluster", cluster, Cluster, "a labkit.cluster.launch.Cluster")
    check_int("i", i, 0, len(cluster.replicas) - 1)
    check_fraction("after", after, allow_zero=True)
    check_positive("timeout", timeout, unit="s")
    victim, answered = _id_of(cluster, i), cluster.router.stats()["answered"]
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        running = pool.submit(run_load, cluster.url, trace, concurrency)
        _wait(lambda: cluster.router.stats()["answered"] - answered >= after * len(trace) or running.done(),
              timeout, f"{after:.0%} of the trace answered")
        killed = time.monotonic()
        cluster.kill(i)
        result = running.result()
    removed = cluster.router.wait_for_event("removed", replica=victim, since=killed, timeout=timeout)
    stats, up_after_kill = cluster.router.stats(), _up(cluster)
    cluster.restart(i)
    listed = cluster.router.replicas()
    return KillReport(victim, killed - started, removed["time"] - killed, result, stats, up_after_kill,
                      [r["id"] for r in listed if r["state"] == "up"], _relative(cluster.router.events(), killed),
                      cluster.router.heartbeat_timeout)


@dataclass
class HangReport:
    """A replica SIGSTOPped under non-streamed requests: its id, the client's LoadResult, the requests the router
    retried meanwhile, how long after the pause the registry removed it and it registered again (s), its new id,
    and the registry's events since the pause (s since the pause)."""
    replica: str
    result: LoadResult
    retried: int
    removed_after: float
    rejoined_after: float
    new_id: str
    events: list[dict]


def hang_under_load(cluster: Cluster, trace: list[dict], i: int = 0, concurrency: int = 3,
                    timeout: float = 30.0) -> HangReport:
    """SIGSTOP replica process i, send `trace` (not streamed, `concurrency` in flight), SIGCONT it, and wait
    until it registers again (its heartbeat gets a 404 once the router removed it). TimeoutError after `timeout`
    s without its removal or its new registration."""
    check_type("cluster", cluster, Cluster, "a labkit.cluster.launch.Cluster")
    check_int("i", i, 0, len(cluster.replicas) - 1)
    check_positive("timeout", timeout, unit="s")
    hung, url, retried = _id_of(cluster, i), cluster.replicas[i].url, cluster.router.stats()["retried"]
    paused = time.monotonic()
    cluster.pause(i)
    try:
        result = run_load(cluster.url, trace, concurrency=concurrency, stream=False)
        removed = cluster.router.wait_for_event("removed", replica=hung, since=paused, timeout=timeout)
    finally:
        cluster.resume(i)
    back = cluster.router.wait_for_event("registered", url=url, since=paused, timeout=timeout)
    events = [e for e in _relative(cluster.router.events(), paused) if e["time"] >= 0]
    return HangReport(hung, result, cluster.router.stats()["retried"] - retried, removed["time"] - paused,
                      back["time"] - paused, back["id"], events)
