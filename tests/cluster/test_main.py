"""`python -m labkit.cluster` as a learner runs it: a subprocess on a free port, the printed line, registration
over HTTP, a signal, exit code 0; bad options exit 2 with a message."""
import re
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from labkit.cluster.__main__ import build_router, parse_args
from labkit.cluster.launch import RouterProcess
from labkit.cluster.policies import LeastOutstanding, PrefixAffinity
from labkit.paths import ROOT

LINE = re.compile(r"^routing on (http://127\.0\.0\.1:(\d+)/v1)$")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_one_command_routes_lists_registrations_and_stops_on_a_signal(sig):
    router = RouterProcess("round_robin", heartbeat_timeout=30.0, timeout=30)
    try:
        assert LINE.match(f"routing on {router.url}"), router.url
        health = httpx.get(router.root + "/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "no_healthy_replica"
        reply = httpx.post(router.root + "/replicas", json={"url": "http://127.0.0.1:9/v1", "model": "tinylm"})
        assert reply.status_code == 201 and reply.json()["heartbeat_timeout"] == 30.0
        assert [m["id"] for m in httpx.get(router.url + "/models").json()["data"]] == ["tinylm"]
        assert [r["url"] for r in router.replicas()] == ["http://127.0.0.1:9/v1"]
        assert router.stats()["replicas_healthy"] == 1
        router.process.send_signal(sig)
        assert router.process.wait(timeout=30) == 0
    finally:
        router.stop()


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit.cluster", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.timeout(60)
def test_a_bad_option_exits_2_with_a_message():
    done = run("--policy", "random")
    assert done.returncode == 2 and "--policy: invalid choice: 'random'" in done.stderr and not done.stdout


@pytest.mark.timeout(60)
def test_a_port_in_use_exits_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = run("--port", str(taken.getsockname()[1]))
    assert done.returncode == 2 and "cannot listen on 127.0.0.1:" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["--heartbeat-timeout", "0"], "--heartbeat-timeout: must be a positive number of seconds, got 0"),
    (["--heartbeat-timeout", "nan"], "--heartbeat-timeout: must be a positive number of seconds, got nan"),
    (["--heartbeat-timeout", "soon"], "--heartbeat-timeout: must be a positive number of seconds, got 'soon'"),
    (["--retries", "-1"], "--retries: must be a non-negative int, got -1"),
    (["--prefix-chars", "0"], "--prefix-chars: must be a positive int, got 0"),
    (["--read-timeout", "inf"], "--read-timeout: must be a positive number of seconds, got inf"),
    (["--port", "70000"], "--port must be in [0, 65535], got 70000"),
])
def test_bad_options_are_refused_by_name(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(args)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_the_options_build_the_router():
    router = build_router(parse_args(["--policy", "prefix_affinity", "--prefix-chars", "32", "--retries", "0",
                                      "--heartbeat-timeout", "2.5", "--read-timeout", "7"]))
    assert isinstance(router.policy, PrefixAffinity) and router.policy.chars == 32
    assert (router.retries, router.registry.heartbeat_timeout, router.read_timeout) == (0, 2.5, 7.0)
    router = build_router(parse_args(["--policy", "least_outstanding"]))
    assert isinstance(router.policy, LeastOutstanding) and router.retries == 2
