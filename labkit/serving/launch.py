"""The service as a child process: `python -m labkit.serving ... --port 0` started, waited for until healthy,
and stopped whatever happens (notebook 06, section 6; the benchmarks and the subprocess tests use it too).

    with start_service(args=["--tp", "2"]) as service:        # blocks until /health answers 200
        client = openai.OpenAI(base_url=service.url, api_key="any", max_retries=0)
        ...
    service.returncode                                        # 0 after a clean SIGTERM
    start_service("data/tinyvlm", args=["--tp", "2"])         # a release folder (lab 07): its ranks load it

The command runs two processes for TinyLM (the API process, and the engine-core process it spawns: see
labkit.serving.__main__); stop() ends the API process, which ends its engine process (a kill of the API process
closes their pipe, and the engine process ends on that too).

A service that cannot start (exit 2: a bad option or folder; exit 1: the load failed, e.g. a rank could not read
its shard) raises RuntimeError with the reason and the end of its stderr.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Iterable

from .._checks import check_int, check_number, check_positive_int, fail
from ..paths import ROOT, TINYLM_CHECKPOINT


class ServiceProcess:
    """`python -m labkit.serving --model MODEL --port PORT [args]` running in a child process (MODEL: a TinyLM
    checkpoint or a release folder; PORT 0: a free one the service picks): `url` is its OpenAI base URL
    (http://127.0.0.1:PORT/v1) once /health answered 200; torch runs on `threads` threads (OMP_NUM_THREADS:
    TinyLM's matmuls are too small to gain from more, see the notebook). Use it in a `with` block (or call stop()
    in a finally): the process is stopped (SIGTERM, then kill) whatever happens, and its exit code is in
    `returncode`."""

    def __init__(self, model=TINYLM_CHECKPOINT, args: Iterable[str] = (), timeout: float = 60.0, threads: int = 1,
                 port: int = 0):
        check_number("timeout", timeout, low=0.0, low_open=True, unit="s")
        args = [str(a) for a in args]
        if "--port" in args or any(a.startswith("--port=") for a in args):
            fail("args", args, "options without --port (pass port=...)")
        check_int("port", port, 0, 65535)
        self._log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "labkit.serving", "--model", str(model), "--port", str(port), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(check_positive_int("threads", threads))}
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=ROOT, env=env)
        self.url = ""
        try:
            self._wait_ready(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, deadline: float) -> None:
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.process.stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = ""
        if " on http" not in line:
            if not line:  # stdout closed: the process is ending
                try:
                    self.process.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            code = self.process.poll()
            self._failed(f"it exited with code {code}" if code is not None else
                         f"no 'serving ... on URL' line (got {line.strip()!r})")
        self.url = line.rsplit(" on ", 1)[1].strip()
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._failed(f"it exited with code {self.process.returncode}")
            try:
                if urllib.request.urlopen(self.root + "/health", timeout=5).status == 200:
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self._failed("/health did not answer 200 in time")

    def _failed(self, why: str) -> None:
        self._log.seek(0)
        raise RuntimeError(f"the service did not start: {why}; its stderr: {self._log.read()[-1500:]}")

    @property
    def root(self) -> str:
        """http://127.0.0.1:PORT (the URL without /v1: /health and /metrics live here)."""
        return self.url.removesuffix("/v1")

    def get(self, path: str) -> str:
        """GET root + path (e.g. "/metrics"); the body as text."""
        with urllib.request.urlopen(self.root + path, timeout=10) as r:
            return r.read().decode()

    def stop(self, timeout: float = 15.0) -> int:
        """Stop the process (SIGTERM, then SIGKILL after `timeout` s); its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for f in (self.process.stdout, self._log):
            if f and not f.closed:
                f.close()
        return self.process.returncode

    @property
    def returncode(self) -> int | None:
        """The exit code once stopped (None while it runs)."""
        return self.process.poll()

    @property
    def pid(self) -> int:
        return self.process.pid

    def __enter__(self) -> "ServiceProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_service(model=TINYLM_CHECKPOINT, args: Iterable[str] = (), timeout: float = 60.0,
                  threads: int = 1, port: int = 0) -> ServiceProcess:
    """Start `python -m labkit.serving --model MODEL` (a TinyLM checkpoint or a release folder) on `port` (0: a
    free one) and wait until it is healthy (notebook 06, section 6; notebook 07 serves data/tinyvlm with it)."""
    return ServiceProcess(model, args, timeout, threads, port)
