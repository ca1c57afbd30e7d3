"""drills: notebook 08's runs against real processes (a fresh cluster per policy, a replica killed under load, a
replica hung under load), and one request's answer as a line."""
import pytest

from labkit.cluster import drills
from labkit.cluster.launch import Cluster
from labkit.cluster.load import shared_prefix_trace
from tests.cluster.conftest import local_router
from tests.refusals import assert_refused

TIMEOUT = 3.0  # the router's heartbeat timeout (s): no replica is removed for a late heartbeat on a busy machine


@pytest.fixture(scope="module")
def cluster():
    with Cluster(2, policy="least_outstanding", heartbeat_timeout=TIMEOUT, heartbeat_interval=0.2) as cluster:
        yield cluster


def test_answer_is_the_text_or_the_refusal_with_its_code():
    with local_router() as router:  # no replica registered
        line = drills.answer(router.client(timeout=10), "Hello")
    assert line.startswith("503 no_healthy_replica: ") and "no healthy replica" in line
    assert_refused(lambda: drills.answer("http://127.0.0.1:1/v1", "Hello"), TypeError, "client",
                   "http://127.0.0.1:1/v1",
                   "openai.OpenAI")


@pytest.mark.timeout(240)
def test_a_kill_under_load_is_counted_removed_and_restarted(cluster):
    trace = shared_prefix_trace(4, 8, 96, seed=3, max_tokens=32)
    kill = drills.kill_under_load(cluster, trace, concurrency=4, after=0.25)
    assert kill.result.sent == len(trace) == kill.result.answered + kill.result.failed
    client, router = kill.counts()
    assert (router["sent"], router["answered"], router["failed"]) == (client["sent"], client["answered"],
                                                                        client["failed"])
    assert 0 < kill.removed_after < TIMEOUT + 3 and kill.victim not in kill.up_after_kill
    assert len(kill.up_after_restart) == 2 and kill.victim not in kill.up_after_restart
    assert [e["time"] for e in kill.events] == sorted(e["time"] for e in kill.events)
    assert any(e["kind"] == "removed" and e["id"] == kill.victim and e["time"] > 0 for e in kill.events)
    marks = kill.marks()
    assert marks["SIGKILL"] == kill.killed_at < marks["removed"] and len(kill.spans()) == len(trace)


@pytest.mark.timeout(240)
def test_a_hung_replica_is_removed_its_request_retried_and_it_rejoins_under_a_new_id(cluster):
    cluster.router.wait_for(2, timeout=30)
    trace = shared_prefix_trace(2, 2, 64, seed=4, max_tokens=8)
    hang = drills.hang_under_load(cluster, trace, i=1, concurrency=2)
    assert hang.result.answered == hang.result.sent == len(trace) and hang.retried >= 1
    assert 0 < hang.removed_after < hang.rejoined_after and hang.new_id != hang.replica
    assert {"removed", "registered"} <= {e["kind"] for e in hang.events} and all(e["time"] >= 0 for e in hang.events)
    cluster.router.wait_for(2, timeout=30)


def test_waiting_for_an_event_that_never_comes_says_what_the_log_holds(cluster):
    with pytest.raises(TimeoutError, match=r"no 'removed' event for replica-99 within 0\.2 s; the last events: "
                                           r"\[\('registered'"):
        cluster.router.wait_for_event("removed", replica="replica-99", timeout=0.2)
    assert_refused(lambda: cluster.router.wait_for_event(3), TypeError, "kind", 3, "an event kind")


@pytest.mark.timeout(240)
def test_a_policy_run_counts_hits_and_spread_on_a_fresh_cluster():
    trace = shared_prefix_trace(2, 4, 96, seed=5, max_tokens=8)
    warm_up = shared_prefix_trace(1, 2, 24, seed=9, max_tokens=4)
    run = drills.policy_run("prefix_affinity", trace, warm_up, extra=[trace[:2]], replicas=2, concurrency=2)
    assert run.result.answered == sum(run.per_replica) == len(trace)
    assert 0 < run.hit_rate < 1 and [c[0] for c in run.costs] == [len(trace), 2]
    row = run.row()
    assert row["policy"] == "prefix_affinity" and row["hit rate %"] == 100 * run.hit_rate


def test_bad_arguments_are_refused_before_any_process_starts():
    assert_refused(lambda: drills.policy_run("random", [], []), ValueError, "policy", "random", "one of")
    assert_refused(lambda: drills.kill_under_load("cluster", []), TypeError, "cluster", "cluster", "a labkit")
    assert_refused(lambda: drills.hang_under_load(None, []), TypeError, "cluster", None, "a labkit")
