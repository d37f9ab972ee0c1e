"""`envbuild build --builder podman|buildah`: the same rendered Dockerfile built daemonless, through
the loopback test mirror, smoke-tested in a buildah container, pushed to the loopback registry and
pulled back with docker. The engine infrastructure comes from tests/infra/provision.sh (podman
and buildah from Debian); under CI=true these fail, never skip, when it is missing. The unit
tests at the end (auto-detection, base-image arguments) need no engine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import unavailable
from envbuilder.render.context import BuildContext
from test_build import (
    ENVBUILD,
    REGISTRY,
    ROOT,
    config,  # noqa: F401  (re-exported or a fixture)
    docker_client,  # noqa: F401  (re-exported or a fixture)
    envbuild,
    fa_github,  # noqa: F401
    github,  # noqa: F401  (re-exported or a fixture)
    index,  # noqa: F401  (re-exported or a fixture)
    pull_back,
)

pytestmark = pytest.mark.docker


def _need_tool(name: str) -> None:
    if shutil.which(name):
        return
    unavailable(f"{name} is not installed (apt-get install podman buildah; tests/infra/provision.sh does)")


def _containers() -> set[str]:
    return set(subprocess.run(["buildah", "containers", "-q"], capture_output=True, text=True).stdout.split())


@pytest.mark.parametrize("engine", ["podman", "buildah"])
def test_daemonless_build_through_the_mirror_smokes_pushes_and_pulls_back(docker_client, config, engine):
    _need_tool(engine)
    _need_tool("buildah")  # both engines smoke-test in a buildah container
    tag = f"envbuild-test/p40:{engine}"
    r = envbuild(
        [
            "build",
            "p40",
            "--builder",
            engine,
            "--mirror",
            "test",
            "--without",
            "apex",
            "--push",
            "local",
            "--tag",
            tag,
        ],
        config,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"builder: {engine} " in r.stderr and "daemonless" in r.stderr
    assert f"registry docker.io: {REGISTRY} serves" in r.stderr  # the same pick, before building
    assert "STEP " in r.stderr  # progress: the step headers
    assert "smoke ok: p40" in r.stderr
    pushed = r.stdout.strip().splitlines()[-1]
    assert pushed.startswith(f"{REGISTRY}/envbuild-test/p40@sha256:")
    # no working container left behind by the smoke test
    left = subprocess.run(
        ["buildah", "containers", "--format", "{{.ImageName}}"], capture_output=True, text=True
    ).stdout
    assert tag not in left
    try:
        docker_client.images.remove(pushed, force=True)
    except Exception:  # noqa: BLE001 - not there yet
        pass
    image = pull_back(docker_client, pushed, "p40")
    # docker's image format: SHELL (bash -o pipefail) kept, which OCI images would drop
    shell = docker_client.api.inspect_image(image.id)["Config"].get("Shell")
    assert shell == ["/bin/bash", "-o", "pipefail", "-c"]
    docker_client.images.remove(image.id, force=True)
    subprocess.run([engine, "rmi", "-f", tag], capture_output=True)


def test_a_failing_step_is_reported_as_that_step_with_podman(docker_client, config):
    _need_tool("podman")
    _need_tool("buildah")
    before = _containers()
    r = envbuild(
        [
            "build",
            "p40",
            "--builder",
            "podman",
            "--mirror",
            "offline",
            "--without",
            "apex",
            "--no-smoke",
            "--no-probe",  # (the probe would refuse the closed index before any step)
            "--tag",
            "envbuild-test/p40:podman-fails",
        ],
        config,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "podman build of envbuild-test/p40:podman-fails failed at [" in r.stderr
    assert "pip install" in r.stderr and "could not pull" not in r.stderr
    assert "Traceback" not in r.stderr
    # --force-rm: the failed step's working container is not left behind
    assert _containers() <= before


@pytest.fixture
def bare_config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("{}\n")
    return path


def test_engine_podman_missing_is_exit_2_with_what_to_install(bare_config, tmp_path):
    config = bare_config
    r = envbuild(["build", "p40", "--builder", "podman", "--without", "apex"], config, PATH=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "--builder podman: `podman` is not on PATH" in r.stderr
    assert "apt-get install podman buildah" in r.stderr and "Traceback" not in r.stderr


def test_engine_from_the_environment(bare_config, tmp_path):
    config = bare_config
    r = envbuild(["build", "p40", "--without", "apex"], config, PATH=str(tmp_path), ENVBUILD_ENGINE="buildah")
    assert r.returncode == 2, r.stderr
    assert "--builder buildah: `buildah` is not on PATH" in r.stderr


def test_podman_without_buildah_needs_no_smoke(bare_config, tmp_path):
    config = bare_config
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "podman").write_text("#!/bin/sh\nexit 0\n")
    (fake / "podman").chmod(0o755)
    r = envbuild(["build", "p40", "--builder", "podman", "--without", "apex"], config, PATH=str(fake))
    assert r.returncode == 2, r.stderr
    assert "`buildah` is not on PATH" in r.stderr and "--no-smoke" in r.stderr


def test_doctor_lists_the_engines(tmp_path):
    # a mirror set on loopback as the config's default: doctor probes it, not the upstream hosts
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "mirror": "lo",
                "mirrors": {"lo": {"description": "loopback", "registries": {"docker.io": [REGISTRY]}}},
            }
        )
    )
    r = subprocess.run(
        ENVBUILD + ["doctor", "p40", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, ENVBUILD_CONFIG=str(config)),
        timeout=300,
    )
    checks = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    engines = checks["engines"]["detail"]
    for name in ("docker", "podman", "buildah"):
        assert name in engines
    if shutil.which("podman") and shutil.which("buildah"):
        assert checks["engines"]["status"] == "ok"
        assert "podman: yes" in engines and "buildah: yes" in engines


# ---- unit tests: no engine needed -------------------------------------------------------------


def _which(*present):
    return lambda name: f"/usr/bin/{name}" if name in present else None


@pytest.mark.parametrize(
    "docker_ok, present, expected",
    [
        (True, ("podman", "buildah"), "docker"),
        (False, ("podman", "buildah"), "podman"),
        (False, ("buildah",), "buildah"),
        (False, (), "docker"),  # nothing else: docker's own error says what to fix
        (True, (), "docker"),
    ],
)
def test_auto_detection_order(monkeypatch, docker_ok, present, expected):
    from envbuilder.engines import daemonless as E

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(shutil, "which", _which(*present))
    monkeypatch.setattr(E, "docker_usable", lambda: (docker_ok, "stub"))
    assert E.auto()[0] == expected


def test_docker_host_set_means_docker(monkeypatch):
    from envbuilder.engines import daemonless as E

    monkeypatch.setenv("DOCKER_HOST", "unix:///nowhere.sock")
    monkeypatch.setattr(shutil, "which", _which("podman", "buildah"))
    monkeypatch.setattr(E, "docker_usable", lambda: pytest.fail("not asked"))
    assert E.auto() == ("docker", "DOCKER_HOST is set")


def test_choose_says_why_it_fell_back(monkeypatch):
    from envbuilder.engines import daemonless as E

    said = []
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(shutil, "which", _which("podman", "buildah"))
    monkeypatch.setattr(E, "docker_usable", lambda: (False, "no daemon"))
    assert E.choose(None, True, said.append) == "podman"
    assert said == ["engine: podman (docker cannot build here: no daemon)"]


DOCKERFILE = """\
ARG BASE_RUNTIME=nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04
ARG BASE_DEVEL={devel}
FROM ${{BASE_DEVEL}} AS builder
RUN true
FROM $BASE_RUNTIME AS runtime
COPY --from=builder /x /x
FROM builder AS again
"""


def test_base_images_are_qualified_and_tls_is_off_only_on_loopback(tmp_path):
    from envbuilder.engines import daemonless as E

    (tmp_path / "Dockerfile").write_text(DOCKERFILE.format(devel="127.0.0.1:5000/nvidia/cuda:dev"))
    assert E.base_images((tmp_path / "Dockerfile").read_text(), {}) == [
        ("BASE_DEVEL", "127.0.0.1:5000/nvidia/cuda:dev"),
        ("BASE_RUNTIME", "nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04"),
    ]
    argv = E.build_argv("podman", tmp_path, "t:1", {}, {"ca_cert": Path("/ca.pem")})
    # a short name as docker reads it (registries.conf may list no search registry)
    assert "BASE_RUNTIME=docker.io/nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04" in argv
    assert "--tls-verify=false" not in argv  # Docker Hub is not loopback
    assert argv[:2] == ["podman", "build"] and "--network=host" in argv
    assert "--format" in argv and argv[argv.index("--format") + 1] == "docker"
    assert "id=ca_cert,src=/ca.pem" in argv
    loop = {"BASE_RUNTIME": "127.0.0.1:5000/nvidia/cuda:rt"}
    argv = E.build_argv("buildah", tmp_path, "t:1", loop, {})
    assert argv[:2] == ["buildah", "bud"] and "--tls-verify=false" in argv and "--layers" in argv
    assert E.is_loopback("localhost:5000") and E.is_loopback("127.0.0.1:5000/prefix")
    assert not E.is_loopback("registry.example.com:5000")


def test_podman_builds_apex_in_the_devel_stage_and_ships_only_the_wheel(docker_client, config):
    """The multi-stage build (the builder stage compiles apex, the runtime stage copies only its
    wheel) through podman; the smoke test imports the compiled extension."""
    _need_tool("podman")
    _need_tool("buildah")
    tag = "envbuild-test/p40:podman-apex"
    r = envbuild(["build", "p40", "--builder", "podman", "--mirror", "test", "--tag", tag, "-v"], config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[1/2] STEP " in r.stderr and "[2/2] STEP " in r.stderr  # both stages
    assert "smoke ok: p40" in r.stderr and "amp_C" in r.stderr
    subprocess.run(["podman", "rmi", "-f", tag], capture_output=True)


def test_no_rendered_step_holds_two_locked_cache_mounts():
    """buildah before 1.29 (Debian's 1.28, also inside podman 4.3) releases only the lock of a
    RUN step's last cache mount (buildah #4342): a later step waits forever on any other locked
    one. The templates lock at most one mount per step, its last cache mount, so every engine
    builds the same file."""
    from conftest import PROFILES, resolved
    from envbuilder.render.files import render_files

    import re

    for profile in PROFILES:
        for line in render_files(BuildContext.of(resolved(profile)))["Dockerfile"].splitlines():
            caches = re.findall(r"--mount=type=cache,\S+", line)
            locked = [c for c in caches if "sharing=locked" in c]
            assert len(locked) <= 1 and (not locked or caches[-1] == locked[0]), (profile, line)


# ---- 4: ENVBUILD_DOCKER_TIMEOUT is a number of seconds ----------------------------------------


@pytest.mark.parametrize("value", ["abc", "", "-5", "0", "1e3", "٣٠٠", "99999999999999999999"])
def test_a_docker_timeout_that_is_no_number_is_named(run_envbuild, tmp_path, value):
    """Before: 'Cannot reach the Docker engine ... invalid literal for int()', exit 1 (and ''
    or '٣٠٠' were taken). Failed before the fix: yes."""
    # (DOCKER_HOST names no daemon: a value taken as a number never reaches a real engine)
    r = run_envbuild(
        "build",
        "t4",
        "--builder",
        "docker",
        "--no-probe",
        env={
            "ENVBUILD_DOCKER_TIMEOUT": value,
            "XDG_CONFIG_HOME": str(tmp_path),
            "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
        },
    )
    assert r.returncode == 2, r.stderr
    assert "ENVBUILD_DOCKER_TIMEOUT" in r.stderr and "seconds" in r.stderr
    assert "Cannot reach the Docker engine" not in r.stderr
