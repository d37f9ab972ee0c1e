#!/usr/bin/env python3
"""Build speed and size: a cold `envbuild build p40` (empty BuildKit cache, apex compiled in
the devel stage) against a rebuild after changing only the verl pin, and the multi-stage runtime
image against a single-stage build of the same spec, through the loopback test mirror, in one run.

Needs what tests/run.sh provisions (as root): dockerd, the registry on 127.0.0.1:5000 with the
debootstrapped stand-ins for nvidia/cuda (the devel one with a C toolchain), and pypiserver in
this venv. Aim (issue 3): the rebuild takes <= 10% of the cold build.

Usage: python bench/bench_build.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fixture_wheels import apex_archive, make_wheel, verl_files, wheels_for_env  # noqa: E402
from httpfixtures import FileServer, free_port  # noqa: E402

REGISTRY = f"127.0.0.1:{os.environ.get('ENVBUILD_TEST_REGISTRY_PORT', '5000')}"
DOCKER = os.environ.get("ENVBUILD_DOCKER", "/usr/bin/docker")
BUMPED = "0.4.1.post9"  # a verl pin that differs from the profile's and nothing else


def single_stage(dockerfile: str) -> str:
    """The same steps in one stage on the devel base: what a Dockerfile without a separate
    runtime stage ships (the compiler, headers and build tools stay in the image)."""
    lines = dockerfile.splitlines(keepends=True)
    start = next(i for i, l in enumerate(lines) if l.startswith("FROM ${BASE_RUNTIME}"))
    torch = next(i for i, l in enumerate(lines) if i > start and l.startswith("# torch:"))
    text = "".join(lines[:start] + lines[torch:])
    return text.replace("--mount=type=bind,from=builder,source=/wheels,target=/wheels", "")


def image_mb(ref: str) -> float:
    out = subprocess.run(
        [DOCKER, "image", "inspect", "-f", "{{.Size}}", ref], check=True, capture_output=True, text=True
    ).stdout
    return int(out) / 1e6


def main() -> int:
    from envbuilder.model import matrix
    from envbuilder.model import mirrors as M
    from envbuilder.model.resolve import Overrides, resolve

    work = Path(tempfile.mkdtemp(prefix="envbuild-bench-build-"))
    m = matrix.load()
    d = resolve(m, "p40", Overrides()).to_dict()
    fixture = ROOT / "tests" / "fixtures" / "verl-0.4.1"
    # torch weighs most by far (the real cu118 wheel is ~2.3 GB): the stand-ins keep that shape
    wheels_for_env(
        work / "pkgs",
        d,
        fixture if fixture.is_dir() else None,
        weights_mb={
            "torch": 768,
            "torchvision": 8,
            "torchaudio": 4,
            "ray": 64,
            "transformers": 10,
            "pyarrow": 40,
        },
    )
    make_wheel(work / "pkgs", "verl", BUMPED, files=verl_files(fixture) if fixture.is_dir() else {})
    for tool in ("packaging", "ninja", "wheel", "setuptools", "psutil"):  # the builder's pip step
        make_wheel(work / "pkgs", tool, "0.0.1")
    apex_path, apex_tgz = apex_archive(
        ROOT / "tests" / "fixtures" / "apex-standin", m.apex["source_url"].format(ref=d["apex"]["ref"])
    )
    github = FileServer({apex_path: apex_tgz}).__enter__()
    overlay = work / "overlay"
    overlay.mkdir()
    record = dict(m.verl["0.4.1"], source="https://pypi.org/project/verl/0.4.1/")
    (overlay / "verl.yaml").write_text(json.dumps({"verl": {BUMPED: record}}))
    port = free_port()
    index = f"http://127.0.0.1:{port}/simple"
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "pypi-server"),
            "run",
            "-i",
            "127.0.0.1",
            "-p",
            str(port),
            "--disable-fallback",
            str(work / "pkgs"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cfg = work / "config.yaml"
    cfg.write_text(
        json.dumps(
            {
                "mirrors": {
                    "test": {
                        "description": "bench",
                        "registries": {"docker.io": [REGISTRY]},
                        "pypi": [index],
                        "pytorch": [index],
                        "github": [github.url("").rstrip("/")],
                    }
                }
            }
        )
    )
    env = dict(os.environ, ENVBUILD_CONFIG=str(cfg), ENVBUILD_MATRIX_DIR=str(overlay))
    base = [sys.executable, "-m", "envbuilder", "build", "p40", "--mirror", "test", "--no-smoke"]

    def build(*extra: str) -> float:
        start = time.perf_counter()
        r = subprocess.run(base + list(extra), env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"bench build failed:\n{r.stderr[-2000:]}")
        return time.perf_counter() - start

    try:
        time.sleep(1.5)
        subprocess.run([DOCKER, "builder", "prune", "-af"], check=True, capture_output=True)
        subprocess.run(
            [DOCKER, "image", "rm", "-f", "envbuild-bench/p40:cold", "envbuild-bench/p40:bumped"],
            capture_output=True,
        )
        cold = build("--tag", "envbuild-bench/p40:cold", "--context", str(work / "ctx"))
        bumped = build("--tag", "envbuild-bench/p40:bumped", "--verl", BUMPED)
        again = build("--tag", "envbuild-bench/p40:bumped")  # back to the profile's pin
        # the same spec as one stage, built with the same client, mirror and build args
        dockerfile = work / "ctx" / "Dockerfile"
        dockerfile.write_text(single_stage(dockerfile.read_text()))
        argv = [DOCKER, "build", "--network=host", "-q", "-t", "envbuild-bench/p40:single"]
        os.environ["ENVBUILD_CONFIG"] = str(cfg)
        choice = M.choice("test", M.get_set(m, "test"))
        for k, v in sorted(choice.build_args(d).items()):
            argv += ["--build-arg", f"{k}={v}"]
        subprocess.run(
            argv + [str(work / "ctx")], env=dict(env, DOCKER_BUILDKIT="1"), check=True, capture_output=True
        )
        multi_mb, single_mb = image_mb("envbuild-bench/p40:cold"), image_mb("envbuild-bench/p40:single")
    finally:
        server.terminate()
        github.__exit__(None, None, None)
    print(f"{'case':48} {'seconds':>8} {'vs cold':>8}")
    print(f"{'cold build (empty BuildKit cache)':48} {cold:8.1f} {1:8.2f}")
    print(f"{'rebuild after changing only the verl pin':48} {bumped:8.1f} {bumped / cold:8.2f}")
    print(f"{'rebuild with the original pin (all cached)':48} {again:8.1f} {again / cold:8.2f}")
    print(f"\n{'image':48} {'MB':>8} {'ratio':>8}")
    print(f"{'single-stage build of the same spec':48} {single_mb:8.0f} {1:8.2f}")
    print(f"{'envbuild multi-stage runtime image':48} {multi_mb:8.0f} {multi_mb / single_mb:8.2f}")
    print(
        "\naim: verl-pin rebuild <= 0.10 of the cold build; stand-in wheels (torch 768 MB) and "
        "debootstrapped bases (devel = base + C toolchain, no nvcc), so the real size gap is larger"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
