"""A shipped profile's real image, end to end: `envbuild build 4090` as docs/mirrors.md's
"Building where only PyPI answers" has a user run it. The base image is the user's own, in their
own registry under the nvidia/cuda name the profile uses, with the profile's Python (3.10):
tests/infra/provision.sh makes it (the debootstrapped Debian plus this machine's CPython 3.10,
tests/infra/python-images.txt) and pushes it under the prefix pypi-only/ of the loopback registry.
The packages are the real wheels from PyPI (about 3 GB: 4090's are the fewest of the shipped
profiles'). The image must import the whole training path (verl.workers.fsdp_workers is the
module torch 2.3.1 broke), pass `pip check`, and be served by the loopback registry after
`--push`.

In the default suite (the docker and pypi tiers), not the heavy one: 12 minutes cold on a busy
2-core machine (4 of build, 7 of push, whose gzip of the 4.9 GB venv alone is 6 CPU-minutes), so
the parallel run starts it first (tests/schedule.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import requests

from conftest import need
from test_build import ENVBUILD, REGISTRY, ROOT, docker_client  # noqa: F401  (fixture)

pytestmark = [pytest.mark.docker]

PROFILE = "4090"
PYTHON_IMAGES = ROOT / "tests" / "infra" / "python-images.txt"
PREFIX = "pypi-only"  # where python-images.txt puts the bases in the loopback registry
TAG = "envbuild-test/4090:real"
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def python_images() -> dict[str, str]:
    """python-images.txt: {image reference: the Python X.Y its base carries}."""
    out = {}
    for line in PYTHON_IMAGES.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            version, ref = words
            out[ref] = version
    return out


def served_config(name: str, tag: str) -> str | None:
    """The image ID (config digest) the loopback registry serves as name:tag, or None."""
    r = requests.get(f"http://{REGISTRY}/v2/{name}/manifests/{tag}", headers={"Accept": MANIFEST}, timeout=10)
    return r.json()["config"]["digest"] if r.status_code == 200 else None


def test_python_images_give_every_profile_the_pypi_only_route_builds_its_own_python():
    """Each shipped profile that compiles nothing (the route's profiles but p40, whose torch is
    on the PyTorch index) finds its runtime image under the prefix, with its Python."""
    from envbuilder.model import matrix
    from envbuilder.model.resolve import resolve

    m = matrix.load()
    have = python_images()
    assert all(ref.startswith(f"127.0.0.1:5000/{PREFIX}/") for ref in have), have
    for name in m.profiles:
        env = resolve(m, name)
        if env.needs_builder or name == "p40":
            continue
        (image,) = env.base_images
        assert have.get(f"127.0.0.1:5000/{PREFIX}/{image}") == env.python, (name, image)


@pytest.fixture(scope="module")
def pypi_only_config(tmp_path_factory, docker_client, real_pypi):  # noqa: F811
    """The user's config for a PyPI-only network, as docs/mirrors.md writes it: images from
    their own registry, packages from PyPI."""
    from envbuilder.model import matrix
    from envbuilder.model.resolve import resolve

    for image in resolve(matrix.load(), PROFILE).base_images:
        name, tag = image.rsplit(":", 1)
        need(
            served_config(f"{PREFIX}/{name}", tag),
            f"{REGISTRY}/{PREFIX}/{image} is not in the registry "
            "(tests/run.sh: provision.sh --python-images-file tests/infra/python-images.txt)",
        )
    cfg = {
        "registries": {"local": REGISTRY},
        "mirrors": {
            "pypi-only": {
                "description": "own registry for images, PyPI for packages",
                "registries": {"docker.io": [f"{REGISTRY}/{PREFIX}"]},
                "pypi": [real_pypi],
            }
        },
    }
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(json.dumps(cfg))
    return path


def test_the_real_4090_image_builds_from_pypi_alone_imports_the_training_path_and_is_pushed(
    docker_client, pypi_only_config
):  # noqa: F811
    # the profile as shipped: no matrix overlay (the other build tests' stand-in Python)
    env = {k: v for k, v in os.environ.items() if k != "ENVBUILD_MATRIX_DIR"}
    env["ENVBUILD_CONFIG"] = str(pypi_only_config)
    argv = ["build", PROFILE, "--mirror", "pypi-only", "--tag", TAG, "--push", "local"]
    ca = Path("/etc/ssl/certs/ca-certificates.crt")  # a host that intercepts TLS trusts its CA here
    if ca.is_file():
        argv += ["--ca-cert", str(ca)]
    r = subprocess.run(ENVBUILD + argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    try:
        assert r.returncode == 0, r.stderr[-4000:]
        assert f"registry docker.io: {REGISTRY}/{PREFIX} serves" in r.stderr
        assert f"smoke ok: {PROFILE}" in r.stderr

        def run(*cmd: str) -> str:
            return docker_client.containers.run(TAG, list(cmd), remove=True, network_mode="host").decode()

        out = run(
            "python",
            "-c",
            "import sys, verl.workers.fsdp_workers, verl.trainer.main_ppo, torch; "
            "print('fsdp ok', torch.__version__, '%d.%d' % sys.version_info[:2])",
        )
        assert "fsdp ok 2.4.0" in out and out.split()[-1] == "3.10", out
        assert "No broken requirements found" in run("python", "-m", "pip", "check")
        freeze = run("python", "-m", "pip", "freeze").split()
        for pin in ("torch==2.4.0", "numpy==1.26.4", "tensordict==0.5.0", "verl==0.4.1"):
            assert pin in freeze, pin
        # pushed: the registry serves this very image under the tag
        name, tag = TAG.rsplit(":", 1)
        assert served_config(name, tag) == docker_client.images.get(TAG).id
    finally:
        for ref in (TAG, f"{REGISTRY}/{TAG}"):  # (the local image's two names: ~6 GB)
            try:
                docker_client.images.remove(ref, force=True)
            except Exception:  # noqa: BLE001 - not there when the build failed
                pass
