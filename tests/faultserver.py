"""A loopback file server that misbehaves the ways real mirrors do (127.0.0.1 only).

FaultServer is httpfixtures.FileServer (its script of actions per path, its request log, its
"serve", "drop", "corrupt", "ignore-range" and HTTP status actions) with the faults a download
can meet mid-body besides:
  "stall"     headers for the whole file, half the body, then nothing until `release` is set
              (or the server closes), then the rest: a mirror that hangs, or a process killed
              while it waits
  "endless"   200 with no Content-Length, the file (if any), then more bytes until the client
              goes away (capped at `endless_cap`, ENDLESS_CAP by default, so a client that never
              stops cannot fill the test's disk or memory); `sent_endless` counts the filler
and, for the network clients that read answers rather than files (registry, index, JSON APIs):
  "html"          200 text/html: a captive portal's sign-in page where JSON belongs
  ("json", v)     200 application/json, the JSON of v (a list, a string, anything)
  ("raw", b)      200 application/json with the bytes b as they are (deep nesting, junk)
  ("answer", status, {header: value}, body)   any answer (a 401 challenge, a HEAD without a
                  digest, a 429 with Retry-After)
  ("redirect", url)   302 to url (a loop: to itself; another host: another server's url)
  ("redirect", url, "endless")   302 to url, with a body that does not end
  "stall-header"  a status line and one header, then nothing until `release` (or close)
  "drip"          a status line, then one byte of an endless header every `drip_every` s
  "drip-body"     headers for a large body, then one byte of it every `drip_every` s
  "ranges"        the file, honouring `Range: bytes=A-B` (206): a wheel read by range requests
Paths are matched without their query string for these actions; HEAD takes the same actions
(without the body), and a HEAD for a plain file answers its status and length.
`wheel_lock` writes a small pip-only lock (lock.json, pylock.toml, requirements.lock) whose files
are served by such a server, for driving `envbuild wheelhouse` without a resolver.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path
from urllib.parse import urlsplit

from fixture_wheels import make_wheel
from httpfixtures import FileServer

ENDLESS_CAP = 64 << 20
_NEW = ("stall", "endless", "endless-html", "html", "stall-header", "drip", "drip-body", "ranges")
_NEW_TUPLES = ("json", "raw", "answer", "redirect")
CAPTIVE_PORTAL = (
    b"<!DOCTYPE html>\n<html><head><title>Sign in to the network</title></head>"
    b'<body><form action="/login">Accept the terms to go on</form></body></html>\n'
)


def _is_new(action) -> bool:
    return action in _NEW or (isinstance(action, tuple) and action and action[0] in _NEW_TUPLES)


class FaultServer(FileServer):
    def __init__(self, files: dict[str, bytes], **kw):
        super().__init__(files, **kw)
        self.release = threading.Event()  # set: stalled responses go on
        self.stalled = threading.Event()  # set once a response is stalled (the test may act)
        self.sent_endless = 0  # bytes the endless action sent, all clients together
        self.sent_drip = 0  # bytes the drip actions sent, all clients together
        self.endless_cap = ENDLESS_CAP
        self.drip_every = 0.2
        self._closing = threading.Event()
        self._httpd.RequestHandlerClass = _fault_handler(self, self._httpd.RequestHandlerClass)
        # a client that goes away mid-body (the faults provoke it) is no error of the server's
        self._httpd.handle_error = lambda request, client_address: None

    def take_new_action(
        self, path: str, range_header: str | None, method: str = "GET", authorization: str | None = None
    ):
        """The next action for `path` when it is one of this module's (logged and consumed, as
        FileServer.next_action does), else None: FileServer's handler takes that one."""
        with self._lock:
            queue = self.script.get(path.lstrip("/"))
            if queue is None:
                queue = self.script.get(urlsplit(path).path.lstrip("/"), [])
            action = queue[0] if queue else self.default
            if not _is_new(action):
                return None
            if queue:
                queue.pop(0)
            from httpfixtures import LoggedRequest

            self.log.append(LoggedRequest(method, path, range_header, authorization))
            return action

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self.release.set()
        super().__exit__(*exc)


def _fault_handler(server: FaultServer, base):
    class Handler(base):
        def do_GET(self):
            self._answer("GET")

        def do_HEAD(self):
            self._answer("HEAD")

        def _answer(self, method: str):
            range_header = self.headers.get("Range")
            action = server.take_new_action(
                self.path, range_header, method, self.headers.get("Authorization")
            )
            key = self.path.lstrip("/")
            body = server.files.get(key, server.files.get(urlsplit(self.path).path.lstrip("/")))
            if action is None:
                if method == "GET":
                    return super().do_GET()
                return self._head_of_file(range_header)
            self.head_only = method == "HEAD"
            try:
                if action == "stall":
                    self._stall(body or b"", range_header)
                elif action == "endless":
                    self._endless(body or b"")
                elif action == "endless-html":  # an index page that never ends (uv reads it whole)
                    self._endless(
                        b"<!DOCTYPE html><html><body>\n",
                        content_type="text/html",
                        filler=b'<a href="pkg-1.0.tar.gz">pkg-1.0.tar.gz</a><br/>\n' * 1500,
                    )
                elif action == "html":
                    self._send(200, {"Content-Type": "text/html; charset=utf-8"}, CAPTIVE_PORTAL)
                elif action == "stall-header":
                    self._stall_header()
                elif action == "drip":
                    self._drip()
                elif action == "drip-body":
                    self._drip_body()
                elif action == "ranges":
                    self._ranges(body, range_header)
                elif action[0] == "json":
                    self._send(200, {"Content-Type": "application/json"}, json.dumps(action[1]).encode())
                elif action[0] == "raw":
                    self._send(200, {"Content-Type": "application/json"}, action[1])
                elif action[0] == "answer":
                    self._send(action[1], action[2], action[3])
                elif action[0] == "redirect" and action[2:] == ("endless",):
                    self._endless(b"", 302, {"Location": action[1]})
                elif action[0] == "redirect":
                    self._send(302, {"Location": action[1]}, b"")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (killed, or it stopped reading): what we wait for

        def _send(self, status: int, headers: dict, body: bytes):
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not self.head_only:
                self.wfile.write(body)

        def _head_of_file(self, range_header):
            action = server.next_action("HEAD", self.path, range_header, self.headers.get("Authorization"))
            body = server.files.get(self.path.lstrip("/"))
            status = action if isinstance(action, int) else (404 if body is None else 200)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body) if status == 200 else 0))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

        def _wait_or_close(self) -> bool:
            """Wait for `release`; True when the server is closing (stop sending)."""
            while not server.release.wait(0.05):
                pass
            if server._closing.is_set():
                self.close_connection = True
                return True
            return False

        def _stall(self, body: bytes, range_header):
            from httpfixtures import _range_start

            start = _range_start(range_header) or 0
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            rest = body[start:]
            self.send_header("Content-Length", str(len(rest)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            half = len(rest) // 2
            self.wfile.write(rest[:half])
            self.wfile.flush()
            server.stalled.set()
            if self._wait_or_close():
                return
            self.wfile.write(rest[half:])

        def _endless(
            self,
            body: bytes,
            status: int = 200,
            headers: dict | None = None,
            content_type: str = "application/octet-stream",
            filler: bytes | None = None,
        ):
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", content_type)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            if self.head_only:
                return
            self.wfile.write(body)
            filler = filler or b"\0" * (64 * 1024)
            sent = len(body)
            while sent < server.endless_cap and not server._closing.is_set():
                self.wfile.write(filler)
                sent += len(filler)
                with server._lock:
                    server.sent_endless += len(filler)

        def _stall_header(self):
            self.close_connection = True
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n")
            self.wfile.flush()
            server.stalled.set()
            self._wait_or_close()

        def _drip(self):
            self.close_connection = True
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
            self.wfile.flush()
            server.stalled.set()
            self._drip_forever()

        def _drip_body(self):
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            self.wfile.flush()
            server.stalled.set()
            if not self.head_only:
                self._drip_forever()

        def _drip_forever(self):
            while not server._closing.wait(server.drip_every):
                self.wfile.write(b"a")
                self.wfile.flush()
                with server._lock:
                    server.sent_drip += 1

        def _ranges(self, body: bytes | None, range_header):
            if body is None:
                return self._send(404, {}, b"")
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header or "")
            if not m:
                return self._send(200, {"Accept-Ranges": "bytes"}, body)
            start = int(m[1])
            end = min(int(m[2]) if m[2] else len(body) - 1, len(body) - 1)
            if start > end:
                return self._send(416, {"Content-Range": f"bytes */{len(body)}"}, b"")
            self._send(
                206,
                {"Content-Range": f"bytes {start}-{end}/{len(body)}", "Accept-Ranges": "bytes"},
                body[start : end + 1],
            )

    return Handler


# ---- a small pip-only lock over the server's files ------------------------------------------

TARGET = {"platform": "linux-64", "python": "3.10", "python_platform": "x86_64-manylinux_2_35"}


def wheels(dest: Path, sizes: dict[str, int]) -> dict[str, bytes]:
    """{wheel file name: bytes} of stand-in wheels `name` weighing about `sizes[name]` bytes."""
    out = {}
    for name, payload in sizes.items():
        path = make_wheel(dest, name, "1.0", payload=payload)
        out[path.name] = path.read_bytes()
    return out


def wheel_lock(
    lock_dir: Path, files: dict[str, bytes], base_url: str, profile: str = "demo", sizes: bool = True
) -> Path:
    """A lock as `envbuild lock` writes it (format 2, pip part only) pinning `files` at
    base_url/<name>, with each file's sha256 (and size, unless `sizes` is False)."""
    from envbuilder.lock import lockfile as L

    lock_dir.mkdir(parents=True, exist_ok=True)
    pylock, req = ['lock-version = "1.0"', 'created-by = "envbuild tests"', ""], []
    for name, data in sorted(files.items()):
        project, version = name.split("-")[:2]
        sha = hashlib.sha256(data).hexdigest()
        size = f", size = {len(data)}" if sizes else ""
        wheel = f'{{ url = "{base_url}/{name}", hashes = {{ sha256 = "{sha}" }}{size} }}'
        pylock += ["[[packages]]", f'name = "{project}"', f'version = "{version}"', f"wheels = [{wheel}]", ""]
        req.append(f"{project}=={version} \\\n    --hash=sha256:{sha}")
    texts = {L.PYLOCK: "\n".join(pylock), L.REQUIREMENTS: "\n".join(req) + "\n"}
    meta = {
        "format": L.FORMAT,
        "profile": profile,
        "input_sha256": "0" * 64,
        "inputs": {},
        "parts": ["pip"],
        "target": TARGET,
        "sources": {"pypi": base_url},
        "files": {n: L.sha256_text(t) for n, t in texts.items()},
    }
    for name, text in {**texts, L.META: L.dumps(meta)}.items():
        (lock_dir / name).write_text(text, encoding="utf-8")
    return lock_dir


def resign(lock_dir: Path) -> None:
    """Re-sign lock.json over the files as they are now (as a careless hand edit would)."""
    from envbuilder.lock import lockfile as L

    meta = json.loads((lock_dir / L.META).read_text())
    meta["files"] = {n: L.sha256_text((lock_dir / n).read_text()) for n in meta["files"]}
    (lock_dir / L.META).write_text(L.dumps(meta))
