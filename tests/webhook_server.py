"""A real HTTP server on the loopback interface, for the webhook publisher's tests (in-process
and with real worker processes): it answers each POST as told and keeps what came."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay: float = 0.0  # before the status line
    drip: float = 0.0  # between the bytes of the body, sent one at a time
    endless: bool = False  # a body that never ends
    interim: tuple[int, ...] = ()  # informational (1xx) answers sent at once, before the delay
    head_drip: float = 0.0  # between the bytes of the headers (the status line comes at once)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = 0.0  # time.time() when it came


class Server:
    """Answers each POST with ``answer_for(received)`` when given, else the next of ``answers``
    (200 when none is left); keeps what came, in order."""

    def __init__(self, answer_for: Callable[[Received], Answer] | None = None) -> None:
        self.answers: list[Answer] = []
        self.received: list[Received] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                got = Received(
                    self.path, dict(self.headers.items()), self.rfile.read(length), time.time()
                )
                with outer.lock:
                    outer.received.append(got)
                    if answer_for is not None:
                        answer = answer_for(got)
                    else:
                        answer = outer.answers.pop(0) if outer.answers else Answer()
                try:
                    for status in answer.interim:
                        self.wfile.write(f"HTTP/1.1 {status} Informational\r\n\r\n".encode())
                        self.wfile.flush()
                    time.sleep(answer.delay)
                    if answer.head_drip:
                        self.wfile.write(f"HTTP/1.1 {answer.status} OK\r\n".encode())
                        for byte in f"X-Pad: {'p' * 100}\r\n".encode():
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(answer.head_drip)
                        return  # never gets to the end of the headers
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    if answer.endless or answer.drip:
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        sent = 0
                        while answer.endless or sent < len(answer.body):
                            self.wfile.write(b"1\r\nx\r\n")
                            self.wfile.flush()
                            sent += 1
                            time.sleep(answer.drip)
                        self.wfile.write(b"0\r\n\r\n")
                    else:
                        self.send_header("Content-Length", str(len(answer.body)))
                        self.end_headers()
                        self.wfile.write(answer.body)
                except OSError:
                    pass  # the client went away: what a dripping answer is for

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
