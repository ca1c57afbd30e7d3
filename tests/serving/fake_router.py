"""A tiny in-process fake router for the Registrar's tests (tests/serving/test_register.py, test_main.py): a
stdlib ThreadingHTTPServer on a free port that records every call and answers the discovery protocol of
labkit.serving.register by hand. Not a labkit module: no test file of its own."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from labkit.serving.register import REGISTER_PATH


class FakeRouter:
    """calls is [(time, method, path, body)] (path unquoted, without its query; a DELETE's ?url= goes in body);
    forget(id) drops a registration (as a heartbeat timeout would); restart() forgets every one and issues ids
    from replica-1 again (a router restarted on the same port); 409 for a url registered twice; a heartbeat or
    DELETE whose url is not the id's: 404. `interval` is the heartbeat_interval its 201 advertises; `delays`
    holds the seconds the next answers wait, one each (a busy router), then none."""

    def __init__(self, port: int = 0, interval: float = 0.25):
        self.calls: list[tuple[float, str, str, dict]] = []
        self.ids: dict[str, str] = {}  # id -> url
        self.issued = 0
        self.interval, self.delays = interval, []
        self.lock = threading.Lock()
        router = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, status: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def handle_call(self):
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size)) if size else {}
                parts = urlsplit(self.path)
                body.update({k: v[0] for k, v in parse_qs(parts.query).items()})
                with router.lock:
                    router.calls.append((time.monotonic(), self.command, unquote(parts.path), body))
                    answer = router.route(self.command, parts.path, body)
                    delay = router.delays.pop(0) if router.delays else 0.0
                time.sleep(delay)
                try:
                    self.answer(*answer)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out meanwhile
                    pass

            do_POST = do_DELETE = handle_call

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.root = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def route(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        def error(status, message, param):
            return status, {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                      "code": None}}
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if method == "POST" and path == REGISTER_PATH:
            if body.get("url") in self.ids.values():
                return error(409, f"{body['url']} is registered already", "url")
            self.issued += 1
            id = f"replica-{self.issued}"
            self.ids[id] = body["url"]
            return 201, {"id": id, "heartbeat_interval": self.interval, "heartbeat_timeout": 1.0}
        if len(parts) < 2 or parts[1] not in self.ids:
            return error(404, f"no replica {parts[1:2]}", "id")
        if "url" in body and body["url"] != self.ids[parts[1]]:
            return error(404, f"{parts[1]} belongs to {self.ids[parts[1]]}, not {body['url']}", "id")
        if method == "POST" and parts[2:] == ["heartbeat"] and len(parts) == 3:
            return 200, {"status": "ok"}
        if method == "DELETE" and len(parts) == 2:
            del self.ids[parts[1]]
            return 200, {"status": "deregistered"}
        return error(400, "unexpected", None)

    def forget(self, id: str) -> None:
        with self.lock:
            del self.ids[id]

    def restart(self) -> None:
        with self.lock:
            self.ids, self.issued = {}, 0

    def of(self, method: str, path: str | None = None) -> list[tuple[float, str, str, dict]]:
        with self.lock:
            return [c for c in self.calls if c[1] == method and (path is None or c[2] == path)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
