"""The service: one engine thread, asyncio streams, text with stop strings, loading states, aborts. Reference:
the offline Engine (Engine.generate), and for stop strings the brute force of test_detokenize."""
import asyncio
import functools
import json
import threading
import time

import httpx
import pytest
import torch

from labkit.kv_cache import LargerThanPoolError
from labkit.paths import TINYLM_CHECKPOINT
from labkit.serving.config import EngineConfig
from labkit.serving.core import checkpoint_engine
from labkit.serving.engine import Engine
from labkit.serving.mm import MultiModalInput
from labkit.serving.processor import Prompt, TextProcessor
from labkit.serving.runner import ModelRunner
from labkit.serving.sampling import SamplingParams
from labkit.serving.api import ServerThread, make_app
from labkit.serving.service import Service, ServiceUnavailable
from labkit.tinylm import ByteTokenizer, generate
from tests.serving.test_detokenize import stopped_reference
from tests.refusals import assert_refused

GREEDY = SamplingParams(max_tokens=12, temperature=0)


def run(coro, timeout: float = 60.0):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


async def until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def service(model):
    svc = Service(lambda: Engine(model, num_blocks=64, max_num_seqs=8)).start()
    assert svc.wait_ready(60), svc.error
    yield svc
    svc.stop()


def offline(model, prompts, params=GREEDY):
    return Engine(model, num_blocks=64).generate([list(p) for p in prompts], params)


def test_outputs_equal_the_offline_engine(service, model, tok, prompts):
    chosen = prompts[:8]

    async def one(p):
        return await (await service.submit(p, GREEDY)).collect()

    async def everything():
        return await asyncio.gather(*(one(p) for p in chosen))
    got = run(everything())
    for p, out, ref in zip(chosen, got, offline(model, chosen)):
        assert (out.text, out.num_tokens, out.finish_reason, out.error) == (tok.decode(ref), len(ref), "length", None)


def test_text_prompts_are_encoded_with_the_tokenizer(service, model, tok):
    out = run(run_text(service, "copy abc -> "))
    assert out.text == tok.decode(offline(model, [tok.encode("copy abc -> ")])[0])


async def run_text(service, text, params=GREEDY, stop=()):
    return await (await service.submit(text, params, stop)).collect()


def test_tokens_that_queued_up_go_out_in_one_chunk(service, model, tok, prompts):
    async def unread_then_read():
        before = service.stats().get("finished_length", 0)
        stream = await service.submit(prompts[0], GREEDY)
        await until(lambda: service.stats().get("finished_length", 0) > before)
        return [c async for c in stream]
    chunks = run(unread_then_read())
    ref = offline(model, prompts[:1])[0]
    assert [(c.text, c.num_tokens, c.finish_reason) for c in chunks] == [(tok.decode(ref), len(ref), "length")]


def test_a_stop_string_ends_the_request_and_is_not_output(service, model, tok, prompts):
    ref = offline(model, prompts[3:4], SamplingParams(max_tokens=40, temperature=0))[0]
    text = tok.decode(ref)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    want, _ = stopped_reference(text, [stop])
    out = run(run_text(service, prompts[3], SamplingParams(max_tokens=40, temperature=0), (stop,)))
    assert (out.text, out.finish_reason) == (want, "stop")
    assert out.num_tokens == len(tok.encode(want + stop))  # every token up to the one completing the stop
    assert wait_for(lambda: service.stats()["running"] == 0 and service.stats()["kv_blocks_used"] == 0)


def test_abort_frees_the_requests_blocks(service, prompts):
    async def read_one_then_abort():
        stream = await service.submit(prompts[0], SamplingParams(max_tokens=200, temperature=0))
        first = await stream.__anext__()
        stream.abort()
        return first
    aborted = service.stats().get("finished_abort", 0)
    first = run(read_one_then_abort())
    assert first.num_tokens >= 1 and first.finish_reason is None
    assert wait_for(lambda: service.stats()["finished_abort"] == aborted + 1)
    assert (service.stats()["running"], service.stats()["kv_blocks_used"]) == (0, 0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("process", [False, True], ids=["engine thread", "engine process"])
def test_refusals_come_back_at_submit_and_the_service_keeps_serving(model, tok, process):
    """The engine's refusals, raised as it raised them (type and message), by either backend (the process's
    come back pickled in Outputs)."""
    if process:
        load = functools.partial(checkpoint_engine, TINYLM_CHECKPOINT, 1, EngineConfig(num_blocks=4), 1)
    else:
        load = lambda: Engine(model, num_blocks=4)  # noqa: E731
    svc = Service(load, process=process).start()  # 64 token slots: less than the context
    try:
        assert svc.wait_ready(90), svc.error
        with pytest.raises(ValueError, match="^prompt must be"):
            run(svc.submit("", GREEDY))
        with pytest.raises(ValueError, match="^max_tokens must be"):
            run(svc.submit("12+7=", SamplingParams(max_tokens=255, temperature=0)))
        with pytest.raises(LargerThanPoolError):
            run(svc.submit("12+7=", SamplingParams(max_tokens=100, temperature=0)))
        out = run(run_text(svc, "12+7=", SamplingParams(max_tokens=4, temperature=0)))
        assert out.text == tok.decode(offline(model, [tok.encode("12+7=")], SamplingParams(max_tokens=4,
                                                                                             temperature=0))[0])
    finally:
        svc.stop()


def test_loading_then_ready_then_stopped(model):
    gate, closed = threading.Event(), []
    svc = Service(lambda: gate.wait(30) and Engine(model, num_blocks=8), close=closed.append).start()
    try:
        assert svc.state == "loading" and not svc.wait_ready(0.2)
        with pytest.raises(ServiceUnavailable, match="loading"):
            run(svc.submit("1+1=", GREEDY))
        gate.set()
        assert svc.wait_ready(60) and svc.state == "ready"
    finally:
        gate.set()
        svc.stop()
    assert svc.state == "stopped" and not svc.alive
    assert len(closed) == 1 and isinstance(closed[0], Engine)  # close(engine) ran once, on stop
    with pytest.raises(ServiceUnavailable):
        run(svc.submit("1+1=", GREEDY))


def test_a_failed_load_is_a_state_with_its_error(tmp_path):
    from labkit.tinylm import load_pretrained
    svc = Service(lambda: Engine(load_pretrained(tmp_path / "nothing")[0])).start()
    assert not svc.wait_ready(60)
    assert svc.state == "failed" and "FileNotFoundError" in svc.error and "nothing" in svc.error
    with pytest.raises(ServiceUnavailable, match="failed"):
        run(svc.submit("1+1=", GREEDY))
    svc.stop()


def test_an_idle_engine_thread_blocks(service):
    steps, cpu = service.stats()["steps"], time.process_time()
    time.sleep(0.5)
    assert service.stats()["steps"] == steps
    assert time.process_time() - cpu < 0.25  # a busy loop would burn about 0.5 s of CPU here


def test_stop_ends_running_requests_with_an_error(model, prompts):
    svc = Service(lambda: Engine(model, num_blocks=64)).start()
    assert svc.wait_ready(60)

    async def stop_midway():
        stream = await svc.submit(prompts[0], SamplingParams(max_tokens=200, temperature=0))
        first = await stream.__anext__()
        await asyncio.get_running_loop().run_in_executor(None, svc.stop)
        return first, await stream.collect()
    first, rest = run(stop_midway())
    assert first.error is None and rest.error == "the service stopped" and rest.finish_reason is None
    assert not svc.alive


class FailingRunner(ModelRunner):
    """Test double (the only way to make the real Engine fail mid-request on one process, as a TP rank that dies
    would): the real runner, raising from its 4th execute on (the warmup is the 1st)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = 0

    def execute(self, step):
        self.calls += 1
        if self.calls >= 4:
            raise RuntimeError("rank 1 died")
        return super().execute(step)


def test_an_engine_failure_fails_its_requests_in_band_and_the_service(model, prompts):
    svc = Service(lambda: Engine(runner=FailingRunner(model, 16, 16), num_blocks=16)).start()
    assert svc.wait_ready(60)

    async def until_it_breaks():
        stream = await svc.submit(prompts[0], SamplingParams(max_tokens=50, temperature=0))
        return [c async for c in stream]
    chunks = run(until_it_breaks())
    assert sum(c.num_tokens for c in chunks) == 2 and chunks[-1].error.startswith("the engine failed")
    assert svc.state == "failed" and "rank 1 died" in svc.error and wait_for(lambda: not svc.alive)
    with pytest.raises(ServiceUnavailable, match="rank 1 died"):
        run(svc.submit("1+1=", GREEDY))
    svc.stop()
    assert svc.state == "failed"


def test_bad_arguments_are_refused(service):
    assert_refused(lambda: Service(5), TypeError, "load", 5, "a callable")
    assert_refused(lambda: Service(dict, close=3), TypeError, "close", 3, "a callable")
    assert_refused(lambda: run(service.submit("1+1=", {"max_tokens": 3})), TypeError, "params", {"max_tokens": 3},
                   "SamplingParams")
    assert_refused(lambda: service.wait_ready(-1), ValueError, "timeout", -1, "seconds")


def test_stream_interval_sends_tokens_in_steps(model, tok):
    """--stream-interval 4: every streamed chunk but the last carries 4 tokens; the text is the same."""
    service = Service(lambda: Engine(model), stream_interval=4).start()
    server = ServerThread(make_app(service)).start()
    try:
        assert service.wait_ready(60)
        body = {"model": "tinylm", "prompt": "The old sailor", "max_tokens": 10, "temperature": 0, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body) as r:
            texts = [json.loads(line[6:])["choices"][0]["text"] for line in r.iter_lines()
                     if line.startswith("data: {")]
        expected = tok.decode(generate(model, tok.encode("The old sailor"), 10))
        assert "".join(texts) == expected and [len(t.encode()) for t in texts] == [4, 4, 2]
    finally:
        server.stop()
        service.stop()


class Shouting(ByteTokenizer):
    """A tokenizer whose text is upper case: shows which tokenizer the service decoded with."""

    def decode_bytes(self, ids) -> bytes:
        return super().decode_bytes(ids).upper()


class Recording(TextProcessor):
    """TinyLM's processor, remembering the threads it ran on."""

    def __init__(self):
        super().__init__()
        self.threads = []

    def completion(self, prompt):
        self.threads.append(threading.current_thread().name)
        return super().completion(prompt)


def test_a_loader_may_bring_its_processor_and_tokenizer(model, tok):
    processor = Recording()
    svc = Service(lambda: (Engine(model, num_blocks=16), processor, Shouting())).start()
    try:
        assert svc.wait_ready(60), svc.error
        assert svc.processor is processor and isinstance(svc.tokenizer, Shouting)

        async def main():
            prompt = await svc.process("completion", "copy abc -> ")
            return prompt, await (await svc.submit(prompt, GREEDY)).collect(), threading.current_thread().name
        prompt, out, loop_thread = run(main())
        assert prompt == Prompt(tok.encode("copy abc -> "))
        assert out.text == tok.decode(offline(model, [prompt.token_ids])[0]).upper()
        assert processor.threads and all(t.startswith("labkit-processor") and t != loop_thread
                                         for t in processor.threads)
        with pytest.raises(ValueError, match="takes no images"):
            run(svc.process("chat", [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]))
    finally:
        svc.stop()
    with pytest.raises(ServiceUnavailable):
        run(svc.process("completion", "1+1="))
    bad = Service(lambda: (Engine(model, num_blocks=8), "not a processor")).start()
    assert not bad.wait_ready(60) and "processor must be a Processor" in bad.error
    bad.stop()


def test_image_inputs_reach_the_engine(service, model):
    """A Prompt's mm (image features at placeholder positions) goes to engine.add_request(mm=...): the answer is
    the offline engine's for the same inputs, and differs from the one without them."""
    d = model.cfg.d_model
    torch.manual_seed(0)
    image = MultiModalInput(offset=2, length=3, hash="picture", embeds=torch.randn(3, d) * 3)
    ids = list(b"ab...=")
    prompt = Prompt(ids, (image,), 3)

    async def main():
        stream = await service.submit(prompt, GREEDY)
        return stream.num_prompt_tokens, await stream.collect()
    n, out = run(main())
    engine = Engine(model, num_blocks=64)
    rid = engine.add_request(ids, GREEDY, mm=(image,))
    engine.run_until_done()
    assert n == len(ids) and out.text == ByteTokenizer().decode(engine.get(rid).output)
    assert out.text != ByteTokenizer().decode(offline(model, [ids])[0])
