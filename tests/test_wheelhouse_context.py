"""A wheelhouse's files enter a build context only as the bytes its manifest names
(`render --wheelhouse`): a file that is a link to a secret, a linked folder, a file whose bytes
are not the manifest's, a FIFO and a file writable by others are each refused or copied, never
followed, through the real `envbuild` (issue 21; each failed on the code before its fix).
"""

from __future__ import annotations
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
import pytest

from mounts import unavailable as _unavailable

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "t4"  # a profile whose shipped lock needs no source archives (pip part only)


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
        listed[f"pypi/{name}"] = {
            "kind": "pip",
            "name": name.split("-")[0],
            "version": "1.0",
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    manifest = {
        "format": 1,
        "files": listed,
        "profiles": {PROFILE: {"input_sha256": "0" * 64, "files": sorted(listed), "built": {}}},
    }
    (wh / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return wh


WHEELS = {
    "alpha-1.0-py3-none-any.whl": b"alpha wheel bytes\n" * 50,
    "beta-1.0-py3-none-any.whl": b"beta wheel bytes\n" * 40,
}
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
    run_envbuild, tmp_path, other_fs, same_fs
):
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
def test_a_wheelhouse_file_whose_bytes_are_not_the_manifests_is_refused(run_envbuild, tmp_path, change):
    """A file swapped after the export (a wheel with other code in it). Before: placed as it
    was, exit 0. Failed before the fix: yes."""
    wh = wheelhouse(tmp_path, WHEELS)
    alpha = wh / "pypi" / "alpha-1.0-py3-none-any.whl"
    data = WHEELS[alpha.name]
    alpha.write_bytes(
        {"same-size": b"X" + data[1:], "longer": data + b"import os\n", "shorter": data[:-5]}[change]
    )
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
def test_checked_wheelhouse_files_are_placed_as_exactly_their_bytes(
    run_envbuild, tmp_path, other_fs, same_fs
):
    """The good path stays: a hard link to the checked file on one file system, a copy of the
    checked bytes across file systems; the record names the manifest's sha256. (A guard for
    the fix, not an attack: it passed before.)"""
    wh = wheelhouse(tmp_path, WHEELS)
    out = (tmp_path if same_fs else other_fs) / "out"
    r = run_envbuild("render", PROFILE, "--wheelhouse", wh, "-o", out)
    assert r.returncode == 0, r.stderr
    out = out / PROFILE  # -o DIR: DIR/<profile>/
    for name, data in WHEELS.items():
        placed = out / "wheelhouse" / name
        assert not placed.is_symlink() and placed.read_bytes() == data
        assert (placed.stat().st_ino == (wh / "pypi" / name).stat().st_ino) == same_fs
    record = json.loads((out / ".envbuild-files.json").read_text())["files"]
    assert (
        record[f"wheelhouse/{'alpha-1.0-py3-none-any.whl'}"]
        == hashlib.sha256(WHEELS["alpha-1.0-py3-none-any.whl"]).hexdigest()
    )


def test_a_wheelhouse_file_writable_by_others_is_copied_not_linked(run_envbuild, tmp_path):
    """A file another user may write could change after the check; its checked bytes are
    copied instead of sharing its inode. Failed before the fix: yes (it was hard-linked)."""
    wh = wheelhouse(tmp_path, WHEELS)
    alpha = wh / "pypi" / "alpha-1.0-py3-none-any.whl"
    alpha.chmod(0o666)
    r = run_envbuild("render", PROFILE, "--wheelhouse", wh, "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    placed = tmp_path / "out" / PROFILE / "wheelhouse" / alpha.name
    assert placed.stat().st_ino != alpha.stat().st_ino and placed.read_bytes() == alpha.read_bytes()
