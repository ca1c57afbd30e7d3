"""The registry against a shadow model under random operations (hypothesis, stateful, a fake clock): counts are
conserved, no removed replica is healthy, outstanding is never negative, ids are never reused, and replaying the
events log gives back the registry's replicas and states, and an id is honoured only for its own url (a
restarted router issues ids again). Then the bad inputs, refused by name, and the events log's cap."""
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from labkit.cluster.registry import EVENT_KINDS, EVENTS_KEPT, ReplicaEvent, Registry, RegistryError, Replica
from tests.refusals import assert_refused

TIMEOUT = 1.0
URLS = [f"http://127.0.0.1:{8000 + i}/v1" for i in range(3)]
MODELS = ["tinylm", "tinyvlm"]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def error_of(call) -> RegistryError:
    with pytest.raises(RegistryError) as info:
        call()
    return info.value


class RegistryMachine(RuleBasedStateMachine):
    """Shadow: id -> {url, model, state, beat, outstanding, routed}, kept by hand from the rules' meaning."""

    def __init__(self):
        super().__init__()
        self.clock = Clock()
        self.registry = Registry(TIMEOUT, clock=self.clock)
        self.shadow: dict[str, dict] = {}
        self.issued: list[str] = []

    def ids(self):  # mostly live ids; else removed ones and ids never issued
        others = st.sampled_from(sorted(set(self.issued) - set(self.shadow) | {"replica-999", "nobody"}))
        live = sorted(self.shadow)
        return st.one_of(st.sampled_from(live), st.sampled_from(live), others) if live else others

    @rule(dt=st.floats(0.0, 0.8))
    def tick(self, dt):
        self.clock.now += dt

    @rule(url=st.sampled_from(URLS), model=st.sampled_from(MODELS))
    def register(self, url, model):
        holder = next((i for i, s in self.shadow.items() if s["url"] == url), None)
        if holder is not None:
            e = error_of(lambda: self.registry.register(url, model))
            assert (e.status, e.param) == (409, "url") and holder in e.message
            return
        r = self.registry.register(url, model)
        assert r.id not in self.issued, "an id was reused"
        assert (r.state, r.outstanding, r.routed, r.registered, r.last_heartbeat) == ("up", 0, 0, self.clock.now,
                                                                                      self.clock.now)
        self.issued.append(r.id)
        self.shadow[r.id] = dict(url=url, model=model, state="up", beat=self.clock.now, outstanding=0, routed=0)

    def unknown(self, call, id):
        e = error_of(call)
        assert (e.status, e.param) == (404, "id") and id in e.message

    def foreign(self, id, url) -> bool:  # a url given that is not the id's: 404 as for an unknown id
        return id not in self.shadow or url not in (None, self.shadow[id]["url"])

    @rule(data=st.data(), running=st.integers(0, 5), url=st.sampled_from([None, None, *URLS]))
    def heartbeat(self, data, running, url):
        id = data.draw(self.ids())
        if self.foreign(id, url):
            return self.unknown(lambda: self.registry.heartbeat(id, {"running": running}, url), id)
        r = self.registry.heartbeat(id, {"running": running, "url": url}, url)
        self.shadow[id].update(state="up", beat=self.clock.now)
        assert r.load == {"running": running} and r.reason == ""

    @rule(data=st.data(), reason=st.sampled_from(["connection refused", "read timeout"]))
    def mark_down(self, data, reason):
        id = data.draw(self.ids())
        if id not in self.shadow:
            return self.unknown(lambda: self.registry.mark_down(id, reason), id)
        assert self.registry.mark_down(id, reason).reason == reason
        self.shadow[id]["state"] = "down"

    @rule(data=st.data(), url=st.sampled_from([None, None, *URLS]))
    def deregister(self, data, url):
        id = data.draw(self.ids())
        if self.foreign(id, url):
            return self.unknown(lambda: self.registry.deregister(id, url), id)
        assert self.registry.deregister(id, url).id == id
        del self.shadow[id]

    @rule(explicit=st.booleans())
    def expire(self, explicit):
        now = self.clock.now
        removed = self.registry.expire(now if explicit else None)
        stale = [i for i, s in self.shadow.items() if now - s["beat"] > TIMEOUT]
        assert [r.id for r in removed] == stale and all(r.state == "down" for r in removed)
        for i in stale:
            del self.shadow[i]
        assert all(now - r.last_heartbeat <= TIMEOUT for r in self.registry.replicas()), "an expired one stayed"

    @rule(data=st.data())
    def begin(self, data):
        id = data.draw(self.ids())
        if id not in self.shadow:
            return self.unknown(lambda: self.registry.begin(id), id)
        self.registry.begin(id)
        self.shadow[id]["outstanding"] += 1
        self.shadow[id]["routed"] += 1

    @rule(data=st.data())
    def end(self, data):
        id = data.draw(self.ids())
        if id in self.shadow and self.shadow[id]["outstanding"] > 0:
            assert self.registry.end(id).outstanding == self.shadow[id]["outstanding"] - 1
            self.shadow[id]["outstanding"] -= 1
        elif id in self.shadow:  # an end without a begin is a bug of the caller's, refused, nothing changes
            assert_refused(lambda: self.registry.end(id), ValueError, "id", id, "a request in flight")
        elif id in self.issued:
            assert self.registry.end(id) is None  # a removed replica: the router's late end() is a no-op
        else:
            self.unknown(lambda: self.registry.end(id), id)

    @invariant()
    def matches_the_shadow(self):
        got = {r.id: dict(url=r.url, model=r.model, state=r.state, beat=r.last_heartbeat, outstanding=r.outstanding,
                          routed=r.routed) for r in self.registry.replicas()}
        assert got == self.shadow
        assert [r.id for r in self.registry.replicas()] == [i for i in self.issued if i in self.shadow]
        assert all(r.outstanding >= 0 and r.routed >= r.outstanding for r in self.registry.replicas())
        for model in (None, *MODELS):
            assert [r.id for r in self.registry.healthy(model)] == [
                i for i in self.issued if i in self.shadow and self.shadow[i]["state"] == "up"
                and model in (None, self.shadow[i]["model"])]
        assert self.registry.models() == sorted({s["model"] for s in self.shadow.values() if s["state"] == "up"})

    @invariant()
    def the_events_replay_to_the_registry(self):
        live: dict[str, str] = {}
        for e in self.registry.events:
            assert e.kind in EVENT_KINDS
            if e.kind == "registered":
                assert e.id not in live
                live[e.id] = "up"
            else:
                assert e.id in live, f"{e.kind} of an id that is not registered"
                if e.kind in ("removed", "deregistered"):
                    del live[e.id]
                else:
                    assert live[e.id] == ("up" if e.kind == "down" else "down")
                    live[e.id] = "down" if e.kind == "down" else "up"
        assert live == {i: s["state"] for i, s in self.shadow.items()}
        times = [e.time for e in self.registry.events]
        assert times == sorted(times)
        assert sum(e.kind == "registered" for e in self.registry.events) == len(self.issued)


RegistryMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
test_registry_against_a_shadow = RegistryMachine.TestCase


def test_a_replica_s_life_in_the_events_log():
    clock = Clock()
    reg = Registry(heartbeat_timeout=1.0, clock=clock)
    a = reg.register("http://127.0.0.1:8001/v1/", "tinylm")
    assert a.url == "http://127.0.0.1:8001/v1" and a.to_dict()["id"] == "replica-1"
    clock.now += 0.5
    reg.mark_down(a.id, "connection refused")
    assert reg.healthy() == [] and reg.get(a.id).reason == "connection refused"
    clock.now += 0.25
    reg.heartbeat(a.id)
    assert reg.healthy() == [a]
    clock.now += 1.0  # exactly the timeout: still there
    assert reg.expire() == []
    clock.now += 0.01
    assert reg.expire() == [a] and a.reason.startswith("no heartbeat for 1.01")
    b = reg.register("http://127.0.0.1:8001/v1", "tinylm")  # the same url, after removal: a new id
    reg.deregister(b.id)
    assert [(e.kind, e.id) for e in reg.events] == [
        ("registered", "replica-1"), ("down", "replica-1"), ("heartbeat-revived", "replica-1"),
        ("removed", "replica-1"), ("registered", "replica-2"), ("deregistered", "replica-2")]
    assert reg.events[1] == ReplicaEvent(100.5, "down", "replica-1", "connection refused")


def test_bad_arguments_are_refused_by_name_and_change_nothing():
    reg = Registry()
    a = reg.register("http://127.0.0.1:8001/v1", "tinylm")
    for url in ("127.0.0.1:8001", "ftp://h/v1", "http:///v1", "http://h:0/v1", "http://h:x/v1", ""):
        assert_refused(lambda: reg.register(url, "tinylm"), ValueError, "url", url, "http:// or https:// URL")
    assert_refused(lambda: reg.register(8001, "tinylm"), TypeError, "url", 8001, "a string")
    assert_refused(lambda: reg.register("http://h/v1", " "), ValueError, "model", " ", "non-empty")
    assert_refused(lambda: reg.register("http://h/v1", None), TypeError, "model", None, "a string")
    assert_refused(lambda: reg.heartbeat(a.id, [1]), TypeError, "load", [1], "a dict")
    assert_refused(lambda: reg.mark_down(a.id, ""), ValueError, "reason", "", "non-empty")
    assert_refused(lambda: reg.get(1), TypeError, "id", 1, "a string")
    assert_refused(lambda: reg.expire(float("nan")), ValueError, "now", float("nan"), "finite")
    assert_refused(lambda: reg.healthy(3), TypeError, "model", 3, "a string or None")
    assert_refused(lambda: Registry(0), ValueError, "heartbeat_timeout", 0, "positive")
    assert_refused(lambda: Registry(True), TypeError, "heartbeat_timeout", True, "positive")
    assert_refused(lambda: Registry(clock=5), TypeError, "clock", 5, "callable")
    assert_refused(lambda: Registry(clock=lambda: "t").register("http://h/v1", "m"), TypeError, "clock()", "t",
                   "seconds")
    assert_refused(lambda: RegistryError(500, "x"), ValueError, "status", 500, "one of (400, 404, 409)")
    assert_refused(lambda: reg.heartbeat(a.id, {"running": -1}), ValueError, "running", -1, "a non-negative int")
    assert_refused(lambda: reg.heartbeat(a.id, {"waiting": 1.5}), TypeError, "waiting", 1.5, "a non-negative int")
    assert_refused(lambda: reg.heartbeat(a.id, {"running": True}), TypeError, "running", True, "non-negative int")
    assert_refused(lambda: reg.heartbeat(a.id, url="x"), ValueError, "url", "x", "http:// or https:// URL")
    assert_refused(lambda: reg.deregister(a.id, url=3), TypeError, "url", 3, "a string")
    assert [r.id for r in reg.replicas()] == ["replica-1"] and reg.get(a.id).state == "up" and len(reg.events) == 1
    assert isinstance(a, Replica) and reg.get(a.id).load == {}


A, B = "http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"


def test_a_restarted_router_does_not_take_one_replica_s_heartbeats_for_another_s():
    clock = Clock()
    before = Registry(clock=clock)
    assert (before.register(A, "tinylm").id, before.register(B, "tinylm").id) == ("replica-1", "replica-2")
    after = Registry(clock=clock)  # the router restarted: B's 404 on replica-2 made it register first
    e = error_of(lambda: after.heartbeat("replica-2", {"running": 1}, B))
    assert (e.status, e.param) == (404, "id")
    assert after.register(B, "tinylm").id == "replica-1"
    e = error_of(lambda: after.heartbeat("replica-1", {"running": 1, "url": A}, A))  # A's old id, now B's
    assert (e.status, e.param) == (404, "id") and "belongs to" in e.message and B in e.message and A in e.message
    e = error_of(lambda: after.deregister("replica-1", A + "/"))
    assert e.status == 404 and after.get("replica-1").url == B  # A cannot remove B either
    assert after.register(A, "tinylm").id == "replica-2"  # A registers again, as the Registrar does on that 404
    assert after.heartbeat("replica-1", {"running": 3, "waiting": 0, "url": B}, B).load == {"running": 3, "waiting": 0}
    assert after.heartbeat("replica-2", None, A).url == A and after.deregister("replica-2", A).url == A
    assert after.heartbeat("replica-1").url == B  # without a url (an older replica): the id alone, as before


def test_the_events_log_keeps_the_latest():
    reg = Registry()
    n = EVENTS_KEPT // 2 + 100  # each replica logs two events
    for _ in range(n):
        reg.deregister(reg.register(A, "tinylm").id)
    assert len(reg.events) == EVENTS_KEPT and reg.events[-1].id == f"replica-{n}"
    assert reg.events[0].id == f"replica-{n - EVENTS_KEPT // 2 + 1}" and reg.events[0].kind == "registered"
