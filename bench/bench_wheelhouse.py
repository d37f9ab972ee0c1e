"""Benchmark: offline wheelhouse export (`envbuild wheelhouse`, and its engine fetch_all) against
sequential downloads of the same lock.

A loopback PEP 503 index serves N generated wheels, adding a fixed latency to every request
and throttling each connection, as a remote mirror does. Timed (median of --repeats runs):
  pip download   real `pip download --no-deps -r req.txt` from that index, one by one
                 (includes pip's start-up and one index-page request per package)
  sequential     fetch_all(jobs=1): the same engine and requests, one file at a time
  parallel       fetch_all(jobs=--jobs)
  envbuild       the whole `envbuild wheelhouse` process on a lock of the same files (a bench
                 input written here: pylock.toml, requirements.lock, lock.json), jobs=--jobs
  no-op          `envbuild wheelhouse` again into the full wheelhouse (hash checks, no request)

Run: .venv/bin/python bench/bench_wheelhouse.py [--files 40] [--size-kib 256] [--latency-ms 50]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from envbuilder.offline.fetch import FetchItem, fetch_all  # noqa: E402
from fixture_wheels import make_wheel  # noqa: E402
from httpfixtures import FileServer  # noqa: E402


def bench_wheel(work: Path, name: str, payload_size: int) -> tuple[str, bytes]:
    """A real, installable py3-none-any wheel whose bulk is incompressible bytes."""
    path = make_wheel(work / "wheels", name, "1.0", payload=payload_size)
    return path.name, path.read_bytes()


def simple_index(wheels: dict[str, tuple[str, bytes]]) -> dict[str, bytes]:
    """The server's files: /simple/ pages (PEP 503) linking to /files/<wheel>#sha256=..."""
    tree = {"simple/": "".join(f'<a href="{n}/">{n}</a>\n' for n in wheels).encode()}
    for name, (filename, data) in wheels.items():
        digest = hashlib.sha256(data).hexdigest()
        link = f'<a href="../../files/{filename}#sha256={digest}">{filename}</a>\n'
        tree[f"simple/{name}/"] = link.encode()
        tree[f"files/{filename}"] = data
    return tree


def timed(run, repeats: int, prepare=lambda: None) -> float:
    """Median wall time of `run` over `repeats`, with `prepare` untimed before each."""
    times = []
    for _ in range(repeats):
        prepare()
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def pip_download(index_url: str, requirements: Path, dest: Path) -> None:
    # --isolated and a PIP_-free environment: only our index, no local wheel caches or mirrors
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--isolated",
            "--no-deps",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "-q",
            "--index-url",
            index_url,
            "-d",
            str(dest),
            "-r",
            str(requirements),
        ],
        check=True,
        env=env,
    )


def bench_lock(lock: Path, wheels: dict[str, tuple[str, bytes]], url) -> None:
    """A pip-only lock of the generated wheels, as `envbuild lock` writes it (the bench's input)."""
    from envbuilder.lock import lockfile as L

    pylock, req = ['lock-version = "1.0"', 'created-by = "bench"', ""], []
    for name, (filename, data) in wheels.items():
        digest = hashlib.sha256(data).hexdigest()
        pylock += [
            "[[packages]]",
            f'name = "{name}"',
            'version = "1.0"',
            f'wheels = [{{ url = "{url(filename)}", size = {len(data)}, hashes = '
            f'{{ sha256 = "{digest}" }} }}]',
            "",
        ]
        req.append(f"{name}==1.0 \\\n    --hash=sha256:{digest}")
    files = {L.PYLOCK: "\n".join(pylock), L.REQUIREMENTS: "\n".join(req) + "\n"}
    meta = {
        "format": L.FORMAT,
        "profile": "bench",
        "input_sha256": "0" * 64,
        "inputs": {},
        "parts": ["pip"],
        "sources": {"pypi": url("")},
        "target": {"platform": "linux-64", "python": "3.10", "python_platform": "x86_64-manylinux_2_35"},
        "files": {n: L.sha256_text(t) for n, t in files.items()},
    }
    lock.mkdir(parents=True, exist_ok=True)
    for name, text in {**files, L.META: L.dumps(meta)}.items():
        (lock / name).write_text(text)


def envbuild_wheelhouse(lock: Path, dest: Path, jobs: int) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "envbuilder",
            "wheelhouse",
            "bench",
            "--lock-dir",
            str(lock),
            "-o",
            str(dest),
            "--jobs",
            str(jobs),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--size-kib", type=int, default=256)
    parser.add_argument("--latency-ms", type=float, default=50)
    parser.add_argument("--rate-mib", type=float, default=20, help="per-connection throughput")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-pip", action="store_true", help="skip the pip download baseline")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-wheels-") as made:
        wheels = {
            f"benchpkg{i:03d}": bench_wheel(Path(made), f"benchpkg{i:03d}", args.size_kib * 1024)
            for i in range(args.files)
        }
    total_bytes = sum(len(data) for _, data in wheels.values())
    server = FileServer(
        simple_index(wheels), latency=args.latency_ms / 1000, rate=args.rate_mib * 1024 * 1024
    )
    with server, tempfile.TemporaryDirectory(prefix="bench-fetch-") as tmp:
        work = Path(tmp)
        items = [
            FetchItem(fn, hashlib.sha256(data).hexdigest(), (server.url(f"files/{fn}"),), len(data))
            for fn, data in wheels.values()
        ]
        quiet = lambda event: None  # noqa: E731 - the bench prints its own table

        def fresh(name: str):
            return lambda: _empty_dir(work / name)

        rows = []
        if not args.no_pip:
            requirements = work / "req.txt"
            requirements.write_text("".join(f"{name}==1.0\n" for name in wheels))
            rows.append(
                (
                    "pip download (sequential)",
                    timed(
                        lambda: pip_download(server.url("simple/"), requirements, work / "pip"),
                        args.repeats,
                        fresh("pip"),
                    ),
                )
            )
            assert len(list((work / "pip").glob("*.whl"))) == args.files
        rows.append(
            (
                "fetch_all jobs=1 (sequential)",
                timed(
                    lambda: fetch_all(items, work / "seq", jobs=1, progress=quiet), args.repeats, fresh("seq")
                ),
            )
        )
        rows.append(
            (
                f"fetch_all jobs={args.jobs}",
                timed(
                    lambda: fetch_all(items, work / "par", jobs=args.jobs, progress=quiet),
                    args.repeats,
                    fresh("par"),
                ),
            )
        )
        bench_lock(work / "lock", wheels, lambda fn: server.url(f"files/{fn}"))
        rows.append(
            (
                f"envbuild wheelhouse jobs={args.jobs}",
                timed(
                    lambda: envbuild_wheelhouse(work / "lock", work / "wh", args.jobs),
                    args.repeats,
                    fresh("wh"),
                ),
            )
        )
        parallel = rows[-1][1]
        rows.append(
            (
                "no-op re-export (all present)",
                timed(lambda: envbuild_wheelhouse(work / "lock", work / "wh", args.jobs), args.repeats),
            )
        )

    print(
        f"{args.files} wheels x {args.size_kib} KiB ({total_bytes / 2**20:.1f} MiB), "
        f"{args.latency_ms:g} ms per request, {args.rate_mib:g} MiB/s per connection, "
        f"median of {args.repeats}"
    )
    print(f"{'method':<32}{'seconds':>9}  envbuild wheelhouse is")
    for label, seconds in rows:
        baseline = label.startswith(("pip", "fetch_all jobs=1"))
        ratio = f"{seconds / parallel:.1f}x faster" if baseline else ""
        print(f"{label:<32}{seconds:>9.3f}  {ratio}".rstrip())


def _empty_dir(path: Path) -> None:
    if path.exists():
        for child in sorted(path.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() else child.unlink()
    path.mkdir(parents=True, exist_ok=True)


if __name__ == "__main__":
    main()
