"""The conventions a client of vLLM expects, against the in-process service (tests/serving/test_api.py's
`serving`) with the real `openai` client and raw httpx: /openapi.json and /docs as vLLM serves them, every answer
documented in /openapi.json and a 405 with its `Allow` header, a body that is not JSON refused with a 415 and
OpenAI's error body, empty prompts and messages as vLLM treats them, and vLLM's spellings of the common options
of `python -m labkit.serving`. Nothing here reaches the network (/docs is fetched from the local server; the CDN
it names is never loaded)."""
import httpx
import jsonschema
import openai
import pytest

from labkit.cluster.policies import make_policy
from labkit.cluster.registry import Registry
from labkit.cluster.router import Router, make_router_app
from labkit.paths import TINYLM_CHECKPOINT
from labkit.serving.__main__ import engine_loader, parse_args
from labkit.serving.config import EngineConfig
from tests.serving.answers import Answer, methods_not_served, undocumented
from tests.serving.test_api import MODEL, reference, serving

pytestmark = pytest.mark.timeout(120)
ENDPOINTS = {"/v1/completions": "post", "/v1/chat/completions": "post", "/v1/models": "get",
             "/v1/models/{model_id}": "get", "/health": "get", "/metrics": "get"}


@pytest.fixture(scope="module")
def server(model):
    with serving(model, num_blocks=32) as (svc, srv, app):
        assert svc.wait_ready(60), svc.error
        yield srv.url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="any", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def schema(server):
    r = httpx.get(server + "/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    return r.json()


def body_schema(schema: dict, path: str) -> dict:
    """The request body's schema of POST `path`, with the components its $ref points into."""
    body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**body, "components": schema["components"]}


def required(schema: dict, path: str) -> list[str]:
    return schema["components"]["schemas"][body_schema(schema, path)["$ref"].rsplit("/", 1)[1]]["required"]


def test_openapi_json_describes_the_real_endpoints(schema):
    assert schema["openapi"].startswith("3.") and schema["info"]["title"] == "labkit serving"
    assert {path: set(ops) for path, ops in schema["paths"].items()} == {p: {m} for p, m in ENDPOINTS.items()}
    assert required(schema, "/v1/completions") == ["model", "prompt"]
    assert required(schema, "/v1/chat/completions") == ["model", "messages"]


def answer(response: httpx.Response) -> Answer:
    return Answer(response.request.method, response.request.url.path, response.status_code,
                  response.headers.get("content-type"), response.headers.get("allow"))


def test_every_answer_is_documented_in_openapi_json(server, schema):
    """One request for each kind of answer (200 as JSON, as a stream, as text; 400, 404, 413, 415); each status and
    media type is in the schema the server publishes (503 and 499: tests/serving/test_api.py's, held against it
    by `serving`)."""
    def post(path, **kw):
        return httpx.post(server + path, timeout=60, **kw)
    replies = [httpx.get(server + "/health"), httpx.get(server + "/v1/models"), httpx.get(server + "/metrics"),
               httpx.get(server + f"/v1/models/{MODEL}"), httpx.get(server + "/v1/models/gpt-4"),
               post("/v1/completions", json={"model": MODEL, "prompt": "1+1=", "max_tokens": 2}),
               post("/v1/completions", json={"model": MODEL, "prompt": "1+1=", "max_tokens": 2, "stream": True}),
               post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "1"}]}),
               post("/v1/completions", json={"model": MODEL, "prompt": 5}),
               post("/v1/chat/completions", content=b"{", headers={"content-type": "application/json"}),
               post("/v1/completions", json={"model": "gpt-4", "prompt": "1+1="}),
               post("/v1/completions", content=b"{}", headers={"content-type": "text/plain"}),
               post("/v1/completions", json={"model": MODEL, "prompt": "a" * 1_000_001})]
    assert [r.status_code for r in replies] == [200] * 4 + [404] + [200] * 3 + [400, 400, 404, 415, 413]
    assert replies[2].headers["content-type"].startswith("text/plain")
    assert replies[6].headers["content-type"].startswith("text/event-stream")
    assert [why for r in replies if (why := undocumented(schema, answer(r)))] == []
    bare = {**schema, "paths": {p: {m: {**op, "responses": {"200": op["responses"]["200"]}} for m, op in ops.items()}
                                for p, ops in schema["paths"].items()}}
    assert undocumented(bare, answer(replies[4])), "a schema without the 404 must not pass the check"


def test_a_method_a_path_does_not_serve_is_a_405_whose_allow_names_those_it_does(server, schema):
    r = httpx.put(server + "/v1/completions")
    assert (r.status_code, r.headers["allow"], r.json()["error"]["code"]) == (405, "POST", "method_not_allowed")
    assert httpx.delete(server + "/v1/models/tinylm").headers["allow"] == "GET"
    assert methods_not_served(server, schema) == []


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"model": MODEL, "prompt": "1+1=", "max_tokens": 2, "temperature": 0, "stop": ["x"]}),
    ("/v1/completions", {"model": MODEL, "prompt": ["ab"], "max_tokens": 2, "top_p": 0.5, "top_k": 3, "seed": 1,
                         "stream": True, "stream_options": {"include_usage": True}, "user": "u"}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text",
                                                                                        "text": "9+5="}]}],
                              "max_completion_tokens": 3, "min_p": 0.1}),
])
def test_bodies_the_server_serves_fit_the_schema_it_publishes(server, schema, path, body):
    r = httpx.post(server + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    jsonschema.validate(body, body_schema(schema, path))


@pytest.mark.parametrize("path, body", [("/v1/completions", {"model": MODEL, "prompt": 5}),
                                        ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}),
                                        ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": "5"}),
                                        ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}),
                                        ("/v1/chat/completions", {"model": MODEL})])
def test_bodies_refused_for_their_types_do_not_fit_the_schema(server, schema, path, body):
    assert httpx.post(server + path, json=body).status_code == 400
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, body_schema(schema, path))


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_are_html_that_load_the_schema(server, page):
    r = httpx.get(server + page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in r.text and "<html>" in r.text.lower()


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "application/jsonl", "multipart/form-data; boundary=x"])
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_a_body_that_is_not_declared_json_gets_415_with_openai_s_error_body(server, endpoint, content_type):
    body = b'{"model": "tinylm", "prompt": "1+1=", "messages": [{"role": "user", "content": "1+1="}]}'
    headers = {} if content_type is None else {"content-type": content_type}
    r = httpx.post(f"{server}/v1/{endpoint}", content=body, headers=headers)
    assert r.status_code == 415 and r.headers["content-type"] == "application/json", r.text
    assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "invalid_request_error",
                                  "param": None, "code": "unsupported_media_type"}}
    message = r.json()["error"]["message"]
    assert message.startswith("Content-Type must be application/json")
    assert message.endswith(f'got "{content_type}"' if content_type else "got no Content-Type header"), message


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON"])
def test_json_with_parameters_or_in_capitals_is_json(server, model, tok, content_type):
    r = httpx.post(server + "/v1/completions", headers={"content-type": content_type}, timeout=60,
                   content=b'{"model": "tinylm", "prompt": "12+7=", "max_tokens": 5, "temperature": 0}')
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == reference(model, tok, "12+7=", 5), r.text


@pytest.mark.parametrize("prompt, param", [("", "prompt"), ([""], "prompt[0]")])
def test_an_empty_prompt_is_refused_naming_prompt_as_vllm_does(client, prompt, param):
    """vLLM's CompletionRequest refuses "" with a 400, param "prompt": "Either prompt or prompt_embeds must be
    provided and non-empty." (this server takes no prompt_embeds); in a list of one, the param is the element."""
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    assert (info.value.status_code, info.value.param, info.value.code) == (400, param, "invalid_value")
    assert info.value.body["message"] == f"{param} must be a non-empty string, got ''"


def test_an_empty_message_among_others_is_served(client, model, tok):
    """vLLM accepts an empty content (its chat template still renders tokens); here the template puts the
    contents one per line, so an empty last message leaves the prompt "3+4=7\\n" and the reply continues it."""
    messages = [{"role": "system", "content": "3+4=7"}, {"role": "user", "content": ""}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    offline = reference(model, tok, "3+4=7\n", 12)
    want, reason = (offline.split("\n")[0], "stop") if "\n" in offline else (offline, "length")
    assert (reply.choices[0].message.content, reply.choices[0].finish_reason) == (want, reason)
    assert reply.usage.prompt_tokens == len("3+4=7\n")


@pytest.mark.parametrize("content", ["", [], [{"type": "text", "text": ""}]])
def test_a_conversation_of_no_token_is_refused_naming_the_content(client, content):
    """One empty message renders to 0 tokens: vLLM's engine refuses that prompt ("The decoder prompt cannot be
    empty"); the 400 names the content it comes from, messages[0].content, not messages."""
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4)
    assert (info.value.param, info.value.code) == ("messages[0].content", "invalid_value")
    assert info.value.body["message"].startswith("messages[0].content must hold text or an image (")
    assert "the decoder prompt cannot be empty" in info.value.body["message"]


def options(*argv) -> dict:
    return vars(parse_args(["--model", "data/tinylm", *argv]))


@pytest.mark.parametrize("labkit, vllm", [
    (["--tp", "2"], ["--tensor-parallel-size", "2"]),
    (["--tp", "2"], ["-tp", "2"]),
    ([], ["--enable-prefix-caching"]),
])
def test_vllm_spellings_parse_to_the_same_options(labkit, vllm):
    assert options(*vllm) == options(*labkit)


def test_vllm_spellings_reach_the_engine_config():
    args = parse_args(["--model", "data/tinylm", "--tensor-parallel-size", "2", "--max-num-seqs", "4",
                       "--block-size", "8", "--no-enable-prefix-caching", "--served-model-name", "tiny"])
    assert (args.tp, args.name, args.stem) == (2, "tiny", TINYLM_CHECKPOINT)
    assert args.config == EngineConfig(block_size=8, max_num_seqs=4, enable_prefix_caching=False, history_limit=1000)
    assert parse_args(["--model", "data/tinylm"]).config.enable_prefix_caching is True  # vLLM V1's default too


def test_no_enable_prefix_caching_turns_the_engine_s_prefix_cache_off():
    on = engine_loader(parse_args(["--model", "data/tinylm", "--num-blocks", "8"]))()
    off = engine_loader(parse_args(["--model", "data/tinylm", "--num-blocks", "8", "--no-enable-prefix-caching"]))()
    assert (on.block_manager.enable_prefix_caching, off.block_manager.enable_prefix_caching) == (True, False)


@pytest.mark.parametrize("argv", [["--tensor-parallel-size", "3"], ["--tensor-parallel-size", "0"],
                                  ["--enable-prefix-caching", "yes"]])
def test_bad_vllm_spelled_options_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--model", "data/tinylm", *argv])
    assert info.value.code == 2 and capsys.readouterr().err.strip()


def test_the_router_publishes_its_schema_too():
    """Lab 08's router (labkit.cluster.router): the same generated /openapi.json, built without serving."""
    paths = make_router_app(Router(Registry(), make_policy("round_robin"))).openapi()["paths"]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/replicas"} <= set(paths)
