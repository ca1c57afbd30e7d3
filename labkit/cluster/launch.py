"""A router and its replicas as child processes on free loopback ports, always stopped (notebook 08, sections 2-4;
the tests and benchmarks/cluster_router.py use it too).

    with Cluster(3, policy="prefix_affinity") as cluster:     # a router, then 3 replicas that register with it
        client = openai.OpenAI(base_url=cluster.url, api_key="any", max_retries=0)
        cluster.kill(0)                                       # SIGKILL: a replica that dies
        cluster.router.wait_for_event("removed", replica="replica-1")  # ... after the heartbeat timeout
        cluster.restart(0)                                    # a new process, a new port: it joins again
        cluster.pause(1); cluster.resume(1)                   # SIGSTOP / SIGCONT: a replica that hangs, then wakes

start_router runs `python -m labkit.cluster --port 0` and reads the port from its first line; start_replica runs
lab 06's `python -m labkit.serving --port 0 --register ROUTER` (labkit.serving.launch) and waits until the router
lists it. Every process is stopped on exit from the `with` block, whatever happened inside it (a paused one is
killed: it cannot answer SIGTERM).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

from .._checks import check_int, check_number, check_positive, check_positive_int, check_type
from ..paths import ROOT, TINYLM_CHECKPOINT
from ..serving import launch as serving_launch
from ..serving import register as discovery
from .policies import make_policy

ServiceProcess = serving_launch.ServiceProcess


def _get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.loads(reply.read())


def replicas_at(root: str) -> list[dict]:
    """GET root/replicas: every replica a router at `root` knows (dicts of labkit.cluster.registry.Replica)."""
    return _get_json(discovery.check_http_url("root", root, root=True) + discovery.REGISTER_PATH)["data"]


def wait_for_replicas(root: str, n: int, timeout: float = 30.0, url: str | None = None) -> list[dict]:
    """Poll the router at `root` until exactly `n` replicas are up (and, with `url`, one of them is `url`); those
    replicas. TimeoutError naming what it saw."""
    check_positive_int("n", n, allow_zero=True)
    deadline = time.monotonic() + check_positive("timeout", timeout, unit="s")
    seen: list[dict] = []
    while True:
        try:
            seen = [r for r in replicas_at(root) if r["state"] == "up"]
        except (urllib.error.URLError, OSError, ValueError):
            seen = seen or []
        if len(seen) == n and (url is None or any(r["url"] == url for r in seen)):
            return seen
        if time.monotonic() > deadline:
            listed = [(r["id"], r["url"]) for r in seen]
            raise TimeoutError(f"the router at {root} has {len(seen)} replicas up after {timeout:g} s, expected {n}"
                               + (f" including {url}" if url else "") + f": {listed}")
        time.sleep(0.05)


class RouterProcess(ServiceProcess):
    """`python -m labkit.cluster --port 0 --policy POLICY ...` in a child process: `url` its OpenAI base URL
    (http://127.0.0.1:PORT/v1) once it printed "routing on URL", `root` the URL without /v1. stop(), `returncode`,
    `get(path)` and the `with` block behave as labkit.serving's ServiceProcess."""

    def __init__(self, policy: str = "prefix_affinity", heartbeat_timeout: float = 1.0, retries: int = 2,
                 args: Iterable[str] = (), timeout: float = 30.0):
        make_policy(policy)  # refused by name before any process starts
        check_positive("heartbeat_timeout", heartbeat_timeout, unit="s")
        check_int("retries", retries, 0)
        check_number("timeout", timeout, low=0.0, low_open=True, unit="s")
        self.heartbeat_timeout = float(heartbeat_timeout)
        self._log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "labkit.cluster", "--port", "0", "--policy", policy, "--heartbeat-timeout",
               repr(float(heartbeat_timeout)), "--retries", str(retries), *map(str, args)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=ROOT, env=env)
        self.url = ""
        try:
            line = self._first_line(time.monotonic() + timeout)
            if not line:  # nothing in time, or stdout closed: the process may be ending
                try:
                    code = self.process.wait(5)
                except subprocess.TimeoutExpired:
                    code = None
                self._failed(f"it printed nothing in {timeout:g} s" if code is None else f"it exited with code {code}")
            if not line.startswith("routing on http"):
                self._failed(f"no 'routing on URL' line (got {line.strip()!r})")
            self.url = line.rsplit(" on ", 1)[1].strip()
        except BaseException:
            self.stop()
            raise

    def _first_line(self, deadline: float) -> str:
        """The child's first stdout line ("" if it closed stdout or said nothing before `deadline`)."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(max(0.0, deadline - time.monotonic())):
                return ""
        return self.process.stdout.readline()

    def _failed(self, why: str) -> None:
        self._log.seek(0)
        raise RuntimeError(f"the router did not start: {why}; its stderr: {self._log.read()[-1500:]}")

    def replicas(self) -> list[dict]:
        """GET /replicas: every registered replica as a dict (id, url, model, state, outstanding, routed, ...)."""
        return replicas_at(self.root)

    def events(self) -> list[dict]:
        """The registry's event log from GET /replicas: {"time" (s, the router's clock), "kind", "id", "detail"}
        for every registration, down, revival, removal and deregistration (the notebook's timeline)."""
        return json.loads(self.get(discovery.REGISTER_PATH))["events"]

    def stats(self) -> dict:
        """The router's counters from GET /metrics: {"requests": n, "answered": n, ...} (labkit_router:NAME)."""
        out = {}
        for line in self.get("/metrics").splitlines():
            if line.startswith("labkit_router:") and "{" not in line:
                name, value = line.split()
                out[name.removeprefix("labkit_router:").removesuffix("_total")] = int(float(value))
        return out

    def wait_for(self, n: int, timeout: float = 30.0, url: str | None = None) -> list[dict]:
        """Block until exactly `n` replicas are up (with `url`: one of them that one); those replicas."""
        return wait_for_replicas(self.root, n, timeout, url)

    def wait_for_event(self, kind: str, replica: str | None = None, url: str | None = None,
                       since: float | None = None, timeout: float = 10.0) -> dict:
        """Block until the registry logs an event of `kind` ("registered", "down", "removed", ...), for the
        replica id `replica` and with `url` in its detail when given, at or after `since` (s, time.monotonic():
        the router's clock on this machine); the first such event. TimeoutError naming what the log holds."""
        check_type("kind", kind, str, "an event kind such as 'removed'")
        deadline = time.monotonic() + check_positive("timeout", timeout, unit="s")
        while True:
            events = self.events()
            for e in events:
                if (e["kind"] == kind and replica in (None, e["id"]) and (url is None or url in e["detail"])
                        and (since is None or e["time"] >= since)):
                    return e
            if time.monotonic() > deadline:
                seen = [(e["kind"], e["id"]) for e in events][-8:]
                raise TimeoutError(f"no {kind!r} event" + (f" for {replica}" if replica else "")
                                   + (f" naming {url}" if url else "") + f" within {timeout:g} s; the last "
                                   f"events: {seen}")
            time.sleep(0.05)


def start_router(policy: str = "prefix_affinity", heartbeat_timeout: float = 1.0, retries: int = 2,
                 args: Iterable[str] = (), timeout: float = 30.0) -> RouterProcess:
    """Start `python -m labkit.cluster` on a free port (`args`: more options, e.g. ["--read-timeout", "10"])."""
    return RouterProcess(policy, heartbeat_timeout, retries, args, timeout)


def _root_of(router) -> str:
    root = router.root if isinstance(router, RouterProcess) else router
    return discovery.check_http_url("router", root, root=True)


def start_replica(router, model=TINYLM_CHECKPOINT, args: Iterable[str] = (), threads: int = 1,
                  heartbeat_interval: float = 0.25, timeout: float = 60.0) -> ServiceProcess:
    """Start `python -m labkit.serving --model MODEL --port 0 --register ROOT` (`router`: a RouterProcess or a
    router's root URL) and wait until it is healthy and the router lists it up."""
    root = _root_of(router)
    check_positive("heartbeat_interval", heartbeat_interval, unit="s")
    started = time.monotonic()
    replica = ServiceProcess(model, ["--register", root, "--heartbeat-interval", repr(float(heartbeat_interval)),
                                     *map(str, args)], timeout, threads)
    try:
        left = max(1.0, timeout - (time.monotonic() - started))
        deadline = time.monotonic() + left
        while not any(r["url"] == replica.url and r["state"] == "up" for r in replicas_at(root)):
            if time.monotonic() > deadline or replica.returncode is not None:
                raise RuntimeError(f"the replica {replica.url} did not register with {root} in {timeout:g} s")
            time.sleep(0.05)
    except BaseException:
        replica.stop()
        raise
    return replica


class Cluster:
    """A router (start_router) and `n` replicas of `model` (start_replica, started side by side), each on
    `threads` torch threads. `replicas[i]` is the i-th ServiceProcess (its `returncode` is set once it is killed or
    stopped; restart(i) puts a new one in its place; None only while its first start has not finished).
    Use it in a `with` block: stop() ends every process, whatever happens."""

    def __init__(self, n: int = 2, policy: str = "prefix_affinity", heartbeat_timeout: float = 1.0,
                 heartbeat_interval: float = 0.25, retries: int = 2, model=TINYLM_CHECKPOINT,
                 replica_args: Iterable[str] = (), router_args: Iterable[str] = (), threads: int = 1,
                 timeout: float = 90.0):
        n = check_positive_int("n", n)
        make_policy(policy)  # refused by name before any process starts
        self.heartbeat_interval = check_positive("heartbeat_interval", heartbeat_interval, unit="s")
        self.model, self.replica_args, self.threads = model, tuple(map(str, replica_args)), check_positive_int(
            "threads", threads)
        self.timeout = check_positive("timeout", timeout, unit="s")
        self.replicas: list[ServiceProcess | None] = [None] * n
        self.paused: set[int] = set()
        self.router = start_router(policy, heartbeat_timeout, retries, router_args)
        try:
            with ThreadPoolExecutor(n) as pool:  # side by side: each one's start-up is mostly waiting
                futures = [pool.submit(self._start, i) for i in range(n)]
            for future in futures:
                future.result()  # the first failure, once every start ended (the started ones are in replicas)
        except BaseException:
            self.stop()
            raise

    def _start(self, i: int) -> ServiceProcess:
        self.replicas[i] = start_replica(self.router, self.model, self.replica_args, self.threads,
                                         self.heartbeat_interval, self.timeout)
        return self.replicas[i]

    @property
    def url(self) -> str:
        """The router's OpenAI base URL (what clients use)."""
        return self.router.url

    def _index(self, i: int) -> int:
        return check_int("i", i, 0, len(self.replicas) - 1)

    def _alive(self, i: int) -> ServiceProcess:
        replica = self.replicas[self._index(i)]
        if replica is None or replica.returncode is not None:
            raise ValueError(f"i must be a running replica, got {i} (it was killed or stopped: restart({i}))")
        return replica

    def kill(self, i: int) -> None:
        """SIGKILL replica i (a crash: no deregistration; the router removes it after its heartbeat timeout)."""
        replica = self._alive(i)
        replica.process.kill()
        replica.process.wait()
        self.paused.discard(i)

    def pause(self, i: int) -> None:
        """SIGSTOP replica i (a hung replica: its socket accepts, nothing answers, no heartbeats)."""
        os.kill(self._alive(i).pid, signal.SIGSTOP)
        self.paused.add(i)

    def resume(self, i: int) -> None:
        """SIGCONT replica i: its heartbeats resume (404 if the router removed it meanwhile: it registers again)."""
        os.kill(self._alive(i).pid, signal.SIGCONT)
        self.paused.discard(i)

    def restart(self, i: int) -> ServiceProcess:
        """Stop replica i (SIGTERM; killed if paused) and start a new one in its place (a new port, a new id);
        returns once the router lists it."""
        self._stop_one(self._index(i))
        return self._start(i)

    def _signal_stop(self, i: int) -> None:
        replica = self.replicas[i]
        if replica is None or replica.returncode is not None:
            return
        if i in self.paused:  # a stopped process cannot handle SIGTERM: end it
            replica.process.kill()
            self.paused.discard(i)
        else:
            replica.process.send_signal(signal.SIGTERM)

    def _stop_one(self, i: int) -> None:
        self._signal_stop(i)
        if self.replicas[i] is not None:
            self.replicas[i].stop()

    def stop(self) -> None:
        """Stop every replica (SIGTERM to all, then each waited for: they deregister), then the router."""
        try:
            for i in range(len(self.replicas)):
                self._signal_stop(i)
            for replica in self.replicas:
                if replica is not None:
                    replica.stop()
        finally:
            self.router.stop()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

