"""Issue 21, "files we place are ours" and the smaller findings: what a wheelhouse, an output
path, an environment variable or nvidia-smi hands envbuild is hostile too. Every test drives
the real command (a fresh `envbuild` process, or the CLI in-process where the machine's probes
must be chosen) against real files, links, FIFOs, mounts and subprocesses; each failed on the
code before its fix (noted per test). No Docker: export-image reads from a read-only OCI
registry on loopback (below) with the real skopeo.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import clean_env, envbuild_exe

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "t4"  # a profile whose shipped lock needs no source archives (pip part only)


def _unavailable(why: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: this test must run, but {why}")
    pytest.skip(why)


# ---- 1: a wheelhouse's files enter a build context only as the bytes its manifest names ------

def wheelhouse(where: Path, files: dict[str, bytes]) -> Path:
    """A wheelhouse for PROFILE as `envbuild wheelhouse` lays it out: the shipped lock under
    locks/, `files` under pypi/, and manifest.json naming each with its size and sha256."""
    wh = where / "wh"
    (wh / "pypi").mkdir(parents=True)
    shutil.copytree(ROOT / "lockfiles" / PROFILE, wh / "locks" / PROFILE)
    listed = {}
    for name, data in files.items():
        (wh / "pypi" / name).write_bytes(data)
        listed[f"pypi/{name}"] = {"kind": "pip", "name": name.split("-")[0], "version": "1.0",
                                  "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"format": 1, "files": listed,
                "profiles": {PROFILE: {"input_sha256": "0" * 64, "files": sorted(listed),
                                       "built": {}}}}
    (wh / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return wh


WHEELS = {"alpha-1.0-py3-none-any.whl": b"alpha wheel bytes\n" * 50,
          "beta-1.0-py3-none-any.whl": b"beta wheel bytes\n" * 40}
SECRET = b"the user's private key\n"


@pytest.fixture
def other_fs(tmp_path):
    """A folder on another file system than tmp_path (so a hard link cannot be made there)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev:
        folder = Path(tempfile.mkdtemp(prefix="envbuild-test-", dir=shm))
        yield folder
        shutil.rmtree(folder, ignore_errors=True)
        return
    if os.geteuid() != 0:
        _unavailable("no /dev/shm on another file system, and mounting one needs root")
    mnt = tmp_path / "otherfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", mnt], check=True)
    yield mnt
    subprocess.run(["umount", "-l", mnt], check=False)


def secret_anywhere(folder: Path) -> list[str]:
    """Files under `folder` (links followed) that hold the secret's bytes, and links in it."""
    found = []
    for p in folder.rglob("*"):
        if p.is_symlink():
            found.append(f"{p} is a link to {os.readlink(p)}")
        elif p.is_file() and p.read_bytes() == SECRET:
            found.append(f"{p} holds the secret")
    return found


@pytest.mark.parametrize("same_fs", [True, False], ids=["same-fs", "other-fs"])
def test_a_wheelhouse_file_that_is_a_link_to_a_secret_never_enters_the_build_context(
        run_envbuild, tmp_path, other_fs, same_fs):
    """Before: the link itself was hard-linked into the context (same file system) or the
    secret copied (another one); render exited 0. Failed before the fix: yes."""
    wh = wheelhouse(tmp_path, WHEELS)
    secret = tmp_path / "id_ed25519"
    secret.write_bytes(SECRET)
    beta = wh / "pypi" / "beta-1.0-py3-none-any.whl"
    beta.unlink()
    beta.symlink_to(secret)
    out = (tmp_path if same_fs else other_fs) / "out"
    r = run_envbuild("render", PROFILE, "--wheelhouse", wh, "-o", out)
    assert r.returncode == 2, r.stderr
    assert "beta-1.0-py3-none-any.whl" in r.stderr and "symbolic link" in r.stderr
    assert not out.exists() or not secret_anywhere(out)
    assert not out.exists(), "nothing is written when a file is refused"


def test_a_wheelhouse_folder_that_is_a_link_is_not_followed(run_envbuild, tmp_path):
    """pypi/ itself a link to another folder holding files of the right names. Failed before
    the fix: yes (the files behind the link were placed)."""
    wh = wheelhouse(tmp_path, WHEELS)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(wh / "pypi", elsewhere)
    (wh / "pypi").symlink_to(elsewhere, target_is_directory=True)
    r = run_envbuild("render", PROFILE, "--wheelhouse", wh, "-o", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert "symbolic link" in r.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("change", ["same-size", "longer", "shorter"])
def test_a_wheelhouse_file_whose_bytes_are_not_the_manifests_is_refused(run_envbuild, tmp_path,
                                                                        change):
    """A file swapped after the export (a wheel with other code in it). Before: placed as it
    was, exit 0. Failed before the fix: yes."""
    wh = wheelhouse(tmp_path, WHEELS)
    alpha = wh / "pypi" / "alpha-1.0-py3-none-any.whl"
    data = WHEELS[alpha.name]
    alpha.write_bytes({"same-size": b"X" + data[1:], "longer": data + b"import os\n",
                       "shorter": data[:-5]}[change])
    r = run_envbuild("render", PROFILE, "--wheelhouse", wh, "-o", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert alpha.name in r.stderr and "manifest" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_fifo_in_place_of_a_wheelhouse_file_is_refused_without_blocking(run_envbuild, tmp_path):
    """A FIFO (or a device) where a file belongs. Before: hard-linked into the context, exit 0
    (a copy would have blocked forever on it). Failed before the fix: yes."""
    wh = wheelhouse(tmp_path, WHEELS)
    beta = wh / "pypi" / "beta-1.0-py3-none-any.whl"
    beta.unlink()
    os.mkfifo(beta)
    r = run_envbuild("render", PROFILE, "--wheelhouse", wh, "-o", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert "not a regular file" in r.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("same_fs", [True, False], ids=["same-fs", "other-fs"])
def test_checked_wheelhouse_files_are_placed_as_exactly_their_bytes(run_envbuild, tmp_path,
                                                                    other_fs, same_fs):
    """The good path stays: a hard link to the checked file on one file system, a copy of the
    checked bytes across file systems; the record names the manifest's sha256. (A guard for
    the fix, not an attack: it passed before.)"""
    wh = wheelhouse(tmp_path, WHEELS)
    out = (tmp_path if same_fs else other_fs) / "out"
    r = run_envbuild("render", PROFILE, "--wheelhouse", wh, "-o", out)
    assert r.returncode == 0, r.stderr
    for name, data in WHEELS.items():
        placed = out / "wheelhouse" / name
        assert not placed.is_symlink() and placed.read_bytes() == data
        assert (placed.stat().st_ino == (wh / "pypi" / name).stat().st_ino) == same_fs
    record = json.loads((out / ".envbuild-files.json").read_text())["files"]
    assert record[f"wheelhouse/{'alpha-1.0-py3-none-any.whl'}"] == \
        hashlib.sha256(WHEELS["alpha-1.0-py3-none-any.whl"]).hexdigest()


def test_a_wheelhouse_file_writable_by_others_is_copied_not_linked(run_envbuild, tmp_path):
    """A file another user may write could change after the check; its checked bytes are
    copied instead of sharing its inode. Failed before the fix: yes (it was hard-linked)."""
    wh = wheelhouse(tmp_path, WHEELS)
    alpha = wh / "pypi" / "alpha-1.0-py3-none-any.whl"
    alpha.chmod(0o666)
    r = run_envbuild("render", PROFILE, "--wheelhouse", wh, "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    placed = tmp_path / "out" / "wheelhouse" / alpha.name
    assert placed.stat().st_ino != alpha.stat().st_ino and placed.read_bytes() == alpha.read_bytes()


# ---- 2: an output folder that is a link is not written through ---------------------------------

@pytest.mark.parametrize("how", ["out-is-a-link", "parent-is-a-link"])
def test_an_output_folder_reached_through_a_link_is_refused(run_envbuild, tmp_path, how):
    """-o a planted link to an empty folder (or a new folder under such a link). Before: the
    render went into the link's target, exit 0. Failed before the fix: yes."""
    target = tmp_path / "victim"
    target.mkdir()
    link = tmp_path / "out"
    link.symlink_to(target, target_is_directory=True)
    out = link if how == "out-is-a-link" else link / "p"
    r = run_envbuild("render", PROFILE, "-o", out)
    assert r.returncode == 2, r.stderr
    assert "symbolic link" in r.stderr and str(link) in r.stderr
    assert list(target.iterdir()) == []


# ---- 3: a registry is a registry, not bake settings ----------------------------------------------

EVIL_REGISTRIES = ["reg.example:5000,type=local,dest=/tmp/stolen", "reg.example:5000 x",
                   "reg.example/Upper", "reg.example:99999", "http://reg.example:5000",
                   "reg.example:5000/a//b", "reg.example:5000\n", "reg.example:５０００"]


@pytest.mark.parametrize("value", EVIL_REGISTRIES)
@pytest.mark.parametrize("where", ["--registry", "ENVBUILD_REGISTRY_LOCAL"])
def test_a_registry_that_is_not_host_port_path_is_refused(run_envbuild, tmp_path, value, where):
    """Before: bake wrote the value into REGISTRY, whose comma adds cache-to settings (here: a
    local cache exported to /tmp/stolen), exit 0. Failed before the fix: yes."""
    args, env = ["bake", PROFILE, "-o", tmp_path / "bake"], {"XDG_CONFIG_HOME": str(tmp_path)}
    if where == "--registry":
        args += ["--registry", value]
    else:
        env["ENVBUILD_REGISTRY_LOCAL"] = value
    r = run_envbuild(*args, env=env)
    assert r.returncode == 2, (r.stderr, (tmp_path / "bake" / "docker-bake.hcl").read_text()
                               if (tmp_path / "bake" / "docker-bake.hcl").exists() else "")
    assert where in r.stderr and "HOST[:PORT]" in r.stderr
    assert not (tmp_path / "bake").exists()


@pytest.mark.parametrize("value", ["localhost:5000", "127.0.0.1:5000", "reg.example.com",
                                   "reg.example.com:443/team/sub-path", "[::1]:5000",
                                   "ghcr.io/my-org"])
def test_a_registry_of_host_port_path_is_baked_as_given(run_envbuild, tmp_path, value):
    """(A guard for the fix: these passed before and still do.)"""
    r = run_envbuild("bake", PROFILE, "-o", tmp_path / "bake", "--registry", value,
                     env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    hcl = (tmp_path / "bake" / "docker-bake.hcl").read_text()
    assert f'variable "REGISTRY" {{\n  default = {json.dumps(value)}\n}}' in hcl


# ---- 4: ENVBUILD_DOCKER_TIMEOUT is a number of seconds ----------------------------------------

@pytest.mark.parametrize("value", ["abc", "", "-5", "0", "1e3", "٣٠٠", "99999999999999999999"])
def test_a_docker_timeout_that_is_no_number_is_named(run_envbuild, tmp_path, value):
    """Before: 'Cannot reach the Docker engine ... invalid literal for int()', exit 1 (and ''
    or '٣٠٠' were taken). Failed before the fix: yes."""
    # (DOCKER_HOST names no daemon: a value taken as a number never reaches a real engine)
    r = run_envbuild("build", PROFILE, "--engine", "docker", "--no-probe",
                     env={"ENVBUILD_DOCKER_TIMEOUT": value, "XDG_CONFIG_HOME": str(tmp_path),
                          "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    assert r.returncode == 2, r.stderr
    assert "ENVBUILD_DOCKER_TIMEOUT" in r.stderr and "seconds" in r.stderr
    assert "Cannot reach the Docker engine" not in r.stderr


