"""The one reader that never blocks (limits.open_regular / read_limited): every file envbuild
reads is opened with O_NONBLOCK, checked with fstat before a byte is read, and refused when it
is not a regular file. A FIFO in place of any input is a clear exit-2 paragraph, never a hang.
Each case runs the real `envbuild` in a fresh process against a real FIFO (os.mkfifo) with a
time limit; on the code before, every one of them hung until the limit (issue 33 #8)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import clean_env, envbuild_exe

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 20  # seconds: a command that reads no FIFO answers in one or two


def run(args, tmp_path: Path, cache: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [envbuild_exe(), *map(str, args)],
            cwd=tmp_path,
            env=clean_env(XDG_CACHE_HOME=str(cache or tmp_path / "cache"), ENVBUILD_DEBUG="1", **env),
            capture_output=True,
            text=True,
            timeout=LIMIT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"envbuild {' '.join(map(str, args))} hung on a FIFO (killed after {LIMIT} s)")


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def refused(r: subprocess.CompletedProcess, name: str) -> None:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert name in r.stderr and "regular file" in r.stderr, r.stderr


def test_a_fifo_overlay_file(tmp_path):
    f = fifo(tmp_path / "overlay" / "lab.yaml")
    refused(run(["list", "--matrix-dir", f.parent], tmp_path), "lab.yaml")


def test_a_fifo_config(tmp_path):
    f = fifo(tmp_path / "config.yaml")
    r = run(["mirrors", "list"], tmp_path, ENVBUILD_CONFIG=str(f))
    refused(r, "config.yaml")
    r = run(["render", "t4", "--mirror", "cn", "-o", tmp_path / "out"], tmp_path, ENVBUILD_CONFIG=str(f))
    refused(r, "config.yaml")


def test_a_fifo_from_file(tmp_path):
    f = fifo(tmp_path / "envbuild.json")
    refused(run(["render", "--from", f, "-o", tmp_path / "out"], tmp_path), "envbuild.json")


@pytest.mark.parametrize("command", ["sbom", "render"])
def test_a_fifo_lock_json(tmp_path, command):
    lock = tmp_path / "lock" / "4090"
    shutil.copytree(ROOT / "tests" / "fixtures" / "locks" / "4090", lock)
    (lock / "lock.json").unlink()
    fifo(lock / "lock.json")
    args = (
        ["sbom", "4090", "--lock-dir", lock.parent]
        if command == "sbom"
        else ["render", "4090", "--locked", lock.parent, "-o", tmp_path / "out"]
    )
    r = run(args, tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "lock.json" in r.stderr and "not a regular file" in r.stderr, r.stderr


def test_a_fifo_requirements_lock_in_the_projects_lockfiles(tmp_path):
    """A plain render reads ./lockfiles/<profile>/requirements.lock for its constraints when
    the lock.json beside it is the plan's: a FIFO there is passed over (as an unreadable lock
    is), not waited on."""
    lock = tmp_path / "lockfiles" / "4090"
    shutil.copytree(ROOT / "lockfiles" / "4090", lock)
    (lock / "requirements.lock").unlink()
    fifo(lock / "requirements.lock")
    r = run(["render", "4090", "-o", tmp_path / "out"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "4090" / "Dockerfile").is_file()


def test_a_fifo_model_config(tmp_path):
    model = tmp_path / "model"
    fifo(model / "config.json")
    r = run(["show", "4090", "--model", model], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "config.json" in r.stderr, r.stderr


def test_a_fifo_in_place_of_the_cache_key(tmp_path):
    """~/.cache/envbuild/.key as a FIFO hung every command, `list` included: the cache goes
    unused instead (an entry that cannot be sealed is worked out afresh)."""
    cache = tmp_path / "cache"
    (cache / "envbuild").mkdir(parents=True, mode=0o700)
    os.chmod(cache / "envbuild", 0o700)
    fifo(cache / "envbuild" / ".key")
    r = run(["list"], tmp_path, cache)
    assert r.returncode == 0, r.stderr
    assert "4090" in r.stdout
    r = run(["render", "t4", "-o", tmp_path / "out"], tmp_path, cache)
    assert r.returncode == 0, r.stderr


def test_the_reader_refuses_a_link_only_where_asked(tmp_path):
    from envbuilder.limits import NotRegularFile, read_limited

    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert read_limited(tmp_path / "link", 10) == b"x"
    with pytest.raises(NotRegularFile):
        read_limited(tmp_path / "link", 10, follow=False)
    fifo(tmp_path / "p")
    with pytest.raises(NotRegularFile):
        read_limited(tmp_path / "p", 10)
    with pytest.raises(NotRegularFile):
        read_limited(Path("/dev/zero"), 10)
    assert read_limited(tmp_path / "f", 10) == b"x"


DIGEST = "sha256:" + "a" * 64
EVERY_COMMAND = {  # every command that reads the matrix and needs no network or Docker
    "list": ["list"],
    "show": ["show", "p40", "--json"],
    "check": ["check", "p40"],
    "grid": ["grid", "--gpu", "p40"],
    "render": ["render", "t4", "-o", "out"],
    "bake": ["bake", "t4", "-o", "bake"],
    "apptainer": ["apptainer", "p40", "--image", f"registry.example/envbuild/p40@{DIGEST}", "-o", "p.def"],
    "launch slurm": ["launch", "slurm", "h100", "--nodes", "2", "--sif", "/x.sif", "-o", "j.sbatch"],
    "launch kuberay": [
        "launch",
        "kuberay",
        "h100",
        "--nodes",
        "2",
        "--image",
        f"r.example/x@{DIGEST}",
        "-o",
        "j.yaml",
    ],
    "launch ray": ["launch", "ray", "h100", "--nodes", "2"],
    "sbom": ["sbom", "4090"],
    "mirrors list": ["mirrors", "list"],
}


@pytest.mark.parametrize("command", EVERY_COMMAND)
def test_a_fifo_overlay_stops_no_command(tmp_path, command):
    """The FIFO overlay against every command that reads the matrix: each refuses it at once."""
    f = fifo(tmp_path / "overlay" / "lab.yaml")
    refused(run([*EVERY_COMMAND[command], "--matrix-dir", f.parent], tmp_path), "lab.yaml")


def test_a_fifo_in_the_overlay_affected_compares(tmp_path):
    f = fifo(tmp_path / "overlay" / "lab.yaml")
    refused(run(["affected", f.parent], tmp_path), "lab.yaml")
