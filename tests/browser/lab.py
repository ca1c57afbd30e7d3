"""JupyterLab driven by headless Chromium, for the browser test (tests/browser/test_in_browser.py).

jupyter_lab() serves a folder on a free loopback port with its own settings (every cell kept in the page),
and stops the server and its kernels on exit; chromium() launches Debian's Chromium through playwright
(never `playwright install`); run_notebook() opens one notebook, runs all cells from the Run menu, moves one
control of every interactive widget and returns what it found. Every wait is on a condition in the page,
with a generous limit, never a fixed sleep: a busy 2-core machine is slow, not broken.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from tests.processes import children

CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
                {"windowingMode": "none", "autoStartDefaultKernel": True},
            "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                {"fetchNews": "false", "checkForUpdates": False}}
TRACEBACK = r"Traceback \(most recent call last\)|Error displaying widget|Failed to load model class"


def missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e .)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, method: str = "GET"):
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
        body = r.read()
        return json.loads(body) if body else None


class Lab:
    """A running JupyterLab: its base URL, token and the folder it serves."""

    def __init__(self, url: str, token: str, root: Path):
        self.url, self.token, self.root = url, token, root

    def api(self, path: str, method: str = "GET"):
        return _get(f"{self.url}/api/{path}?token={self.token}", method)

    def shutdown_kernels(self) -> None:
        for session in self.api("sessions"):
            self.api(f"sessions/{session['id']}", "DELETE")


def _write_settings(home: Path) -> dict[str, str]:
    for name, value in SETTINGS.items():
        path = home / "settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = {"JUPYTER_CONFIG_DIR": "config", "JUPYTER_RUNTIME_DIR": "runtime", "JUPYTERLAB_SETTINGS_DIR": "settings",
           "JUPYTERLAB_WORKSPACES_DIR": "workspaces", "IPYTHONDIR": "ipython"}
    return {k: str(home / v) for k, v in env.items()}


def kernel_threads() -> dict[str, str]:
    """OMP_NUM_THREADS for the kernels when pytest-xdist runs several workers: the cores shared out among them, so
    that two notebooks' torch thread pools do not spin on each other's cores (on 2 cores, 03, 06 and 09 on two
    workers: 8-15% less wall time, benchmarks/RESULTS.md). The notebooks' checks hold on one thread (the portable
    pass runs them so); a caller's own OMP_NUM_THREADS wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"OMP_NUM_THREADS": str(max(1, cores // workers))}


@contextmanager
def jupyter_lab(root: Path, home: Path, timeout: float = 180):
    """JupyterLab serving `root` on 127.0.0.1, its state under `home`; yields a Lab; stops it and its kernels.
    Its kernels run on kernel_threads()."""
    env = {**os.environ, **_write_settings(home), **kernel_threads()}
    token, log = secrets.token_hex(16), (home / "jupyterlab.log").open("w")
    for _ in range(3):  # a port taken between free_port() and the server's bind: try another
        port = free_port()
        args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                "--ServerApp.port_retries=0", f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}",
                "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        if os.geteuid() == 0:
            args.append("--allow-root")
        server = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        lab, deadline = Lab(f"http://127.0.0.1:{port}", token, root), time.monotonic() + timeout
        while server.poll() is None and time.monotonic() < deadline:
            try:
                lab.api("status")
                break
            except OSError:
                time.sleep(0.2)
        if server.poll() is None:
            break
    else:
        raise RuntimeError(f"JupyterLab did not start; see {home / 'jupyterlab.log'}")
    try:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"JupyterLab did not answer within {timeout:g} s")
        yield lab
    finally:
        kernels = children(server.pid)
        try:
            lab.shutdown_kernels()
        except OSError:
            pass
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)
        for pid in kernels:  # a kernel the server could not stop
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


@contextmanager
def chromium():
    """Headless Chromium (playwright, Debian's binary); closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, timeout=120_000)
        try:
            yield browser
        finally:
            browser.close()
