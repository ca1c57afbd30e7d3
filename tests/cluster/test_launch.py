"""launch: a router process and real replica processes, failures on purpose (SIGKILL, SIGSTOP), rejoin, and every
request accounted for by the real openai client and by the router's own counters."""
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from labkit.cluster.launch import Cluster, start_replica, start_router
from labkit.cluster.load import run_load, shared_prefix_trace
from tests.cluster.conftest import wait_until
from tests.refusals import assert_refused

TIMEOUT = 3.0  # the router's heartbeat timeout (s); replicas heartbeat every 0.2 s: none late by 3 s on a busy machine
SLACK = 3.0    # how much later than the timeout a removal may come on a busy 2-core machine
COUNTED = ("requests", "answered", "failed", "refused", "retried", "inband_errors", "removals")
N = 48         # requests in a load run: 48 x 48 tokens, a few seconds, long enough to strike in the middle


@pytest.fixture(scope="module")
def cluster():
    with Cluster(2, policy="round_robin", heartbeat_timeout=TIMEOUT, heartbeat_interval=0.2) as cluster:
        yield cluster


def healthy(cluster) -> None:
    """Both replicas running and listed up (a failed earlier test may have left one down)."""
    for i, replica in enumerate(cluster.replicas):
        if i in cluster.paused:
            cluster.resume(i)
        if replica is None or replica.returncode is not None:
            cluster.restart(i)
    cluster.router.wait_for(2, timeout=30)


def under_load(cluster, fault, n_before: int = 4):
    """Run an N-request streamed trace through the router; once `n_before` were answered, fault(); then wait
    until the faulty replica is removed. (LoadResult, the router's counter deltas, seconds fault -> removal)."""
    before = cluster.router.stats()
    bodies = shared_prefix_trace(4, N // 4, 96, seed=7, max_tokens=48)
    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(run_load, cluster.url, bodies, 4, True, 30.0)
        assert wait_until(lambda: cluster.router.stats()["answered"] >= before["answered"] + n_before, 60)
        struck, mid_run = time.monotonic(), not load.done()
        fault()
        assert wait_until(lambda: len(cluster.router.replicas()) == 1, TIMEOUT + SLACK + 5)
        removed = time.monotonic() - struck
        result = load.result(timeout=120)
    assert mid_run, "the run ended before the fault"
    after = cluster.router.stats()
    assert after["in_flight"] == 0
    print(f"removed {removed:.2f} s after the fault; the router's counts: {after}")
    return result, {k: after[k] - before[k] for k in COUNTED}, removed


def check_accounted(result, delta) -> None:
    assert result.sent == N == result.answered + result.failed
    assert delta["requests"] == N and delta["refused"] == 0
    assert (delta["answered"], delta["failed"]) == (result.answered, result.failed)  # the client and the router agree
    assert delta["retried"] > 0 or delta["inband_errors"] > 0
    assert delta["failed"] == delta["inband_errors"]  # a failure here is a stream ended in-band, never a hang
    assert all("mid-stream" in r.error for r in result.records if r.status == "failed"), result.errors()


@pytest.mark.timeout(120)
def test_replicas_register_and_the_router_serves_them(cluster):
    listed = cluster.router.wait_for(2)
    assert sorted(r["url"] for r in listed) == sorted(r.url for r in cluster.replicas)
    client = openai.OpenAI(base_url=cluster.url, api_key="any", max_retries=0)
    assert [m.id for m in client.models.list()] == ["tinylm"]
    assert client.completions.create(model="tinylm", prompt="2+2=", max_tokens=3, temperature=0).choices[0].text


@pytest.mark.timeout(240)
def test_a_replica_killed_mid_run_is_removed_every_request_accounted_and_a_restart_rejoins(cluster):
    healthy(cluster)
    victim = next(r["id"] for r in cluster.router.replicas() if r["url"] == cluster.replicas[0].url)
    result, delta, removed = under_load(cluster, lambda: cluster.kill(0))
    check_accounted(result, delta)
    assert removed < TIMEOUT + SLACK and delta["removals"] == 1, removed
    events = [e["kind"] for e in cluster.router.events() if e["id"] == victim]
    assert events[0] == "registered" and events[-1] == "removed"
    new = cluster.restart(0)  # a new process on a new port: a new replica
    listed = cluster.router.wait_for(2)
    new_id = next(r["id"] for r in listed if r["url"] == new.url)
    assert new_id != victim
    client = openai.OpenAI(base_url=cluster.url, api_key="any", max_retries=0)
    for _ in range(2):  # round robin: one of the two goes to the new replica
        assert client.completions.create(model="tinylm", prompt="1+2=", max_tokens=2, temperature=0).choices[0].text
    assert {r["id"]: r["routed"] for r in cluster.router.replicas()}[new_id] == 1


@pytest.mark.timeout(240)
def test_a_paused_replica_is_removed_within_the_timeout_and_rejoins_when_it_wakes(cluster):
    healthy(cluster)
    paused = cluster.replicas[1]
    result, delta, removed = under_load(cluster, lambda: cluster.pause(1))
    check_accounted(result, delta)
    assert removed < TIMEOUT + SLACK and delta["removals"] == 1, removed
    cluster.resume(1)  # its next heartbeat gets a 404: it registers again, as a new replica
    listed = cluster.router.wait_for(2, timeout=30, url=paused.url)
    assert paused.url in [r["url"] for r in listed]


@pytest.mark.timeout(120)
def test_every_process_is_stopped_on_exit_even_a_paused_one():
    with Cluster(1, policy="round_robin", heartbeat_timeout=5.0) as small:
        small.pause(0)
        processes = [small.router.process, small.replicas[0].process]
    assert all(p.poll() is not None for p in processes)
    assert processes[0].returncode == 0  # the router stopped cleanly (SIGTERM)


@pytest.mark.timeout(60)
def test_a_router_that_does_not_start_says_why():
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 2; its stderr: .*--port must be in"):
        start_router(args=["--port", "70000"])  # the last --port wins: refused, exit 2
    with pytest.raises(RuntimeError, match=r"printed nothing in 0\.01 s"):
        start_router(timeout=0.01)  # still starting: no line yet, and it has not exited


def test_bad_arguments_are_refused_before_any_process_starts():
    assert_refused(lambda: Cluster(0), ValueError, "n", 0, "a positive int")
    assert_refused(lambda: Cluster(1, policy="random"), ValueError, "name", "random", "one of")
    assert_refused(lambda: start_router(heartbeat_timeout=0), ValueError, "heartbeat_timeout", 0, "positive")
    assert_refused(lambda: start_router(retries=-1), ValueError, "retries", -1, "an int >= 0")
    assert_refused(lambda: start_replica("localhost:9000"), ValueError, "router", "localhost:9000", "root URL")


def test_a_replica_index_is_checked(cluster):
    assert_refused(lambda: cluster.kill(2), ValueError, "i", 2, "an int in [0, 1]")
    assert_refused(lambda: cluster.pause("0"), TypeError, "i", "0", "an int")
