"""Benchmark: lock the p40 profile's pip part with uv and with conda-lock's own pip solver.

Both resolve the same requirements (the p40 profile's torch, verl pins and verl, as `envbuild
lock` asks for them) against the same two loopback pypiservers: a PyTorch-like index whose torch
stand-in is --torch-mb of incompressible bytes, and a PyPI-like one. Both indexes are reached
through a relay that counts the bytes sent and caps each connection at --mb-per-s (a fast
mirror; 0 = loopback speed). Each run is a fresh process with empty caches (cold), as in CI.
Timed (median of --repeats):
  uv          `uv pip compile --generate-hashes` with envbuild's arguments (reads wheel METADATA
              with a range request, as pypiserver has no PEP 658 .metadata files)
  conda-lock  conda_lock.pypi_solver.solve_pypi (its vendored Poetry), which downloads whole
              wheels to read their metadata
Also reported: the bytes each received from the indexes, and whether both resolutions agree.

Run: .venv/bin/python bench/bench_lock.py [--torch-mb 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import lockfixtures as F  # noqa: E402
from envbuilder.model import matrix  # noqa: E402
from envbuilder.lock.pip import compile_args, parse, requirements_in, uv_bin  # noqa: E402
from envbuilder.model.resolve import resolve  # noqa: E402

CONDA_LOCK = textwrap.dedent("""
    import json, re, sys, tempfile, pathlib
    from conda_lock.lockfile.v1.models import HashModel
    from conda_lock.lockfile.v2prelim.models import LockedDependency
    from conda_lock.models.lock_spec import VersionedDependency
    from conda_lock.models.pip_repository import PipRepository
    from conda_lock.pypi_solver import solve_pypi
    reqs, indexes = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    mapping = pathlib.Path(tempfile.mkdtemp()) / "map.json"; mapping.write_text("{}")
    specs = {}
    for r in reqs:
        m = re.match(r"([A-Za-z0-9._-]+)(?:\\[([^\\]]+)\\])?(?:==(.+))?$", r)
        specs[m[1]] = VersionedDependency(name=m[1], manager="pip",
                                          version="==" + m[3] if m[3] else "*",
                                          extras=m[2].split(",") if m[2] else [])
    python = LockedDependency(name="python", version="3.10.0", manager="conda", platform="linux-64",
                              url="http://127.0.0.1/linux-64/python-3.10.0-h0_0.conda",
                              hash=HashModel(md5="0" * 32), categories={"main"})
    res = solve_pypi(pip_specs=specs, use_latest=[], pip_locked={}, conda_locked={"python": python},
                     python_version="3.10.0", platform="linux-64",
                     pip_repositories=[PipRepository.from_string(u) for u in indexes],
                     allow_pypi_requests=False, mapping_url=str(mapping))
    print(json.dumps(sorted([n, d.version] for n, d in res.items())))
""")


class Relay:
    """HTTP relay to an index on loopback: counts response bytes, caps the rate per connection."""

    def __init__(self, upstream: str, bytes_per_s: float):
        self.honor_range = True
        relay = self
        self.sent = 0
        self.lock = threading.Lock()
        origin = upstream.split("/simple/")[0]

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _relay(self, method: str):
                keep = ("range", "accept") if relay.honor_range else ("accept",)
                headers = {k: v for k, v in self.headers.items() if k.lower() in keep}
                req = urllib.request.Request(origin + self.path, method=method, headers=headers)
                try:
                    r = urllib.request.urlopen(req)
                except urllib.error.HTTPError as e:
                    r = e
                body = r.read() if method == "GET" else b""
                self.send_response(r.status if hasattr(r, "status") else r.code)
                for k, v in r.headers.items():
                    if k.lower() in ("content-type", "etag", "last-modified") or (
                        relay.honor_range and k.lower() in ("content-range", "accept-ranges")
                    ):
                        self.send_header(k, v)
                # links in pypiserver's pages point back at it: rewrite them to the relay
                body = body.replace(origin.encode(), relay.url.encode())
                length = len(body) if method == "GET" else r.headers.get("Content-Length", "0")
                self.send_header("Content-Length", str(length))
                self.end_headers()
                t0 = time.monotonic()
                for i in range(0, len(body), 256 * 1024):
                    chunk = body[i : i + 256 * 1024]
                    try:
                        self.wfile.write(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        return  # the client stopped reading: it has what it needed
                    with relay.lock:
                        relay.sent += len(chunk)
                    if bytes_per_s:
                        ahead = (i + len(chunk)) / bytes_per_s - (time.monotonic() - t0)
                        if ahead > 0:
                            time.sleep(ahead)

            def do_GET(self):
                self._relay("GET")

            def do_HEAD(self):
                self._relay("HEAD")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda *a: None  # clients drop keep-alive connections at exit
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def take(self) -> int:
        with self.lock:
            sent, self.sent = self.sent, 0
        return sent


def run_uv(env, pypi: str, torch: str) -> tuple[float, set]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "requirements.in").write_text(requirements_in(env))
        e = dict(os.environ, UV_CACHE_DIR=str(tmp / "cache"), UV_PYTHON_DOWNLOADS="never")
        args = compile_args(env.name, env.python, "2.35", pypi, torch)
        t0 = time.perf_counter()
        p = subprocess.run(
            [
                uv_bin(),
                "pip",
                "compile",
                "requirements.in",
                *args,
                "--generate-hashes",
                "-q",
                "-o",
                "requirements.lock",
            ],
            cwd=tmp,
            env=e,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - t0
        assert p.returncode == 0, p.stderr
        got = {(n, x.version) for n, x in parse((tmp / "requirements.lock").read_text()).items()}
        return seconds, got


def run_conda_lock(env, pypi: str, torch: str) -> tuple[float, set]:
    reqs = [r for r in requirements_in(env).splitlines() if r]
    with tempfile.TemporaryDirectory() as tmp:
        e = dict(os.environ, XDG_CACHE_HOME=tmp)  # Poetry's cache (pypoetry-conda-lock) starts empty
        t0 = time.perf_counter()
        p = subprocess.run(
            [sys.executable, "-c", CONDA_LOCK, json.dumps(reqs), json.dumps([torch, pypi])],
            env=e,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - t0
        assert p.returncode == 0, p.stderr[-3000:]
        got = {(n.lower(), v) for n, v in json.loads(p.stdout.strip().splitlines()[-1])}
        return seconds, got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch-mb", type=int, default=100, help="size of the torch stand-in wheel")
    ap.add_argument(
        "--mb-per-s", type=float, default=50.0, help="per-connection rate cap of the indexes (0: no cap)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ["ENVBUILD_NO_CACHE"] = "1"
    env = resolve(matrix.load(), "p40")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wheels = F.p40_wheels(tmp / "torch", tmp / "pypi", torch_payload=args.torch_mb * 2**20)
        with F.PypiServer(tmp / "torch") as torch, F.PypiServer(tmp / "pypi") as pypi:
            rate = args.mb_per_s * 2**20
            relays = [Relay(torch.url, rate), Relay(pypi.url, rate)]
            torch_url, pypi_url = (f"{r.url}/simple/" for r in relays)
            results = {}
            for ranges in (True, False):
                for r in relays:
                    r.honor_range = ranges
                for _ in range(args.repeats):
                    for name, fn in (("uv", run_uv), ("conda-lock", run_conda_lock)):
                        for r in relays:
                            r.take()
                        seconds, got = fn(env, pypi_url, torch_url)
                        results.setdefault((name, ranges), []).append(
                            (seconds, sum(r.take() for r in relays), got)
                        )
        torch_size = wheels["torch"].stat().st_size
    print(
        f"p40 pip part ({len(results['uv', True][0][2])} packages), torch stand-in "
        f"{torch_size / 2**20:.0f} MiB, pypiserver on loopback at "
        f"{f'{args.mb_per_s:g} MiB/s per connection' if args.mb_per_s else 'full speed'}, "
        f"cold caches, median of {args.repeats}"
    )
    print(f"{'index':<22}{'solver':<12}{'seconds':>9}{'MiB received':>14}")
    med = {}
    for (name, ranges), runs in results.items():
        med[name, ranges] = statistics.median(r[0] for r in runs)
        print(
            f"{'Range requests' if ranges else 'no Range (200 only)':<22}{name:<12}"
            f"{med[name, ranges]:>9.2f}{statistics.median(r[1] for r in runs) / 2**20:>14.1f}"
        )
    for ranges in (True, False):
        print(
            f"conda-lock / uv, {'with' if ranges else 'without'} Range: "
            f"{med['conda-lock', ranges] / med['uv', ranges]:.1f}x"
        )
    sets = [runs[0][2] for runs in results.values()]
    print("same resolution:", "yes" if all(x == sets[0] for x in sets) else "NO")


if __name__ == "__main__":
    main()
