"""load: the shared-prefix trace, run_load with the real openai client (every request accounted for, whatever the
server does), percentiles, and the prefix-cache hit rate from the replicas' /metrics."""
import asyncio
import socket
import statistics
import time
from collections import Counter

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from labkit.cluster.load import (CONTEXT, LoadResult, RequestOutcome, percentile, prefix_counts, prefix_hit_rate,
                                 run_load, shared_prefix_trace)
from labkit.tinylm import load_pretrained
from tests.cluster.conftest import chunked, fake_replica, raw_server, sse_head
from tests.refusals import assert_refused


def test_the_trace_shares_prefixes_fits_the_context_and_is_fixed_by_its_seed():
    bodies = shared_prefix_trace(n_prefixes=3, per_prefix=5, prefix_chars=100, seed=4, max_tokens=20)
    tok = load_pretrained()[1]
    assert len(bodies) == 15 and all(b["model"] == "tinylm" and b["temperature"] == 0 for b in bodies)
    assert all(len(tok.encode(b["prompt"])) + b["max_tokens"] <= CONTEXT for b in bodies)
    prefixes = Counter(b["prompt"][:100] for b in bodies)
    assert sorted(prefixes.values()) == [5, 5, 5]
    assert len({b["prompt"] for b in bodies}) == 15  # each request its own question
    order = [b["prompt"][:100] for b in bodies]
    assert order != sorted(order, key=order.index)  # shuffled: one prefix's requests are not all in a row
    assert shared_prefix_trace(3, 5, 100, seed=4, max_tokens=20) == bodies
    assert not set(prefixes) & {b["prompt"][:100] for b in shared_prefix_trace(3, 5, 100, seed=5)}


def test_bad_trace_arguments_are_refused_by_name():
    assert_refused(lambda: shared_prefix_trace(0), ValueError, "n_prefixes", 0, "a positive int")
    assert_refused(lambda: shared_prefix_trace(2, 1.5), TypeError, "per_prefix", 1.5, "a positive int")
    assert_refused(lambda: shared_prefix_trace(prefix_chars=211), ValueError, "prefix_chars", 211, "at most 210")
    tok = load_pretrained()[1]  # 210 is the bound: the longest copy question still fits, and so does the answer
    longest = max(len(tok.encode(b["prompt"])) for b in shared_prefix_trace(8, 8, prefix_chars=210))
    assert 250 <= longest + 16 <= CONTEXT
    assert_refused(lambda: shared_prefix_trace(seed=-1), ValueError, "seed", -1, "a non-negative int")
    assert_refused(lambda: shared_prefix_trace(model=3), TypeError, "model", 3, "a model id")


@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=2, max_size=40), st.integers(1, 99))
def test_percentile_is_the_inclusive_quantile(values, q):
    assert percentile(values, q) == pytest.approx(statistics.quantiles(values, n=100, method="inclusive")[q - 1],
                                                  abs=1e-9)


def test_a_result_counts_and_summarises_its_records():
    records = [RequestOutcome(0, "answered", tokens=4, start=0.0, first=0.5, end=1.0),
               RequestOutcome(1, "failed", "APIConnectionError: Connection error.", start=0.0, end=0.2),
               RequestOutcome(2, "answered", tokens=6, start=1.0, first=1.1, end=3.0)]
    result = LoadResult(records, wall_s=4.0)
    assert (result.sent, result.answered, result.failed) == (3, 2, 1)
    assert result.tokens_per_s == 2.5 and result.latency_p50 == 1.5 and result.ttft_p50 == pytest.approx(0.3)
    assert result.errors() == {"APIConnectionError: Connection error.": 1}
    cut = "replica-2 failed mid-stream: RemoteProtocolError: peer closed connection without sending complete body"
    broken = LoadResult([RequestOutcome(i, "failed", f"APIError: {cut} (incomplete chunked read)", end=1.0)
                         for i in range(2)],
                        wall_s=1.0)
    # the type name the message repeats goes; the rest is cut after the last whole word that fits in 100
    words = f"{cut} (incomplete chunked read)".split()
    kept = max(k for k in range(len(words)) if len(" ".join(words[:k]) + " ...") <= 100)
    assert broken.errors() == {" ".join(words[:kept]) + " ...": 2} and len(cut) > 100
    assert LoadResult([RequestOutcome(0)], 1.0).latency_p99 is None  # none answered: no percentile, not a NaN


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_run_load_answers_what_the_replica_answers(shared, stream):
    url = shared.replica_processes[0].url
    bodies = shared_prefix_trace(2, 2, 64, seed=9, max_tokens=6)
    result = run_load(url, bodies, concurrency=2, stream=stream)
    client = openai.OpenAI(base_url=url, api_key="any", max_retries=0)
    own = [client.completions.create(**b) for b in bodies]
    assert result.sent == result.answered == 4 and result.failed == 0
    assert [r.text for r in result.records] == [o.choices[0].text for o in own]
    assert [r.tokens for r in result.records] == [o.usage.completion_tokens for o in own]
    assert all(0 <= r.start <= r.end for r in result.records) and result.latency_p50 <= result.latency_p99
    assert (result.ttft_p50 is not None) == stream and result.tokens_per_s > 0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once it is closed


@pytest.mark.timeout(60)
def test_requests_that_fail_are_recorded_with_their_error_never_lost():
    bodies = shared_prefix_trace(2, 2, 64, max_tokens=2)
    result = run_load(f"http://127.0.0.1:{closed_port()}/v1", bodies, concurrency=3)
    assert result.sent == result.failed == 4 and all("APIConnectionError" in r.error for r in result.records)
    with fake_replica("503") as fake:
        result = run_load(fake.url, bodies, concurrency=2, stream=False)
    assert result.failed == 4 and all(r.error.startswith("InternalServerError 503") for r in result.records)
    with fake_replica("break", events=1) as fake:  # a stream that breaks after a byte
        result = run_load(fake.url, bodies[:1], concurrency=1)
    assert result.failed == 1 and result.records[0].first is not None, result.records


EVENT = (b'data: {"id": "x", "object": "text_completion", "created": 1, "model": "tinylm", '
         b'"choices": [{"index": 0, "text": "a", "finish_reason": null}]}\n\n')


def not_json(conn) -> None:
    """A stream with an event that is not JSON: the openai client raises json's error, not an OpenAIError."""
    events = EVENT + b"data: not json\n\ndata: [DONE]\n\n"
    conn.sendall(sse_head(b"content-length: %d\r\nconnection: close\r\n" % len(events)) + events)


def slow(conn) -> None:
    """A stream that sends an event every 0.2 s, for ever (until the client leaves): each read is quick."""
    conn.sendall(sse_head())
    while True:
        conn.sendall(chunked(EVENT))
        time.sleep(0.2)


@pytest.mark.timeout(60)
def test_whatever_the_client_raises_the_request_is_recorded_and_the_run_goes_on():
    with raw_server(not_json) as url:
        result = run_load(url, [{"model": "tinylm", "prompt": "x"}] * 3, concurrency=2)
    assert result.sent == result.failed == 3 and all("JSONDecodeError" in r.error for r in result.records)


@pytest.mark.timeout(60)
def test_the_timeout_bounds_a_whole_request_not_each_read():
    with raw_server(slow) as url:
        result = run_load(url, [{"model": "tinylm", "prompt": "x"}], concurrency=1, timeout=1.0)
    assert result.failed == 1 and result.records[0].error == "timed out after 1 s", result.records
    assert result.records[0].first is not None  # it was streaming: the reads came in time, the whole did not


@pytest.mark.timeout(60)
def test_run_load_works_inside_a_running_event_loop():
    async def notebook_cell():  # a Jupyter kernel's loop is running when a cell calls run_load
        return run_load(f"http://127.0.0.1:{closed_port()}/v1", [{"model": "tinylm", "prompt": "x"}])
    assert asyncio.run(notebook_cell()).failed == 1


def test_bad_load_arguments_are_refused_by_name():
    assert_refused(lambda: run_load(8000, []), TypeError, "base_url", 8000, "the OpenAI base URL")
    assert_refused(lambda: run_load("http://x/v1", ["hi"]), TypeError, "bodies[0]", "hi", "a request body")
    assert_refused(lambda: run_load("http://x/v1", [], concurrency=0), ValueError, "concurrency", 0, "positive")
    assert_refused(lambda: run_load("http://x/v1", [], timeout=-1), ValueError, "timeout", -1, "positive")


@pytest.mark.timeout(120)
def test_the_hit_rate_is_the_block_managers_arithmetic(shared):
    replica = shared.replica_processes[1].root
    prompt = "hit rate " + "".join(chr(97 + (i * 7) % 26) for i in range(141))  # 150 tokens, used nowhere else
    before = prefix_counts([replica])
    client = openai.OpenAI(base_url=replica + "/v1", api_key="any", max_retries=0)
    for _ in range(2):
        client.completions.create(model="tinylm", prompt=prompt, max_tokens=1, temperature=0)
    # the second request finds the first one's full blocks before its last token: (150 - 1) // 16 blocks of 16
    assert prefix_hit_rate([replica], since=before) == (150 - 1) // 16 * 16 / 300
    counts = prefix_counts(shared.root)  # through the router: its replicas' roots
    assert sorted(counts) == sorted(r.root for r in shared.replica_processes)
    with pytest.raises(ValueError, match="looked up prompt tokens since the snapshot"):
        prefix_hit_rate([replica], since=prefix_counts([replica]))
