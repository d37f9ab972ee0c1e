"""`envbuild verify gh200 --platform linux/arm64 --rootfs DIR`: the aarch64 wheels of the Grace
profile's compiled core (numpy, pyarrow, tokenizers, ...), installed within lockfiles/gh200's pins
from real PyPI and imported on an aarch64 CPU emulated by Debian's qemu-user-static.

The real run is heavy (`-m heavy`): it makes (once, cached) a Debian bookworm arm64 root with
python3 (debootstrap's first stage, then its python .debs unpacked: about 75 s, no QEMU needed for
that) and fetches some 60 MB of wheels. Its Python is bookworm's 3.11, not the profile's 3.12:
it proves the locked versions' aarch64 wheels load and run on aarch64, not the profile's exact
files, and not torch, vLLM or a GPU. The refusals run in every CI run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENVBUILD = [sys.executable, "-m", "envbuilder.cli"]
ROOTFS = Path(
    os.environ.get("ENVBUILD_TEST_ARM64_ROOTFS", "/var/cache/envbuild-test/rootfs-bookworm-arm64-python")
)


def envbuild(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ENVBUILD, *args], capture_output=True, text=True, cwd=ROOT, timeout=1800)


def arm64_rootfs() -> Path:
    """ROOTFS, made when absent: debootstrap --arch=arm64 --foreign (its required packages
    unpacked) and python3's downloaded .debs unpacked with dpkg-deb (no maintainer script runs,
    none is needed to start python3)."""
    if (ROOTFS / "usr" / "bin" / "python3").exists():
        return ROOTFS
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        pytest.fail("the emulated verify needs root and debootstrap (tests/infra/provision.sh installs it)")
    work = ROOTFS.with_name(ROOTFS.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    subprocess.run(
        [
            "debootstrap",
            "--arch=arm64",
            "--foreign",
            "--variant=minbase",
            "--include=python3",
            "bookworm",
            str(work),
            "http://deb.debian.org/debian",
        ],
        check=True,
        capture_output=True,
        timeout=1200,
    )
    for deb in sorted((work / "var" / "cache" / "apt" / "archives").glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work)], check=True, timeout=300)
        deb.unlink()
    if (work / "proc").is_symlink():  # (the first stage may link it to the host's /proc)
        (work / "proc").unlink()
    (work / "proc").mkdir(exist_ok=True)
    work.rename(ROOTFS)
    return ROOTFS


@pytest.mark.heavy
def test_gh200s_aarch64_wheels_install_within_its_lock_and_import_under_qemu():
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        pytest.fail("no qemu-aarch64 binfmt handler: tests/infra/provision.sh installs qemu-user-static")
    r = envbuild("verify", "gh200", "--platform", "linux/arm64", "--rootfs", str(arm64_rootfs()), "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["ok"] and report["machine"] == "aarch64" and report["extensions_aarch64"]
    assert report["numpy"] == [[5.0, 14.0], [14.0, 50.0]] and report["pyarrow"] == 6
    assert {"numpy", "pyarrow", "tokenizers", "pydantic_core"} <= set(report["modules"])
    pins = (ROOT / "lockfiles" / "gh200" / "requirements.lock").read_text()
    assert "numpy==2.3.5" in pins  # (the version installed is the lock's: uv had it as a constraint)


@pytest.mark.parametrize(
    "args, code, says",
    [
        (["h200", "--platform", "linux/arm64", "--rootfs", "/"], 2, "is linux/amd64"),
        (["gh200", "--platform", "linux/arm64"], 2, "go together"),
        (["gh200", "--platform", "linux/arm64", "--rootfs", "/"], 2, "no aarch64 python3"),
    ],
)
def test_the_emulated_verify_refuses_what_it_cannot_check(args, code, says):
    r = envbuild("verify", *args)
    assert r.returncode == code, r.stdout + r.stderr
    assert says in r.stderr


def _rootfs_check(rootfs: Path) -> subprocess.CompletedProcess:
    """verify's input check of `rootfs` in a child with a time limit (a FIFO hung it for good)."""
    code = (
        "import sys; from pathlib import Path; from conftest import resolved; "
        "from envbuilder.errors import UserError; from envbuilder.machine.emulated import check_inputs\n"
        "try:\n    check_inputs(resolved('gh200'), 'linux/arm64', Path(sys.argv[1]))\n"
        "except UserError as e:\n    print(e, file=sys.stderr); sys.exit(2)\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    return subprocess.run(
        [sys.executable, "-c", code, str(rootfs)], capture_output=True, text=True, env=env, timeout=30
    )


def test_a_fifo_or_a_link_out_of_the_root_as_its_python3_is_refused_without_waiting(tmp_path):
    """DIR/usr/bin/python3 a FIFO (issue 43, item 22), or reached through a link that leaves
    DIR (usr -> the host's /usr): no aarch64 python3, exit 2, nothing read outside DIR."""
    fifo_root = tmp_path / "fifo"
    (fifo_root / "usr" / "bin").mkdir(parents=True)
    os.mkfifo(fifo_root / "usr" / "bin" / "python3.11")
    (fifo_root / "usr" / "bin" / "python3").symlink_to("python3.11")
    r = _rootfs_check(fifo_root)
    assert r.returncode == 2 and "no aarch64 python3" in r.stderr, r.stderr
    # a link that climbs out of the root: read inside it, as chroot does
    host = tmp_path / "host" / "usr" / "bin"
    host.mkdir(parents=True)
    (host / "python3").write_bytes(
        b"\x7fELF\x02\x01\x01" + bytes(11) + (183).to_bytes(2, "little") + bytes(8)
    )
    out_root = tmp_path / "out"
    out_root.mkdir()
    (out_root / "usr").symlink_to(tmp_path / "host" / "usr")
    r = _rootfs_check(out_root)
    assert r.returncode == 2 and "no aarch64 python3" in r.stderr, r.stderr
    (out_root / "usr").unlink()
    (out_root / "usr").symlink_to("../host/usr")  # (.. from the root's top stays at its top)
    r = _rootfs_check(out_root)
    assert r.returncode == 2 and "no aarch64 python3" in r.stderr, r.stderr
