"""The Registrar against a tiny in-process fake router (tests/serving/fake_router.py): it registers only once
ready, heartbeats on a fixed-rate schedule, registers again after a 404 (a removal, or a restarted router that
gave its id to another url), survives a router that cannot be reached or answers garbage, never outlives stop()
with a registration, ignores http_proxy, and deregisters on stop. Then bad input, by name."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from labkit.paths import ROOT
from labkit.serving.register import (HEARTBEAT_FIELDS, REGISTER_PATH, Registrar, check_http_url, heartbeat_body,
                                     heartbeat_path, replica_path, routable_url)
from tests.refusals import assert_refused
from tests.serving.fake_router import FakeRouter, wait_until

REPLICA, OTHER = "http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"


@pytest.fixture
def router():
    r = FakeRouter()
    yield r
    r.close()


def beat_times(router, id="replica-1") -> list[float]:
    return [c[0] for c in router.of("POST", heartbeat_path(id))]


def median_gap(times: list[float]) -> float:
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    return gaps[len(gaps) // 2]


@pytest.mark.timeout(30)
def test_registers_once_ready_heartbeats_and_deregisters(router):
    ready = threading.Event()
    stats = {"running": np.int64(2), "waiting": 1, "kv_usage": 0.5}  # numpy ints, as an engine may report them
    reg = Registrar(router.root, REPLICA, "tinylm", ready.is_set, lambda: stats, interval=0.05).start()
    try:
        time.sleep(0.3)  # six intervals not ready: nothing sent
        assert router.calls == [] and reg.id is None
        ready.set()
        wait_until(lambda: len(router.of("POST")) >= 12)
    finally:
        reg.stop()
    assert not reg.is_alive()
    posts = router.of("POST")
    assert posts[0][2:] == (REGISTER_PATH, {"url": REPLICA, "model": "tinylm"})
    beats = router.of("POST", heartbeat_path("replica-1"))
    assert len(beats) == len(posts) - 1 and all(b[3] == {"url": REPLICA, "running": 2, "waiting": 1} for b in beats)
    assert 0.04 <= median_gap(beat_times(router)) <= 0.5  # about the interval (a loaded CPU stretches it)
    assert [c[1:] for c in router.calls[-1:]] == [("DELETE", replica_path("replica-1"), {"url": REPLICA})]
    assert router.ids == {} and reg.id is None
    assert (reg.registrations, reg.heartbeats, reg.failures) == (1, len(beats), 0)
    assert reg.answer["heartbeat_timeout"] == 1.0


@pytest.mark.timeout(30)
def test_a_404_makes_it_register_again(router):
    reg = Registrar(router.root, REPLICA, "tinylm", lambda: True, interval=0.05).start()
    try:
        wait_until(lambda: reg.heartbeats >= 2)
        router.forget("replica-1")  # the router removed it (a missed heartbeat, say) while it was alive
        wait_until(lambda: reg.id == "replica-2" and reg.heartbeats >= 4)
    finally:
        reg.stop()
    assert router.of("POST", REGISTER_PATH)[1][3] == {"url": REPLICA, "model": "tinylm"}
    assert reg.registrations == 2 and reg.failures == 1 and "404" in reg.last_error
    assert router.of("DELETE") and router.of("DELETE")[0][2] == replica_path("replica-2")
    assert all(b[3] == {"url": REPLICA, "running": 0, "waiting": 0}
               for b in router.of("POST", heartbeat_path("replica-2")))


@pytest.mark.timeout(30)
def test_a_restarted_router_s_reissued_id_is_not_taken_for_ours(router):
    """The router restarts (a new registry): B registers first and gets replica-1 again, A's id of before."""
    a_ready = threading.Event()
    a_ready.set()
    a = Registrar(router.root, REPLICA, "tinylm", a_ready.is_set, interval=0.05).start()
    wait_until(lambda: a.id == "replica-1")
    b = Registrar(router.root, OTHER, "tinylm", lambda: True, interval=0.05).start()
    try:
        wait_until(lambda: b.id == "replica-2" and b.heartbeats >= 1)
        a_ready.clear()  # A holds its beats while B re-registers
        time.sleep(0.1)
        router.restart()
        wait_until(lambda: b.id == "replica-1")
        a_ready.set()
        wait_until(lambda: a.id == "replica-2" and a.heartbeats >= 2)
        assert router.ids == {"replica-1": OTHER, "replica-2": REPLICA} and "belongs to" in a.last_error
    finally:
        a.stop()
        b.stop()
    assert router.ids == {}


@pytest.mark.timeout(30)
def test_it_survives_a_router_that_cannot_be_reached():
    with socket.socket() as s:  # a free port, closed: nothing listens there yet
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reg = Registrar(f"http://127.0.0.1:{port}", REPLICA, "tinylm", lambda: True, interval=0.05, timeout=0.5).start()
    try:
        wait_until(lambda: reg.failures >= 3)
        assert reg.is_alive() and reg.id is None and reg.last_error.startswith("POST /replicas")
        router = FakeRouter(port)  # the router comes up late
        try:
            wait_until(lambda: reg.heartbeats >= 2)
        finally:
            router.close()  # ... and goes away: heartbeats fail, the thread lives on
        failures = reg.failures
        wait_until(lambda: reg.failures >= failures + 3)
        assert reg.is_alive() and reg.id == "replica-1"
        started = time.monotonic()
        reg.stop(timeout=0.5)  # deregistering from a router that is gone is best effort, and quick
        assert time.monotonic() - started < 5 and not reg.is_alive()
    finally:
        reg.stop()


def garbage_server(reply: bytes) -> tuple[socket.socket, int]:
    """A socket server answering every connection with `reply`, then closing it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)

    def loop():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            with c:
                c.settimeout(2)
                try:
                    c.recv(65536)
                    c.sendall(reply)
                    # the end of the reply (FIN), then drain until the client closes: closing with unread request
                    # bytes would send a reset, and the client would see ConnectionResetError instead of `reply`
                    c.shutdown(socket.SHUT_WR)
                    while c.recv(65536):
                        pass
                except OSError:
                    pass
    threading.Thread(target=loop, daemon=True).start()
    return s, s.getsockname()[1]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("reply, error", [(b"HELLO\r\n\r\n", "BadStatusLine"),
                                          (b'HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{"id": "re',
                                           "IncompleteRead")])
def test_it_survives_a_router_answering_garbage(reply, error):
    server, port = garbage_server(reply)
    reg = Registrar(f"http://127.0.0.1:{port}", REPLICA, "tinylm", lambda: True, interval=0.02).start()
    try:
        wait_until(lambda: reg.failures >= 3)
        assert reg.is_alive() and reg.id is None and error in reg.last_error, reg.last_error
    finally:
        reg.stop(timeout=0.2)
        server.close()


class OddIds(FakeRouter):
    """Issues ids that need quoting in a path."""

    def route(self, method, path, body):
        status, answer = super().route(method, path, body)
        if status == 201:
            odd = f"odd/{answer['id']} ?"
            self.ids[odd] = self.ids.pop(answer["id"])
            answer["id"] = odd
        return status, answer


@pytest.mark.timeout(30)
def test_ids_are_quoted_in_paths():
    router = OddIds()
    reg = Registrar(router.root, REPLICA, "tinylm", lambda: True, interval=0.02).start()
    try:
        wait_until(lambda: reg.heartbeats >= 2)
    finally:
        reg.stop()
        router.close()
    assert reg.is_alive() is False and router.ids == {} and router.of("DELETE")[0][2] == "/replicas/odd/replica-1 ?"


@pytest.mark.timeout(30)
def test_beats_keep_a_fixed_rate_and_a_slow_answer_times_out_within_the_interval(router):
    reg = Registrar(router.root, REPLICA, "tinylm", lambda: True, interval=0.2, timeout=1.0).start()
    try:
        wait_until(lambda: reg.heartbeats >= 1)
        router.delays = [0.1] * 6 + [0.8]  # answers take half an interval, then one is held 0.8 s
        wait_until(lambda: len(router.calls) >= 12)
    finally:
        reg.stop()
    times = beat_times(router)
    assert median_gap(times) < 0.26  # 0.2 s apart, not 0.2 + 0.1 (interval + round trip)
    assert max(b - a for a, b in zip(times, times[1:])) < 0.7  # not 0.8 + 0.2: the router's 1 s timeout is safe
    assert "timed out" in reg.last_error or reg.failures >= 1


@pytest.mark.timeout(30)
def test_a_router_asking_for_a_shorter_interval_gets_it():
    router = FakeRouter(interval=0.05)
    reg = Registrar(router.root, REPLICA, "tinylm", lambda: True, interval=0.5).start()
    try:
        wait_until(lambda: reg.heartbeats >= 6, timeout=2.5)  # at 0.5 s it would take 3 s
        assert reg.interval == 0.05 and reg.requested_interval == 0.5 and "0.5 s -> 0.05 s" in reg.last_error
    finally:
        reg.stop()
        router.close()


@pytest.mark.timeout(30)
def test_stop_during_a_404_does_not_register_again(router):
    reg = Registrar(router.root, REPLICA, "tinylm", lambda: True, interval=1.0, timeout=1.0).start()
    try:
        wait_until(lambda: reg.heartbeats >= 1)
        router.delays = [0.7, 1.5]  # the next heartbeat answers 404 after 0.7 s; a register would take 1.5 s
        router.forget("replica-1")
        wait_until(lambda: len(router.of("POST", heartbeat_path("replica-1"))) >= 2)  # that heartbeat is in flight
        reg.stop(timeout=0.2)
        assert not reg.is_alive()
        time.sleep(0.5)
        assert router.ids == {} and len(router.of("POST", REGISTER_PATH)) == 1 and reg.id is None
    finally:
        reg.stop()


@pytest.mark.timeout(30)
def test_no_beats_while_not_ready(router):
    ready = threading.Event()
    ready.set()
    reg = Registrar(router.root, REPLICA, "tinylm", ready.is_set, interval=0.03).start()
    try:
        wait_until(lambda: reg.heartbeats >= 2)
        ready.clear()
        time.sleep(0.1)
        beats = len(beat_times(router))
        time.sleep(0.3)
        assert len(beat_times(router)) == beats and reg.skipped >= 3 and reg.id == "replica-1"
        ready.set()
        wait_until(lambda: len(beat_times(router)) >= beats + 2)
    finally:
        reg.stop()


PROXIED = """
import time
from labkit.serving.register import Registrar
from tests.serving.fake_router import FakeRouter, wait_until
router = FakeRouter()
reg = Registrar(router.root, "http://127.0.0.1:8001/v1", "tinylm", lambda: True, interval=0.05).start()
time.sleep(0.5)
print(reg.registrations, reg.heartbeats >= 2)
reg.stop(); router.close()
"""


@pytest.mark.timeout(60)
def test_http_proxy_is_ignored():
    env = {**os.environ, "http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "no_proxy": "",
           "NO_PROXY": "", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROXIED], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=50)
    assert out.stdout.split() == ["1", "True"], out.stdout + out.stderr


@pytest.mark.timeout(30)
def test_a_409_is_retried_until_the_old_registration_is_gone(router):
    router.route("POST", REGISTER_PATH, {"url": REPLICA, "model": "tinylm"})  # a previous life of this replica
    reg = Registrar(router.root, REPLICA, "tinylm", lambda: True, interval=0.05).start()
    try:
        wait_until(lambda: reg.failures >= 2)
        assert reg.id is None and "409" in reg.last_error
        router.forget("replica-1")  # the router expired the old one
        wait_until(lambda: reg.id == "replica-2")
    finally:
        reg.stop()


def test_the_protocol_s_paths_and_bodies():
    assert (REGISTER_PATH, heartbeat_path("replica-3"), replica_path("replica-3")) == (
        "/replicas", "/replicas/replica-3/heartbeat", "/replicas/replica-3")
    assert heartbeat_body({"running": 3, "waiting": 0, "steps": 9}) == {"running": 3, "waiting": 0}
    assert heartbeat_body(None) == dict.fromkeys(HEARTBEAT_FIELDS, 0)
    for bad in (-1, float("nan"), float("inf"), "3", True, None, [2]):
        assert heartbeat_body({"running": bad, "waiting": np.int32(4)}) == {"running": 0, "waiting": 4}
    assert json.dumps(heartbeat_body({"running": np.int64(7), "waiting": np.float64(2.0)})) == \
        '{"running": 7, "waiting": 2}'
    assert check_http_url("router", "http://127.0.0.1:9000/", root=True) == "http://127.0.0.1:9000"
    assert check_http_url("url", "https://h/v1/") == "https://h/v1"
    assert routable_url("http://0.0.0.0:8001/v1") == routable_url("http://[::]:8001/v1/") == REPLICA
    assert routable_url("http://10.0.0.2:8001/v1") == "http://10.0.0.2:8001/v1"


def test_bad_input_is_refused_by_name():
    ok = dict(router="http://127.0.0.1:9000", url=REPLICA, model="tinylm", is_ready=lambda: True)
    for name, value, error, expected in [
            ("router", "http://127.0.0.1:9000/v1", ValueError, "no path"), ("router", "127.0.0.1:9000", ValueError,
                                                                               "root URL"),
            ("router", 9000, TypeError, "a string"), ("url", "ftp://h/v1", ValueError, "http://"),
            ("url", "http://h:99999/v1", ValueError, "http://"), ("model", "", ValueError, "non-empty"),
            ("is_ready", True, TypeError, "a callable"), ("stats", {}, TypeError, "a callable"),
            ("interval", 0, ValueError, "positive"), ("timeout", -1.0, ValueError, "positive")]:
        assert_refused(lambda: Registrar(**{**ok, name: value}), error, name, value, expected)
    assert_refused(lambda: heartbeat_path(1), TypeError, "id", 1, "a string")
    reg = Registrar(**ok)
    assert_refused(lambda: reg.stop(timeout=0), ValueError, "timeout", 0, "positive")
    assert not reg.is_alive() and reg.id is None
    reg.start()
    with pytest.raises(RuntimeError, match="started already"):
        reg.start()
    reg.stop(timeout=0.1)
    with pytest.raises(RuntimeError, match="started already"):
        reg.start()
