"""launch: `python -m labkit.serving` as a child process, started until healthy and always stopped."""
import socket
import urllib.request

import pytest

from labkit.serving import explore
from labkit.serving.launch import ServiceProcess, start_service
from tests.refusals import assert_refused


@pytest.mark.timeout(120)
def test_service_subprocess_starts_answers_and_stops():
    with start_service(timeout=90) as service:
        assert service.url.startswith("http://127.0.0.1:") and service.url.endswith("/v1")
        assert urllib.request.urlopen(service.root + "/health", timeout=10).status == 200
        assert "labkit:engine_steps_total" in service.get("/metrics")
        process = service.process
    assert process.poll() == 0 and service.stop() == 0  # stopped by the with block; stopping again is harmless


@pytest.mark.timeout(60)
def test_a_service_that_cannot_start_is_reported(tmp_path):
    with pytest.raises(RuntimeError, match=r"(?s)did not start: it exited with code 2.*no release there"):
        start_service(tmp_path / "missing", timeout=30)
    assert_refused(lambda: start_service(timeout=0), ValueError, "timeout", 0, "")


def test_explore_re_exports_the_launcher_for_the_notebook():
    assert explore.start_service is start_service and explore.ServiceProcess is ServiceProcess


@pytest.mark.timeout(60)
def test_a_folder_that_is_not_a_release_is_reported(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 2.*model_type must be one of \['tinyvlm'\]"):
        start_service(tmp_path, timeout=30)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # TinyLM's type, not TinyLM's config
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 2.*config.json.*vocab_size"):
        start_service(tmp_path, timeout=30)


@pytest.mark.timeout(120)
def test_the_port_is_an_argument_not_a_second_option():
    """Notebook 07 showed `--port 0 ... --port 53561`: the port is start_service(port=...), and --port among the
    options is refused before any process starts."""
    assert_refused(lambda: start_service(args=["--port", "8000"]), ValueError, "args", ["--port", "8000"],
                   "options without --port")
    assert_refused(lambda: start_service(port=70000), ValueError, "port", 70000, "an int in [0, 65535]")
    with socket.socket() as s:  # a port free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with start_service(port=port, timeout=90) as service:
        assert service.url == f"http://127.0.0.1:{port}/v1"
