"""OpenAI's wire format: request checking, the chat template, and response bodies validated by the `openai`
package's own types (the reference for their shape). The published request schema and the checks agree on every
body hypothesis makes (jsonschema, an independent validator, reads the schema). The HTTP status of every bad
input is in test_api.py."""
import functools
import json

import jsonschema
import pytest
from fastapi import FastAPI
from hypothesis import assume, given, settings, strategies as st
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from labkit._checks import fail
from labkit.serving import protocol
from labkit.serving.processor import CHAT_ROLES
from labkit.serving.protocol import CHAT_STOP, DEFAULT_ONLY, APIError, Reply, parse_body, parse_request, refusal, sse
from labkit.serving.sampling import SamplingParams

M = "tinylm"


def test_defaults_are_openais():
    req = parse_request({"model": M, "prompt": "12+7="}, "completion", M)
    assert (req.prompt, req.params, req.stop, req.stream, req.include_usage) == \
        ("12+7=", SamplingParams(max_tokens=16, temperature=1.0), (), False, False)


def test_null_is_the_default():
    body = {"model": M, "prompt": "12+7=", "max_tokens": None, "temperature": None, "top_p": None, "top_k": None,
            "stop": None, "stream": None, "stream_options": None, "seed": None}
    assert parse_request(body, "completion", M) == parse_request({"model": M, "prompt": "12+7="}, "completion", M)


@pytest.mark.parametrize("kind, fields, message", [
    ("completion", {"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
    ("completion", {"max_tokens": 2.5}, "max_tokens must be an int, got 2.5"),
    ("completion", {"temperature": "hot"}, "temperature must be a number, got 'hot'"),
    ("completion", {"top_p": 0}, "top_p must be > 0, got 0"),
    ("completion", {"seed": 2**64}, f"seed must be <= {2**64 - 1}, got {2**64}"),
    ("completion", {"prompt": 5}, "prompt must be a string or an array, got 5"),
    ("completion", {"prompt": [""]}, "prompt[0] must be a non-empty string, got ''"),
    ("completion", {"stop": list("abcde")}, "stop must be an array of at most 4 items, got ['a', 'b', 'c', 'd', 'e']"),
    ("completion", {"n": 2}, "n is not supported by this server (only 1), got 2"),
    ("completion", {"best_effort": 1}, "unrecognized request argument: best_effort"),
    ("chat", {"messages": [{"role": "robot", "content": "x"}]},
     "messages[0].role must be one of 'system', 'developer', 'user' or 'assistant', got 'robot'"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "audio"}]}]},
     "messages[0].content[0].type must be one of 'text', 'image_url', got 'audio'"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text is a required field"),
])
def test_a_refusal_names_the_field_the_value_and_what_was_expected(kind, fields, message):
    base = {"model": M, "prompt": "a"} if kind == "completion" else {"model": M, "messages": [{"role": "user",
                                                                                             "content": "a"}]}
    with pytest.raises(APIError) as info:
        parse_request({**base, **fields}, kind, M)
    assert (info.value.status, info.value.message) == (400, message)


def test_fields_map_to_sampling_params():
    body = {"model": M, "prompt": ["copy ab -> "], "max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "top_k": -1,
            "min_p": 0.1, "seed": 3, "stop": "\n", "stream": True, "stream_options": {"include_usage": True},
            "user": "someone", **{k: None for k in DEFAULT_ONLY}}
    req = parse_request(body, "completion", M)
    assert req.params == SamplingParams(max_tokens=9, temperature=0.5, top_p=0.9, top_k=0, min_p=0.1, seed=3)
    assert (req.prompt, req.stop, req.stream, req.include_usage) == ("copy ab -> ", ("\n",), True, True)


def test_fields_at_their_default_are_accepted():
    body = {"model": M, "messages": [{"role": "user", "content": "a"}], **DEFAULT_ONLY, "presence_penalty": 0.0,
            "max_tokens": 4, "max_completion_tokens": 7}
    body.pop("best_of"), body.pop("echo"), body.pop("suffix")
    req = parse_request(body, "chat", M)
    assert req.params.max_tokens == 7 and req.stop == CHAT_STOP


def test_completion_only_fields_are_unknown_to_chat():
    with pytest.raises(APIError) as info:
        parse_request({"model": M, "messages": [{"role": "user", "content": "a"}], "prompt": "x"}, "chat", M)
    assert (info.value.status, info.value.param, info.value.code) == (400, "prompt", "unknown_parameter")


def test_chat_messages_are_checked_and_passed_on_whole():
    messages = [{"role": "user", "content": [{"type": "text", "text": "colour="},
                                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]
    assert parse_request({"model": M, "messages": messages}, "chat", M).prompt == messages  # not flattened
    for content, param in [([{"type": "audio"}], "messages[0].content[0].type"),
                           ([{"type": "image_url", "image_url": "x"}], "messages[0].content[0].image_url"),
                           (7, "messages[0].content")]:
        with pytest.raises(APIError) as info:
            parse_request({"model": M, "messages": [{"role": "user", "content": content}]}, "chat", M)
        assert (info.value.status, info.value.param) == (400, param)


def refused(call) -> Exception:
    with pytest.raises(Exception) as info:
        call()
    return info.value


def test_refusals_name_their_argument_from_the_refusal_they_carry():
    e = refusal(refused(lambda: fail("max_tokens", 300, "<= 250")))
    assert (e.status, e.param, e.code, e.body()["error"]["message"]) == (400, "max_tokens", "invalid_value",
                                                                         "max_tokens must be <= 250, got 300")
    assert refusal(refused(lambda: fail("n", "2", "an int", TypeError))).code == "invalid_type"
    # the name is data, never parsed from the text: a message that merely looks like a refusal names nothing
    assert refusal(ValueError("max_tokens must be <= 250, got 300")).param is None
    assert refusal(TypeError("the pool is full"), default="prompt").param == "prompt"
    assert refusal(TypeError("x must be y, got z")).code == "invalid_type"
    assert refusal(refused(lambda: fail("messages[0].content[1].type", "y", "x")), default="messages").param == \
        "messages[0].content[1].type"  # the field the refusal names, else the default
    assert refusal(ValueError("the image is broken"), default="messages").param == "messages"
    assert refusal(refused(lambda: fail("a.b", "y", "x")), "a").param == "a"
    with pytest.raises(APIError, match="invalid JSON"):
        parse_body(b"{'single': 'quotes'}")
    assert parse_body(b'{"a": 1}') == {"a": 1}


def test_bodies_are_what_the_openai_client_parses():
    usage = Reply.usage(5, 3)
    text = Reply("completion", M)
    assert Completion.model_validate(text.full("19", "stop", usage)).usage.total_tokens == 8
    assert Completion.model_validate(text.chunk("1", "length", with_usage=True)).choices[0].text == "1"
    assert text.chunk("1")["choices"][0]["finish_reason"] is None  # OpenAI streams null until the end
    assert Completion.model_validate(text.usage_chunk(usage)).choices == []
    chat = Reply("chat", M)
    assert ChatCompletion.model_validate(chat.full("19", "length", usage)).choices[0].message.content == "19"
    first = ChatCompletionChunk.model_validate(chat.chunk("", first=True))
    last = ChatCompletionChunk.model_validate(chat.chunk("", "stop"))
    assert (first.choices[0].delta.role, last.choices[0].delta.content, last.choices[0].finish_reason) == \
        ("assistant", None, "stop")
    assert ChatCompletionChunk.model_validate(chat.usage_chunk(usage)).usage.completion_tokens == 3
    assert text.id.startswith("cmpl-") and chat.id.startswith("chatcmpl-") and text.id != Reply("completion", M).id


def test_server_sent_events():
    assert sse("[DONE]") == "data: [DONE]\n\n"
    assert json.loads(sse({"a": "é"})[len("data: "):]) == {"a": "é"} and sse({}).endswith("\n\n")


@functools.cache
def published(kind: str) -> jsonschema.Draft202012Validator:
    """A validator of the `kind` request body as /openapi.json publishes it (components and all)."""
    app = FastAPI()
    protocol.publish(app)
    name = protocol.request_schema(kind)["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return jsonschema.Draft202012Validator({"$ref": name, "components": app.openapi()["components"]})


def served(body: dict, kind: str) -> bool:
    """Whether parse_request takes `body`: a 400 refuses it; a well-formed body naming another model is a 404,
    which no schema can know of (the served model's id is the server's)."""
    try:
        parse_request(body, kind, M)
    except APIError as e:
        assert e.status == 400 or (e.status, e.code) == (404, "model_not_found"), e.message
        return e.status == 404
    return True


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=3), max_leaves=6)
edges = st.sampled_from([0, 1, 2, -1, -2, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 5.0, 2**64 - 1, 2**64, True, False, None, "",
                         "a", "none", "text", [], [""], ["a"], ["a", "b"], list("abcde"), {}, {"type": "text"},
                         {"include_usage": True}, {"a": 1}])  # each field's bounds, defaults and near misses
values = st.one_of(edges, edges, json_values)
COMPLETION_FIELDS = [*protocol.CompletionRequest.model_fields, "best_effort", "messages"]
CHAT_FIELDS = [*protocol.ChatCompletionRequest.model_fields, "prompt"]
text = st.text(max_size=3)
part = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": text}),
                 st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries(
                     {"url": text}, optional={"detail": text})}),
                 st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "audio"]) | json_values},
                                       optional={"text": json_values, "image_url": json_values}))
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(CHAT_ROLES), "content": text | st.lists(part, max_size=3)},
                          optional={"name": text}),
    st.fixed_dictionaries({}, optional={"role": st.sampled_from([*CHAT_ROLES, "robot"]) | json_values,
                                        "content": text | st.lists(part, max_size=2) | json_values}))


@settings(max_examples=400, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(COMPLETION_FIELDS), values, max_size=2),
       stream_options=st.none() | st.fixed_dictionaries({}, optional={"include_usage": json_values}))
def test_the_published_completion_schema_is_the_rule_the_server_applies(fields, stream_options):
    body = {"model": M, "prompt": "a", **fields}
    if stream_options is not None:
        body.update(stream=True, stream_options=stream_options)
    assume(body.get("stream_options") is None or body.get("stream") is True)  # a rule across fields: not a schema's
    assert published("completion").is_valid(body) == served(body, "completion"), body


@settings(max_examples=400, deadline=None)
@given(messages=st.lists(message, min_size=1, max_size=3) | json_values,
       fields=st.dictionaries(st.sampled_from(CHAT_FIELDS), values, max_size=2))
def test_the_published_chat_schema_is_the_rule_the_server_applies(messages, fields):
    body = {"model": M, "messages": messages, **fields}
    assume(body.get("stream_options") is None or body.get("stream") is True)
    assert published("chat").is_valid(body) == served(body, "chat"), body
