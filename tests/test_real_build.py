"""The real-image tier: `envbuild build 4090` on a machine that reaches PyPI and nothing else
(no Docker Hub, no PyTorch index), with the real wheels from PyPI, on the debootstrapped base
pushed into the loopback registry under the nvidia/cuda tag the profile names: the README's
"Building where only PyPI answers" path, end to end. The image must import the whole training
path (verl.workers.fsdp_workers is the module torch 2.3.1 broke) and pass `pip check`.

Heavy (several GB of wheels, a ~6 GB image): opt in with `pytest -m heavy` (tests/run.sh runs
it when ENVBUILD_HEAVY=1)."""

from __future__ import annotations

import json

import pytest

from test_build import REGISTRY, docker_client, envbuild  # noqa: F401  (fixture)

pytestmark = [pytest.mark.docker, pytest.mark.heavy]

BASE = "envbuild-test/base:bookworm"  # tests/infra/provision.sh makes it


@pytest.fixture(scope="module")
def pypi_only_config(tmp_path_factory, docker_client, real_pypi):  # noqa: F811
    """The user's config for a PyPI-only network: images from their own registry (where they
    put a base image under the nvidia/cuda name), packages from PyPI."""
    from envbuilder.model import matrix
    from envbuilder.model.resolve import resolve

    env = resolve(matrix.load(), "4090").to_dict()
    image = docker_client.images.get(BASE)
    for ref in sorted(set(env["cuda"]["images"].values())):
        repo, tag = ref.rsplit(":", 1)
        image.tag(f"{REGISTRY}/{repo}", tag)
        docker_client.images.push(f"{REGISTRY}/{repo}", tag)
    cfg = {
        "registries": {"local": REGISTRY},
        "mirrors": {
            "pypi-only": {
                "description": "own registry for images, PyPI for packages",
                "registries": {"docker.io": [REGISTRY]},
                "pypi": [real_pypi],
            }
        },
    }
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(json.dumps(cfg))
    return path


def test_the_real_4090_image_builds_from_pypi_alone_and_imports_the_training_path(
    docker_client, pypi_only_config
):  # noqa: F811
    tag = "envbuild-test/4090:real"
    r = envbuild(
        [
            "build",
            "4090",
            "--mirror",
            "pypi-only",
            "--tag",
            tag,
            "--ca-cert",
            "/etc/ssl/certs/ca-certificates.crt",
            "--push",
            "local",
        ],
        pypi_only_config,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "smoke ok: 4090" in r.stderr
    try:
        out = docker_client.containers.run(
            tag,
            [
                "python",
                "-c",
                "import verl.workers.fsdp_workers, verl.trainer.main_ppo, "
                "torch; print('fsdp ok', torch.__version__)",
            ],
            remove=True,
            network_mode="host",
        ).decode()
        assert "fsdp ok 2.4.0" in out
        check = docker_client.containers.run(
            tag, ["python", "-m", "pip", "check"], remove=True, network_mode="host"
        ).decode()
        assert "No broken requirements found" in check
        freeze = docker_client.containers.run(
            tag, ["python", "-m", "pip", "freeze"], remove=True, network_mode="host"
        ).decode()
        assert "numpy==1.26.4" in freeze and "tensordict==0.5.0" in freeze
    finally:
        docker_client.images.remove(tag, force=True)
