"""Which healthy replica gets the next request: round robin, least outstanding, prefix affinity (notebook 08,
section 3).

    policy = make_policy("prefix_affinity", chars=64)
    replica = policy.choose(registry.healthy("tinylm"), body)   # body: the request's JSON, as the client sent it

Prefix affinity sends requests that share the start of their prompt to the same replica, so that replica's
prefix cache (lab 05) holds the shared blocks and its hit rate climbs, where round robin spreads one prefix over
every replica and each one computes it again. It is rendezvous (highest-random-weight) hashing, Thaler &
Ravishankar, "Using name-based mappings to increase hit rates", IEEE/ACM ToN 6(1), 1998:

    owner(key) = argmax over ids of  w(id, key),   w = first 8 bytes of blake2b(f"{id}|{key}"), big-endian int

Every replica scores every key and the highest score wins, so removing a replica moves only the keys it owned
(to their second-best), and adding one moves to it only the keys it now wins: no other key changes owner.
(A modulo hash, hash(key) % n, moves almost every key when n changes.) SGLang's router ("cache-aware") and
llm-d's prefix scorer do the same with a radix tree of what each replica has seen; vLLM's production stack
offers both session and prefix routing.
"""

from __future__ import annotations

import hashlib

from .._checks import check_choice, check_positive_int, check_type, fail
from .registry import Replica

ROUTING_POLICIES = ("round_robin", "least_outstanding", "prefix_affinity")


def _image_tag(part: dict) -> str:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    digest = hashlib.blake2b(str(url).encode(), digest_size=8).hexdigest()
    return f"<image {digest}>"  # equal images (the same data URL) share a tag; the tag is short


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            out.append(str(part.get("text", "")))
        elif isinstance(part, dict) and part.get("type") == "image_url":
            out.append(_image_tag(part))
    return "".join(out)


def prefix_key(body: dict, chars: int = 64) -> str:
    """The first `chars` characters of a request's prompt text, the key prefix affinity hashes.

    /v1/completions: body["prompt"] (a string, or a list of one string). /v1/chat/completions: the messages in
    order, each "role: text" on its own line, the text being its string content or its text parts joined, an
    image part standing as "<image HASH>" (blake2b of its URL: equal images share a key, and a 4 KB data URL
    does not crowd the text out). A body without a prompt or messages gets "" (the replica refuses it; the
    router passes its 400 on)."""
    check_type("body", body, dict, "a dict (the request's JSON body)")
    chars = check_positive_int("chars", chars, unit="characters")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt[:chars]
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    lines = [f"{m.get('role')}: {_content_text(m.get('content'))}" for m in messages if isinstance(m, dict)]
    return "\n".join(lines)[:chars]


def weight(id: str, key: str) -> int:
    """Replica `id`'s score for `key`: the first 8 bytes of blake2b(f"{id}|{key}") as a big-endian int."""
    return int.from_bytes(hashlib.blake2b(f"{id}|{key}".encode()).digest()[:8], "big")


def rendezvous(key: str, ids: list[str]) -> str:
    """The id in `ids` with the highest weight(id, key) (ties, 1 in 2**64, go to the larger id)."""
    check_type("key", key, str, "a string")
    check_type("ids", ids, (list, tuple), "a list of replica ids")
    if not ids:
        fail("ids", ids, "a non-empty list of replica ids")
    for i, id in enumerate(ids):
        check_type(f"ids[{i}]", id, str, "a string")
    return max(ids, key=lambda id: (weight(id, key), id))


class Policy:
    """choose(replicas, body) -> the replica that gets this request; `replicas` are the healthy ones serving its
    model (non-empty, all "up"), in registration order."""
    name = ""

    def choose(self, replicas: list[Replica], body: dict) -> Replica:
        check_type("replicas", replicas, (list, tuple), "a list of replicas")
        if not replicas:
            fail("replicas", replicas, "a non-empty list of healthy replicas")
        for i, r in enumerate(replicas):
            check_type(f"replicas[{i}]", r, Replica, "a Replica")
            if r.state != "up":
                fail(f"replicas[{i}].state", r.state, '"up" (policies choose among healthy replicas)')
        check_type("body", body, dict, "a dict (the request's JSON body)")
        return self._choose(list(replicas), body)

    def _choose(self, replicas: list[Replica], body: dict) -> Replica:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RoundRobin(Policy):
    """The next replica in turn: a counter modulo the number of healthy replicas."""
    name = "round_robin"

    def __init__(self):
        self.count = 0

    def _choose(self, replicas, body):
        replica = replicas[self.count % len(replicas)]
        self.count += 1
        return replica


class LeastOutstanding(Policy):
    """The replica with the fewest requests in flight through the router; ties: the one this policy chose least
    recently (never chosen first), then registration order. So ties rotate (sequential clients alternate),
    and a replica that rejoins, with a new id and nothing routed, gets its turn and no more; a tie broken by
    the least routed would send it everything until it caught up. `last` maps an id to the count of choices
    when it was last chosen (ids absent from the replicas offered are forgotten once there are many)."""
    name = "least_outstanding"

    def __init__(self):
        self.count = 0
        self.last: dict[str, int] = {}

    def _choose(self, replicas, body):
        replica = min(enumerate(replicas),
                      key=lambda ir: (ir[1].outstanding, self.last.get(ir[1].id, -1), ir[0]))[1]
        self.count += 1
        self.last[replica.id] = self.count
        if len(self.last) > 4 * len(replicas) + 64:  # replicas that left: keep the map small
            offered = {r.id for r in replicas}
            self.last = {id: n for id, n in self.last.items() if id in offered}
        return replica


class PrefixAffinity(Policy):
    """rendezvous(prefix_key(body, chars), ids): one prompt prefix, one replica (while it is healthy)."""
    name = "prefix_affinity"

    def __init__(self, chars: int = 64):
        self.chars = check_positive_int("chars", chars, unit="characters")

    def _choose(self, replicas, body):
        owner = rendezvous(prefix_key(body, self.chars), [r.id for r in replicas])
        return next(r for r in replicas if r.id == owner)

    def __repr__(self) -> str:
        return f"PrefixAffinity(chars={self.chars})"


def make_policy(name: str, **options) -> Policy:
    """The policy called `name` (one of ROUTING_POLICIES); options: prefix_affinity takes chars=64, the others none."""
    check_choice("name", name, ROUTING_POLICIES)
    if name == "prefix_affinity":
        unknown = sorted(set(options) - {"chars"})
        if unknown:
            fail("options", unknown, "only chars for prefix_affinity", TypeError)
        return PrefixAffinity(**options)
    if options:
        fail("options", sorted(options), f"none for {name}", TypeError)
    return RoundRobin() if name == "round_robin" else LeastOutstanding()
