"""Loopback HTTP file servers for download tests and benchmarks (127.0.0.1 only).

A FileServer serves an in-memory {path: bytes} map, honours `Range: bytes=N-`, logs every
request, and can misbehave on cue: each path has a script of actions consumed one per request,
after which `default` applies.
  "serve"         the file (206 for a Range request)
  "drop"          headers for the whole file, half the body, then close the connection
  "corrupt"       the file with one byte changed
  "ignore-range"  the whole file with 200 even when a Range was asked for
  <int>           that HTTP status with an empty body
A path ending in "/" is served as text/html, so a PEP 503 simple index is just more entries.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    range: str | None
    authorization: str | None = None


class FileServer:
    def __init__(
        self,
        files: dict[str, bytes],
        *,
        script: dict[str, list] | None = None,
        default="serve",
        latency: float = 0.0,
        rate: float | None = None,
    ):
        self.files = dict(files)
        self.script = {path: list(actions) for path, actions in (script or {}).items()}
        self.default = default
        self.latency = latency  # seconds added before every response
        self.rate = rate  # bytes per second per connection, None for unthrottled
        self.log: list[LoggedRequest] = []
        self.in_flight = 0  # requests inside their latency sleep right now
        self.max_in_flight = 0  # the most that ever overlapped
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        # a short poll interval so that shutdown() returns quickly
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def requests_for(self, path: str) -> list[LoggedRequest]:
        with self._lock:
            return [r for r in self.log if r.path == "/" + path.lstrip("/")]

    def next_action(self, method: str, path: str, range_header: str | None, authorization: str | None = None):
        with self._lock:
            self.log.append(LoggedRequest(method, path, range_header, authorization))
            queue = self.script.get(path.lstrip("/"), [])
            return queue.pop(0) if queue else self.default

    def __enter__(self) -> "FileServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler_for(server: FileServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, so client connection pools matter
        disable_nagle_algorithm = True  # as real servers do; else delayed ACKs add 40 ms a file

        def do_GET(self):
            range_header = self.headers.get("Range")
            action = server.next_action("GET", self.path, range_header, self.headers.get("Authorization"))
            with server._lock:
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            time.sleep(server.latency)
            with server._lock:
                server.in_flight -= 1
            body = server.files.get(self.path.lstrip("/"))
            if isinstance(action, int) or body is None:
                return self._empty(action if isinstance(action, int) else 404)
            if action == "corrupt":
                body = bytes([body[0] ^ 0xFF]) + body[1:]
            start = _range_start(range_header) if action != "ignore-range" else None
            if start is not None and start >= len(body):
                return self._empty(416, {"Content-Range": f"bytes */{len(body)}"})
            self.send_response(200 if start is None else 206)
            if start is not None:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                body = body[start:]
            self.send_header("Content-Length", str(len(body)))
            kind = "text/html" if self.path.endswith("/") else "application/octet-stream"
            self.send_header("Content-Type", kind)
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if action == "drop":
                self._write(body[: len(body) // 2])
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._write(body)

        def _empty(self, status: int, headers: dict | None = None):
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _write(self, body: bytes):
            step = 64 * 1024
            for i in range(0, len(body), step):
                self.wfile.write(body[i : i + step])
                if server.rate:
                    time.sleep(min(step, len(body) - i) / server.rate)

        def log_message(self, *args):  # keep test output clean
            pass

    return Handler


def _range_start(header: str | None) -> int | None:
    match = re.fullmatch(r"bytes=(\d+)-", header or "")
    return int(match.group(1)) if match else None


def free_port() -> int:
    """A loopback port nothing listens on (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port_url(path: str) -> str:
    """A loopback URL on which nothing listens: connections are refused."""
    return f"http://127.0.0.1:{free_port()}/{path}"
