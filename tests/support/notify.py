"""A local HTTP endpoint that records the notification webhooks it receives and can hold its first answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.processes import free_port


class Hooks:
    """What the local webhook endpoint received, and how it answers."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.answered = 0
        # Cleared: the first request waits (un-answered) until the test sets it.
        self.release_first = threading.Event()
        self.release_first.set()
        self.lock = threading.Lock()

    def bodies(self, path: str = "/hook") -> list[dict[str, Any]]:
        with self.lock:
            return [body for at, body in self.received if at == path]


@contextmanager
def webhook_server(hooks: Hooks) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with hooks.lock:
                hooks.received.append((self.path, body))
                first = len(hooks.received) == 1
            if first:
                hooks.release_first.wait(60)
            self.send_response(hooks.status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            with hooks.lock:
                hooks.answered += 1

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        hooks.release_first.set()
        server.shutdown()
        server.server_close()
