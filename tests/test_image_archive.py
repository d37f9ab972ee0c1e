"""Images across an air gap (issue 13, item 4): `export-image` writes an OCI archive with a
sidecar digest, `import-image` checks it and loads it into the loopback registry, and the
image pulled back from there runs. dockerd, the registry on 127.0.0.1:5000, the base image and
skopeo come from tests/infra/provision.sh (run by tests/run.sh); under CI=true these fail,
never skip, when that infrastructure is missing."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import uuid

import pytest

# the build tests' fixtures (a loopback index, GitHub stand-ins and a config with the `test`
# mirror set), for the p40 image; their helpers for the CLI and the CI=true rule
from test_build import (
    REGISTRY,
    _need,
    config,  # noqa: F401  (re-exported or a fixture)
    docker_client,  # noqa: F401  (re-exported or a fixture)
    envbuild,
    fa_github,  # noqa: F401
    github,  # noqa: F401  (re-exported or a fixture)
    index,  # noqa: F401  (re-exported or a fixture)
)

pytestmark = pytest.mark.docker

BASE = f"{REGISTRY}/nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04"  # tests/infra/images.txt


@pytest.fixture(scope="module")
def skopeo(docker_client):
    path = shutil.which("skopeo")
    _need(path is not None, "skopeo is not installed (apt install skopeo; provision.sh does)")
    return path


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    """A config whose `local` registry is the loopback one (import-image's default)."""
    path = tmp_path_factory.mktemp("imgcfg") / "config.yaml"
    path.write_text(json.dumps({"registries": {"local": REGISTRY}}))
    return path


@pytest.fixture
def tiny(docker_client, skopeo):
    """A fresh image FROM the provisioned base (a label makes it this test's own); removed
    afterwards."""
    marker = uuid.uuid4().hex[:12]
    tag = f"envbuild-test/archive:{marker}"
    dockerfile = f"FROM {BASE}\nLABEL io.envbuild.test.archive={marker}\n".encode()
    image, _ = docker_client.images.build(
        fileobj=io.BytesIO(dockerfile), tag=tag, rm=True, network_mode="host"
    )
    yield tag, marker, image.id
    import docker.errors

    try:
        docker_client.images.remove(tag, force=True)
    except docker.errors.ImageNotFound:
        pass  # the round trip removed it itself


def _index_digest(archive) -> str:
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))
    assert len(index["manifests"]) == 1
    return index["manifests"][0]["digest"]


def _registry_has(name: str, tag: str) -> bool:
    import requests

    r = requests.head(
        f"http://{REGISTRY}/v2/{name}/manifests/{tag}",
        timeout=10,
        headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.docker.distribution.manifest.v2+json"
        },
    )
    return r.status_code == 200


def _export(tiny, tmp_path, cfg, name="image.tar"):
    out = tmp_path / name
    r = envbuild(["export-image", tiny[0], "-o", str(out)], cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def test_round_trip_through_an_archive_on_loopback(docker_client, tiny, tmp_path, cfg):
    tag, marker, image_id = tiny
    out, r = _export(tiny, tmp_path, cfg)
    side = json.loads((tmp_path / "image.tar.json").read_text())
    # the sidecar names the archive's own manifest, and the archive's bytes
    assert r.stdout.strip() == side["manifest_digest"] == _index_digest(out)
    assert side["archive_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert side["archive_size"] == out.stat().st_size
    assert side["name"] == tag and side["image"] == tag
    assert side["source"] == f"docker-daemon:{image_id}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.tar", "image.tar.json"]

    # across the gap: the engine forgets the image, the registry gets it from the archive
    docker_client.images.remove(tag, force=True)
    new = f"envbuild-test/archive-imported:{marker}"
    r = envbuild(["import-image", str(out), "--name", new], cfg)  # --registry local (config)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = f"{REGISTRY}/envbuild-test/archive-imported@{side['manifest_digest']}"
    assert r.stdout.strip() == ref
    pulled = docker_client.images.pull(ref)
    try:
        # the OCI form of the config drops Docker-only fields: a new image ID, as recorded
        assert pulled.id == side["config_digest"]
        assert pulled.labels["io.envbuild.test.archive"] == marker
        out_ = docker_client.containers.run(
            ref, ["cat", "/etc/os-release"], remove=True, network_mode="host"
        ).decode()
        assert "ID=debian" in out_
        # and out again, from the registry this time: the same manifest
        r = envbuild(["export-image", f"{REGISTRY}/{new}", "-o", str(tmp_path / "again.tar")], cfg)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.strip() == side["manifest_digest"]
    finally:
        docker_client.images.remove(pulled.id, force=True)


def test_a_corrupted_archive_is_refused_and_nothing_is_loaded(tiny, tmp_path, cfg):
    out, _ = _export(tiny, tmp_path, cfg)
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the middle of a layer
    out.write_bytes(bytes(data))
    name = f"envbuild-test/archive-corrupt-{tiny[1]}"
    r = envbuild(["import-image", str(out), "--registry", REGISTRY, "--name", f"{name}:x"], cfg)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "sha256" in r.stderr and "corrupt" in r.stderr and "nothing was loaded" in r.stderr
    assert "Traceback" not in r.stderr
    assert not _registry_has(name, "x")

    # a copy cut short is caught by its size, and an archive without its sidecar is refused
    out.write_bytes(bytes(data[: len(data) // 3]))
    r = envbuild(["import-image", str(out), "--registry", REGISTRY, "--name", f"{name}:x"], cfg)
    assert r.returncode == 2 and "incomplete" in r.stderr
    (tmp_path / "image.tar.json").unlink()
    r = envbuild(["import-image", str(out), "--registry", REGISTRY, "--name", f"{name}:x"], cfg)
    assert r.returncode == 2 and "no sidecar" in r.stderr
    assert not _registry_has(name, "x")


def test_an_existing_output_is_not_overwritten_without_force(tiny, tmp_path, cfg):
    out = tmp_path / "image.tar"
    out.write_bytes(b"someone else's file")
    r = envbuild(["export-image", tiny[0], "-o", str(out)], cfg)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "exists" in r.stderr and "--force" in r.stderr
    assert out.read_bytes() == b"someone else's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.tar"]  # no temp left behind
    r = envbuild(["export-image", tiny[0], "-o", str(out), "--force"], cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _index_digest(out) == r.stdout.strip()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.tar", "image.tar.json"]


def test_a_missing_image_is_exit_1_and_writes_nothing(docker_client, skopeo, tmp_path, cfg):
    missing = f"envbuild-test/archive:no-such-{uuid.uuid4().hex[:8]}"
    r = envbuild(["export-image", missing, "-o", str(tmp_path / "x.tar")], cfg)
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"No image {missing} in the Docker engine" in r.stderr
    r = envbuild(["export-image", f"{REGISTRY}/{missing}", "-o", str(tmp_path / "x.tar")], cfg)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "has no manifest" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_without_skopeo_says_how_to_install_it(tmp_path, cfg):
    empty = tmp_path / "bin"
    empty.mkdir()
    r = envbuild(
        ["export-image", "envbuild-test/archive:any", "-o", str(tmp_path / "x.tar")], cfg, PATH=str(empty)
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert "skopeo is not installed" in r.stderr and "apt install skopeo" in r.stderr
    assert not (tmp_path / "x.tar").exists()


def test_the_p40_image_crosses_the_gap_and_passes_its_smoke_test(docker_client, skopeo, config, tmp_path):
    from envbuilder.engines.docker import smoke
    from envbuilder.render.files import smoke_command

    tag = "envbuild-test/p40:archive"
    r = envbuild(
        ["build", "p40", "--mirror", "test", "--without", "apex", "--no-smoke", "--tag", tag], config
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "p40.tar"
    r = envbuild(["export-image", tag, "-o", str(out)], config)
    assert r.returncode == 0, r.stderr[-3000:]
    digest = r.stdout.strip()
    docker_client.images.remove(tag, force=True)
    name = f"envbuild-test/p40-imported:{uuid.uuid4().hex[:8]}"
    r = envbuild(["import-image", str(out), "--registry", "local", "--name", name], config)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = r.stdout.strip()
    assert ref == f"{REGISTRY}/envbuild-test/p40-imported@{digest}"
    pulled = docker_client.images.pull(ref)
    try:
        assert "smoke ok: p40" in smoke(docker_client, ref, smoke_command())
    finally:
        docker_client.images.remove(pulled.id, force=True)
