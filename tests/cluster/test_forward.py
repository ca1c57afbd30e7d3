"""forward: one attempt at one replica (its queue of answers, cancel, close), the ticket that accounts for a
request once, and whole server-sent events (the router's behaviour over HTTP is in test_router)."""
import asyncio
import json
import socket

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from labkit.cluster.forward import Attempt, Failure, SSEBuffer, forward, unavailable
from labkit.cluster.policies import make_policy
from labkit.cluster.registry import Registry
from labkit.cluster.router import Router
from labkit.serving.protocol import APIError
from tests.cluster.conftest import accounted, fake_replica, local_router, raw_server
from tests.refusals import assert_refused


def test_sse_buffer_cuts_whole_events_and_sees_done_and_errors():
    buffer = SSEBuffer()
    assert buffer.feed(b'data: {"a": 1}\n\ndata: {"b"') == [b'data: {"a": 1}\n\n']
    assert buffer.feed(b': 2}\n\n') == [b'data: {"b": 2}\n\n'] and not buffer.done
    assert buffer.feed(b'data: {"error": {}}\r\n\r\ndata: [DONE]\n\n') == [b'data: {"error": {}}\n\n',
                                                                        b"data: [DONE]\n\n"]
    assert buffer.done and buffer.error
    # an event is whole only at its blank line: one newline is not enough, and an event may have several lines
    assert SSEBuffer().feed(b'data: {"c": 3}\n') == []
    assert SSEBuffer().feed(b'event: x\ndata: {"c": 3}\n\n') == [b'event: x\ndata: {"c": 3}\n\n']


@given(st.lists(st.text("ab{}\" :", max_size=12), min_size=1, max_size=6), st.lists(st.integers(1, 40), max_size=20))
def test_however_the_bytes_are_cut_the_same_whole_events_come_out(payloads, cuts):
    events = [f"data: {p}\n\n".encode() for p in payloads] + [b"data: [DONE]\n\n"]
    raw, out, buffer, at = b"".join(events), [], SSEBuffer(), 0
    for size in cuts + [len(b"".join(events))]:
        out += buffer.feed(raw[at:at + size])
        at += size
    assert out == events and buffer.done


def test_a_ticket_is_resolved_once_through_the_routers_count():
    router = Router(Registry(), make_policy("round_robin"))
    ticket = router.ticket()
    zero = dict.fromkeys(["retried", "inband_errors", "removals"], 0)
    assert router.counters == {"requests": 1, "answered": 0, "failed": 0, "refused": 0, "in_flight": 1, **zero}
    assert ticket.resolve("answered") and not ticket.resolve("failed")
    assert router.counters == {"requests": 1, "answered": 1, "failed": 0, "refused": 0, "in_flight": 0, **zero}
    with pytest.raises(ValueError, match="outcome must be one of"):
        ticket.resolve("lost")
    assert_refused(lambda: router.count(lost=1), ValueError, "counter", "lost", "one of ['answered'")


async def attempt_at(url: str, action=None):
    """Everything an Attempt at `url` queues (after `action(attempt)`), and how often on_end ran."""
    ended = []
    async with httpx.AsyncClient(trust_env=False) as client:
        attempt = Attempt(client, "replica-1", url, b'{"model": "tinylm", "prompt": "x"}', ended.append)
        if action is not None:
            await asyncio.sleep(0.2)
            action(attempt)
        got = [await attempt.next()]
        while got[-1][0] in ("start", "data"):
            got.append(await attempt.next())
        attempt.close()
        attempt.close()
    return got, len(ended)


def test_an_attempt_at_a_closed_port_is_a_connection_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got, ended = asyncio.run(attempt_at(f"http://127.0.0.1:{port}/v1/completions"))
    assert got[0][0] == "error" and got[0][1].connection and "ConnectError" in got[0][1].message
    assert ended == 1  # close() twice, on_end once


@pytest.mark.timeout(30)
def test_a_cancelled_attempt_says_why_and_a_broken_one_is_a_connection_failure():
    with fake_replica("hang") as fake:
        got, _ = asyncio.run(attempt_at(fake.url + "/completions", lambda a: a.cancel("replica-1 was removed")))
    assert got == [("error", Failure("replica-1 was removed"))]
    with fake_replica("break", events=2) as fake:
        got, _ = asyncio.run(attempt_at(fake.url + "/completions"))
    assert [kind for kind, _ in got[:1]] == ["start"] and got[-1][0] == "error" and got[-1][1].connection
    assert b"".join(v for k, v in got if k == "data").count(b"data: ") == 2


def test_unavailable_is_a_503_in_openai_s_body():
    error = unavailable("no healthy replica", "no_healthy_replica")
    assert error.status == 503 and error.body() == {"error": {"message": "no healthy replica", "type":
                                                             "service_unavailable_error", "param": None,
                                                             "code": "no_healthy_replica"}}


def not_gzip(conn) -> None:
    """A 200 that says its body is gzip and is not: httpx raises DecodingError (not a TransportError) reading it."""
    body = b"this is not gzip at all"
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
                 b"content-length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.timeout(30)
def test_an_answer_that_cannot_be_decoded_is_a_failed_attempt_not_a_hang():
    with raw_server(not_gzip) as url:
        got, ended = asyncio.run(asyncio.wait_for(attempt_at(url + "/completions"), 10))
        assert got[0][0] == "start" and got[-1][0] == "error" and ended == 1
        assert "DecodingError" in got[-1][1].message and not got[-1][1].connection  # the replica is not down
        with local_router(heartbeat_timeout=60.0) as lr:
            id = lr.register(url)
            reply = httpx.post(lr.url + "/completions", json={"model": "tinylm", "prompt": "x"}, timeout=10)
            assert reply.status_code == 503 and reply.json()["error"]["code"] == "all_replicas_failed"
            assert "DecodingError" in reply.json()["error"]["message"]
            stats = lr.router.stats()
            assert (stats["failed"], stats["in_flight"]) == (1, 0) and accounted(stats)
            assert [(r["id"], r["state"], r["outstanding"]) for r in lr.replicas()] == [(id, "up", 0)]


@pytest.mark.timeout(30)
def test_a_stopping_router_ends_its_forwards_as_failed_and_retries_none():
    async def scenario():
        router = Router(Registry(60.0), make_policy("round_robin"), retries=2)
        await router.start()
        for fake in fakes:
            router.registry.register(fake.url, "tinylm")
        ticket = router.ticket()
        body = {"model": "tinylm", "prompt": "x"}
        task = asyncio.ensure_future(forward(router, None, "/completions", json.dumps(body).encode(), body,
                                             "tinylm", ticket))
        while fakes[0].calls == 0:  # the first replica holds the request
            await asyncio.sleep(0.02)
        await router.stop()
        with pytest.raises(APIError) as info:
            await asyncio.wait_for(task, 10)
        return router, info.value

    with fake_replica("hang") as first, fake_replica("hang") as second:
        fakes = [first, second]
        router, error = asyncio.run(scenario())
    assert error.status == 503 and "the router is stopping" in error.message
    assert router.counters["retried"] == 0 and second.calls == 0  # nothing started on the closing client
    assert all(r.outstanding == 0 for r in router.registry.replicas())
