"""The replica's side of service discovery: register with a router once healthy, heartbeat, deregister on the way
out (notebook 08, section 2; `python -m labkit.serving --register http://127.0.0.1:PORT` runs it).

The protocol (this module defines it; the router, labkit.cluster, answers it):

    POST   /replicas                  {"url": "http://127.0.0.1:P/v1", "model": "tinylm"}
           -> 201 {"id": "replica-1", "heartbeat_interval": s, "heartbeat_timeout": s}
              409 the url is registered already; 400 a bad body (the field named in the error's "param")
    POST   /replicas/{id}/heartbeat   {"url": ..., "running": n, "waiting": n}  -> 200;  404 an unknown id
    DELETE /replicas/{id}?url=...                                             -> 200;  404 an unknown id

    replica                                   router
      │  (its /health answers 200)              │
      │── POST /replicas ──────────────────────>│  201 {"id": "replica-1", ...}
      │── POST /replicas/replica-1/heartbeat ──>│  200        every `interval` s
      │        ... the router removed it (missed heartbeats while it hung) ...
      │── POST /replicas/replica-1/heartbeat ──>│  404        -> it registers again, as a new id
      │── DELETE /replicas/replica-2 ──────────>│  200        on SIGTERM, before the server stops

Heartbeats and the DELETE carry the replica's url: a router that restarted issues "replica-1" again, maybe to
another replica, and answers 404 to a url that is not that id's (the replica then registers again). The id is
quoted in the path (urllib.parse.quote, safe=""); heartbeat_path / replica_path build the paths unquoted, so the
router can use them as route templates ("{replica_id}").

Errors are OpenAI's body ({"error": {"message", "type", "param", "code"}}). A router that cannot be reached, or
that answers anything unexpected (a bad status line, a cut answer), is retried every `interval` s forever: a
replica started before its router joins when the router comes up. Like Consul's or etcd's leases with TTLs,
liveness is the heartbeat: a replica that stops sending them is removed after the router's heartbeat_timeout,
however it died. stdlib urllib only (this runs inside every replica, beside the model), and no proxy: the
router is on the local network, so http_proxy and friends are ignored.
"""

from __future__ import annotations

import http.client
import json
import math
import numbers
import threading
import time
import urllib.error
import urllib.request
from typing import Callable
from urllib.parse import quote, urlsplit

from .._checks import check_positive, check_type, fail

REGISTER_PATH = "/replicas"
HEARTBEAT_FIELDS = ("running", "waiting")
"""The load keys of a heartbeat body, taken from the service's stats() (requests in its batch, and queued)."""
WILDCARD_HOSTS = ("0.0.0.0", "::")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy, whatever the environment says


def heartbeat_path(id: str) -> str:
    """Where replica `id` sends its heartbeats: /replicas/{id}/heartbeat (unquoted: a route template too)."""
    return f"{REGISTER_PATH}/{check_type('id', id, str, 'a string')}/heartbeat"


def replica_path(id: str) -> str:
    """Replica `id`'s registration (DELETE it to deregister): /replicas/{id} (unquoted)."""
    return f"{REGISTER_PATH}/{check_type('id', id, str, 'a string')}"


def check_http_url(name: str, url, root: bool = False) -> str:
    """An http(s) URL with a host (`root`: and no path, "http://127.0.0.1:9000"), its trailing slashes removed."""
    check_type(name, url, str, "a string")
    expected = ("an http:// or https:// root URL with a host and no path, e.g. 'http://127.0.0.1:9000'" if root
                else "an http:// or https:// URL with a host, e.g. 'http://127.0.0.1:8001/v1'")
    try:
        parts = urlsplit(url)
        ok = (parts.port is None or parts.port > 0) and parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # a port that is not a number or out of range
        ok, parts = False, None
    if not ok or (root and (parts.path.strip("/") or parts.query or parts.fragment)):
        fail(name, url, expected)
    return url.rstrip("/")


def routable_url(url: str) -> str:
    """`url` with a wildcard listening host (0.0.0.0, ::) replaced by 127.0.0.1: a server bound to every
    interface is reached on loopback, and a router cannot connect to 0.0.0.0 (__main__ says so when it does)."""
    parts = urlsplit(check_http_url("url", url))
    if parts.hostname not in WILDCARD_HOSTS:
        return url.rstrip("/")
    netloc = "127.0.0.1" + (f":{parts.port}" if parts.port is not None else "")
    return parts._replace(netloc=netloc).geturl().rstrip("/")


def _count(value) -> int:
    """A non-negative int from a stats value (numpy ints included); 0 for anything else."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return int(value)
    return 0


def heartbeat_body(stats: dict | None) -> dict:
    """The heartbeat's load from a service's stats(): {"running": n, "waiting": n}, each a non-negative int (0
    for a missing key or a value that is not a non-negative number). The Registrar adds "url"."""
    stats = stats if isinstance(stats, dict) else {}
    return {key: _count(stats.get(key, 0)) for key in HEARTBEAT_FIELDS}


class Registrar:
    """A daemon thread that keeps replica `url` (its /v1 base URL), serving `model`, registered with the router
    at `router` (its root URL, no /v1): registers once is_ready() is first True, heartbeats every `interval` s
    with stats() (None: empty loads), registers again after a 404 (the router removed it, or restarted and gave
    its id to another url), retries every `interval` s while the router cannot be reached, and deregisters on
    stop(). While is_ready() is False (the service draining or failed) it sends no heartbeats: the router
    removes it after its heartbeat_timeout, and it registers again once ready.

    Timing: a fixed-rate schedule (a beat is due every `interval` s however long the last one took; one that
    fell more than an interval behind starts afresh); a heartbeat's request times out after min(timeout,
    interval) s, registering and deregistering after `timeout` s. A router advertising a shorter
    heartbeat_interval in its 201 gets it: interval = min(the one asked for, the router's), noted in last_error.
    Counters for the notebook: registrations, heartbeats (answered 200), failures (anything else), skipped
    (beats not sent while not ready) and last_error; `id` is the current registration (None while unregistered).
    """

    def __init__(self, router: str, url: str, model: str, is_ready: Callable[[], bool],
                 stats: Callable[[], dict] | None = None, interval: float = 0.25, timeout: float = 1.0):
        self.router = check_http_url("router", router, root=True)
        self.url = check_http_url("url", url)
        self.model = check_type("model", model, str, "a string")
        if not model.strip():
            fail("model", model, "a non-empty string")
        if not callable(is_ready):
            fail("is_ready", is_ready, "a callable returning True once the replica is healthy", TypeError)
        if stats is not None and not callable(stats):
            fail("stats", stats, "None or a callable returning the service's stats dict", TypeError)
        self.is_ready, self.stats = is_ready, stats
        self.requested_interval = self.interval = check_positive("interval", interval, unit="s")
        self.timeout = check_positive("timeout", timeout, unit="s")
        self.id: str | None = None
        self.registrations = self.heartbeats = self.failures = self.skipped = 0
        self.last_error = ""
        self.answer: dict = {}  # the router's last 201 body (heartbeat_interval, heartbeat_timeout)
        self._halt = threading.Event()
        self._stop_timeout = self.timeout
        self._thread = threading.Thread(target=self._run, name="labkit-registrar", daemon=True)

    def start(self) -> "Registrar":
        """Start the thread (once: a Registrar that was started, or stopped, cannot start again)."""
        if self._thread.ident is not None or self._halt.is_set():
            raise RuntimeError("this Registrar was started already (or stopped): make a new one")
        self._thread.start()
        return self

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Stop heartbeating and deregister: the thread ends its loop (no registration starts after this call),
        sends the DELETE itself (best effort, at most `timeout` s, default the request timeout: a router that
        is gone or has removed us already is not an error), and is joined for at most the requests in flight (a
        heartbeat, and the registration its 404 started) plus that DELETE."""
        self._stop_timeout = self.timeout if timeout is None else check_positive("timeout", timeout, unit="s")
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(min(self.timeout, self.interval) + self.timeout + self._stop_timeout + 0.5)

    def _call(self, method: str, path: str, body: dict | None, timeout: float) -> tuple[int, dict]:
        """(HTTP status, JSON body) of one request; status 0 when there was no HTTP answer (unreachable, timed
        out, a garbled or cut answer, a body or URL that could not be sent): last_error says which."""
        try:
            data = None if body is None else json.dumps(body).encode()
            request = urllib.request.Request(self.router + path, data=data, method=method,
                                             headers={"Content-Type": "application/json"})
            try:
                with _OPENER.open(request, timeout=timeout) as reply:
                    status, raw = reply.status, reply.read()
            except urllib.error.HTTPError as e:
                status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError, TypeError) as e:
            self.last_error = f"{method} {path}: {type(e).__name__}: {getattr(e, 'reason', e)}"
            return 0, {}
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {}
        return status, answer if isinstance(answer, dict) else {}

    def _failed(self, method: str, path: str, status: int, answer: dict) -> None:
        self.failures += 1
        if status:
            error = answer.get("error")
            message = error.get("message") if isinstance(error, dict) else answer
            self.last_error = f"{method} {path}: {status} {message}"

    def _register(self) -> None:
        status, answer = self._call("POST", REGISTER_PATH, {"url": self.url, "model": self.model}, self.timeout)
        if status == 201 and isinstance(answer.get("id"), str):
            self.id, self.answer = answer["id"], answer
            self.registrations += 1
            advertised = answer.get("heartbeat_interval")
            if isinstance(advertised, numbers.Real) and not isinstance(advertised, bool) and \
                    0 < advertised < self.requested_interval:
                self.interval = float(advertised)
                self.last_error = (f"the router asks for a heartbeat every {advertised:g} s: interval "
                                   f"{self.requested_interval:g} s -> {advertised:g} s")
            else:
                self.interval = self.requested_interval
        else:  # unreachable, 409 (our old registration not expired yet), ...: again next interval
            self._failed("POST", REGISTER_PATH, status, answer)

    def _path(self, delete: bool = False) -> str:
        id = quote(self.id, safe="")
        return replica_path(id) + "?url=" + quote(self.url, safe="") if delete else heartbeat_path(id)

    def _heartbeat(self) -> None:
        try:
            stats = self.stats() if self.stats is not None else None
        except Exception:  # a stats snapshot that failed: the heartbeat still says we are alive
            stats = None
        path = self._path()
        body = {"url": self.url, **heartbeat_body(stats)}
        status, answer = self._call("POST", path, body, min(self.timeout, self.interval))
        if status == 200:
            self.heartbeats += 1
            return
        self._failed("POST", path, status, answer)
        if status == 404:  # removed while alive, or the id is another url's now: join again, unless stopping
            self.id = None
            if not self._halt.is_set():
                self._register()

    def _step(self) -> None:
        if self.id is None:
            if self._ready():
                self._register()
        elif self._ready():
            self._heartbeat()
        else:  # not ready (draining, failed): silent, so the router removes it after its timeout
            self.skipped += 1

    def _run(self) -> None:
        due = time.monotonic()
        while not self._halt.is_set():
            try:
                self._step()
            except Exception as e:  # never let the thread die: the replica would never heartbeat again
                self.failures += 1
                self.last_error = f"{type(e).__name__}: {e}"
            due += self.interval
            now = time.monotonic()
            if due < now - self.interval:  # more than a beat behind (a slow router): no burst to catch up
                due = now
            self._halt.wait(max(0.0, due - now))
        if self.id is not None:  # stop(): deregister from this thread, after the last request it started
            try:
                self._call("DELETE", self._path(delete=True), None, self._stop_timeout)
            finally:
                self.id = None

    def _ready(self) -> bool:
        try:
            return bool(self.is_ready())
        except Exception:
            return False
