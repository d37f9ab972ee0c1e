"""Real image builds through a loopback mirror: dockerd, the registry on 127.0.0.1:5000 and the
debootstrapped base image come from tests/infra/provision.sh (run by tests/run.sh); the package
index is a pypiserver started here with stand-in wheels. Under CI=true these fail, never skip,
when the infrastructure is missing."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import need
from fixture_wheels import (
    apex_archive,
    flash_attn_release_wheel,
    flash_attn_sdist,
    make_wheel,
    real_uv_wheel,
    wheels_for_env,
)
from httpfixtures import FileServer, free_port

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = f"127.0.0.1:{os.environ.get('ENVBUILD_TEST_REGISTRY_PORT', '5000')}"
VERL_FIXTURE = ROOT / "tests" / "fixtures" / "verl-0.4.1"
APEX_STANDIN = ROOT / "tests" / "fixtures" / "apex-standin"
FLASH_ATTN_STANDIN = ROOT / "tests" / "fixtures" / "flash-attn-standin"
# the build tests' base image is debootstrapped Debian bookworm (tests/infra/provision.sh): its
# python3 is 3.11, whatever the profile's CUDA image would ship; the builder names flash-attn's
# wheel from the Python it runs
IMAGE_PYTHON = "3.11"
FA_PROFILE = ["4090", "--with", "flash-attn"]  # flash-attn 2.6.3 on torch 2.4.0 (CUDA 12.1)
BUILD_TOOLS = ("packaging", "ninja", "wheel", "setuptools", "psutil")  # the builder stage's pip step
ENVBUILD = [sys.executable, "-m", "envbuilder.cli"]


def _need(ok: bool, why: str) -> None:
    need(ok, f"{why} (tests/run.sh, run as root, provisions Docker)")


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
    """A pypiserver on loopback with stand-in wheels for everything p40 installs, and uv's real
    wheel."""
    from envbuilder.model import matrix
    from envbuilder.model.resolve import Overrides, resolve

    pkgs = tmp_path_factory.mktemp("pkgs")
    d = resolve(matrix.load(), "p40", Overrides(without=("apex",))).to_dict()
    wheels_for_env(pkgs, d, VERL_FIXTURE if VERL_FIXTURE.is_dir() else None)
    # the builder's tools at the versions the shipped p40 lock pins (a full p40 render constrains
    # them, as a real mirror of PyPI would serve), or any version where no lock pins them
    from envbuilder.lock.constraints import find_constraints

    full = find_constraints(resolve(matrix.load(), "p40", Overrides()))
    pinned = dict(pin.split("==", 1) for pins in (full.layers if full else {}).values() for pin in pins)
    for name in BUILD_TOOLS:
        make_wheel(pkgs, name, pinned.get(name, "0.0.1"))
    # the 4090 with flash-attn: its stand-ins where p40's do not already have the file, and
    # flash-attn's sdist, which the builder's fallback builds (in a second: a stand-in)
    fa = resolve(matrix.load(), "4090", Overrides(with_=("flash-attn",))).to_dict()
    extra = pkgs.parent / "pkgs-4090"
    for w in wheels_for_env(extra, fa, VERL_FIXTURE if VERL_FIXTURE.is_dir() else None):
        if not (pkgs / w.name).exists():
            w.rename(pkgs / w.name)
    flash_attn_sdist(FLASH_ATTN_STANDIN, pkgs, fa["flash_attn"]["version"])
    # the real uv wheel: the runtime stage runs `uv pip install`, so no stand-in can do (and an
    # export of a lock made against this index carries it into the wheelhouse)
    real_uv_wheel(pkgs)
    port = free_port()
    exe = Path(sys.executable).parent / "pypi-server"
    _need(exe.exists(), "pypiserver is not installed")
    log = open(pkgs.parent / "pypiserver.log", "w")
    proc = subprocess.Popen(
        [
            str(exe),
            "run",
            "-i",
            "127.0.0.1",
            "-p",
            str(port),
            "--disable-fallback",
            "--hash-algo",
            "sha256",
            str(pkgs),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
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
    from envbuilder.model import matrix

    path, data = apex_archive(APEX_STANDIN, matrix.load().apex["source_url"].format(ref="25.08"))
    with FileServer({path: data}) as srv:
        yield srv.url("").rstrip("/")


def fa_release_name(python: str = IMAGE_PYTHON, abi: bool = False) -> tuple[str, str]:
    """(path on github.com, file name) of the flash-attn release wheel the builder looks for:
    the stand-in torch in the image is 2.4.0 built with CUDA 12.1 and the old C++ ABI."""
    from envbuilder.model import matrix
    from envbuilder.images.flash_attn_wheel import wheel_filename
    from envbuilder.model.resolve import Overrides, resolve

    d = resolve(matrix.load(), "4090", Overrides(with_=("flash-attn",))).to_dict()
    fa = d["flash_attn"]
    name = wheel_filename(
        fa["wheel"], fa["version"], d["torch"]["version"], d["torch"]["cuda"], python, abi, fa["cuda_tags"]
    )
    return fa["release"].split("://", 1)[1].split("/", 1)[1] + "/" + name, name


@pytest.fixture(scope="module")
def fa_github(tmp_path_factory):
    """A loopback github.com that has apex's archive and flash-attn's release wheel (a stand-in
    holding the training path's modules) for the build image's torch and Python, old ABI only."""
    from envbuilder.model import matrix

    path, name = fa_release_name()
    # salted per session: its sha256 is in the locked builder step, which so never comes from
    # the cache (the assertions read what the step printed)
    wheel = flash_attn_release_wheel(
        tmp_path_factory.mktemp("fa-release"), name, "2.6.3", salt=os.urandom(6).hex()
    )
    apex_path, apex_data = apex_archive(APEX_STANDIN, matrix.load().apex["source_url"].format(ref="25.08"))
    with FileServer({path: wheel.read_bytes(), apex_path: apex_data}) as srv:
        yield srv


@pytest.fixture(scope="module")
def config(tmp_path_factory, index, github, fa_github):
    """The user's config: a `test` mirror set mapping Docker Hub to the loopback registry, and
    a `fallback` set whose first endpoint is a closed port and whose second answers /v2/ but
    does not hold the image (so the pull itself fails and the build moves on)."""
    closed = f"127.0.0.1:{free_port()}"
    body = {"pypi": [index], "pytorch": [index], "huggingface": ["http://127.0.0.1:9/hf"], "github": [github]}
    cfg = {
        "registries": {"local": REGISTRY},
        "mirrors": {
            "test": dict(body, description="loopback test mirror", registries={"docker.io": [REGISTRY]}),
            "fallback": dict(
                body,
                description="first endpoint closed",
                registries={"docker.io": [closed, f"{REGISTRY}/empty", REGISTRY]},
            ),
            # flash-attn's release wheel through a GitHub prefix that carries credentials
            "test-fa": dict(
                body,
                description="loopback mirror with flash-attn's release",
                registries={"docker.io": [REGISTRY]},
                github=[fa_github.url("").rstrip("/").replace("http://", f"http://envbuild:{FA_TOKEN}@")],
            ),
            # the package index (and HF endpoint) through URLs that carry credentials
            "test-cred": dict(
                body,
                description="loopback mirror behind credentials",
                registries={"docker.io": [REGISTRY]},
                pypi=[index.replace("http://", f"http://envbuild:{INDEX_TOKEN}@")],
                pytorch=[index.replace("http://", f"http://envbuild:{INDEX_TOKEN}@")],
                huggingface=[f"http://envbuild:{INDEX_TOKEN}@127.0.0.1:9/hf"],
            ),
            "nowhere": dict(
                body,
                description="registries that answer but lack the images",
                registries={"docker.io": [f"{REGISTRY}/empty", closed]},
            ),
            "offline": {
                "description": "no package index, no GitHub: all point at a closed port",
                "registries": {"docker.io": [REGISTRY]},
                "pypi": [f"http://{closed}/simple"],
                "pytorch": [f"http://{closed}/simple"],
                "github": [f"http://{closed}"],
            },
        },
    }
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


FA_TOKEN = "fa-" + os.urandom(6).hex()  # a credential in the GitHub prefix: never in the image
INDEX_TOKEN = "ix-" + os.urandom(6).hex()  # a credential in the index URLs: never in the image


@functools.lru_cache(maxsize=None)
def standin_python_overlay() -> str:
    """A matrix overlay whose every CUDA image ships the stand-in base's Python (3.11): the
    Dockerfile refuses a base image whose python3 is not the profile's Python, so the build
    tests render for the base they build on (as a user with such a base would, with --python)."""
    import tempfile

    from envbuilder.model import matrix

    m = matrix.load()
    folder = Path(tempfile.mkdtemp(prefix="envbuild-standin-python-"))
    (folder / "standin.yaml").write_text(
        json.dumps(
            {
                "sources": {"provision": "tests/infra/provision.sh (Debian bookworm's python3)"},
                "cuda": {k: dict(rec, python=IMAGE_PYTHON, source="provision") for k, rec in m.cuda.items()},
            }
        )
    )
    return str(folder)


def envbuild(args, config, **env):
    full = dict(os.environ, ENVBUILD_CONFIG=str(config), ENVBUILD_MATRIX_DIR=standin_python_overlay())
    full.update(env)
    return subprocess.run(ENVBUILD + args, capture_output=True, text=True, env=full, cwd=ROOT, timeout=1800)


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


def pull_back(client, ref: str, profile: str):
    """Pull `ref` and check it is `profile`'s image: its /etc/envbuild.json and its label."""
    image = client.images.pull(ref)
    out = client.containers.run(
        image.id,
        ["python", "-c", "import json; print(json.load(open('/etc/envbuild.json'))['profile'])"],
        remove=True,
        network_mode="host",
    )
    assert out.decode().strip() == profile
    assert image.labels["io.envbuild.profile"] == profile
    return image


def test_build_p40_through_mirror_pushes_and_pulls_back(docker_client, config):
    tag = "envbuild-test/p40:mirror"
    r = envbuild(
        ["build", "p40", "--mirror", "test", "--without", "apex", "--push", "local", "--tag", tag], config
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "smoke ok: p40" in r.stderr
    pushed = r.stdout.strip().splitlines()[-1]
    assert pushed.startswith(f"{REGISTRY}/envbuild-test/p40@sha256:")
    docker_client.images.remove(f"{REGISTRY}/{tag}", force=True)
    docker_client.images.remove(tag, force=True)
    pull_back(docker_client, pushed, "p40")


def test_build_compiles_apex_in_the_devel_stage_and_ships_only_the_wheel(docker_client, config):
    tag = "envbuild-test/p40:apex"
    r = envbuild(["build", "p40", "--mirror", "test", "--tag", tag, "-v"], config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[builder" in r.stderr and "apex @ http://127.0.0.1:" in r.stderr  # through the mirror
    assert "smoke ok: p40" in r.stderr and "amp_C" in r.stderr
    # the runtime stage has the compiled extension but not the compiler that built it
    out = docker_client.containers.run(
        tag,
        [
            "sh",
            "-c",
            "command -v cc gcc || echo no-compiler; python -c 'import amp_C; print(amp_C.standin())'",
        ],
        remove=True,
        network_mode="host",
    ).decode()
    assert out.split() == ["no-compiler", "amp_C"]


def test_build_falls_back_to_the_next_registry_endpoint(docker_client, config):
    r = envbuild(
        [
            "build",
            "p40",
            "--mirror",
            "fallback",
            "--without",
            "apex",
            "--no-smoke",
            "--tag",
            "envbuild-test/p40:fallback",
        ],
        config,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "DOWN" in r.stderr  # the closed port, found by the probe
    # picked before building, by the manifests each endpoint serves: one build, no retries
    assert f"registry docker.io: {REGISTRY}/empty does not serve" in r.stderr
    assert f"registry docker.io: {REGISTRY} serves" in r.stderr
    assert r.stderr.count("builder: ") == 1


def test_no_endpoint_serving_the_base_images_builds_nothing_and_says_what_each_answered(
    docker_client, config
):
    r = envbuild(
        [
            "build",
            "p40",
            "--mirror",
            "nowhere",
            "--without",
            "apex",
            "--no-smoke",
            "--tag",
            "envbuild-test/p40:nowhere",
        ],
        config,
    )
    assert r.returncode == 1
    assert "No endpoint of mirror set 'nowhere' serves" in r.stderr
    assert f"{REGISTRY}/empty: The registry http://{REGISTRY} has no manifest" in r.stderr
    assert "Cannot reach the registry" in r.stderr  # the closed port
    assert "builder: " not in r.stderr and "Traceback" not in r.stderr


def test_a_failing_step_is_reported_as_that_step_not_as_a_pull(docker_client, config):
    """The index points at a closed port: pip's step fails once, named, with its output; no
    other registry endpoint is tried."""
    r = envbuild(
        [
            "build",
            "p40",
            "--mirror",
            "offline",
            "--without",
            "apex",
            "--no-smoke",
            "--no-probe",  # (the probe would refuse the closed index before any step)
            "--tag",
            "envbuild-test/p40:step-fails",
        ],
        config,
    )
    assert r.returncode == 1
    assert r.stderr.count("builder: ") == 1
    assert "failed at [" in r.stderr and "pip install" in r.stderr
    assert "could not pull" not in r.stderr


def test_a_base_image_with_another_python_is_refused_before_anything_installs(docker_client, config):
    """The field report: a base image that already has python3 (3.11 on the Debian stand-in)
    skipped the apt step, and the profile's Python 3.10 pins went into 3.11 without a word. Now
    the first step stops the build, naming both versions and both ways out."""
    r = envbuild(
        [
            "build",
            "p40",
            "--mirror",
            "test",
            "--without",
            "apex",
            "--no-smoke",
            "--tag",
            "envbuild-test/p40:other-python",
        ],
        config,
        ENVBUILD_MATRIX_DIR="",
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert (
        "the base image's python3 is Python 3.11, but p40's pins and wheels are for Python 3.10"
    ) in r.stderr
    assert "--python X.Y" in r.stderr and "failed at [" in r.stderr


def test_a_build_whose_base_registry_does_not_answer_stops_before_any_step(docker_client, config, tmp_path):
    """No --mirror, and the registry the base images come from does not answer (Docker Hub on a
    network that blocks it; here a closed loopback port): the build names it and --mirror in
    seconds, before its first step, instead of failing minutes in."""
    from envbuilder.model import matrix

    dead = f"127.0.0.1:{free_port()}"
    rec = dict(matrix.load().cuda["12.1"], python=IMAGE_PYTHON, source="provision")
    rec["images"] = {role: f"{dead}/{ref}" for role, ref in rec["images"].items()}
    (tmp_path / "dead.yaml").write_text(
        json.dumps({"sources": {"provision": "tests/infra/provision.sh"}, "cuda": {"12.1": rec}})
    )
    start = time.monotonic()
    r = envbuild(
        ["build", "4090", "--no-smoke", "--push", "local"],
        config,
        ENVBUILD_MATRIX_DIR=os.pathsep.join([standin_python_overlay(), str(tmp_path)]),
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"{dead} (the base images): connection refused/unreachable" in r.stderr
    assert "--mirror NAME" in r.stderr and "failed at [" not in r.stderr
    assert time.monotonic() - start < 60


def test_ca_cert_reaches_the_build_but_no_layer(docker_client, config, tmp_path):
    secret = b"ENVBUILD-TEST-CA-" + os.urandom(8).hex().encode()
    ca = tmp_path / "corp.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n" + secret + b"\n-----END CERTIFICATE-----\n")
    tag = "envbuild-test/p40:ca"
    r = envbuild(
        [
            "build",
            "p40",
            "--mirror",
            "test",
            "--without",
            "apex",
            "--no-smoke",
            "--ca-cert",
            str(ca),
            "--tag",
            tag,
            "-v",
        ],
        config,
    )
    # the CA replaces pip's trust store: plain-http loopback indexes don't care, so it builds
    assert r.returncode == 0, r.stderr[-3000:]
    assert _layers_contain(docker_client, tag, b"Acquire::https::CAInfo")  # the scan sees layers
    assert not _layers_contain(docker_client, tag, secret)


def test_daemon_not_running_is_a_clear_exit_1(config, tmp_path):
    r = envbuild(
        ["build", "p40", "--without", "apex"], config, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock"
    )
    assert r.returncode == 1
    assert "Cannot reach the Docker engine" in r.stderr and "Traceback" not in r.stderr


def test_unreachable_registry_pushes_nothing(docker_client, config):
    closed = f"127.0.0.1:{free_port()}"
    r = envbuild(
        [
            "build",
            "p40",
            "--mirror",
            "test",
            "--without",
            "apex",
            "--no-smoke",
            "--tag",
            "envbuild-test/p40:unreach",
            "--push",
            closed,
        ],
        config,
    )
    assert r.returncode == 1
    # found before the build, not after it: nothing is built for a push that cannot happen
    assert f"{closed} (the push): connection refused/unreachable" in r.stderr
    assert "builder:" not in r.stderr and "@sha256:" not in r.stdout


def test_unknown_registry_name_is_bad_input_and_builds_nothing(docker_client, config):
    r = envbuild(
        [
            "build",
            "p40",
            "--mirror",
            "test",
            "--without",
            "apex",
            "--no-smoke",
            "--tag",
            "envbuild-test/p40:unknown",
            "--push",
            "nosuchregistry",
        ],
        config,
    )
    assert r.returncode == 2  # (a name the config does not know is bad input, found before building)
    assert "builder:" not in r.stderr
    assert "nosuchregistry" in r.stderr and "Traceback" not in r.stderr


def test_build_from_a_wheelhouse_with_no_index_at_all(docker_client, config, index, github, tmp_path):
    """p40 whole, apex included: its build tools and source archive come from the wheelhouse too."""
    lock = tmp_path / "lock"
    r = envbuild(
        [
            "lock",
            "p40",
            "--only",
            "pip,sources",
            "--index-url",
            index,
            "--torch-index-url",
            index,
            "--github-url",
            github,
            "-o",
            str(lock),
        ],
        config,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    r = envbuild(
        [
            "wheelhouse",
            "p40",
            "--lock-dir",
            str(lock),
            "-o",
            str(tmp_path / "wh"),
            "--url-map",
            f"https://github.com={github}",
            "--accept-partial",
        ],
        config,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    r = envbuild(
        [
            "build",
            "p40",
            "--wheelhouse",
            str(tmp_path / "wh"),
            "--mirror",
            "offline",
            "--tag",
            "envbuild-test/p40:wheelhouse",
            "-v",
        ],
        config,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--no-index --find-links /wheelhouse" in r.stderr
    assert "apex @ file:///wheelhouse/sources/apex-25.08.tar.gz#sha256=" in r.stderr
    assert "smoke ok: p40" in r.stderr and "amp_C" in r.stderr
    # the image carries the SBOM of the lock it was built from, its sha256 in a label: the same
    # bytes `render --wheelhouse` writes (the wheelhouse's copy of the lock)
    image = "envbuild-test/p40:wheelhouse"
    inside = docker_client.containers.run(image, ["cat", "/opt/envbuild/sbom.cdx.json"], remove=True)
    r = envbuild(["render", "p40", "--wheelhouse", str(tmp_path / "wh"), "-o", str(tmp_path / "r")], config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert inside == (tmp_path / "r" / "p40" / "sbom.cdx.json").read_bytes()
    assert (
        docker_client.images.get(image).labels["io.envbuild.sbom-sha256"]
        == hashlib.sha256(inside).hexdigest()
    )
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(inside.decode()) is None
    components = json.loads(inside)["components"]
    apex = json.loads((lock / "p40" / "sources.lock").read_text())["apex"]
    assert [c["hashes"][0]["content"] for c in components if c["name"] == "apex"] == [apex["sha256"]]
    assert {"torch", "verl"} <= {c["name"] for c in components if c["purl"].startswith("pkg:pypi/")}


# ---- flash-attn: the release wheel first, the sdist build as the fallback ---------------------

# the fallback's own line in the build output (BuildKit prefixes output lines with "#N secs ")
FALLBACK_SAID = re.compile(
    r"^#\d+ [\d.]+ envbuild: flash-attn: building 2\.6\.3 from "
    r"its PyPI sdist instead",
    re.M,
)


def _history(client, image: str) -> str:
    return "\n".join(str(h.get("CreatedBy", "")) for h in client.images.get(image).history())


def test_flash_attn_installs_the_release_wheel_through_the_mirror_and_compiles_nothing(
    docker_client, config, fa_github
):
    tag = "envbuild-test/4090:fa-prebuilt"
    path, name = fa_release_name()
    r = envbuild(["build", *FA_PROFILE, "--mirror", "test-fa", "--tag", tag, "-v"], config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"fetching the prebuilt wheel http://***@127.0.0.1:{fa_github.port}/{path}" in r.stderr
    assert f"installed the prebuilt wheel {name}" in r.stderr
    assert "checked against its own RECORD (integrity, not a pin" in r.stderr
    assert not FALLBACK_SAID.search(r.stderr)  # (the -v log echoes the command; not its output)
    assert "flash-attn stand-in: source build" not in r.stderr  # the sdist was never built
    assert "smoke ok: 4090" in r.stderr and "flash_attn_2_cuda" in r.stderr
    # the credential went to the server as Basic auth, and into no layer and no history entry
    assert any(q.authorization and q.path == "/" + path for q in fa_github.log)
    assert FA_TOKEN not in r.stderr
    assert FA_TOKEN not in _history(docker_client, tag)
    assert not _layers_contain(docker_client, tag, FA_TOKEN.encode())
    out = (
        docker_client.containers.run(
            tag,
            [
                "python",
                "-c",
                "import flash_attn_2_cuda, flash_attn; "
                "print(flash_attn.__version__, hasattr(flash_attn_2_cuda, 'BUILT_FROM'))",
            ],
            remove=True,
            network_mode="host",
        )
        .decode()
        .split()
    )
    assert out == ["2.6.3", "False"]  # the release wheel's module, not the sdist build's


def test_flash_attn_without_a_release_wheel_falls_back_to_the_sdist_build(docker_client, config):
    """The `test` mirror's GitHub has only apex's archive: 404 for the wheel, so the builder
    says so and builds flash-attn from the (stand-in) sdist on the index."""
    tag = "envbuild-test/4090:fa-fallback"
    r = envbuild(["build", *FA_PROFILE, "--mirror", "test", "--tag", tag, "-v"], config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no prebuilt wheel:" in r.stderr and "answered HTTP 404" in r.stderr
    assert FALLBACK_SAID.search(r.stderr)
    assert (
        "flash-attn stand-in: source build of 2.6.3 (FLASH_ATTENTION_FORCE_BUILD=TRUE, "
        "FLASH_ATTN_CUDA_ARCHS=80)"
    ) in r.stderr
    assert "smoke ok: 4090" in r.stderr
    out = (
        docker_client.containers.run(
            tag,
            ["python", "-c", "import flash_attn_2_cuda; print(flash_attn_2_cuda.BUILT_FROM)"],
            remove=True,
            network_mode="host",
        )
        .decode()
        .strip()
    )
    assert out == "sdist"


def test_flash_attn_from_the_wheel_index_flash_attn_index_names(docker_client, config, tmp_path):
    """--flash-attn-index: the builder stage downloads flash-attn's wheel from that index (a
    loopback pypiserver serving a fixture wheel, named as verl's wheelhouse names its own),
    checks it (no cuobjdump in the stand-in base image: said so), and compiles nothing."""
    from lockfixtures import PypiServer

    tag = "envbuild-test/4090:fa-index"
    files = {
        "flash_attn_2_cuda.py": "FROM_INDEX = True  # envbuild test stand-in\n",
        "flash_attn/bert_padding.py": "# envbuild test stand-in\n",
    }
    py = "cp" + IMAGE_PYTHON.replace(".", "")
    make_wheel(tmp_path / "fa-index", "flash_attn", "2.6.3", tag=f"{py}-{py}-linux_x86_64", files=files)
    with PypiServer(tmp_path / "fa-index") as fa_index:
        args = [
            "build",
            *FA_PROFILE,
            "--flash-attn-index",
            fa_index.url,
            "--mirror",
            "test",
            "--tag",
            tag,
            "-v",
        ]
        r = envbuild(args, config)
    assert r.returncode == 0, r.stderr[-3000:]
    # (said only after the download: the step's check of the wheel it took)
    assert "no cuobjdump here (not a CUDA devel image?)" in r.stderr
    assert "flash-attn stand-in: source build" not in r.stderr
    assert "smoke ok: 4090" in r.stderr
    out = docker_client.containers.run(
        tag,
        ["python", "-c", "import flash_attn_2_cuda; print(flash_attn_2_cuda.FROM_INDEX)"],
        remove=True,
        network_mode="host",
    )
    assert out.decode().strip() == "True"  # the index's wheel, not a build


def test_flash_attn_from_a_wheelhouse_with_no_index_and_no_github(
    docker_client, config, index, fa_github, tmp_path
):
    """Lock pins the release wheel (the ABI variant the release has; the other answers 404),
    the wheelhouse carries it, and the offline build installs it by sha256."""
    menv = {}  # (envbuild() renders for the build image's Python: the lock pins the file it needs)
    github = fa_github.url("").rstrip("/")
    lock = tmp_path / "lock"  # lock -o DIR: DIR/4090/; wheelhouse --lock-dir DIR reads it there
    r = envbuild(
        [
            "lock",
            *FA_PROFILE,
            "--only",
            "pip,sources",
            "--index-url",
            index,
            "--torch-index-url",
            index,
            "--github-url",
            github,
            "-o",
            str(lock),
        ],
        config,
        **menv,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    sources = json.loads((lock / "4090" / "sources.lock").read_text())
    _, name = fa_release_name()
    assert sorted(sources) == ["flash-attn-cxx11abiFALSE"]  # no TRUE variant on this "release"
    assert sources["flash-attn-cxx11abiFALSE"]["filename"] == name
    assert sources["flash-attn-cxx11abiFALSE"]["url"].startswith("https://github.com/Dao-AILab/")
    r = envbuild(
        [
            "wheelhouse",
            "4090",
            "--lock-dir",
            str(lock),
            "-o",
            str(tmp_path / "wh"),
            "--url-map",
            f"https://github.com={github}",
            "--accept-partial",
        ],
        config,
        **menv,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "wh" / "sources" / name).is_file()
    served = len(fa_github.log)
    r = envbuild(
        [
            "build",
            *FA_PROFILE,
            "--wheelhouse",
            str(tmp_path / "wh"),
            "--mirror",
            "offline",
            "--tag",
            "envbuild-test/4090:fa-wheelhouse",
            "-v",
        ],
        config,
        **menv,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    sha = sources["flash-attn-cxx11abiFALSE"]["sha256"]
    assert f"fetching the prebuilt wheel file:///wheelhouse/sources/{name}" in r.stderr
    assert f"sha256 {sha} as the lock pins it" in r.stderr
    assert not FALLBACK_SAID.search(r.stderr) and "flash-attn stand-in: source build" not in r.stderr
    assert "smoke ok: 4090" in r.stderr
    assert len(fa_github.log) == served  # the build asked GitHub for nothing


def test_a_bake_target_builds_with_exactly_the_args_its_file_gives(docker_client, config, tmp_path):
    """`docker buildx bake` is not installable here: the bake file is parsed (python-hcl2) and
    its p40 target built by the engine that is here, with the target's context, args and tag
    and nothing else; the image then passes its smoke test. (The registry cache-from/cache-to
    entries need buildx and are not exercised.)"""
    from bakefile import load
    from envbuilder.engines import docker as B
    from envbuilder.render.files import smoke_command

    r = envbuild(
        [
            "bake",
            "p40",
            "--without",
            "apex",
            "--mirror",
            "test",
            "--registry",
            "local",
            "-o",
            str(tmp_path / "bake"),
        ],
        config,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    bake = load(tmp_path / "bake" / "docker-bake.hcl")
    t = bake["targets"]["p40"]
    assert bake["groups"]["default"] == ["p40"]
    assert t["tags"][0].startswith(f"{REGISTRY}/envbuild/p40:")
    rc, log = B.run_build(
        B.find_buildkit(), tmp_path / "bake" / t["context"], t["tags"][0], t["args"], {}, lambda line: None
    )
    assert rc == 0, log[-3000:]
    assert "smoke ok: p40" in B.smoke(docker_client, t["tags"][0], smoke_command())
    docker_client.images.remove(t["tags"][0], force=True)


def test_a_mirrors_credentials_reach_the_build_but_no_layer_history_or_file(docker_client, config):
    """An index URL with user:password@ used to be a build arg, which `docker history` shows, and
    the image's HF_ENDPOINT (a build arg too) disagreed with its /etc/envbuild.json. Now the
    files name the mirror without credentials and the credentials reach RUN steps as a secret."""
    tag = "envbuild-test/p40:cred"
    r = envbuild(
        ["build", "p40", "--mirror", "test-cred", "--without", "apex", "--no-smoke", "--tag", tag, "-v"],
        config,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert INDEX_TOKEN not in r.stderr + r.stdout
    assert INDEX_TOKEN not in _history(docker_client, tag)
    assert not _layers_contain(docker_client, tag, INDEX_TOKEN.encode())
    spec = json.loads(
        docker_client.containers.run(tag, ["cat", "/etc/envbuild.json"], remove=True, network_mode="host")
    )
    env = dict(e.split("=", 1) for e in docker_client.images.get(tag).attrs["Config"]["Env"])
    assert env["HF_ENDPOINT"] == spec["huggingface"] == "http://127.0.0.1:9/hf"
    assert spec["indexes"]["pypi"].startswith("http://127.0.0.1:")  # the mirror, bare
    docker_client.images.remove(tag, force=True)


def test_a_p40_owners_first_hour_end_to_end(docker_client, config, index, github, tmp_path):
    """The field report's first hour, each step the one the previous output names: render p40,
    read its README, `envbuild build --push local` inside the folder with no way to Docker Hub
    (a clear exit 1 naming --mirror, before any build step), the same through the loopback
    mirror, the wheelhouse (refused for the shipped lock's PyPI torch, then locked here and
    exported), and the offline install with the right Python. Only loopback is ever reached:
    "no network" is a proxy on a closed loopback port."""

    base = dict(os.environ, ENVBUILD_CONFIG=str(config), ENVBUILD_MATRIX_DIR=standin_python_overlay())

    def run(args, cwd, **extra):
        r = subprocess.run(
            ENVBUILD + args, cwd=cwd, env=dict(base, **extra), capture_output=True, text=True, timeout=1800
        )
        return r.returncode, r.stdout, r.stderr

    code, out, err = run(["render", "p40", "-o", "out"], tmp_path)
    assert code == 0, err
    folder = tmp_path / "out" / "p40"
    readme = (folder / "README.md").read_text()
    assert "`envbuild build --push local`" in readme and "`envbuild doctor p40`" in readme
    # (for Python 3.11 no shipped lock fits: the README says how to make one)
    assert "--mirror NAME" in readme and "`envbuild lock p40` makes one" in readme
    assert "`envbuild wheelhouse p40 -o wh/p40`" in readme

    dead = f"http://127.0.0.1:{free_port()}"  # every non-loopback request goes nowhere
    code, out, err = run(
        ["build", "--push", "local"],
        folder,
        HTTPS_PROXY=dead,
        HTTP_PROXY=dead,
        https_proxy=dead,
        http_proxy=dead,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    assert code == 1, err[-3000:]
    assert "building p40 as ./envbuild.json holds it" in err
    assert "registry-1.docker.io (the base images)" in err and "--mirror NAME" in err
    assert "builder:" not in err and "failed at [" not in err  # nothing was built

    code, out, err = run(["build", "--mirror", "test", "--push", "local"], folder)
    assert code == 0, err[-3000:]
    assert re.search(r"^build done in \S+: \d+ steps, \d+ cached, \d+ run$", err, re.M), err[-2000:]
    assert f"{REGISTRY}/envbuild/p40@sha256:" in out

    code, _, err = run(["wheelhouse", "p40", "-o", "wh"], tmp_path)  # the shipped lock
    assert code == 2 and "torch is a swap" in err and "envbuild lock p40" in err
    code, _, err = run(
        [
            "lock",
            "p40",
            "--only",
            "pip,sources",
            "--index-url",
            index,
            "--torch-index-url",
            index,
            "--github-url",
            github,
        ],
        tmp_path,
    )
    assert code == 0, err[-3000:]
    code, _, err = run(
        ["wheelhouse", "p40", "-o", "wh", "--url-map", f"https://github.com={github}"], tmp_path
    )
    assert code == 2 and "no conda part" in err and "--accept-partial" in err
    code, out, err = run(
        ["wheelhouse", "p40", "-o", "wh", "--url-map", f"https://github.com={github}", "--accept-partial"],
        tmp_path,
    )
    assert code == 0, err[-3000:]

    install = [str(tmp_path / "wh" / "install.sh"), "--prefix", str(tmp_path / "env")]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    wrong = subprocess.run(
        install,
        env=dict(clean, PIP_CONFIG_FILE=os.devnull, PYTHON=shutil.which("python3.10") or "/bin/false"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert wrong.returncode == 2 and f"the p40 lock is for Python {IMAGE_PYTHON}" in wrong.stderr
    assert not (tmp_path / "env").exists()
    right = subprocess.run(
        install,
        env=dict(clean, PIP_CONFIG_FILE=os.devnull, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert right.returncode == 0, right.stderr[-3000:]
    check = subprocess.run(
        [str(tmp_path / "env" / "bin" / "python"), "-c", "import torch, verl; print(torch.__version__)"],
        capture_output=True,
        text=True,
    )
    assert check.stdout.strip() == "2.6.0+cu118", check.stderr
