"""processor: Prompt, OpenAI's message schema checked once, TinyLM's plain-text chat template (TextProcessor),
and the thread a Service runs its processor on."""
import asyncio
import threading

import pytest
from hypothesis import given, strategies as st

from labkit.serving.processor import (Processor, ProcessorThread, Prompt, TextProcessor, chat_prompt, message_parts,
                                      prompt_text)
from labkit.tinylm import ByteTokenizer
from tests.refusals import assert_refused

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def test_the_chat_template_is_the_contents_one_per_line():
    messages = [{"role": "system", "content": "3+4=7"}, {"role": "user", "content": "12+7="}]
    assert chat_prompt(messages) == "3+4=7\n12+7="
    assert chat_prompt([{"role": "user", "content": [{"type": "text", "text": "co"}, {"type": "text", "text": "py"}],
                         "name": "ann"}]) == "copy"
    with pytest.raises(ValueError, match="^messages must be messages whose role"):
        chat_prompt([{"role": "tool", "content": "x"}])
    with pytest.raises(TypeError, match="^messages must be a non-empty list"):
        chat_prompt([])


@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]),
                          st.lists(st.text(alphabet="abc=+ 0123", max_size=6), min_size=1, max_size=3)),
                min_size=1, max_size=4))
def test_text_processor_tokens_are_the_template_bytes(messages):
    """Independent reference: the template written out directly (join parts, then lines), as UTF-8 bytes."""
    body = [{"role": r, "content": [{"type": "text", "text": t} for t in parts]} for r, parts in messages]
    text = "\n".join("".join(parts) for _, parts in messages)
    if not text:
        with pytest.raises(ValueError):
            TextProcessor().chat(body)
        return
    prompt = TextProcessor().chat(body)
    assert prompt == Prompt(list(text.encode()))
    assert (prompt.mm, prompt.num_image_tokens) == ((), 0)


def test_message_parts_name_every_field():
    parts = message_parts([{"role": "user", "content": [{"type": "text", "text": "a"}, IMAGE]},
                           {"role": "assistant", "content": "b"}])
    assert [(role, [(p.kind, p.value, p.param) for p in ps]) for role, ps in parts] == [
        ("user", [("text", "a", "messages[0].content[0].text"),
                  ("image_url", "data:image/png;base64,AAAA", "messages[0].content[1].image_url.url")]),
        ("assistant", [("text", "b", "messages[1].content")])]
    user = lambda content: [{"role": "user", "content": content}]  # noqa: E731
    assert_refused(lambda: message_parts(user([{"type": "video"}])), ValueError, "messages[0].content[0].type",
                   "video", "one of")
    assert_refused(lambda: message_parts(user([{"type": "text", "text": 3}])), TypeError,
                   "messages[0].content[0].text", 3, "a string")
    assert_refused(lambda: message_parts(user([{"type": "image_url", "image_url": {"url": 5}}])), TypeError,
                   "messages[0].content[0].image_url", {"url": 5}, "an object")
    assert_refused(lambda: message_parts(user(None)), TypeError, "messages[0].content", None, "content parts")
    assert_refused(lambda: message_parts(user(["x"])), TypeError, "messages[0].content[0]", "x", "a content part")


def test_a_text_only_model_refuses_an_image_part_by_name():
    tp = TextProcessor()
    assert_refused(lambda: tp.chat([{"role": "user", "content": [{"type": "text", "text": "a"}, IMAGE]}]),
                   ValueError, "messages[0].content[1].type", "image_url", "takes no images")


def test_completion_prompts():
    tp = TextProcessor(ByteTokenizer())
    assert tp.completion("12+7=") == tp.completion(["12+7="]) == Prompt(list(b"12+7="))
    assert_refused(lambda: tp.completion(""), ValueError, "prompt", "", "a non-empty string")
    assert_refused(lambda: tp.completion([1, 2]), TypeError, "prompt", [1, 2], "a string")
    assert prompt_text("x", ["y"]) == "y"
    assert isinstance(tp, Processor) and not isinstance(object(), Processor)


def test_prompt_is_checked():
    assert Prompt([1, 2], (), 2).num_image_tokens == 2
    assert_refused(lambda: Prompt((1, 2)), TypeError, "token_ids", (1, 2), "a list")
    assert_refused(lambda: Prompt([1, -2]), TypeError, "token_ids", [1, -2], "ints >= 0")
    assert_refused(lambda: Prompt([1], [None]), TypeError, "mm", [None], "a tuple")
    assert_refused(lambda: Prompt([1], (), 2), ValueError, "num_image_tokens", 2, "in [0, 1]")
    with pytest.raises(TypeError, match="^tokenizer must be a tokenizer with encode"):
        TextProcessor(object())


def test_the_processor_runs_on_its_own_thread():
    seen = []

    class Recording(TextProcessor):
        def chat(self, messages):
            seen.append(threading.current_thread().name)
            return super().chat(messages)

    class Broken(TextProcessor):
        def completion(self, prompt):
            return "not a prompt"

    async def main():
        thread = ProcessorThread()
        try:
            got = await thread.run(Recording(), "chat", [{"role": "user", "content": "hi"}])
            with pytest.raises(ValueError, match="takes no images"):
                await thread.run(Recording(), "chat", [{"role": "user", "content": [IMAGE]}])
            with pytest.raises(RuntimeError, match="not a Prompt"):
                await thread.run(Broken(), "completion", "x")
            with pytest.raises(ValueError, match="^kind must be"):
                await thread.run(Recording(), "embed", "x")
            return got, threading.current_thread().name
        finally:
            thread.close()

    got, loop_thread = asyncio.run(main())
    assert got == Prompt(list(b"hi"))
    assert seen and all(name.startswith("labkit-processor") and name != loop_thread for name in seen)
