"""The router's one owner of replica state: who is registered, who is up, who is busy (notebook 08, section 2).

    registry = Registry(heartbeat_timeout=1.0)
    r = registry.register("http://127.0.0.1:8001/v1", "tinylm")   # -> Replica(id="replica-1", state="up", ...)
    registry.heartbeat(r.id, {"running": 2, "waiting": 0})        # every interval, from the replica's Registrar
    registry.begin(r.id); ...; registry.end(r.id)                 # one request forwarded through the router
    registry.mark_down(r.id, "connection refused")                # routed around at once ...
    registry.expire()                                             # ... removed once its heartbeats stop

A replica's life (the events log records each arrow, for the notebook's timeline):

    register ──> "up" ──mark_down──> "down" ──heartbeat──> "up"   ("heartbeat-revived")
                  │                    │
                  └──── no heartbeat for heartbeat_timeout s ────> removed ("removed", by expire)
                  └──── deregister (a replica stopping cleanly) ──> removed ("deregistered")

Ids are "replica-1", "replica-2", ... in registration order and never reused, so a replica that comes back
after being removed is a new replica (its old id answers 404, which is how its Registrar learns to register
again). A router that restarts has a new Registry that issues "replica-1" again, maybe to another replica: so
heartbeat() and deregister() take the caller's url (the Registrar always sends it) and answer 404 when the id
belongs to another url, and that replica registers again too. Times are seconds on `clock` (time.monotonic by
default; the tests pass a fake clock). `events` keeps the last EVENTS_KEPT events (a deque: a router up for
days does not grow without bound).

Bad arguments raise TypeError / ValueError by name (labkit._checks), the name being the HTTP body's field
("url", "model", "load", "running", "waiting"): the router answers them with
labkit.serving.protocol.refusal(error) (a 400 naming that field). State conflicts raise RegistryError with the HTTP
status the router sends: 404 an unknown id, 409 a url already registered. Not thread-safe: the router calls it from
one asyncio loop.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable
from .._checks import check_choice, check_number, check_positive, check_type, fail, is_int, is_number
from ..serving import register as discovery  # the protocol's side in the replica (check_http_url)

STATES = ("up", "down")
EVENT_KINDS = ("registered", "heartbeat-revived", "down", "removed", "deregistered")
EVENTS_KEPT = 1000
"""How many of the latest events Registry.events keeps."""


@dataclass
class Replica:
    """One registered replica. Times in seconds on the registry's clock; `outstanding` counts requests in flight
    through the router, `routed` every request sent to it (retries included), `load` the last heartbeat's body
    ({"running": n, "waiting": n} from its engine)."""
    id: str
    url: str                  # its OpenAI base URL, http://HOST:PORT/v1
    model: str
    registered: float
    last_heartbeat: float
    state: str = "up"         # "up" | "down"
    reason: str = ""          # "" when up, else why it is down
    outstanding: int = 0
    routed: int = 0
    load: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The replica as JSON-ready data (the router's GET /replicas)."""
        return asdict(self)


@dataclass(frozen=True)
class ReplicaEvent:
    """One change of a replica's state: `kind` one of EVENT_KINDS, at `time` (s), with why in `detail`."""
    time: float
    kind: str
    id: str
    detail: str = ""


class RegistryError(Exception):
    """A request the registry cannot honour in its current state: `status` the HTTP status the router answers
    (400 bad request, 404 unknown id, 409 conflict), `message`, and `param` the body field or path part it is
    about ("url", "id"), as OpenAI's error body has them."""

    def __init__(self, status: int, message: str, param: str | None = None):
        check_choice("status", status, (400, 404, 409))
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def _check_text(name: str, value) -> str:
    check_type(name, value, str, "a string")
    if not value.strip():
        fail(name, value, "a non-empty string")
    return value


class Registry:
    """Every replica the router knows, by id, in registration order (see the module docstring)."""

    def __init__(self, heartbeat_timeout: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.heartbeat_timeout = check_positive("heartbeat_timeout", heartbeat_timeout, unit="s")
        if not callable(clock):
            fail("clock", clock, "a callable returning seconds (time.monotonic)", TypeError)
        self.clock = clock
        self.events: deque[ReplicaEvent] = deque(maxlen=EVENTS_KEPT)  # the latest events, oldest first
        self._replicas: dict[str, Replica] = {}  # id -> replica, in registration order (dicts keep it)
        self._issued = 0                         # ids issued so far: never reused
        self._removed: set[str] = set()          # ids removed (expired or deregistered): end() is a no-op there

    def _now(self) -> float:
        now = self.clock()
        if not is_number(now):
            fail("clock()", now, "a number of seconds", TypeError)
        return float(now)

    def _log(self, when: float, kind: str, id: str, detail: str = "") -> None:
        self.events.append(ReplicaEvent(when, kind, id, detail))

    def get(self, id: str, url: str | None = None) -> Replica:
        """The registered replica `id` (RegistryError 404 when there is none: never issued, or removed; and,
        when `url` is given, when `id` belongs to another url: a restarted router issued it again)."""
        check_type("id", id, str, "a string")
        if url is not None:
            url = discovery.check_http_url("url", url)
        replica = self._replicas.get(id)
        if replica is None:
            raise RegistryError(404, f"no registered replica {id!r} (never registered, or removed)", "id")
        if url is not None and url != replica.url:
            raise RegistryError(404, f"{id!r} belongs to {replica.url}, not {url} (the router restarted and "
                                     f"issued it again): register again", "id")
        return replica

    def register(self, url: str, model: str) -> Replica:
        """A new replica serving `model` at `url` (its /v1 base URL), "up", heartbeat now. A url that is
        registered already (up or down) is a RegistryError 409."""
        url, model = discovery.check_http_url("url", url), _check_text("model", model)
        for other in self._replicas.values():
            if other.url == url:
                raise RegistryError(409, f"{url} is registered already, as {other.id} ({other.state})", "url")
        now = self._now()
        self._issued += 1
        replica = Replica(f"replica-{self._issued}", url, model, now, now)
        self._replicas[replica.id] = replica
        self._log(now, "registered", replica.id, f"{model} at {url}")
        return replica

    def heartbeat(self, id: str, load: dict | None = None, url: str | None = None) -> Replica:
        """Replica `id` (at `url`, when given: another url's id is a 404) is alive: its heartbeat time is now
        and its load `load` (a dict, e.g. {"running": n, "waiting": n}, each a non-negative int; a "url" key is
        the sender, not load, and is dropped; None keeps the last load). A "down" replica that heartbeats is
        "up" again."""
        if load is not None:
            check_type("load", load, dict, "a dict (the heartbeat body)")
            load = {k: v for k, v in load.items() if k != "url"}
            for key in discovery.HEARTBEAT_FIELDS:
                if key in load and not (is_int(load[key]) and load[key] >= 0):
                    fail(key, load[key], "a non-negative int (requests)", TypeError if not is_int(load[key])
                         else ValueError)
        replica = self.get(id, url)
        now = self._now()
        replica.last_heartbeat = now
        if load is not None:
            replica.load = load
        if replica.state == "down":
            self._log(now, "heartbeat-revived", id, f"was down: {replica.reason}")
            replica.state, replica.reason = "up", ""
        return replica

    def mark_down(self, id: str, reason: str) -> Replica:
        """A connection to replica `id` failed: it is "down" (routed around at once) until a heartbeat revives
        it or expire() removes it. Marking a down replica again only updates the reason."""
        replica = self.get(id)
        reason = _check_text("reason", reason)
        if replica.state == "up":
            self._log(self._now(), "down", id, reason)
        replica.state, replica.reason = "down", reason
        return replica

    def _remove(self, replica: Replica, when: float, kind: str, why: str) -> Replica:
        del self._replicas[replica.id]
        self._removed.add(replica.id)
        replica.state, replica.reason = "down", why
        self._log(when, kind, replica.id, why)
        return replica

    def deregister(self, id: str, url: str | None = None) -> Replica:
        """Replica `id` (at `url`, when given: another url's id is a 404) stops cleanly: removed now (the
        returned object is "down", reason "deregistered")."""
        replica = self.get(id, url)
        return self._remove(replica, self._now(), "deregistered", "deregistered")

    def expire(self, now: float | None = None) -> list[Replica]:
        """Remove every replica whose last heartbeat is more than heartbeat_timeout s before `now` (default: the
        clock); the removed replicas, in registration order (the router cancels their in-flight requests)."""
        now = self._now() if now is None else check_number("now", now, unit="s")
        stale = [r for r in self._replicas.values() if now - r.last_heartbeat > self.heartbeat_timeout]
        return [self._remove(r, now, "removed", f"no heartbeat for {now - r.last_heartbeat:.2f} s") for r in stale]

    def healthy(self, model: str | None = None) -> list[Replica]:
        """The "up" replicas (serving `model`, when given), in registration order: what a policy chooses from."""
        if model is not None:
            check_type("model", model, str, "a string or None")
        return [r for r in self._replicas.values() if r.state == "up" and model in (None, r.model)]

    def replicas(self) -> list[Replica]:
        """Every registered replica, up or down, in registration order."""
        return list(self._replicas.values())

    def models(self) -> list[str]:
        """The names the healthy replicas serve, sorted, each once (the router's GET /v1/models)."""
        return sorted({r.model for r in self.healthy()})

    def begin(self, id: str) -> Replica:
        """A request is forwarded to replica `id`: outstanding and routed + 1."""
        replica = self.get(id)
        replica.outstanding += 1
        replica.routed += 1
        return replica

    def end(self, id: str) -> Replica | None:
        """A forwarded request ended (answered, failed or cancelled): outstanding - 1. A replica removed
        meanwhile is a no-op (None); an id never issued is a RegistryError 404; an end without its begin a
        ValueError."""
        check_type("id", id, str, "a string")
        if id in self._removed:
            return None
        replica = self.get(id)
        if replica.outstanding == 0:
            fail("id", id, "a replica with a request in flight (end() without begin())")
        replica.outstanding -= 1
        return replica
