"""Loopback stand-ins for what `envbuild lock` talks to: fixture wheels behind pypiserver, a conda
channel built with py-rattler-build and served over HTTP, and a registry with pushed manifests.
Shared by tests/test_lock.py and bench/bench_lock.py. Nothing here leaves 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from fixture_wheels import make_wheel  # noqa: E402  (one wheel writer for every test)
from httpfixtures import free_port  # noqa: E402,F401  (re-exported: F.free_port)


def wait_http(url: str, seconds: float = 30.0) -> None:
    import requests

    deadline = time.monotonic() + seconds
    while True:
        try:
            requests.get(url, timeout=2)
            return
        except requests.RequestException:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {seconds} s")
            time.sleep(0.1)


# ---- wheels ---------------------------------------------------------------------------------

CP310 = "cp310-cp310-linux_x86_64"


def p40_wheels(torch_dir: Path, pypi_dir: Path, torch_payload: int = 0) -> dict[str, Path]:
    """Stand-ins named exactly as the p40 profile pins them: torch's three on a PyTorch-like index
    (which, like the real one, also carries a few common dependencies), the rest on a PyPI-like
    one, which also has a decoy `torch 2.6.0+cu118` that must never be picked."""
    w = {}
    w["torch"] = make_wheel(
        torch_dir,
        "torch",
        "2.6.0+cu118",
        tag=CP310,
        payload=torch_payload,
        requires=("filelock", "typing-extensions>=4.10.0"),
    )
    w["torchvision"] = make_wheel(
        torch_dir, "torchvision", "0.21.0+cu118", tag=CP310, requires=("torch==2.6.0+cu118", "numpy")
    )
    w["torchaudio"] = make_wheel(
        torch_dir, "torchaudio", "2.6.0+cu118", tag=CP310, requires=("torch==2.6.0+cu118",)
    )
    make_wheel(torch_dir, "filelock", "3.16.1")  # same bytes as PyPI's
    make_wheel(torch_dir, "numpy", "2.1.2", tag=CP310)  # not the pinned 1.26.4
    w["decoy"] = make_wheel(pypi_dir, "torch", "2.6.0+cu118", tag=CP310, salt="decoy")
    make_wheel(pypi_dir, "torch", "2.6.0", tag=CP310, requires=("filelock",))
    for name, version, requires, tag in [
        ("filelock", "3.16.1", (), "py3-none-any"),
        ("typing-extensions", "4.12.2", (), "py3-none-any"),
        ("numpy", "1.26.4", (), CP310),
        ("numpy", "2.1.2", (), CP310),
        ("transformers", "4.51.3", ("filelock", "numpy>=1.17", "tokenizers>=0.21,<0.22"), "py3-none-any"),
        ("tokenizers", "0.21.1", (), CP310),
        ("tensordict", "0.6.2", ("torch>=2.5.0", "numpy"), CP310),
        ("accelerate", "1.7.0", ("torch>=2.0.0", "numpy"), "py3-none-any"),
        ("peft", "0.15.2", ("torch>=1.13.0", "transformers", "accelerate>=0.21.0"), "py3-none-any"),
        ("datasets", "3.6.0", ("pyarrow>=15.0.0", "numpy>=1.17", "filelock"), "py3-none-any"),
        ("pyarrow", "20.0.0", (), CP310),
        ("hydra-core", "1.3.2", ("omegaconf<2.4,>=2.2",), "py3-none-any"),
        ("omegaconf", "2.3.0", (), "py3-none-any"),
        ("codetiming", "1.4.0", (), "py3-none-any"),
        ("torchdata", "0.11.0", ("torch>=2",), "py3-none-any"),
        ("aiohttp", "3.11.18", (), CP310),
        ("pandas", "2.2.3", ("numpy>=1.22.4",), CP310),
        (
            "verl",
            "0.4.1",
            (
                "accelerate",
                "codetiming",
                "datasets",
                "hydra-core",
                "numpy",
                "pandas",
                "peft",
                "pyarrow>=19.0.0",
                "ray[default]>=2.41.0",
                "tensordict<=0.6.2",
                "torchdata",
                "transformers",
            ),
            "py3-none-any",
        ),
    ]:
        files = verl_files() if name == "verl" else None
        w.setdefault(name, make_wheel(pypi_dir, name, version, tag=tag, requires=requires, files=files))
    w["ray"] = make_wheel(
        pypi_dir, "ray", "2.46.0", tag=CP310, requires=("filelock",), extras={"default": ("aiohttp>=3.7",)}
    )
    for name, version in [
        ("packaging", "25.0"),
        ("ninja", "1.11.1.4"),
        ("wheel", "0.45.1"),
        ("setuptools", "81.0.0"),
        ("psutil", "7.0.0"),
    ]:  # the builder's tools (setuptools: verl 0.4.1's pin)
        w[name] = make_wheel(pypi_dir, name, version)
    return w


class PypiServer:
    """`pypi-server run` on a free loopback port over one wheel folder."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple/"

    def __enter__(self) -> "PypiServer":
        exe = Path(sys.executable).with_name("pypi-server")
        self.proc = subprocess.Popen(
            [
                str(exe),
                "run",
                "-i",
                "127.0.0.1",
                "-p",
                str(self.port),
                "--disable-fallback",
                "--hash-algo",
                "sha256",
                str(self.root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_http(self.url)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)


# ---- conda channel --------------------------------------------------------------------------

# name, version, subdir, build, depends, constrains
CHANNEL_PACKAGES = [
    ("python", "3.10.0", "linux-64", "h0_0", ["__glibc >=2.17"], []),
    ("python", "3.12.0", "linux-64", "h0_0", ["__glibc >=2.17"], []),
    ("pip", "24.0", "noarch", "pyh0_0", ["python >=3.7"], []),
    ("cuda-version", "11.8", "noarch", "h0_3", [], ["__cuda >=11.8"]),
    ("cuda-version", "12.4", "noarch", "h0_3", [], ["__cuda >=12.4"]),
    (
        "cuda-nvcc",
        "11.8.89",
        "linux-64",
        "h0_0",
        ["__cuda >=11.8", "__glibc >=2.17", "cuda-version 11.8.*"],
        [],
    ),
    (
        "cuda-nvcc",
        "12.4.131",
        "linux-64",
        "h0_0",
        ["__cuda >=12.4", "__glibc >=2.17", "cuda-version 12.4.*"],
        [],
    ),
    ("cuda-cudart-dev", "11.8.89", "linux-64", "h0_0", ["cuda-version 11.8.*"], []),
    ("cuda-libraries-dev", "11.8.0", "linux-64", "h0_0", ["cuda-version 11.8.*"], []),
    # a Grace host's (GH200, GB200): its own python; pip is the noarch one above
    ("python", "3.12.0", "linux-aarch64", "h0_0", ["__glibc >=2.17"], []),
]


# py-rattler may kill the interpreter at exit after its work is done (see
# envbuilder/lock/rattler_worker.py), so the tests run it in a child too: the child prints a
# result line and leaves with os._exit, and pytest's own exit code stays its own.
RESULT = "lockfixtures-result: "


def _in_child(*args) -> dict:
    proc = subprocess.run([sys.executable, __file__, *map(str, args)], capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    raise RuntimeError(f"{args[0]} child died (exit {proc.returncode}): {proc.stderr[-3000:]}")


def build_channel(root: Path) -> Path:
    """A tiny conda channel (assemble_package + rattler.index), byte-reproducible packages."""
    _in_child("build-channel", root)
    return root


def install_locked(lock_yml: Path, prefix: Path, tamper: str | None = None) -> dict:
    """rattler.install of conda-lock.yml's conda entries, from their URLs and hashes alone (no
    repodata, no solve): {"ok": True} or {"error": message}. `tamper` zeroes one sha256."""
    return _in_child("install", lock_yml, prefix, tamper or "")


def _build_channel(root: Path) -> None:
    import asyncio
    import datetime
    import tempfile

    from rattler.index import index_fs
    from rattler_build import ArchiveType, assemble_package

    ts = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    for name, version, subdir, build, depends, constrains in CHANNEL_PACKAGES:
        with tempfile.TemporaryDirectory() as tmp:
            payload = Path(tmp) / ("share" if subdir == "noarch" else "bin") / f"{name}-{version}.txt"
            payload.parent.mkdir(parents=True)
            payload.write_text(f"{name} {version} envbuild test stand-in\n")
            (root / subdir).mkdir(parents=True, exist_ok=True)
            assemble_package(
                name=name,
                version=version,
                target_platform=subdir,
                build_string=build,
                output_dir=root / subdir,
                files_dir=Path(tmp),
                depends=depends,
                constrains=constrains,
                noarch="generic" if subdir == "noarch" else None,
                license="MIT",
                archive_type=ArchiveType.Conda,
                timestamp=ts,
                detect_prefix=False,
            )
    asyncio.run(index_fs(root, write_zst=False, write_shards=False, force=True))


def channel_of(url: str) -> tuple[str, str, str]:
    """(channel URL, subdir, file name) of a package URL."""
    from pathlib import PurePosixPath
    from urllib.parse import urlsplit

    path = PurePosixPath(urlsplit(url).path)
    subdir = path.parent.name
    return url[: url.rindex(f"/{subdir}/")] + "/", subdir, path.name


def _install(lock_yml: Path, prefix: Path, tamper: str) -> None:
    import asyncio

    from conda_lock.lockfile import parse_conda_lock_file
    from rattler import PackageRecord, RepoDataRecord, install
    from rattler.package import BuildString
    from rattler.platform import Platform

    records, platform = [], "linux-64"
    for p in parse_conda_lock_file(lock_yml).package:
        platform = p.platform  # (one platform a lock: its conda-lock.yml says which)
        if p.manager != "conda":
            continue
        channel, subdir, fname = channel_of(p.url)
        sha = "0" * 64 if p.name == tamper else p.hash.sha256
        record = PackageRecord(
            name=p.name,
            version=p.version,
            build=BuildString(p.build),
            build_number=0,
            subdir=subdir,
            depends=[f"{k} {v}" if v != "*" else k for k, v in p.dependencies.items()],
            md5=bytes.fromhex(p.hash.md5),
            sha256=bytes.fromhex(sha),
            noarch="generic" if subdir == "noarch" else None,
        )
        records.append(RepoDataRecord(record, file_name=fname, url=p.url, channel=channel))
    asyncio.run(
        install(
            records,
            target_prefix=prefix,
            cache_dir=prefix.parent / f"{prefix.name}-pkgs",
            platform=Platform(platform),
            execute_link_scripts=False,
            show_progress=False,
        )
    )


class StaticServer:
    """A threading HTTP file server on loopback that logs request paths."""

    def __init__(self, root: Path):
        log = self.log = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *a):
                log.append(self.path)

        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
        )
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---- registry -------------------------------------------------------------------------------

DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def _sha(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


class Registry:
    """Push tiny images through the registry HTTP API (no docker client)."""

    def __init__(self, url: str):
        import requests

        self.url = url.rstrip("/")
        self.s = requests.Session()

    def blob(self, repo: str, data: bytes) -> dict:
        d = _sha(data)
        if self.s.head(f"{self.url}/v2/{repo}/blobs/{d}").status_code != 200:
            r = self.s.post(f"{self.url}/v2/{repo}/blobs/uploads/")
            r.raise_for_status()
            loc = r.headers["Location"]
            loc = loc if loc.startswith("http") else self.url + loc
            self.s.put(
                loc, params={"digest": d}, data=data, headers={"Content-Type": "application/octet-stream"}
            ).raise_for_status()
        return {"digest": d, "size": len(data)}

    def manifest(self, repo: str, ref: str, body: dict, media_type: str) -> str:
        raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        r = self.s.put(
            f"{self.url}/v2/{repo}/manifests/{ref}", data=raw, headers={"Content-Type": media_type}
        )
        r.raise_for_status()
        return _sha(raw)

    def image(self, repo: str, ref: str, arch: str, oci: bool) -> tuple[str, int]:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            data = f"{repo} {arch}\n".encode()
            ti = tarfile.TarInfo("hello.txt")
            ti.size, ti.mtime = len(data), 0
            t.addfile(ti, io.BytesIO(data))
        tar = buf.getvalue()
        layer = gzip.compress(tar, mtime=0)
        cfg = json.dumps(
            {
                "architecture": arch,
                "os": "linux",
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": [_sha(tar)]},
            },
            sort_keys=True,
        ).encode()
        mt = OCI_MANIFEST if oci else DOCKER_V2
        body = {
            "schemaVersion": 2,
            "mediaType": mt,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json"
                if oci
                else "application/vnd.docker.container.image.v1+json",
                **self.blob(repo, cfg),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip"
                    if oci
                    else "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    **self.blob(repo, layer),
                }
            ],
        }
        raw_len = len(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
        return self.manifest(repo, ref, body, mt), raw_len

    def multiarch(self, repo: str, tag: str, oci: bool) -> str:
        """A manifest list (docker) or an index (OCI) of amd64 + arm64 under `tag`."""
        entries = []
        for arch in ("amd64", "arm64"):
            digest, size = self.image(repo, f"{tag}-{arch}", arch, oci)
            entries.append(
                {
                    "mediaType": OCI_MANIFEST if oci else DOCKER_V2,
                    "digest": digest,
                    "size": size,
                    "platform": {"architecture": arch, "os": "linux"},
                }
            )
        mt = OCI_INDEX if oci else DOCKER_LIST
        return self.manifest(repo, tag, {"schemaVersion": 2, "mediaType": mt, "manifests": entries}, mt)


# tests/infra/provision.sh's registry (ENVBUILD_TEST_REGISTRY_PORT there)
SHARED_REGISTRY = f"http://127.0.0.1:{os.environ.get('ENVBUILD_TEST_REGISTRY_PORT', '5000')}"


@contextlib.contextmanager
def registry(workdir: Path):
    """The loopback registry tests/infra/provision.sh runs on :5000 when it answers, else a
    registry of our own (Debian's docker-registry) on a free port."""
    import requests

    try:
        if requests.get(f"{SHARED_REGISTRY}/v2/", timeout=2).status_code == 200:
            yield SHARED_REGISTRY
            return
    except requests.RequestException:
        pass
    exe = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    if not Path(exe).exists() and os.geteuid() == 0:
        apt_env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "docker-registry"]):
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=apt_env)
    if not Path(exe).exists():
        raise RuntimeError(
            "no registry on 127.0.0.1:5000 and no docker-registry binary (apt-get install docker-registry)"
        )
    port = free_port()
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yml"
    config.write_text(
        f"version: 0.1\nlog: {{level: error}}\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {workdir / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen([exe, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/v2/")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


class TokenGate:
    """A Docker-Hub-like front for a registry: /v2/ answers 401 with a Bearer challenge unless
    the request carries the token that /token hands out anonymously."""

    TOKEN = "envbuild-test-token"

    def __init__(self, upstream: str):
        import requests

        gate = self
        self.token_requests: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _relay(self, method: str):
                if self.path.startswith("/token"):
                    gate.token_requests.append(self.path)
                    body = json.dumps({"token": gate.TOKEN}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if self.headers.get("Authorization") != f"Bearer {gate.TOKEN}":
                    self.send_response(401)
                    self.send_header(
                        "WWW-Authenticate",
                        f'Bearer realm="{gate.url}/token",service="envbuild-test-registry"',
                    )
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                r = requests.request(
                    method, upstream + self.path, headers={"Accept": self.headers.get("Accept", "")}
                )
                self.send_response(r.status_code)
                for h in ("Content-Type", "Docker-Content-Digest", "Content-Length"):
                    if h in r.headers:
                        self.send_header(h, r.headers[h])
                self.end_headers()
                if method == "GET":
                    self.wfile.write(r.content)

            def do_HEAD(self):
                self._relay("HEAD")

            def do_GET(self):
                self._relay("GET")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    what, *rest = sys.argv[1:]
    try:
        if what == "build-channel":
            _build_channel(Path(rest[0]))
        elif what == "install":
            _install(Path(rest[0]), Path(rest[1]), rest[2])
        result = {"ok": True}
    except Exception as e:  # the test reads the message
        result = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write(RESULT + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


def verl_files() -> dict[str, str]:
    """The stand-in verl 0.4.1 wheel's files: the real 0.4.1 sources that the p40 patches and the
    precision audit read (tests/fixtures/verl-0.4.1), and an empty module for each other module
    of p40's training path, so that install.sh's patch and audit steps run on it as on the real
    wheel (the real wheel's own patch test is test_hf_rollout_rules's, in the pypi tier)."""
    from conftest import FIXTURES, resolved

    root = FIXTURES / "verl-0.4.1"
    files = {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in root.rglob("*.py")}
    files.pop("verl/__init__.py")  # (make_wheel's, with the version)
    for module in resolved("p40").training_path:
        if module.split(".")[0] != "verl":
            continue
        parts = module.split(".")
        if len(parts) == 1 or f"{'/'.join(parts)}.py" in files or f"{'/'.join(parts)}/__init__.py" in files:
            continue
        files[f"{'/'.join(parts)}.py"] = f'"""Stand-in for {module} (envbuild tests)."""\n'
        for i in range(1, len(parts)):  # its packages
            files.setdefault(f"{'/'.join(parts[:i])}/__init__.py", "")
    return files
