#!/usr/bin/env python3
"""Build speed: a cold `envbuild build p40` (empty BuildKit cache) against a rebuild after
changing only the verl pin, through the loopback test mirror, in one run.

Needs what tests/run.sh provisions (as root): dockerd, the registry on 127.0.0.1:5000 with the
debootstrapped stand-in for nvidia/cuda, and pypiserver in this venv. Aim (issue 3): the rebuild
takes <= 10% of the cold build.

Usage: python bench/bench_build.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fixture_wheels import make_wheel, verl_files, wheels_for_env  # noqa: E402

REGISTRY = f"127.0.0.1:{os.environ.get('ENVBUILD_TEST_REGISTRY_PORT', '5000')}"
DOCKER = os.environ.get("ENVBUILD_DOCKER", "/usr/bin/docker")
BUMPED = "0.4.1.post9"  # a verl pin that differs from the profile's and nothing else


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    from envbuilder import matrix
    from envbuilder.resolve import Overrides, resolve

    work = Path(tempfile.mkdtemp(prefix="envbuild-bench-build-"))
    m = matrix.load()
    d = resolve(m, "p40", Overrides(without=("apex",))).data
    fixture = ROOT / "tests" / "fixtures" / "verl-0.4.1"
    # torch weighs most by far (the real cu118 wheel is ~2.3 GB): the stand-ins keep that shape
    wheels_for_env(work / "pkgs", d, fixture if fixture.is_dir() else None,
                   weights_mb={"torch": 768, "torchvision": 8, "torchaudio": 4, "ray": 64,
                               "transformers": 10, "pyarrow": 40})
    make_wheel(work / "pkgs", "verl", BUMPED, files=verl_files(fixture) if fixture.is_dir() else {})
    overlay = work / "overlay"
    overlay.mkdir()
    record = dict(m.verl["0.4.1"], source="https://pypi.org/project/verl/0.4.1/")
    (overlay / "verl.yaml").write_text(json.dumps({"verl": {BUMPED: record}}))
    port = free_port()
    index = f"http://127.0.0.1:{port}/simple"
    server = subprocess.Popen([str(Path(sys.executable).parent / "pypi-server"), "run", "-i",
                               "127.0.0.1", "-p", str(port), "--disable-fallback", str(work / "pkgs")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cfg = work / "config.yaml"
    cfg.write_text(json.dumps({"mirrors": {"test": {
        "description": "bench", "registries": {"docker.io": [REGISTRY]},
        "pypi": [index], "pytorch": [index]}}}))
    env = dict(os.environ, ENVBUILD_CONFIG=str(cfg), ENVBUILD_MATRIX_DIR=str(overlay))
    base = [sys.executable, "-m", "envbuilder", "build", "p40", "--mirror", "test",
            "--without", "apex", "--no-smoke"]

    def build(*extra: str) -> float:
        start = time.perf_counter()
        r = subprocess.run(base + list(extra), env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"bench build failed:\n{r.stderr[-2000:]}")
        return time.perf_counter() - start

    try:
        time.sleep(1.5)
        subprocess.run([DOCKER, "builder", "prune", "-af"], check=True, capture_output=True)
        subprocess.run([DOCKER, "image", "rm", "-f", "envbuild-bench/p40:cold",
                        "envbuild-bench/p40:bumped"], capture_output=True)
        cold = build("--tag", "envbuild-bench/p40:cold")
        bumped = build("--tag", "envbuild-bench/p40:bumped", "--verl", BUMPED)
        again = build("--tag", "envbuild-bench/p40:bumped")  # back to the profile's pin
    finally:
        server.terminate()
    print(f"{'case':48} {'seconds':>8} {'vs cold':>8}")
    print(f"{'cold build (empty BuildKit cache)':48} {cold:8.1f} {1:8.2f}")
    print(f"{'rebuild after changing only the verl pin':48} {bumped:8.1f} {bumped / cold:8.2f}")
    print(f"{'rebuild with the original pin (all cached)':48} {again:8.1f} {again / cold:8.2f}")
    print("\naim: verl-pin rebuild <= 0.10 of the cold build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
