"""The grading kernel's side: the network guard, the verdict read from a check's output, the loopback
interface of a kernel's own network namespace. (install() runs only inside grading kernels: see
tests/course/test_submission.py and test_gradebook.py, which grade through it.)"""
import subprocess
import sys

import pytest

from labkit.course import sandbox, submission


@pytest.mark.parametrize("host, local", [
    ("127.0.0.1", True), ("127.3.4.5", True), ("localhost", True), ("::1", True), (None, True), ("", True),
    (b"localhost", True), ("1.1.1.1", False), ("example.com", False), ("10.0.0.1", False), (b"example.com", False),
])
def test_is_local(host, local):
    assert sandbox.is_local(host) is local


@pytest.mark.parametrize("event, args", [
    ("socket.connect", (None, ("93.184.216.34", 80))),
    ("socket.sendto", (None, ("8.8.8.8", 53))),
    ("socket.getaddrinfo", ("example.com", 443, 0, 0, 0, 0)),
    ("socket.gethostbyname", ("example.com",)),
])
def test_the_guard_refuses_the_outside(event, args):
    with pytest.raises(PermissionError, match="network access is off while grading"):
        sandbox.network_guard(event, args)


@pytest.mark.parametrize("event, args", [
    ("socket.connect", (None, ("127.0.0.1", 8888))),
    ("socket.connect", (None, "/tmp/kernel.sock")),
    ("socket.getaddrinfo", ("localhost", 80, 0, 0, 0, 0)),
    ("open", ("/etc/hosts", "r", 0)),
])
def test_the_guard_lets_local_use_through(event, args):
    assert sandbox.network_guard(event, args) is None


@pytest.mark.parametrize("printed, verdict", [
    ("[PASS] f matches the reference on 1 fixed and 20 random cases.\n",
     ("PASS", "f matches the reference on 1 fixed and 20 random cases.")),
    ("[TODO] f: not implemented yet; ...\n", ("TODO", "f: not implemented yet; ...")),
    # the learner's function printed a PASS line while the check ran: the check's own line comes last
    ("[PASS] f is right, trust me\n[FAIL] f(1) returned 2, expected 1.\n", ("FAIL", "f(1) returned 2, expected 1.")),
    ("[PASS] fine[FAIL] f(1) returned 2.\n", ("FAIL", "f(1) returned 2.")),
    ("nothing recognisable\n", ("ERROR", "nothing recognisable")),
])
def test_verdict_of_printed_output(printed, verdict):
    assert sandbox.verdict_of(printed) == verdict


def test_loopback_comes_up_in_a_network_namespace_of_its_own():
    prefix = submission.isolation()
    if not prefix:
        pytest.skip("unshare --net is not allowed on this machine: the audit hook alone keeps the network off")
    code = ("import socket; from labkit.course import sandbox; assert sandbox.loopback_up(); s = socket.socket(); "
            "s.bind(('127.0.0.1', 0)); s.listen(); socket.create_connection(s.getsockname(), timeout=5); "
            "print('loopback ok')")
    done = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "loopback ok", done.stderr
    outside = subprocess.run([*prefix, sys.executable, "-c",
                              "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)"],
                             capture_output=True, text=True, timeout=120)
    assert outside.returncode != 0 and ("OSError" in outside.stderr or "unreachable" in outside.stderr)
