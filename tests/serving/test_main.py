"""`python -m labkit.serving` as a learner runs it: a subprocess on a free port, the `openai` client, a signal,
exit code 0; bad options exit 2 with a message."""
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from labkit.paths import ROOT, TINYLM_CHECKPOINT
from labkit.serving.__main__ import MODEL_TYPES, engine_loader, model_loader, parse_args, release_config
from labkit.serving.launch import start_service
from labkit.serving.register import REGISTER_PATH, heartbeat_path, replica_path
from labkit.tinylm import generate
from tests.refusals import assert_refused
from tests.serving.fake_router import FakeRouter, wait_until

LINE = re.compile(r"^serving (\S+) on (http://127\.0\.0\.1:(\d+)/v1)$")


def start(*args):
    return subprocess.Popen([sys.executable, "-m", "labkit.serving", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def first_line(proc, timeout: float = 60.0) -> str:
    lines = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert lines, "the service printed nothing"
    return lines[0].rstrip("\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_one_command_serves_the_openai_client_and_stops_on_a_signal(model, tok, sig):
    proc = start("--model", "data/tinylm", "--port", "0", "--num-blocks", "32")
    try:
        match = LINE.match(first_line(proc))
        assert match and match[1] == "tinylm", match
        deadline = time.monotonic() + 60
        while httpx.get(match[2][:-3] + "/health").status_code != 200:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        client = openai.OpenAI(base_url=match[2], api_key="any", max_retries=0, timeout=60)
        text = client.completions.create(model="tinylm", prompt="12+7=", max_tokens=8, temperature=0).choices[0].text
        assert text == tok.decode(generate(model, tok.encode("12+7="), 8))
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.timeout(60)
def test_a_missing_checkpoint_exits_2_with_a_message(tmp_path):
    proc = start("--model", str(tmp_path / "nothing"), "--port", "0")
    _, err = proc.communicate(timeout=50)
    assert proc.returncode == 2 and "nothing" in err and "no release there" in err


@pytest.mark.timeout(90)
def test_a_checkpoint_that_fails_to_load_exits_1(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(TINYLM_CHECKPOINT, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # cut short
    proc = start("--model", str(broken), "--port", "0")
    out, err = proc.communicate(timeout=80)
    assert LINE.match(out.splitlines()[0])  # it was serving (/health 503) while the load ran
    assert proc.returncode == 1 and "loading the model failed" in err and "model.safetensors" in err, err


def test_tinylm_s_release_is_served_here_and_names_the_model(tmp_path, capsys):
    args = parse_args(["--model", str(TINYLM_CHECKPOINT)])
    assert (args.load, args.stem, args.name) == (None, TINYLM_CHECKPOINT, "tinylm")
    (tmp_path / "x.safetensors").write_bytes(b"")  # weights without config.json: not a release
    with pytest.raises(SystemExit) as info:
        parse_args(["--model", str(tmp_path)])
    assert info.value.code == 2 and "no release there" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--port", "70000"], ["--tp", "0"], ["--num-blocks", "x"], ["--policy", "fifo"],
                                  [], ["--tp", "3"], ["--block-size", "12"], ["--stream-interval", "0"]])
def test_bad_options_exit_2(argv, capsys):
    model = [] if not argv else ["--model", "data/tinylm"]
    with pytest.raises(SystemExit) as info:
        parse_args(model + argv)
    assert info.value.code == 2 and capsys.readouterr().err.strip()


def test_options_reach_the_engine():
    args = parse_args(["--model", "data/tinylm", "--num-blocks", "40", "--block-size", "8", "--max-num-seqs",
                       "4", "--policy", "chunked", "--served-model-name", "tiny"])
    assert (args.stem, args.name) == (TINYLM_CHECKPOINT, "tiny")
    engine = engine_loader(args)()
    assert (engine.stats()["kv_blocks_total"], engine.block_manager.block_size) == (40, 8)
    assert (engine.scheduler.max_num_seqs, engine.scheduler.policy) == (4, "chunked")



def test_a_release_s_model_type_picks_its_loader(tmp_path, capsys):
    """MODEL_TYPES maps config.json's model_type to "module:function", imported only then (vLLM's lazy
    ModelRegistry); an unknown type, a config that is not JSON, and a folder without one exit 2 saying why."""
    assert model_loader("tinyvlm").__name__ == "labkit.day0.serve" and set(MODEL_TYPES) == {"tinyvlm"}
    assert_refused(lambda: model_loader("llama"), ValueError, "model_type", "llama", "one of ['tinyvlm']")
    for config, expected in [({"model_type": "gpt2"}, "model_type must be one of"),
                             ({}, "model_type must be one of"), ("{", "Expecting"), ([1], "expected an object")]:
        (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        with pytest.raises(SystemExit) as info:
            parse_args(["--model", str(tmp_path)])
        err = capsys.readouterr().err
        assert info.value.code == 2 and expected in err and str(tmp_path) in err, err
    (tmp_path / "config.json").unlink()
    assert release_config(str(tmp_path)) is None and release_config(str(tmp_path / "missing")) is None


@pytest.mark.timeout(120)
def test_register_joins_the_router_and_leaves_on_sigterm():
    """`--register ROOT` (lab 08): once healthy it registers its own /v1 URL (127.0.0.1 when it listens on
    0.0.0.0), heartbeats with its url and queue lengths at --heartbeat-interval, and deregisters on SIGTERM
    before exiting with code 0."""
    router = FakeRouter()
    try:
        args = ["--register", router.root, "--heartbeat-interval", "0.1", "--host", "0.0.0.0"]
        with start_service(args=args) as service:
            wait_until(lambda: len(router.of("POST", heartbeat_path("replica-1"))) >= 3, timeout=30)
            url = service.url.replace("//0.0.0.0:", "//127.0.0.1:")
            assert service.url.startswith("http://0.0.0.0:") and url.startswith("http://127.0.0.1:")
            assert router.of("POST", REGISTER_PATH)[0][3] == {"url": url, "model": "tinylm"}
            assert set(router.of("POST", heartbeat_path("replica-1"))[-1][3]) == {"url", "running", "waiting"}
            assert router.of("DELETE") == []
        assert service.returncode == 0
        assert [c[1:3] for c in router.of("DELETE")] == [("DELETE", replica_path("replica-1"))]
        assert router.ids == {}
    finally:
        router.close()


@pytest.mark.parametrize("argv", [["--heartbeat-interval", "0"], ["--heartbeat-interval", "x"],
                                  ["--heartbeat-interval", "inf"], ["--register", "not-a-url"],
                                  ["--register", "http://127.0.0.1:9000/v1"]])
def test_bad_register_options_exit_2_with_a_message(argv, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--model", "data/tinylm", *argv])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"argument {argv[0]}: must be" in err and argv[1] in err, err


def test_register_options_default_to_none_and_a_quarter_second():
    args = parse_args(["--model", "data/tinylm"])
    assert (args.register, args.heartbeat_interval) == (None, 0.25)
    args = parse_args(["--model", "data/tinylm", "--register", "http://127.0.0.1:9000/", "--heartbeat-interval", "1"])
    assert (args.register, args.heartbeat_interval) == ("http://127.0.0.1:9000", 1.0)
