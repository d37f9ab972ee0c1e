"""The one writer of every file envbuild writes outside a rendered folder
(render/outdir.py `write_owned_file`): `launch slurm`, `launch kuberay`, `apptainer`, `sbom -o`
and `grid --html`. It writes only a regular file (a link, a FIFO or a device at the path is
refused, --force included, and never opened, followed or replaced), refuses without --force a
file the user edited since envbuild wrote it (the bytes it wrote are recorded beside the file),
and keeps the umask (and a replaced file's own mode). Each case runs the real `envbuild` in a
fresh process; on the code before, each failed (noted per test)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import clean_env, envbuild_exe

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "a" * 64
COMMANDS = {
    "slurm": ["launch", "slurm", "h100", "--nodes", "2", "--sif", "/x.sif"],
    "kuberay": [
        "launch",
        "kuberay",
        "h100",
        "--nodes",
        "2",
        "--image",
        f"registry.example:5000/envbuild/h100@{DIGEST}",
    ],
    "apptainer": ["apptainer", "p40", "--image", f"registry.example/envbuild/p40@{DIGEST}"],
    "sbom": ["sbom", "4090", "--lock-dir", str(ROOT / "tests" / "fixtures" / "locks")],
    "grid": ["grid", "--gpu", "p40"],
}
LIMIT = 60


def run(kind: str, path: Path, *extra: str, umask: int = 0o022) -> subprocess.CompletedProcess:
    args = [*COMMANDS[kind], "--html" if kind == "grid" else "-o", str(path), *extra]
    try:
        r = subprocess.run(
            [envbuild_exe(), *args],
            cwd=path.parent,
            env=clean_env(ENVBUILD_DEBUG="1"),
            capture_output=True,
            text=True,
            timeout=LIMIT,
            preexec_fn=lambda: os.umask(umask),
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"envbuild {' '.join(args)} hung (killed after {LIMIT} s)")
    assert "Traceback" not in r.stderr, r.stderr
    return r


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.parametrize("kind", COMMANDS)
@pytest.mark.parametrize("force", [False, True], ids=["", "force"])
def test_a_fifo_is_refused_not_waited_on(tmp_path, kind, force):
    """On the code before, launch, apptainer and sbom waited on the FIFO for good (their
    header check opened it), and grid --html and --force replaced it."""
    path = tmp_path / "out"
    os.mkfifo(path)
    r = run(kind, path, *(["--force"] if force else []))
    assert r.returncode == 2 and "a FIFO, not a regular file" in r.stderr, r.stderr
    assert stat.S_ISFIFO(path.lstat().st_mode)


@pytest.mark.parametrize("kind", COMMANDS)
def test_a_link_or_a_device_is_never_replaced_even_with_force(tmp_path, kind):
    """On the code before, --force (and grid --html without it) replaced the link and the
    device node with a file."""
    target = tmp_path / "notes.txt"
    target.write_text("the user's notes\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    for extra in ([], ["--force"]):
        r = run(kind, link, *extra)
        assert r.returncode == 2 and "is a link, not a regular file" in r.stderr, r.stderr
        assert link.is_symlink() and target.read_text() == "the user's notes\n"
    device = tmp_path / "null"
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # (the tests run as root)
    r = run(kind, device, "--force")
    assert r.returncode == 2 and "is a device, not a regular file" in r.stderr, r.stderr
    assert stat.S_ISCHR(device.lstat().st_mode)


@pytest.mark.parametrize("kind", COMMANDS)
def test_an_edited_file_is_kept_until_force(tmp_path, kind):
    """Issue 33 #9: the launchers, apptainer and sbom checked only a header line, and grid
    nothing, so a second run replaced the user's edits (an `#SBATCH --account` added)."""
    path = tmp_path / "out"
    assert run(kind, path).returncode == 0
    first = path.read_bytes()
    record = tmp_path / ".out.envbuild-sha256"
    assert record.read_text() == f"{hashlib.sha256(first).hexdigest()}  out\n"
    assert run(kind, path).returncode == 0  # its own, unedited: written again
    assert path.read_bytes() == first
    edited = first.replace(b"{", b"{ ", 1) if kind == "sbom" else first + b"\n#SBATCH --account=mine\n"
    path.write_bytes(edited)
    r = run(kind, path)
    assert r.returncode == 2 and "edited since envbuild wrote it" in r.stderr, r.stderr
    assert path.read_bytes() == edited
    assert run(kind, path, "--force").returncode == 0
    assert path.read_bytes() == first


def test_grid_html_never_replaces_a_users_file(tmp_path):
    """Issue 33 #7: grid --html FILE replaced any file."""
    page = tmp_path / "notes.html"
    page.write_text("<p>the user's page</p>\n")
    r = run("grid", page)
    assert r.returncode == 2 and "envbuild did not write it" in r.stderr, r.stderr
    assert page.read_text() == "<p>the user's page</p>\n"
    assert run("grid", page, "--force").returncode == 0
    assert "<html" in page.read_text().lower()


@pytest.mark.parametrize("kind", COMMANDS)
def test_the_umask_and_a_files_own_mode_are_kept(tmp_path, kind):
    """Issue 33 #7: output ignored the umask (grid wrote 0644 always), and a 0600 file became
    0644 when replaced."""
    path = tmp_path / "out"
    assert run(kind, path, umask=0o077).returncode == 0
    assert mode(path) == 0o600
    path.unlink()
    assert run(kind, path, umask=0o022).returncode == 0
    assert mode(path) == 0o644
    path.chmod(0o600)
    assert run(kind, path, "--force", umask=0o022).returncode == 0
    assert mode(path) == 0o600


def test_a_record_another_user_planted_does_not_make_a_file_envbuilds(tmp_path):
    """In a shared folder (/tmp, scratch) another user could plant `.NAME.envbuild-sha256`
    with the hash of someone's own file there, so that envbuild replaced it without --force.
    A record counts only when it is this user's."""
    page = tmp_path / "notes.html"
    page.write_text("<p>the user's page</p>\n")
    record = tmp_path / ".notes.html.envbuild-sha256"
    record.write_text(f"{hashlib.sha256(page.read_bytes()).hexdigest()}  notes.html\n")
    os.chown(record, 4242, 4242)  # (the tests run as root)
    r = run("grid", page)
    assert r.returncode == 2 and "envbuild did not write it" in r.stderr, r.stderr
    assert page.read_text() == "<p>the user's page</p>\n"
    os.chown(record, os.getuid(), os.getgid())  # the same record, this user's: the file is envbuild's
    assert run("grid", page).returncode == 0


@pytest.mark.parametrize(
    "name", ["p40", "h100-verl09", "a.b_c+1", "", ".", "..", ".hidden", "a/b", "a\\b", "a\x00b", "a\nb", None]
)
def test_one_test_of_a_name_that_stays_in_its_folder(name):
    """The folder a render writes and the file names a lock or wheelhouse lists are held to one
    rule (text.is_plain_name): the render's guard refuses exactly what the lock's reader refuses."""
    from envbuilder.errors import UserError
    from envbuilder.render.outdir import folder_name
    from envbuilder.text import is_plain_name

    plain = is_plain_name(name)
    assert plain == (name in ("p40", "h100-verl09", "a.b_c+1"))
    if plain:
        assert folder_name(name, "a profile") == name
    elif isinstance(name, str):
        with pytest.raises(UserError, match="not a plain folder name"):
            folder_name(name, "a profile")
