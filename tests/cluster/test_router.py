"""router (+ forward): routing by policy, streaming, retries, in-band errors, removal, counters and bad input, over
loopback with real replicas (`python -m labkit.serving`), fake ones that fail on purpose, and the openai client."""
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from labkit.cluster.load import prefix_counts, prefix_hit_rate, run_load, shared_prefix_trace
from labkit.cluster.policies import make_policy, prefix_key, rendezvous
from labkit.cluster.registry import Registry
from labkit.cluster.router import Router, make_router_app
from tests.cluster.conftest import accounted, fake_replica, heartbeats, local_router, settled, wait_until
from tests.refusals import assert_refused
from tests.serving.answers import methods_not_served

GREEDY = {"model": "tinylm", "temperature": 0}


def which(shared, call) -> str:
    """Run call(); the id of the one replica whose routed count went up."""
    before = shared.routed()
    call()
    after = shared.routed()
    moved = [id for id in after if after[id] != before.get(id, 0)]
    assert len(moved) == 1, (before, after)
    return moved[0]


def complete(client, prompt: str, max_tokens: int = 4) -> str:
    return client.completions.create(prompt=prompt, max_tokens=max_tokens, **GREEDY).choices[0].text


@pytest.mark.timeout(120)
def test_round_robin_alternates(shared):
    shared.router.policy = make_policy("round_robin")
    client = shared.client()
    got = [which(shared, lambda: complete(client, "12+7=")) for _ in range(4)]
    assert got[0] != got[1] and got == got[:2] * 2 and set(got) == set(shared.ids)


@pytest.mark.timeout(120)
def test_least_outstanding_avoids_the_busy_replica(shared):
    with fake_replica("hang") as fake, local_router(policy="least_outstanding", heartbeat_timeout=60.0) as lr:
        busy, idle = lr.register(fake.url), lr.register(shared.replica_processes[0].url)
        held = ThreadPoolExecutor(1).submit(complete, lr.client(), "9+9=")  # a tie: the first registered gets it
        assert wait_until(lambda: fake.calls == 1)
        short = [which(lr, lambda: complete(lr.client(), "3+4=")) for _ in range(3)]
        assert short == [idle] * 3 and fake.calls == 1
        assert {r["id"]: r["outstanding"] for r in lr.replicas()} == {busy: 1, idle: 0}
        fake.released.set()  # it answers with an empty stream: the held request is retried on the idle one
        own = openai.OpenAI(base_url=shared.replica_processes[0].url, api_key="any", max_retries=0)
        assert held.result(timeout=30) == complete(own, "9+9=")
        assert lr.router.stats()["retried"] == 1 and accounted(lr.router.stats())


@pytest.mark.timeout(200)
def test_prefix_affinity_keeps_a_prefix_on_one_replica_and_raises_the_hit_rate(shared):
    shared.router.policy = make_policy("prefix_affinity")
    client = shared.client()
    for body in shared_prefix_trace(n_prefixes=2, per_prefix=3, seed=5, max_tokens=2)[:4]:
        expected = rendezvous(prefix_key(body), shared.ids)
        assert which(shared, lambda: client.completions.create(**body)) == expected
    rates = {}
    for seed, policy in ((21, "round_robin"), (22, "prefix_affinity")):  # fresh prefixes for each policy
        shared.router.policy = make_policy(policy)
        before = prefix_counts(shared.root)
        result = run_load(shared.url, shared_prefix_trace(4, 4, 128, seed=seed, max_tokens=4), concurrency=1)
        assert result.answered == result.sent == 16, result.errors()
        rates[policy] = prefix_hit_rate(shared.root, since=before)
    print(f"prefix-cache hit rate: {rates}")
    assert rates["prefix_affinity"] > rates["round_robin"] > 0, rates


@pytest.mark.timeout(120)
def test_streaming_through_the_router_equals_the_replicas_own_answer(shared):
    shared.router.policy = make_policy("round_robin")
    client = shared.client()
    direct = [openai.OpenAI(base_url=r.url, api_key="any", max_retries=0) for r in shared.replica_processes]
    messages = [{"role": "user", "content": "copy ab12 -> "}]
    for prompt in ("37+48=", "kv: tam=41 bok=07 ? tam="):
        own = {c.completions.create(prompt=prompt, max_tokens=12, **GREEDY).choices[0].text for c in direct}
        for _ in range(2):  # each replica in turn
            stream = client.completions.create(prompt=prompt, max_tokens=12, stream=True, **GREEDY)
            assert {"".join(c.choices[0].text for c in stream)} == own
    own = {c.chat.completions.create(messages=messages, max_tokens=12, **GREEDY).choices[0].message.content
           for c in direct}
    stream = client.chat.completions.create(messages=messages, max_tokens=12, stream=True, **GREEDY)
    assert {"".join(c.choices[0].delta.content or "" for c in stream)} == own and len(own) == 1
    whole = client.chat.completions.create(messages=messages, max_tokens=12, **GREEDY)
    assert {whole.choices[0].message.content} == own
    assert accounted(shared.router.stats())


@pytest.mark.timeout(120)
def test_a_client_that_leaves_mid_stream_is_aborted_upstream(shared):
    def aborted():
        return sum(int(float(line.rsplit(None, 1)[1])) for r in shared.replica_processes
                   for line in r.get("/metrics").splitlines() if 'finished_reason="abort"' in line)
    before, failed = aborted(), shared.router.counters["failed"]
    body = {"prompt": "The", "max_tokens": 250, "stream": True, **GREEDY}
    with httpx.stream("POST", shared.url + "/completions", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        next(reply.iter_lines())
    assert wait_until(lambda: aborted() == before + 1, 20)
    assert wait_until(lambda: shared.router.in_flight == 0 and shared.router.counters["failed"] == failed + 1)
    assert all(r["outstanding"] == 0 for r in shared.replicas())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("events", [0, 1], ids=["before-the-answer", "mid-stream"])
def test_a_client_that_leaves_a_hung_replica_closes_the_upstream(events):
    with fake_replica("hang", events) as fake, local_router(heartbeat_timeout=60.0) as lr:
        lr.register(fake.url)
        body = {"prompt": "x", "stream": True, **GREEDY}
        with pytest.raises(httpx.ReadTimeout) if events == 0 else contextlib.nullcontext():
            with httpx.stream("POST", lr.url + "/completions", json=body, timeout=httpx.Timeout(5, read=0.5)) as reply:
                assert next(reply.iter_lines()).startswith("data: ")  # then the client leaves
        assert wait_until(lambda: fake.left == 1, 10)  # the router hung up on the replica too
        stats = lr.router.stats()
        assert stats["failed"] == 1 and stats["in_flight"] == 0 and lr.replicas()[0]["outstanding"] == 0


@pytest.mark.timeout(60)
def test_no_healthy_replica_is_a_503_with_openai_body():
    with local_router() as lr:
        with pytest.raises(openai.APIStatusError) as info:
            lr.client().completions.create(prompt="1+1=", max_tokens=2, **GREEDY)
        assert info.value.status_code == 503 and info.value.body["code"] == "no_healthy_replica"
        health = httpx.get(lr.root + "/health")
        assert health.status_code == 503 and health.json()["error"]["type"] == "service_unavailable_error"
        assert httpx.get(lr.url + "/models").json() == {"object": "list", "data": []}
        assert lr.router.stats()["failed"] == 1 and accounted(lr.router.stats())


JSON = {"content-type": "application/json"}


def post(root: str, path: str, **kw) -> httpx.Response:
    return httpx.post(root + path, **kw)


@pytest.mark.timeout(120)
def test_bad_input_gets_clear_answers_and_the_router_keeps_serving(shared):
    root, client = shared.root, shared.client()
    registered = shared.replica_processes[0].url
    cases = [  # (reply, status, param)
        (post(root, "/replicas", json={"url": registered, "model": "tinylm"}), 409, "url"),
        (post(root, "/replicas/replica-999/heartbeat", json={"running": 0}), 404, "id"),
        (httpx.delete(root + "/replicas/replica-999"), 404, "id"),
        (post(root, "/replicas", content=b"{not json"), 400, None),
        (post(root, "/replicas", json={"model": "tinylm"}), 400, "url"),
        (post(root, "/replicas", json={"url": "ftp://x", "model": "tinylm"}), 400, "url"),
        (post(root, "/replicas", json={"url": "http://127.0.0.1:1/v1", "model": 7}), 400, "model"),
        (post(root, f"/replicas/{shared.ids[0]}/heartbeat", json=[1, 2]), 400, None),
        (post(shared.url, "/completions", content=b"[1]", headers=JSON), 400, None),
        (post(shared.url, "/completions", content=b'{"model": "tinylm"}', headers={"content-type": "text/plain"}),
         415, None),  # refused by the router itself, as a replica would refuse it
        (post(shared.url, "/chat/completions", content=b'{"model": "tinylm"}'), 415, None),  # no Content-Type
        (post(shared.url, "/completions", json={"prompt": "x"}), 400, "model"),
    ]
    for reply, status, param in cases:
        assert reply.status_code == status, reply.text
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert cases[-1][0].json()["error"]["message"].startswith("model is a required field")
    assert sorted(r["id"] for r in shared.replicas()) == sorted(shared.ids)  # nothing registered or removed
    refused, retried = shared.router.counters["refused"], shared.router.counters["retried"]
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-9", prompt="x")
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="context is 256"):  # every replica refuses it: theirs
        client.completions.create(prompt="x" * 300, max_tokens=4, **GREEDY)
    stats = shared.router.stats()
    assert stats["refused"] == refused + 2 and stats["retried"] == retried  # a 4xx is not retried
    assert complete(client, "5+5=") and accounted(shared.router.stats())  # still serving


@pytest.mark.timeout(60)
def test_every_answer_is_documented_and_a_405_names_the_methods_a_path_serves():
    """The router's /openapi.json lists each status it answers (local_router holds every answer against it) and the
    replicas' request bodies; a method a path does not serve is a 405 with `Allow` (RFC 9110, 15.5.6)."""
    with local_router() as lr:
        schema = httpx.get(lr.root + "/openapi.json").json()
        completions = schema["paths"]["/v1/completions"]["post"]
        body = completions["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": "#/components/schemas/CompletionRequest"}
        assert {"400", "404", "413", "415", "499", "503"} <= set(completions["responses"])
        r = httpx.put(lr.root + "/replicas")
        assert (r.status_code, r.headers["allow"], r.json()["error"]["code"]) == \
            (405, "GET, POST", "method_not_allowed")
        assert httpx.get(lr.root + "/replicas/x/heartbeat").headers["allow"] == "POST"
        assert methods_not_served(lr.root, schema) == []
        assert httpx.get(lr.root + "/metrics").headers["content-type"].startswith("text/plain")
        assert httpx.post(lr.root + "/replicas/x/heartbeat", json={}).status_code == 404
    assert len(lr.recorder.answers) > 20 and {a.status for a in lr.recorder.answers} >= {200, 404, 405}


@pytest.mark.timeout(120)
def test_every_replica_failing_is_a_503_naming_each_then_a_good_one_serves(shared):
    with fake_replica("503") as a, fake_replica("503") as b, local_router(heartbeat_timeout=60.0) as lr:
        ids = [lr.register(a.url), lr.register(b.url)]
        with pytest.raises(openai.APIStatusError) as info:
            lr.client().completions.create(prompt="1+1=", max_tokens=2, **GREEDY)
        assert info.value.status_code == 503 and info.value.body["code"] == "all_replicas_failed"
        assert all(id in info.value.message and "not ready" in info.value.message for id in ids)
        assert (a.calls, b.calls) == (1, 1) and lr.router.counters["retried"] == 1
        for id in ids:
            assert httpx.delete(f"{lr.root}/replicas/{id}").status_code == 200
        lr.register(shared.replica_processes[0].url)
        assert complete(lr.client(), "2+2=") and lr.router.stats()["answered"] == 1
        assert accounted(lr.router.stats())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("retries", [0, 1])
def test_retries_stop_at_the_cap_even_with_replicas_left(retries):
    """Three replicas that all answer 503: a request is sent to 1 + retries of them, never more."""
    with fake_replica("503") as a, fake_replica("503") as b, fake_replica("503") as c, \
            local_router(heartbeat_timeout=60.0, retries=retries) as lr:
        for fake in (a, b, c):
            lr.register(fake.url)
        with pytest.raises(openai.APIStatusError) as info:
            lr.client().completions.create(prompt="1+1=", max_tokens=2, **GREEDY)
        assert info.value.status_code == 503 and f"({1 + retries} tried, retries={retries})" in info.value.message
        assert a.calls + b.calls + c.calls == 1 + retries and lr.router.counters["retried"] == retries
        assert accounted(settled(lr.router))


@pytest.mark.timeout(120)
def test_a_dead_replica_is_marked_down_and_the_request_retried(shared):
    with local_router(heartbeat_timeout=60.0) as lr:
        dead = lr.register("http://127.0.0.1:9/v1")  # nothing listens on port 9 (discard)
        lr.register(shared.replica_processes[0].url)
        assert complete(lr.client(), "2+3=")
        down = next(r for r in lr.replicas() if r["id"] == dead)
        assert down["state"] == "down" and down["reason"] and lr.router.counters["retried"] == 1
        assert httpx.get(lr.root + "/health").json()["replicas"] == 1


@pytest.mark.timeout(120)
def test_a_stream_broken_after_its_first_event_ends_in_band(shared):
    with fake_replica("break", events=2) as fake, local_router(heartbeat_timeout=60.0) as lr:
        lr.register(fake.url)
        lr.register(shared.replica_processes[0].url)
        seen = []
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            for chunk in lr.client().completions.create(prompt="1+1=", max_tokens=8, stream=True, **GREEDY):
                seen.append(chunk.choices[0].text)
        assert seen == ["t0 ", "t1 "]  # what came before the break, then the error: no retry after a byte
        stats = settled(lr.router)
        assert stats["inband_errors"] == 1 and stats["failed"] == 1 and stats["retried"] == 0 and accounted(stats)
        assert lr.replicas()[0]["state"] == "down"  # the broken connection marks it down
        assert complete(lr.client(), "4+4=")  # the next request goes to the good one


@pytest.mark.timeout(60)
def test_a_stream_that_ends_early_ends_in_band_and_leaves_its_replica_up():
    """The replica closed its body cleanly before [DONE] (its connection is fine): the client gets an in-band
    error, and the replica is not marked down (only a broken connection does that)."""
    with fake_replica("end", events=2) as fake, local_router(heartbeat_timeout=60.0) as lr:
        lr.register(fake.url)
        seen = []
        with pytest.raises(openai.APIError, match="closed the stream before"):
            for chunk in lr.client().completions.create(prompt="1+1=", max_tokens=8, stream=True, **GREEDY):
                seen.append(chunk.choices[0].text)
        assert seen == ["t0 ", "t1 "]
        stats = settled(lr.router)
        assert stats["inband_errors"] == 1 and stats["failed"] == 1 and accounted(stats)
        assert lr.replicas()[0]["state"] == "up"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["inband", "inband-hang"])
def test_a_replica_s_own_in_band_error_passes_through_and_counts_as_failed(mode):
    """The openai client raises at the error event and leaves: the request counts as the replica's in-band error
    whether its [DONE] came in the same read, a later one ("inband": a race) or never ("inband-hang")."""
    with fake_replica(mode, events=1) as fake, local_router(heartbeat_timeout=60.0) as lr:
        lr.register(fake.url)
        with pytest.raises(openai.APIError, match="the fake engine failed"):
            for _ in lr.client().completions.create(prompt="x", max_tokens=4, stream=True, **GREEDY):
                pass
        stats = settled(lr.router)
        assert stats["failed"] == stats["inband_errors"] == 1 and stats["answered"] == 0 and accounted(stats)
        assert lr.replicas()[0]["state"] == "up"  # it answered: its connection is fine
        if mode == "inband-hang":
            assert wait_until(lambda: fake.left == 1), "the router kept the replica's request open"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_removed_replica_s_request_is_retried_if_nothing_was_sent(shared, stream):
    with fake_replica("hang") as fake, local_router(heartbeat_timeout=2.0) as lr:
        hung = lr.register(fake.url)  # first in round robin order; never heartbeats
        good = lr.register(shared.replica_processes[1].url)
        with heartbeats(lr.root, lambda: [good] + [hung] * (fake.calls == 0)):  # hung: until it holds the request
            start = time.monotonic()
            reply = lr.client().completions.create(prompt="6+1=", max_tokens=4, stream=stream, **GREEDY)
            text = "".join(c.choices[0].text for c in reply) if stream else reply.choices[0].text
            waited = time.monotonic() - start
        own = openai.OpenAI(base_url=shared.replica_processes[1].url, api_key="any", max_retries=0)
        assert text == own.completions.create(prompt="6+1=", max_tokens=4, **GREEDY).choices[0].text
        stats = settled(lr.router)
        assert fake.calls == 1 and stats["retried"] == 1 and stats["removals"] == 1 and stats["answered"] == 1
        assert waited < 20.0, waited  # removed (when: the registry's tests), then answered: never a hang
        assert [e["kind"] for e in httpx.get(lr.root + "/replicas").json()["events"] if e["id"] == hung] == \
            ["registered", "removed"]


@pytest.mark.timeout(60)
def test_a_removed_replica_s_started_stream_ends_in_band():
    with fake_replica("hang", events=1) as fake, local_router(heartbeat_timeout=2.0) as lr:
        id = lr.register(fake.url)
        with heartbeats(lr.root, [id]):  # alive until its first event reached the client, then silent
            stream = iter(lr.client(timeout=20).completions.create(prompt="x", max_tokens=4, stream=True, **GREEDY))
            chunks = [next(stream).choices[0].text]
        with pytest.raises(openai.APIError, match="was removed"):
            for chunk in stream:
                chunks.append(chunk.choices[0].text)
        assert chunks == ["t0 "]
        stats = settled(lr.router)
        assert stats["inband_errors"] == stats["failed"] == stats["removals"] == 1 and accounted(stats)


@pytest.mark.timeout(120)
def test_counters_add_up_under_concurrent_load_and_metrics_agree(shared):
    shared.router.policy = make_policy("least_outstanding")
    bodies = shared_prefix_trace(2, 4, 64, seed=3, max_tokens=4) + [{"model": "nope", "prompt": "x"}]
    seen = []
    watcher = threading.Thread(target=lambda: [seen.append(shared.router.stats()) or time.sleep(0.01)
                                               for _ in range(100)])
    watcher.start()
    before = dict(shared.router.counters)
    result = run_load(shared.url, bodies, concurrency=4)
    watcher.join()
    assert all(accounted(s) for s in seen)
    after = shared.router.stats()
    assert after["answered"] - before["answered"] == result.answered == len(bodies) - 1
    assert after["refused"] - before["refused"] == result.failed == 1
    metrics = dict(line.rsplit(None, 1) for line in httpx.get(shared.root + "/metrics").text.splitlines()
                   if line.startswith("labkit_router:") and "{" not in line)
    assert {k: int(metrics[f"labkit_router:{k}_total"]) for k in ("requests", "answered", "failed", "refused")} == \
        {k: shared.router.counters[k] for k in ("requests", "answered", "failed", "refused")}
    for r in shared.replicas():
        assert f'labkit_router:replica_routed_total{{replica="{r["id"]}",url="{r["url"]}",state="up"}} {r["routed"]}' \
            in httpx.get(shared.root + "/metrics").text


def test_bad_router_arguments_are_refused_by_name():
    registry, policy = Registry(), make_policy("round_robin")
    assert_refused(lambda: Router("registry", policy), TypeError, "registry", "registry", "a labkit.cluster")
    assert_refused(lambda: Router(registry, "round_robin"), TypeError, "policy", "round_robin", "a Policy")
    assert_refused(lambda: Router(registry, policy, retries=-1), ValueError, "retries", -1, "an int >= 0")
    assert_refused(lambda: Router(registry, policy, retries=1.5), TypeError, "retries", 1.5, "an int")
    assert_refused(lambda: Router(registry, policy, read_timeout=0), ValueError, "read_timeout", 0, "positive")
    assert_refused(lambda: make_router_app("router"), TypeError, "router", "router", "a labkit.cluster")
