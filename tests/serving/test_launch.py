"""launch: `python -m labkit.serving` as a child process, started until healthy and always stopped."""
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
    with pytest.raises(RuntimeError, match=r"(?s)did not start: it exited with code 2.*no TinyLM checkpoint"):
        start_service(tmp_path / "missing", timeout=30)
    assert_refused(lambda: start_service(timeout=0), ValueError, "timeout", 0, "")


def test_explore_re_exports_the_launcher_for_the_notebook():
    assert explore.start_service is start_service and explore.ServiceProcess is ServiceProcess


@pytest.mark.timeout(60)
def test_a_folder_that_is_not_a_release_is_reported(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 2.*model_type must be one of \['tinyvlm'\]"):
        start_service(tmp_path, timeout=30)
