"""The HTTP API over loopback: the real `openai` client and raw HTTP (httpx) against servers this module starts on
free ports and stops. References: labkit.tinylm.generate run alone (greedy), independent of the serving engine."""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import openai
import pytest

from labkit.serving.api import ServerThread, make_app
from labkit.serving.engine import Engine
from labkit.serving.service import Service
from labkit.tinylm import TASK_KINDS, generate, make_tasks
from tests.refusals import assert_refused
from tests.serving.answers import Recorder

pytestmark = pytest.mark.timeout(120)
MODEL = "tinylm"


@contextmanager
def serving(model, gate: threading.Event | None = None, **engine):
    """A Service (its load held until `gate` is set, if given) behind uvicorn on a free loopback port. Every
    answer it gives is held against its /openapi.json when the block ends (tests/serving/answers.py)."""
    svc = Service(lambda: (gate is None or gate.wait(60)) and Engine(model, **engine)).start()
    app = make_app(svc, MODEL)
    schema = app.openapi()  # as served, before a test adds a route of its own
    recorder = Recorder(app)
    srv = ServerThread(recorder).start()
    try:
        yield svc, srv, app
    finally:
        if gate is not None:
            gate.set()
        srv.stop()
        svc.stop()
    assert recorder.answers and not recorder.undocumented(schema), recorder.undocumented(schema)


@pytest.fixture(scope="module")
def server(model):
    with serving(model, num_blocks=64) as (svc, srv, app):
        assert svc.wait_ready(60), svc.error
        yield svc, srv, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1].url + "/v1", api_key="any", max_retries=0, timeout=60)


def reference(model, tok, text: str, max_tokens: int) -> str:
    """Greedy continuation by TinyLM alone: the text every path through the service must give."""
    return tok.decode(generate(model, tok.encode(text), max_tokens))


def wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def metrics(url: str) -> dict:
    """/metrics parsed as Prometheus text: {name or name{labels}: value}; every sample's name has a # TYPE."""
    text = httpx.get(url + "/metrics").text
    types = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")}
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            name, _, labels = key.partition("{")
            assert name in types and (not labels or labels.endswith("}")), line
            assert all("=" in kv and kv.split("=", 1)[1].startswith('"') for kv in labels[:-1].split(",") if labels)
            samples[name if "finished_reason" not in labels else labels.split("finished_reason=")[1][1:-2]] = \
                float(value)
    assert set(types.values()) <= {"gauge", "counter"}
    return samples


def test_health_models_and_unknown_routes(server, client):
    url = server[1].url
    assert (httpx.get(url + "/health").status_code, httpx.get(url + "/health").json()) == (200, {"status": "ready"})
    assert [m.id for m in client.models.list()] == [MODEL] and client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    r = httpx.get(url + "/nowhere")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("text", ["12+7=", "copy abc -> ", "The old sailor"])
def test_completion_streamed_equals_plain_equals_offline(client, model, tok, text):
    want = reference(model, tok, text, 24)
    plain = client.completions.create(model=MODEL, prompt=text, max_tokens=24, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=[text], max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert plain.choices[0].text == want and plain.choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and not chunks[-1].choices and usage[0] == plain.usage
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (len(tok.encode(text)), 24)


@pytest.mark.parametrize("messages", [[{"role": "user", "content": "copy abc -> "}],
                                      [{"role": "system", "content": "3+4=7"}, {"role": "user", "content": "12+7="}],
                                      [{"role": "user", "content": [{"type": "text", "text": "9+5="}]}]])
def test_chat_streamed_equals_plain_equals_offline(client, model, tok, messages):
    contents = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in messages]
    offline = reference(model, tok, "\n".join(contents), 30)  # the chat template: contents, one per line
    want, reason = (offline.split("\n")[0], "stop") if "\n" in offline else (offline, "length")
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert (plain.choices[0].message.content, plain.choices[0].finish_reason) == (want, reason)
    assert plain.choices[0].message.role == "assistant" and chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert [c.usage for c in chunks if c.usage] == [plain.usage]
    assert plain.usage.completion_tokens == len(tok.encode(want)) + (reason == "stop")


def test_sampling_fields_reach_the_engine(client, model, tok):
    greedy = reference(model, tok, "83+58=", 12)
    top1 = client.completions.create(model=MODEL, prompt="83+58=", max_tokens=12, temperature=1.0,
                                     extra_body={"top_k": 1, "min_p": 0.0}, user="learner")
    assert top1.choices[0].text == greedy  # top_k 1 keeps only the most likely token
    seeded = [client.completions.create(model=MODEL, prompt="The", max_tokens=20, temperature=1.5, top_p=0.9,
                                        seed=7).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]
    stop = greedy[2:4]
    cut = client.completions.create(model=MODEL, prompt="83+58=", max_tokens=12, temperature=0, stop=[stop, "zz"])
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == (greedy[:greedy.find(stop)], "stop")


@pytest.mark.timeout(240)
def test_32_concurrent_streaming_clients_get_the_offline_outputs(server, client, model, tok):
    texts = [t.prompt for k in TASK_KINDS for t in make_tasks(k, 11)][:32]

    def ask(text):
        chunks = list(client.completions.create(model=MODEL, prompt=text, max_tokens=16, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        return "".join(c.choices[0].text for c in chunks if c.choices), [c.usage for c in chunks if c.usage][0]

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, texts))
    for text, (answer, usage) in zip(texts, answers):
        assert answer == reference(model, tok, text, 16)
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(tok.encode(text)), 16)
    assert wait_for(lambda: server[0].stats()["running"] == 0)


BAD = [  # (endpoint, raw body, status, param, code)
    ("completions", b"{", 400, None, "invalid_json"),
    ("completions", b"[" * 100_000 + b"]" * 100_000, 400, None, "invalid_json"),  # deeper than json can parse
    ("completions", b'{"model": "tinylm", "prompt": "' + b"a" * 1_000_001 + b'"}', 413, None, "request_too_large"),
    ("completions", b"[1, 2]", 400, None, "invalid_json"),
    ("completions", {"prompt": "1+1="}, 400, "model", "missing_required_parameter"),
    ("completions", {"model": 5, "prompt": "1+1="}, 400, "model", "invalid_type"),
    ("completions", {"model": "gpt-4", "prompt": "1+1="}, 404, "model", "model_not_found"),
    ("completions", {"model": MODEL}, 400, "prompt", "missing_required_parameter"),
    ("completions", {"model": MODEL, "prompt": 5}, 400, "prompt", "invalid_type"),
    ("completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt", "invalid_value"),  # a list of one
    ("completions", {"model": MODEL, "prompt": [1, 2]}, 400, "prompt", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": [1]}, 400, "prompt[0]", "invalid_type"),  # token ids
    ("completions", {"model": MODEL, "prompt": ""}, 400, "prompt", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "\ud800"}, 400, "prompt", "invalid_value"),  # a lone surrogate
    ("completions", {"model": MODEL, "prompt": "1+1=" * 70}, 400, "prompt", "invalid_value"),  # > context
    ("completions", {"model": MODEL, "prompt": "a", "max_tokens": "5"}, 400, "max_tokens", "invalid_type"),
    ("completions", {"model": MODEL, "prompt": "a", "max_tokens": True}, 400, "max_tokens", "invalid_type"),
    ("completions", {"model": MODEL, "prompt": "a", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "max_tokens": 256}, 400, "max_tokens", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "max_tokens": 256, "stream": True}, 400, "max_tokens",
     "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "temperature": 2.5}, 400, "temperature", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "temperature": -0.1}, 400, "temperature", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ("completions", {"model": MODEL, "prompt": "a", "top_p": 0}, 400, "top_p", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "top_p": 1.5}, 400, "top_p", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "top_k": 1.5}, 400, "top_k", "invalid_type"),
    ("completions", {"model": MODEL, "prompt": "a", "min_p": 2}, 400, "min_p", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "seed": -1}, 400, "seed", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "stop": 5}, 400, "stop", "invalid_type"),
    ("completions", {"model": MODEL, "prompt": "a", "stop": [""]}, 400, "stop[0]", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "stop": list("abcde")}, 400, "stop", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "n": 2}, 400, "n", "unsupported_value"),
    ("completions", {"model": MODEL, "prompt": "a", "logprobs": 3}, 400, "logprobs", "unsupported_value"),
    ("completions", {"model": MODEL, "prompt": "a", "echo": True}, 400, "echo", "unsupported_value"),
    ("completions", {"model": MODEL, "prompt": "a", "stream": "yes"}, 400, "stream", "invalid_type"),
    ("completions", {"model": MODEL, "prompt": "a", "stream_options": {"include_usage": True}}, 400,
     "stream_options", "invalid_value"),
    ("completions", {"model": MODEL, "prompt": "a", "stream": True, "stream_options": {"include_usage": 1}}, 400,
     "stream_options.include_usage", "invalid_type"),
    ("completions", {"model": MODEL, "prompt": "a", "best_effort": 1}, 400, "best_effort", "unknown_parameter"),
    ("chat/completions", {"model": MODEL}, 400, "messages", "missing_required_parameter"),
    ("chat/completions", {"model": MODEL, "messages": []}, 400, "messages", "invalid_value"),
    ("chat/completions", {"model": MODEL, "messages": "hi"}, 400, "messages", "invalid_type"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages[0].role", "invalid_value"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     400, "messages[0].content[1].type", "invalid_value"),  # an image for the text-only TinyLM
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content", "invalid_type"),  # the field inside messages, as OpenAI names it
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": ""}]}, 400,
     "messages[0].content", "invalid_value"),  # a prompt of 0 tokens: the content it comes from, not "messages"
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": []}]}, 400,
     "messages[0].content", "invalid_value"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "\ud800"}]}, 400, "messages",
     "invalid_value"),  # text the tokenizer refuses: not an empty conversation
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a" * 300}]}, 400, "messages",
     "invalid_value"),  # past the context: the engine's "prompt" is the chat request's messages
    ("completions", {"model": MODEL, "prompt": "a" * 300}, 400, "prompt", "invalid_value"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "a"}], "tools": [{}]}, 400,
     "tools", "unsupported_value"),
    ("chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "a"}]}, 404, "model",
     "model_not_found"),
]


@pytest.mark.parametrize("endpoint, body, status, param, code", BAD, ids=range(len(BAD)))
def test_bad_input_gets_openai_error_body(server, endpoint, body, status, param, code):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server[1].url}/v1/{endpoint}", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status and r.headers["content-type"].startswith("application/json"), r.text
    error = r.json()["error"]
    assert set(r.json()) == {"error"} and set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error
    assert error["message"] and "Traceback" not in r.text


def test_a_refused_prompt_is_worded_for_the_request_that_sent_it(server):
    """The engine refuses its "prompt"; a chat request has no prompt field, so its 400 says "messages"."""
    for endpoint, body, field in [("chat/completions", {"messages": [{"role": "user", "content": "a" * 300}]},
                                   "messages"), ("completions", {"prompt": "a" * 300}, "prompt")]:
        r = httpx.post(f"{server[1].url}/v1/{endpoint}", json={"model": MODEL, **body})
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == field, r.text
        assert error["message"].startswith(f"{field} must be at most "), error["message"]


def test_the_service_still_answers_after_bad_input(server, client, model, tok):
    for body in (b"{", b'{"model": "tinylm", "prompt": "a", "max_tokens": 9999}'):
        r = httpx.post(server[1].url + "/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400
    assert client.completions.create(model=MODEL, prompt="9+5=", max_tokens=6, temperature=0).choices[0].text \
        == reference(model, tok, "9+5=", 6)


def test_a_request_larger_than_the_kv_pool_is_refused(model, tok):
    with serving(model, num_blocks=4) as (svc, srv, _):  # 64 token slots, less than the model's context
        assert svc.wait_ready(60)
        for stream in (False, True):
            r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "12+7=", "max_tokens": 100,
                                                               "stream": stream})
            assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_large", r.text
        ok = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "12+7=", "max_tokens": 8,
                                                            "temperature": 0})
        assert ok.json()["choices"][0]["text"] == reference(model, tok, "12+7=", 8)


def test_a_client_that_disconnects_mid_stream_is_aborted_and_its_blocks_freed(server):
    svc, srv, _ = server
    aborted = svc.stats()["finished_abort"]
    body = {"model": MODEL, "prompt": "The old sailor", "max_tokens": 200, "temperature": 0, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: ")).startswith("data: {")
    assert wait_for(lambda: svc.stats()["finished_abort"] == aborted + 1)
    assert wait_for(lambda: (svc.stats()["running"], svc.stats()["kv_blocks_used"]) == (0, 0))


def test_a_non_streaming_client_that_disconnects_is_aborted_too(server):
    svc, srv, _ = server
    aborted = svc.stats()["finished_abort"]
    body = {"model": MODEL, "prompt": "The old sailor", "max_tokens": 240, "temperature": 0}  # >= 0.2 s of steps
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", json=body, timeout=0.05)  # gives up before the answer
    assert wait_for(lambda: svc.stats()["finished_abort"] == aborted + 1)
    assert wait_for(lambda: (svc.stats()["running"], svc.stats()["kv_blocks_used"]) == (0, 0))


def test_health_is_503_while_loading_then_200(model):
    gate = threading.Event()
    with serving(model, gate, num_blocks=8) as (svc, srv, _):
        r = httpx.get(srv.url + "/health")
        assert (r.status_code, r.json()) == (503, {"status": "loading"})
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "1+1="})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
        gate.set()
        assert wait_for(lambda: httpx.get(srv.url + "/health").status_code == 200)


def test_a_failed_load_is_503_with_its_error(model):
    with serving(model, num_blocks=0) as (svc, srv, _):
        assert not svc.wait_ready(60)
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 503 and r.json()["status"] == "failed" and "num_blocks" in r.json()["error"]
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "1+1="})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"


def test_metrics_are_prometheus_text_and_move_with_requests(server, client):
    url = server[1].url
    before = metrics(url)
    for text in ("1+1=", "copy xy -> "):
        client.completions.create(model=MODEL, prompt=text, max_tokens=5, temperature=0)
    after = metrics(url)
    assert after["labkit:requests_total"] - before["labkit:requests_total"] == 2
    assert after["labkit:prompt_tokens_total"] - before["labkit:prompt_tokens_total"] == 4 + 11
    assert after["labkit:generation_tokens_total"] - before["labkit:generation_tokens_total"] == 10
    assert after["length"] - before["length"] == 2
    assert after["labkit:prefix_cache_queries_total"] > before["labkit:prefix_cache_queries_total"]
    assert after["labkit:engine_steps_total"] >= before["labkit:engine_steps_total"] + 5
    assert after["labkit:kv_cache_blocks_total"] == 64 and after["labkit:num_requests_running"] == 0
    assert {"labkit:num_requests_waiting", "labkit:num_requests_swapped", "labkit:kv_cache_usage_perc",
            "labkit:prefix_cache_hits_total", "labkit:num_preemptions_total"} <= set(after)


def test_an_unexpected_error_is_a_500_without_traceback_and_serving_goes_on(server, client):
    app, url = server[2], server[1].url

    def boom():
        raise RuntimeError("secret internals")

    def typed(n: int):
        return {"n": n}
    # Test-only routes on the real app: the only way to reach the catch-all and FastAPI's own validation.
    app.add_api_route("/test-boom", boom)
    app.add_api_route("/test-typed", typed)
    r = httpx.get(url + "/test-boom")
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "secret" not in r.text and "Traceback" not in r.text
    r = httpx.get(url + "/test-typed", params={"n": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert client.completions.create(model=MODEL, prompt="1+1=", max_tokens=2, temperature=0).choices


def test_an_error_after_the_stream_started_goes_in_band(model):
    with serving(model, num_blocks=32) as (svc, srv, _):
        assert svc.wait_ready(60)
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="any", max_retries=0, timeout=60)
        stream = c.completions.create(model=MODEL, prompt="The", max_tokens=200, temperature=0, stream=True)
        next(iter(stream))
        threading.Thread(target=svc.stop).start()  # the engine goes away while the stream runs
        with pytest.raises(openai.APIError, match="the service stopped"):
            list(stream)


def test_bad_arguments_are_refused(server):
    assert_refused(lambda: make_app("service"), TypeError, "service", "service", "a labkit.serving.Service")
    assert_refused(lambda: make_app(server[0], 5), TypeError, "model_name", 5, "a non-empty str")
    assert_refused(lambda: make_app(server[0], ""), ValueError, "model_name", "", "a non-empty str")
    assert_refused(lambda: ServerThread(server[2], port=-1), ValueError, "port", -1, "an int in [0, 65535]")
