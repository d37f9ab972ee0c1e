"""A loopback file server that misbehaves the ways real mirrors do (127.0.0.1 only).

FaultServer is httpfixtures.FileServer (its script of actions per path, its request log, its
"serve", "drop", "corrupt", "ignore-range" and HTTP status actions) with the faults a download
can meet mid-body besides:
  "stall"     headers for the whole file, half the body, then nothing until `release` is set
              (or the server closes), then the rest: a mirror that hangs, or a process killed
              while it waits
  "endless"   200 with no Content-Length, the file, then more bytes until the client goes away
              (capped at ENDLESS_CAP so a client that never stops cannot fill the test's disk)
`wheel_lock` writes a small pip-only lock (lock.json, pylock.toml, requirements.lock) whose files
are served by such a server, for driving `envbuild wheelhouse` without a resolver.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from fixture_wheels import make_wheel
from httpfixtures import FileServer

ENDLESS_CAP = 64 << 20
_NEW = ("stall", "endless")


class FaultServer(FileServer):
    def __init__(self, files: dict[str, bytes], **kw):
        super().__init__(files, **kw)
        self.release = threading.Event()  # set: stalled responses go on
        self.stalled = threading.Event()  # set once a response is stalled (the test may act)
        self.sent_endless = 0  # bytes the endless action sent, all clients together
        self._closing = threading.Event()
        self._httpd.RequestHandlerClass = _fault_handler(self, self._httpd.RequestHandlerClass)
        # a client that goes away mid-body (the faults provoke it) is no error of the server's
        self._httpd.handle_error = lambda request, client_address: None

    def take_new_action(self, path: str, range_header: str | None):
        """The next action for `path` when it is one of this module's (logged and consumed, as
        FileServer.next_action does), else None: FileServer's handler takes that one."""
        with self._lock:
            queue = self.script.get(path.lstrip("/"), [])
            action = queue[0] if queue else self.default
            if action not in _NEW:
                return None
            if queue:
                queue.pop(0)
            from httpfixtures import LoggedRequest

            self.log.append(LoggedRequest("GET", path, range_header))
            return action

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self.release.set()
        super().__exit__(*exc)


def _fault_handler(server: FaultServer, base):
    class Handler(base):
        def do_GET(self):
            range_header = self.headers.get("Range")
            action = server.take_new_action(self.path, range_header)
            body = server.files.get(self.path.lstrip("/"))
            if action is None or body is None:
                return super().do_GET()
            try:
                if action == "stall":
                    self._stall(body, range_header)
                else:
                    self._endless(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (killed, or it stopped reading): what we wait for

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
            while not server.release.wait(0.05):
                pass
            if server._closing.is_set():
                self.close_connection = True
                return
            self.wfile.write(rest[half:])

        def _endless(self, body: bytes):
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            self.wfile.write(body)
            filler = b"\0" * (64 * 1024)
            sent = len(body)
            while sent < ENDLESS_CAP and not server._closing.is_set():
                self.wfile.write(filler)
                sent += len(filler)
                with server._lock:
                    server.sent_endless += len(filler)

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


def wheel_lock(lock_dir: Path, files: dict[str, bytes], base_url: str, profile: str = "demo",
               sizes: bool = True) -> Path:
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
        pylock += ["[[packages]]", f'name = "{project}"', f'version = "{version}"',
                   f"wheels = [{wheel}]", ""]
        req.append(f"{project}=={version} \\\n    --hash=sha256:{sha}")
    texts = {L.PYLOCK: "\n".join(pylock), L.REQUIREMENTS: "\n".join(req) + "\n"}
    meta = {"format": L.FORMAT, "profile": profile, "input_sha256": "0" * 64, "inputs": {},
            "parts": ["pip"], "target": TARGET, "sources": {"pypi": base_url},
            "files": {n: L.sha256_text(t) for n, t in texts.items()}}
    for name, text in {**texts, L.META: L.dumps(meta)}.items():
        (lock_dir / name).write_text(text, encoding="utf-8")
    return lock_dir


def resign(lock_dir: Path) -> None:
    """Re-sign lock.json over the files as they are now (as a careless hand edit would)."""
    from envbuilder.lock import lockfile as L

    meta = json.loads((lock_dir / L.META).read_text())
    meta["files"] = {n: L.sha256_text((lock_dir / n).read_text()) for n in meta["files"]}
    (lock_dir / L.META).write_text(L.dumps(meta))
