"""The engine core in its own process (Service(process=True), what `python -m labkit.serving` runs): the same
outputs as the offline Engine, /health naming the engine process, a killed engine process failing its requests
in-band (never a hang), and no process left after stop (refusals: test_service.py, both backends). References:
Engine.generate run here, and /proc for the processes."""
import asyncio
import functools
import os
import pickle
import signal
import time

import httpx
import pytest

from labkit.paths import TINYLM_CHECKPOINT
from labkit.serving.api import ServerThread, make_app
from labkit.serving.config import EngineConfig
from labkit.serving.core import (AbortRequest, AddRequest, EngineCore, Outputs, Ready, Stop, checkpoint_engine)
from labkit.serving.engine import Engine
from labkit.serving.processor import TextProcessor
from labkit.serving.sampling import SamplingParams
from labkit.serving.service import Service, ServiceUnavailable
from tests.processes import children, gone
from tests.refusals import assert_refused

pytestmark = pytest.mark.timeout(120)
GREEDY = SamplingParams(max_tokens=12, temperature=0)


def run(coro, timeout: float = 60.0):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def spawned(num_blocks: int = 64, tp: int = 1) -> Service:
    load = functools.partial(checkpoint_engine, TINYLM_CHECKPOINT, tp, EngineConfig(num_blocks=num_blocks), 1)
    svc = Service(load, process=True).start()
    assert svc.wait_ready(90), svc.error
    return svc


@pytest.fixture(scope="module")
def service():
    svc = spawned()
    yield svc
    svc.stop()


def offline(model, prompts, params=GREEDY):
    return Engine(model, num_blocks=64).generate([list(p) for p in prompts], params)


async def texts(svc, prompts, params=GREEDY):
    streams = [await svc.submit(p, params) for p in prompts]
    return [(await s.collect()) for s in streams]


def test_messages_are_frozen_and_pickle(model):
    for msg in (AddRequest("r", [1, 2], GREEDY), AbortRequest("r"), Stop(), Ready(7),
                Outputs((("r", 5, None),), ("r",), (), (("q", ValueError("x")),), {"steps": 1})):
        back = pickle.loads(pickle.dumps(msg))
        assert type(back) is type(msg) and repr(back) == repr(msg)
    with pytest.raises(AttributeError):
        AbortRequest("r").request_id = "s"


def test_the_core_answers_commands_with_one_outputs_per_step(model, prompts):
    core = EngineCore(Engine(model, num_blocks=64))
    assert core.handle(AddRequest("a", list(prompts[0]), GREEDY)) and core.handle(AddRequest("b", [], GREEDY))
    first = core.step()
    assert first.admitted == ("a",) and [r for r, _ in first.refused] == ["b"]
    assert isinstance(first.refused[0][1], ValueError) and first.tokens[0][0] == "a"
    tokens = [first.tokens[0][1]]
    while core.busy:
        tokens += [t for _, t, _ in core.step().tokens]
    assert tokens == offline(model, [prompts[0]])[0] and not core.handle(Stop())


def test_outputs_equal_the_offline_engine_and_health_names_the_process(service, model, tok, prompts):
    outs = run(texts(service, prompts[:6]))
    want = offline(model, prompts[:6])
    assert [o.num_tokens for o in outs] == [len(w) for w in want]
    assert [o.text for o in outs] == [tok.decode(w) for w in want]
    assert service.engine_pid != os.getpid() and service.alive and service.engine_pid in children(os.getpid())
    server = ServerThread(make_app(service)).start()
    try:
        r = httpx.get(server.url + "/health")
        assert (r.status_code, r.json()) == (200, {"status": "ready",
                                                   "engine": {"pid": service.engine_pid, "alive": True}})
    finally:
        server.stop()


def test_abort_frees_the_blocks_in_the_engine_process(service, prompts):
    async def read_one_then_abort():
        stream = await service.submit(prompts[0], SamplingParams(max_tokens=200, temperature=0))
        first = await stream.__anext__()
        stream.abort()
        return first
    aborted = service.stats()["finished_abort"]
    assert run(read_one_then_abort()).num_tokens >= 1
    deadline = time.monotonic() + 20
    while service.stats()["finished_abort"] != aborted + 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (service.stats()["finished_abort"], service.stats()["running"], service.stats()["kv_blocks_used"]) == \
        (aborted + 1, 0, 0)


def test_an_idle_engine_process_blocks(service):
    steps, before = service.stats()["steps"], _cpu(service.engine_pid)
    time.sleep(0.5)
    assert service.stats()["steps"] == steps and _cpu(service.engine_pid) - before < 0.25


def _cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_killed_engine_process_fails_requests_in_band_and_health(prompts):
    svc = spawned()
    server = ServerThread(make_app(svc)).start()
    try:
        pid = svc.engine_pid

        async def kill_midway():
            stream = await svc.submit(prompts[0], SamplingParams(max_tokens=200, temperature=0))
            first = await stream.__anext__()
            os.kill(pid, signal.SIGKILL)
            return first, await stream.collect()
        first, rest = run(kill_midway(), timeout=30)
        assert first.error is None and rest.error.startswith("the engine failed") and rest.finish_reason is None
        assert svc.state == "failed" and "engine process died (exit code -9)" in svc.error and gone(pid)
        r = httpx.get(server.url + "/health")
        assert r.status_code == 503 and r.json()["status"] == "failed" and r.json()["engine"]["alive"] is False
        r = httpx.post(server.url + "/v1/completions", json={"model": "tinylm", "prompt": "1+1="}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
        with pytest.raises(ServiceUnavailable, match="died"):
            run(svc.submit("1+1=", GREEDY))
    finally:
        server.stop()
        svc.stop()


def test_stop_ends_the_process_and_running_requests(prompts):
    svc = spawned()
    pid = svc.engine_pid

    async def stop_midway():
        stream = await svc.submit(prompts[0], SamplingParams(max_tokens=200, temperature=0))
        first = await stream.__anext__()
        await asyncio.get_running_loop().run_in_executor(None, svc.stop)
        return first, await stream.collect()
    first, rest = run(stop_midway())
    assert first.error is None and rest.error == "the service stopped" and svc.state == "stopped"
    assert gone(pid) and not svc.alive
    with pytest.raises(ServiceUnavailable):
        run(svc.submit("1+1=", GREEDY))


def test_tp2_engine_process_starts_its_ranks_and_stop_ends_them_all(model, prompts):
    svc = spawned(tp=2)
    pid = svc.engine_pid
    ranks = children(pid)
    try:
        assert len(ranks) >= 2  # the gloo ranks are the engine process's children
        assert [o.num_tokens for o in run(texts(svc, prompts[:2]))] == [len(w) for w in offline(model, prompts[:2])]
    finally:
        svc.stop()
    assert all(gone(p) for p in [pid, *ranks])


def test_a_failed_load_in_the_engine_process_is_a_state(tmp_path):
    svc = Service(functools.partial(checkpoint_engine, tmp_path / "nothing", 1, EngineConfig()), process=True)
    svc.start()
    assert not svc.wait_ready(60)
    assert svc.state == "failed" and "FileNotFoundError" in svc.error and "nothing" in svc.error
    assert gone(svc.engine_pid)
    svc.stop()


def test_what_cannot_go_to_a_process_is_refused(model):
    closure = lambda: Engine(model)  # noqa: E731 - what a notebook passes: it cannot be pickled
    assert_refused(lambda: Service(closure, process=True), TypeError, "load", closure, "picklable")
    load = functools.partial(checkpoint_engine, TINYLM_CHECKPOINT, 1, EngineConfig())
    assert_refused(lambda: Service(load, close=print, process=True), TypeError, "close", print, "None")
    assert_refused(lambda: Service(load, process=1), TypeError, "process", 1, "a bool")
    assert_refused(lambda: Service(load, load_processor=print), TypeError, "load_processor", print, "process=True")
    assert_refused(lambda: Service(load, process=True, load_processor=7), TypeError, "load_processor", 7, "callable")


def test_a_processor_loads_once_the_engine_process_is_ready_and_its_failure_is_a_state(tok):
    """load_processor (lab 07's vision encoder) runs in this process after the engine said Ready, while the
    service still says loading; its processor and tokenizer then serve; a loader that raises fails the service
    naming why and ends the engine process."""
    seen = []

    def load_processor():
        seen.append(svc.state)
        return TextProcessor(tok), tok
    load = functools.partial(checkpoint_engine, TINYLM_CHECKPOINT, 1, EngineConfig(num_blocks=16), 1)
    svc = Service(load, process=True, load_processor=load_processor).start()
    try:
        assert svc.wait_ready(90), svc.error
        assert seen == ["loading"] and svc.tokenizer is tok and isinstance(svc.processor, TextProcessor)
        assert run(texts(svc, ["12+7="], SamplingParams(max_tokens=2, temperature=0)))[0].num_tokens == 2
    finally:
        svc.stop()

    def broken():
        raise ValueError("no vision tower in this folder")
    svc = Service(load, process=True, load_processor=broken).start()
    try:
        assert not svc.wait_ready(90) and svc.state == "failed"
        assert svc.error == "loading the processor failed: ValueError: no vision tower in this folder"
        assert gone(svc.engine_pid)
    finally:
        svc.stop()
