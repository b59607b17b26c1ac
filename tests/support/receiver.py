"""A real webhook receiver for the tests: an HTTP server on a loopback port, in a thread of
its own, that keeps every request it gets (headers and body as received) and answers with
the status the test sets. ``stop`` closes its port (connections are refused) and ``start``
opens it again on the same port, for a receiver that goes down and comes back."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook

from .processes import free_port


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    started: float
    ended: float = 0.0
    status: int = 0  # what the receiver answered

    @property
    def message_id(self) -> str:
        return self.headers["webhook-id"]

    def verified(self, secret: str) -> Any:
        """The body, parsed, once its signature is checked with the library's verifier."""
        return Webhook(secret).verify(self.body, self.headers)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    port: int = field(default_factory=free_port)
    status: int = 200
    delay: float = 0.0  # seconds each answer takes
    statuses: dict[str, int] = field(default_factory=dict)  # per webhook-id, over ``status``
    got: list[Received] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                with receiver._lock:
                    receiver.in_flight += 1
                    receiver.most_in_flight = max(receiver.most_in_flight, receiver.in_flight)
                got = Received(
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(int(self.headers.get("content-length") or 0)),
                    time.monotonic(),
                )
                if receiver.delay:
                    time.sleep(receiver.delay)
                status = receiver.statuses.get(got.headers.get("webhook-id", ""), receiver.status)
                with receiver._lock:
                    receiver.in_flight -= 1
                    got.ended = time.monotonic()
                    got.status = status
                    receiver.got.append(got)
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def accepted(self) -> list[Received]:
        """The requests answered 2xx, in the order they arrived."""
        with self._lock:
            got = list(self.got)
        return [r for r in got if 200 <= r.status < 300]

    def ids(self) -> list[str]:
        with self._lock:
            return [r.message_id for r in self.got]
