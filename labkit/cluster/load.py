"""Load for the router: a trace of requests that share prompt prefixes, run by the real `openai` client, and the
replicas' prefix-cache hit rate (notebook 08, sections 3 and 4; benchmarks/cluster_router.py).

    bodies = shared_prefix_trace(n_prefixes=4, per_prefix=6, prefix_chars=128, seed=0)
    before = prefix_counts(cluster.router.root)            # each replica's prefix-cache counters
    result = run_load(cluster.url, bodies, concurrency=4)  # LoadResult: every request answered or failed
    prefix_hit_rate(cluster.router.root, since=before)     # prompt tokens served from the cache / looked up

A trace's prompts are a prefix (readable text from labkit.tinylm's corpus, `prefix_chars` characters) and a task
question (arithmetic or copy, from the test split), shuffled with the seed so that the requests of one prefix
are spread over the run: round robin scatters them over the replicas, prefix affinity keeps them on one, whose
prefix cache (lab 05) then serves the shared blocks. TinyLM's tokenizer is byte-level: one character, one token.

run_load never loses a request: each body gets one RequestOutcome, "answered" (with its text and tokens) or "failed"
(with the client's error: an HTTP status, a connection error, a timeout, an in-band stream error, or anything
else the client raised). The client is openai.AsyncOpenAI with max_retries=0, so the retries counted are the
router's, not the client's.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import openai

from .._checks import check_bool, check_positive, check_positive_int, check_type, fail
from ..course import display
from ..rng import Rng
from ..serving import register as discovery
from ..tinylm import corpus, make_tasks

CONTEXT = 256  # TinyLM's context (tokens): a prompt and its max_tokens fit in it
QUESTION_KINDS = ("arithmetic", "copy")


LONGEST_QUESTION = len(" copy ") + 20 + len(" -> ")  # a copy task (its string 4..20 characters), after a space


def _prefixes(n: int, chars: int, seed: int) -> list[str]:
    """`n` texts of `chars` characters: the test split's text documents (seed `seed`) in turn, joined by spaces."""
    docs = (d.strip() for d in corpus.documents("test", seed) if corpus.kind_of(d) == "text")
    out = []
    for _ in range(n):
        text = ""
        while len(text) < chars:
            text += next(docs) + " "
        out.append(text[:chars])
    return out


def shared_prefix_trace(n_prefixes: int = 4, per_prefix: int = 6, prefix_chars: int = 128, seed: int = 0,
                        model: str = "tinylm", max_tokens: int = 16) -> list[dict]:
    """n_prefixes * per_prefix /v1/completions bodies (greedy: temperature 0): each prompt one of `n_prefixes`
    shared prefixes of `prefix_chars` characters + its own question, in an order shuffled by `seed`."""
    n_prefixes, per_prefix = check_positive_int("n_prefixes", n_prefixes), check_positive_int("per_prefix", per_prefix)
    prefix_chars = check_positive_int("prefix_chars", prefix_chars, unit="characters")
    seed = check_positive_int("seed", seed, allow_zero=True)
    max_tokens = check_positive_int("max_tokens", max_tokens, unit="tokens")
    check_type("model", model, str, "a model id (str)")
    if prefix_chars + LONGEST_QUESTION + max_tokens > CONTEXT:
        fail("prefix_chars", prefix_chars, f"at most {CONTEXT - LONGEST_QUESTION - max_tokens} with max_tokens="
             f"{max_tokens} (the prefix, a question and the answer fit TinyLM's {CONTEXT}-token context)")
    prefixes = _prefixes(n_prefixes, prefix_chars, seed)
    n = n_prefixes * per_prefix
    tasks = zip(*(make_tasks(kind, (n + 1) // 2, seed=seed) for kind in QUESTION_KINDS))
    questions = [t.prompt for pair in tasks for t in pair]  # arithmetic, copy, arithmetic, ...
    order = list(range(n))  # request k: prefix k // per_prefix, question k
    rng = Rng(seed)
    for i in range(n - 1, 0, -1):  # Fisher-Yates with the course's generator
        j = rng.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return [{"model": model, "prompt": f"{prefixes[k // per_prefix].rstrip()} {questions[k]}", "max_tokens": max_tokens,
             "temperature": 0} for k in order]


@dataclass
class RequestOutcome:
    """One request of a load run: `index` in the trace, `status` "answered" or "failed" (then `error` says
    why), `text` and `tokens` (completion tokens) when answered, and times in seconds from the run's start:
    `start`, `first` (the first text chunk of a stream), `end`."""
    index: int
    status: str = "failed"
    error: str = ""
    text: str = ""
    tokens: int = 0
    start: float = 0.0
    first: float | None = None
    end: float = 0.0

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start


def percentile(values, q: float) -> float | None:
    """The q-th percentile (linear interpolation between order statistics); None for no values."""
    values = list(values)
    return float(np.percentile(values, q)) if values else None


def _percentile_of(what: str, q: int) -> property:
    """A LoadResult property: the q-th percentile of the answered records' `what` (s), None without any."""
    return property(lambda self: percentile([getattr(r, what) for r in self.records if r.status == "answered"
                                             and getattr(r, what) is not None], q),
                    doc=f"p{q} of the answered requests' {what} (s); None when there is none")


@dataclass
class LoadResult:
    """What a load run did: every request's RequestOutcome, the counts (sent == answered + failed), the wall time (s),
    output tokens/s over it, and latency / time-to-first-token percentiles of the answered requests (s; None
    when none was answered, or no stream)."""
    records: list[RequestOutcome]
    wall_s: float
    sent: int = field(init=False)
    answered: int = field(init=False)
    failed: int = field(init=False)

    def __post_init__(self):
        self.sent = len(self.records)
        self.answered = sum(r.status == "answered" for r in self.records)
        self.failed = sum(r.status == "failed" for r in self.records)
        assert self.sent == self.answered + self.failed, "a record is neither answered nor failed"

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.records if r.status == "answered") / self.wall_s

    latency_p50 = _percentile_of("latency", 50)
    latency_p99 = _percentile_of("latency", 99)
    ttft_p50 = _percentile_of("ttft", 50)
    ttft_p99 = _percentile_of("ttft", 99)

    def errors(self) -> dict[str, int]:
        """How many requests failed with each error: at most 100 characters of it, cut after a whole word (" ..."
        marks a cut), without the leading "APIError: " (openai's base class, which says nothing the message does
        not: a router's in-band stream error)."""
        out: dict[str, int] = {}
        for r in self.records:
            if r.status == "failed":
                key = display.clip(r.error.removeprefix("APIError: "), 100)
                out[key] = out.get(key, 0) + 1
        return out


def _error(e: Exception) -> str:
    status = getattr(e, "status_code", None)
    return f"{type(e).__name__}" + (f" {status}" if status else "") + f": {e}"


async def _ask(client: openai.AsyncOpenAI, record: RequestOutcome, body: dict, stream: bool, t0: float) -> None:
    """Send `body`, filling `record`'s text, tokens and (streamed) time of the first text chunk."""
    chat = "messages" in body
    create = client.chat.completions.create if chat else client.completions.create
    if not stream:
        reply = await create(**body)
        record.text = reply.choices[0].message.content if chat else reply.choices[0].text
        record.tokens = reply.usage.completion_tokens if reply.usage else 0
        return
    parts = []
    async with await create(**body, stream=True, stream_options={"include_usage": True}) as chunks:
        async for chunk in chunks:  # the `async with` closes the response, even when the deadline cancels this
            text = (chunk.choices[0].delta.content if chat else chunk.choices[0].text) if chunk.choices else ""
            if text and record.first is None:
                record.first = time.perf_counter() - t0
            parts.append(text or "")
            if chunk.usage:
                record.tokens = chunk.usage.completion_tokens
    record.text = "".join(parts)


async def _one(client: openai.AsyncOpenAI, record: RequestOutcome, body: dict, stream: bool, t0: float,
               timeout: float) -> None:
    record.start = time.perf_counter() - t0
    try:
        await asyncio.wait_for(_ask(client, record, body, stream, t0), timeout)
        record.status = "answered"
    except asyncio.TimeoutError:  # before OSError (TimeoutError is one): the whole request took too long
        record.status, record.error = "failed", f"timed out after {timeout:g} s"
    except Exception as e:  # noqa: BLE001 - HTTP status, connection, in-band stream error, a body that is not
        record.status, record.error = "failed", _error(e)  # JSON, a bug: recorded, never lost with the others
    finally:
        record.end = time.perf_counter() - t0


async def run_load_async(base_url: str, bodies: list[dict], concurrency: int = 4, stream: bool = True,
                         timeout: float = 60.0) -> LoadResult:
    """run_load on the running event loop."""
    check_type("base_url", base_url, str, "the OpenAI base URL (http://HOST:PORT/v1)")
    check_type("bodies", bodies, list, "a list of request bodies (dicts)")
    for i, body in enumerate(bodies):
        check_type(f"bodies[{i}]", body, dict, "a request body (dict)")
    concurrency = check_positive_int("concurrency", concurrency, unit="requests in flight")
    check_bool("stream", stream)
    timeout = check_positive("timeout", timeout, unit="s")
    records = [RequestOutcome(i) for i in range(len(bodies))]
    pending = iter(range(len(bodies)))
    t0 = time.perf_counter()
    async with openai.AsyncOpenAI(base_url=base_url, api_key="any", max_retries=0, timeout=timeout) as client:
        async def worker():
            for i in pending:
                await _one(client, records[i], bodies[i], stream, t0, timeout)
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(bodies)))))
    return LoadResult(records, max(time.perf_counter() - t0, 1e-9))


def run_load(base_url: str, bodies: list[dict], concurrency: int = 4, stream: bool = True,
             timeout: float = 60.0) -> LoadResult:
    """Send `bodies` to `base_url` (a router's or a replica's /v1) with openai.AsyncOpenAI (max_retries=0),
    `concurrency` requests in flight, streamed or not. `timeout` (s) bounds each request from its start to its
    last byte (asyncio.wait_for: a request still going then is recorded failed, "timed out after `timeout` s"),
    and each of the client's steps too (connect, each read). Runs its own event loop on a worker thread, so it
    works from a notebook (whose loop is running) as from a script."""
    with ThreadPoolExecutor(1, thread_name_prefix="labkit-load") as pool:
        return pool.submit(asyncio.run, run_load_async(base_url, bodies, concurrency, stream, timeout)).result()


PREFIX_METRICS = ("labkit:prefix_cache_hits_total", "labkit:prefix_cache_queries_total")


def _replica_roots(targets) -> list[str]:
    if isinstance(targets, str):  # a router: its replicas
        root = discovery.check_http_url("targets", targets, root=True)
        with urllib.request.urlopen(root + discovery.REGISTER_PATH, timeout=5) as reply:
            return [r["url"].removesuffix("/v1") for r in json.loads(reply.read())["data"]]
    check_type("targets", targets, (list, tuple), "a router's root URL (str) or a list of replica root URLs")
    return [discovery.check_http_url(f"targets[{i}]", t, root=True) for i, t in enumerate(targets)]


def prefix_counts(targets) -> dict[str, tuple[int, int]]:
    """{replica root: (prefix-cache hits, queries)} in prompt tokens, from each replica's /metrics. `targets`: a
    router's root URL (its registered replicas) or a list of replica root URLs; an unreachable one is left out."""
    out = {}
    for root in _replica_roots(targets):
        try:
            with urllib.request.urlopen(root + "/metrics", timeout=5) as reply:
                text = reply.read().decode()
        except OSError:
            continue
        values = {line.split("{")[0]: int(float(line.rsplit(None, 1)[1])) for line in text.splitlines()
                  if line.startswith(PREFIX_METRICS)}
        out[root] = (values.get(PREFIX_METRICS[0], 0), values.get(PREFIX_METRICS[1], 0))
    return out


def prefix_hit_rate(targets, since: dict[str, tuple[int, int]] | None = None) -> float:
    """Prompt tokens served from the replicas' prefix caches / prompt tokens looked up, over every replica of
    `targets` (as prefix_counts, or a prefix_counts snapshot taken after the run), counted since the snapshot
    `since` (prefix_counts before the run; None: since each replica started). A replica that died meanwhile is
    left out (its counters cannot be read). ValueError when no prompt token was looked up."""
    now = prefix_counts(targets) if not isinstance(targets, dict) else targets
    since = since or {}
    hits = sum(h - since.get(root, (0, 0))[0] for root, (h, _) in now.items())
    queries = sum(q - since.get(root, (0, 0))[1] for root, (_, q) in now.items())
    if queries <= 0:
        fail("targets", targets, "replicas that looked up prompt tokens since the snapshot (none did)")
    return hits / queries
