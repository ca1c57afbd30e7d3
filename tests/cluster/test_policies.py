"""Routing policies: rendezvous hashing against a brute-force argmax, its minimal disruption (hypothesis), its
spread over many keys; prefix_key for completion and chat bodies; round robin cycles; least outstanding picks the
minimum, then the least recently chosen (a rejoined replica gets its turn, not every request); bad input refused
by name."""
import hashlib
import random
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from labkit.cluster.policies import (ROUTING_POLICIES, LeastOutstanding, Policy, PrefixAffinity,
                                     RoundRobin, make_policy, prefix_key, rendezvous)
from labkit.cluster.registry import Registry, Replica
from tests.refusals import assert_refused

IDS = st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=8, unique=True)
KEYS = st.lists(st.text(max_size=20), min_size=1, max_size=30)


def brute_force_owner(key: str, ids: list[str]) -> str:
    """Score every id by the published weight and keep the best, by hand."""
    best, best_score = None, -1
    for id in ids:
        score = 0
        for byte in hashlib.blake2b((id + "|" + key).encode("utf-8")).digest()[:8]:
            score = score * 256 + byte
        if score > best_score or (score == best_score and id > best):
            best, best_score = id, score
    return best


def replicas(n: int, outstanding=None, routed=None) -> list[Replica]:
    out = [Replica(f"replica-{i + 1}", f"http://127.0.0.1:{8001 + i}/v1", "tinylm", 0.0, 0.0) for i in range(n)]
    for i, r in enumerate(out):
        r.outstanding = outstanding[i] if outstanding else 0
        r.routed = routed[i] if routed else 0
    return out


@settings(max_examples=200, deadline=None)
@given(key=st.text(max_size=40), ids=IDS)
def test_rendezvous_is_the_argmax_of_the_weights(key, ids):
    assert rendezvous(key, ids) == brute_force_owner(key, ids)
    assert rendezvous(key, list(reversed(ids))) == rendezvous(key, ids)  # the order of ids does not matter


@settings(max_examples=200, deadline=None)
@given(ids=IDS, keys=KEYS, data=st.data())
def test_removing_one_id_moves_only_its_keys(ids, keys, data):
    gone = data.draw(st.sampled_from(ids))
    rest = [i for i in ids if i != gone]
    if not rest:
        return
    for key in keys:
        before, after = rendezvous(key, ids), rendezvous(key, rest)
        assert (before != after) == (before == gone)


@settings(max_examples=200, deadline=None)
@given(ids=IDS, keys=KEYS, new=st.text(min_size=1, max_size=8))
def test_adding_one_id_moves_keys_only_to_it(ids, keys, new):
    if new in ids:
        return
    for key in keys:
        before, after = rendezvous(key, ids), rendezvous(key, ids + [new])
        assert after in (before, new)


def test_many_keys_spread_roughly_evenly():
    rng = random.Random(8)
    ids = [f"replica-{i}" for i in range(1, 5)]
    keys = [f"{rng.random():.12f}" for _ in range(4000)]
    counts = {i: 0 for i in ids}
    for key in keys:
        counts[rendezvous(key, ids)] += 1
    assert all(850 <= c <= 1150 for c in counts.values()), counts  # 1000 each, binomial sd ~27


def test_prefix_key_of_a_completion_and_of_a_chat():
    assert prefix_key({"prompt": "x" * 100}) == "x" * 64
    assert prefix_key({"prompt": ["copy abc -> "]}, chars=4) == "copy"
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 4000}}
    other = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "B" * 4000}}
    chat = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "what is "}, image,
                                                      {"type": "text", "text": "?"}]}]}
    key = prefix_key(chat, chars=1000)
    assert key.startswith("system: be brief\nuser: what is <image ") and key.endswith(">?")
    assert len(key) < 100  # the image is a short tag, not its 4 KB URL
    same = {"messages": [dict(chat["messages"][0]), {"role": "user", "content": [
        {"type": "text", "text": "what is "}, dict(image), {"type": "text", "text": "?"}]}]}
    assert prefix_key(same, chars=1000) == key  # equal images share a key
    chat["messages"][1]["content"][1] = other
    assert prefix_key(chat, chars=1000) != key
    assert prefix_key({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) \
        == "user: hi\nassistant: yo"
    assert prefix_key(chat, chars=10) == "system: be"
    assert prefix_key({"model": "tinylm"}) == ""  # nothing to key on: the replica refuses the body


def test_prefix_affinity_keeps_a_prefix_on_one_replica():
    policy, pool = make_policy("prefix_affinity", chars=8), replicas(3)
    chosen = {policy.choose(pool, {"prompt": "shared: " + tail}).id for tail in ("a", "bb", "12+7=")}
    assert len(chosen) == 1
    owner = chosen.pop()
    assert owner == brute_force_owner("shared: ", [r.id for r in pool])
    rest = [r for r in pool if r.id != owner]
    assert policy.choose(rest, {"prompt": "shared: x"}).id == brute_force_owner("shared: ", [r.id for r in rest])
    assert repr(policy) == "PrefixAffinity(chars=8)"


def test_round_robin_cycles_through_the_healthy():
    policy, pool = make_policy("round_robin"), replicas(3)
    assert [policy.choose(pool, {}).id for _ in range(7)] == [f"replica-{i % 3 + 1}" for i in range(7)]
    assert isinstance(policy, RoundRobin)


@settings(max_examples=200, deadline=None)
@given(outstanding=st.lists(st.integers(0, 3), min_size=1, max_size=6),
       history=st.lists(st.integers(0, 5), max_size=12))
def test_least_outstanding_picks_the_minimum_then_the_least_recently_chosen(outstanding, history):
    """Against a model by hand: after choices among the first replicas (`history`), the next choice is the
    fewest outstanding, then the one chosen longest ago (never chosen: first), then registration order."""
    pool, policy = replicas(len(outstanding), outstanding), LeastOutstanding()
    when: dict[str, int] = {}
    for step, i in enumerate(history):
        one = [pool[i % len(pool)]]
        assert policy.choose(one, {}) is one[0]
        when[one[0].id] = step
    got = policy.choose(pool, {"prompt": "x"})
    expected = sorted(range(len(pool)), key=lambda i: (outstanding[i], when.get(pool[i].id, -1), i))[0]
    assert got is pool[expected]


def test_least_outstanding_gives_a_rejoined_replica_its_turn_and_no_more():
    """Sequential clients (every choice a tie on outstanding): the two replicas alternate; when one restarts
    (a new id, nothing routed) it still gets half the requests, not all of them."""
    registry = Registry(heartbeat_timeout=1e9)
    a, b = (registry.register(f"http://127.0.0.1:{p}/v1", "tinylm") for p in (8001, 8002))
    policy = make_policy("least_outstanding")

    def run(n: int) -> Counter:
        counts = Counter()
        for _ in range(n):
            r = policy.choose(registry.healthy(), {})
            registry.begin(r.id)
            registry.end(r.id)
            counts[r.id] += 1
        return counts
    assert run(100) == {a.id: 50, b.id: 50}
    registry.deregister(b.id)
    c = registry.register("http://127.0.0.1:8002/v1", "tinylm")
    assert run(100) == {a.id: 50, c.id: 50}  # a tie by least routed: c 75, a 25 (c catching up)
    for _ in range(200):  # many replicas come and go: the policy's memory stays bounded
        registry.deregister(c.id)
        c = registry.register("http://127.0.0.1:8002/v1", "tinylm")
        run(1)
    assert len(policy.last) <= 4 * 2 + 64 + 1


def test_bad_input_is_refused_by_name():
    pool = replicas(2)
    assert_refused(lambda: make_policy("random"), ValueError, "name", "random", "one of")
    assert_refused(lambda: make_policy("round_robin", chars=8), TypeError, "options", ["chars"], "none for")
    assert_refused(lambda: make_policy("prefix_affinity", size=8), TypeError, "options", ["size"], "only chars")
    assert_refused(lambda: PrefixAffinity(0), ValueError, "chars", 0, "positive int")
    assert_refused(lambda: prefix_key("hi"), TypeError, "body", "hi", "a dict")
    assert_refused(lambda: rendezvous("k", []), ValueError, "ids", [], "non-empty")
    assert_refused(lambda: rendezvous("k", ["a", 2]), TypeError, "ids[1]", 2, "a string")
    assert_refused(lambda: rendezvous(3, ["a"]), TypeError, "key", 3, "a string")
    for policy in map(make_policy, ROUTING_POLICIES):
        assert_refused(lambda: policy.choose([], {}), ValueError, "replicas", [], "non-empty")
        assert_refused(lambda: policy.choose(["r"], {}), TypeError, "replicas[0]", "r", "a Replica")
        assert_refused(lambda: policy.choose(pool, None), TypeError, "body", None, "a dict")
        pool[1].state = "down"
        assert_refused(lambda: policy.choose(pool, {}), ValueError, "replicas[1].state", "down", '"up"')
        pool[1].state = "up"
    with pytest.raises(NotImplementedError):
        Policy().choose(pool, {})
