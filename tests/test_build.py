"""Real image builds through a loopback mirror: dockerd, the registry on 127.0.0.1:5000 and the
debootstrapped base image come from tests/infra/provision.sh (run by tests/run.sh); the package
index is a pypiserver started here with stand-in wheels. Under CI=true these fail, never skip,
when the infrastructure is missing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from fixture_wheels import apex_archive, make_wheel, wheels_for_env
from httpfixtures import FileServer, free_port

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = f"127.0.0.1:{os.environ.get('ENVBUILD_TEST_REGISTRY_PORT', '5000')}"
VERL_FIXTURE = ROOT / "tests" / "fixtures" / "verl-0.4.1"
APEX_STANDIN = ROOT / "tests" / "fixtures" / "apex-standin"
BUILD_TOOLS = ("packaging", "ninja", "wheel", "setuptools", "psutil")  # the builder stage's pip step
ENVBUILD = [sys.executable, "-m", "envbuilder.cli"]


def _need(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {why}: run tests/run.sh as root (it provisions Docker)")
    pytest.skip(why)


def _registry_up() -> bool:
    import requests

    try:
        return requests.get(f"http://{REGISTRY}/v2/", timeout=3).status_code in (200, 401)
    except requests.RequestException:
        return False


@pytest.fixture(scope="module")
def docker_client():
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means no engine
        _need(False, f"no Docker engine ({e})")
    _need(_registry_up(), f"no registry on {REGISTRY}")
    return client


@pytest.fixture(scope="module")
def index(tmp_path_factory, docker_client):
    """A pypiserver on loopback with stand-in wheels for everything p40 installs."""
    from envbuilder import matrix
    from envbuilder.resolve import Overrides, resolve

    pkgs = tmp_path_factory.mktemp("pkgs")
    d = resolve(matrix.load(), "p40", Overrides(without=("apex",))).data
    wheels_for_env(pkgs, d, VERL_FIXTURE if VERL_FIXTURE.is_dir() else None)
    for name in BUILD_TOOLS:
        make_wheel(pkgs, name, "0.0.1")
    port = free_port()
    exe = Path(sys.executable).parent / "pypi-server"
    _need(exe.exists(), "pypiserver is not installed")
    log = open(pkgs.parent / "pypiserver.log", "w")
    proc = subprocess.Popen([str(exe), "run", "-i", "127.0.0.1", "-p", str(port),
                             "--disable-fallback", "--hash-algo", "sha256", str(pkgs)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/simple"
    import requests

    for _ in range(100):
        try:
            if requests.get(url + "/", timeout=1).ok:
                break
        except requests.RequestException:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("pypiserver did not start")
    yield url
    proc.terminate()
    proc.wait(10)
    log.close()


@pytest.fixture(scope="module")
def github():
    """A loopback stand-in for github.com serving the apex source archive at apex's real path."""
    from envbuilder import matrix

    path, data = apex_archive(APEX_STANDIN, matrix.load().apex["source_url"].format(ref="25.08"))
    with FileServer({path: data}) as srv:
        yield srv.url("").rstrip("/")


@pytest.fixture(scope="module")
def config(tmp_path_factory, index, github):
    """The user's config: a `test` mirror set mapping Docker Hub to the loopback registry, and
    a `fallback` set whose first endpoint is a closed port and whose second answers /v2/ but
    does not hold the image (so the pull itself fails and the build moves on)."""
    closed = f"127.0.0.1:{free_port()}"
    body = {"pypi": [index], "pytorch": [index], "huggingface": ["http://127.0.0.1:9/hf"],
            "github": [github]}
    cfg = {
        "registries": {"local": REGISTRY},
        "mirrors": {
            "test": dict(body, description="loopback test mirror", registries={"docker.io": [REGISTRY]}),
            "fallback": dict(body, description="first endpoint closed",
                             registries={"docker.io": [closed, f"{REGISTRY}/empty", REGISTRY]}),
            "offline": {"description": "no package index, no GitHub: all point at a closed port",
                        "registries": {"docker.io": [REGISTRY]},
                        "pypi": [f"http://{closed}/simple"], "pytorch": [f"http://{closed}/simple"],
                        "github": [f"http://{closed}"]},
        },
    }
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def envbuild(args, config, **env):
    full = dict(os.environ, ENVBUILD_CONFIG=str(config), **env)
    return subprocess.run(ENVBUILD + args, capture_output=True, text=True, env=full, cwd=ROOT,
                          timeout=1800)


def _layers_contain(client, image: str, needle: bytes) -> bool:
    """True when any file of any layer in `docker save` holds `needle`."""
    data = b"".join(client.images.get(image).save(named=True))
    with tarfile.open(fileobj=io.BytesIO(data)) as outer:
        for member in outer.getmembers():
            if not member.isfile():
                continue
            blob = outer.extractfile(member).read()
            if needle in blob:
                return True
            if member.name.endswith((".tar", "/layer.tar")) or tarfile.is_tarfile(io.BytesIO(blob)):
                try:
                    with tarfile.open(fileobj=io.BytesIO(blob)) as layer:
                        for f in layer.getmembers():
                            if f.isfile() and needle in layer.extractfile(f).read():
                                return True
                except tarfile.TarError:
                    pass
    return False


def test_build_p40_through_mirror_pushes_and_pulls_back(docker_client, config):
    tag = "envbuild-test/p40:mirror"
    r = envbuild(["build", "p40", "--mirror", "test", "--without", "apex", "--push", "local",
                  "--tag", tag], config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "smoke ok: p40" in r.stderr
    pushed = r.stdout.strip().splitlines()[-1]
    assert pushed.startswith(f"{REGISTRY}/envbuild-test/p40@sha256:")
    docker_client.images.remove(f"{REGISTRY}/{tag}", force=True)
    docker_client.images.remove(tag, force=True)
    image = docker_client.images.pull(pushed)
    out = docker_client.containers.run(image.id, ["python", "-c", "import json; "
                                       "print(json.load(open('/etc/envbuild.json'))['profile'])"],
                                       remove=True, network_mode="host")
    assert out.decode().strip() == "p40"
    assert image.labels["io.envbuild.profile"] == "p40"


def test_build_compiles_apex_in_the_devel_stage_and_ships_only_the_wheel(docker_client, config):
    tag = "envbuild-test/p40:apex"
    r = envbuild(["build", "p40", "--mirror", "test", "--tag", tag, "-v"], config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[builder" in r.stderr and "apex @ http://127.0.0.1:" in r.stderr  # through the mirror
    assert "smoke ok: p40" in r.stderr and "amp_C" in r.stderr
    # the runtime stage has the compiled extension but not the compiler that built it
    out = docker_client.containers.run(tag, ["sh", "-c", "command -v cc gcc || echo no-compiler; "
                                             "python -c 'import amp_C; print(amp_C.standin())'"],
                                       remove=True, network_mode="host").decode()
    assert out.split() == ["no-compiler", "amp_C"]


def test_build_falls_back_to_the_next_registry_endpoint(docker_client, config):
    r = envbuild(["build", "p40", "--mirror", "fallback", "--without", "apex", "--no-smoke",
                  "--tag", "envbuild-test/p40:fallback"], config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "DOWN" in r.stderr  # the closed port, found by the probe
    assert f"pull failed through docker.io -> {REGISTRY}/empty" in r.stderr
    assert r.stderr.rstrip().splitlines()[-2] == f"served by: docker.io -> {REGISTRY}"


def test_ca_cert_reaches_the_build_but_no_layer(docker_client, config, tmp_path):
    secret = b"ENVBUILD-TEST-CA-" + os.urandom(8).hex().encode()
    ca = tmp_path / "corp.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n" + secret + b"\n-----END CERTIFICATE-----\n")
    tag = "envbuild-test/p40:ca"
    r = envbuild(["build", "p40", "--mirror", "test", "--without", "apex", "--no-smoke",
                  "--ca-cert", str(ca), "--tag", tag, "-v"], config)
    # the CA replaces pip's trust store: plain-http loopback indexes don't care, so it builds
    assert r.returncode == 0, r.stderr[-3000:]
    assert _layers_contain(docker_client, tag, b"Acquire::https::CAInfo")  # the scan sees layers
    assert not _layers_contain(docker_client, tag, secret)


def test_daemon_not_running_is_a_clear_exit_1(config, tmp_path):
    r = envbuild(["build", "p40", "--without", "apex"], config,
                 DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    assert r.returncode == 1
    assert "Cannot reach the Docker engine" in r.stderr and "Traceback" not in r.stderr


def test_unreachable_registry_pushes_nothing(docker_client, config):
    closed = f"127.0.0.1:{free_port()}"
    r = envbuild(["build", "p40", "--mirror", "test", "--without", "apex", "--no-smoke",
                  "--tag", "envbuild-test/p40:unreach", "--push", closed], config)
    assert r.returncode == 1
    assert "unreachable" in r.stderr and "nothing was pushed" in r.stderr
    assert "@sha256:" not in r.stdout


def test_unknown_registry_name_is_a_clear_exit_1(docker_client, config):
    r = envbuild(["build", "p40", "--mirror", "test", "--without", "apex", "--no-smoke",
                  "--tag", "envbuild-test/p40:unknown", "--push", "nosuchregistry"], config)
    assert r.returncode == 1
    assert "nosuchregistry" in r.stderr and "Traceback" not in r.stderr


def test_build_from_a_wheelhouse_with_no_index_at_all(docker_client, config, index, github, tmp_path):
    """p40 whole, apex included: its build tools and source archive come from the wheelhouse too."""
    lock = tmp_path / "lock"
    r = envbuild(["lock", "p40", "--only", "pip,sources", "--index-url", index, "--torch-index-url", index,
                  "--github-url", github, "-o", str(lock)], config)
    assert r.returncode == 0, r.stderr[-3000:]
    r = envbuild(["wheelhouse", "p40", "--lock-dir", str(lock), "-o", str(tmp_path / "wh"),
                  "--url-map", f"https://github.com={github}"], config)
    assert r.returncode == 0, r.stderr[-3000:]
    r = envbuild(["build", "p40", "--wheelhouse", str(tmp_path / "wh"), "--mirror", "offline",
                  "--tag", "envbuild-test/p40:wheelhouse", "-v"], config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--no-index --find-links /wheelhouse" in r.stderr
    assert "apex @ file:///wheelhouse/sources/apex-25.08.tar.gz#sha256=" in r.stderr
    assert "smoke ok: p40" in r.stderr and "amp_C" in r.stderr
