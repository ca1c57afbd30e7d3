"""OpenAI's wire format: request checking, the chat template, and response bodies validated by the `openai`
package's own types (the reference for their shape). The HTTP status of every bad input is in test_api.py."""
import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from labkit._checks import fail
from labkit.serving.protocol import CHAT_STOP, DEFAULT_ONLY, APIError, Reply, parse_body, parse_request, refusal, sse
from labkit.serving.sampling import SamplingParams

M = "tinylm"


def test_defaults_are_openais():
    req = parse_request({"model": M, "prompt": "12+7="}, "completion", M)
    assert (req.prompt, req.params, req.stop, req.stream, req.include_usage) == \
        ("12+7=", SamplingParams(max_tokens=16, temperature=1.0), (), False, False)


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
