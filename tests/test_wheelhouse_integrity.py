"""`envbuild wheelhouse` under faults: mirrors that misbehave (tests/faultserver.py, loopback
only), exports killed, interrupted or run twice at once, a full disk, files that rot, and
manifests or locks crafted to lead outside the wheelhouse. After each, what manifest.json and
the simple index list is exactly what hashes right on disk, and a re-run finishes the job.

The locks here are small pip-only ones written by faultserver.wheel_lock: no resolver, no index.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultserver import FaultServer, resign, wheel_lock, wheels
from mounts import mounted  # noqa: F401  (a fixture)

ALPHA, BETA, GAMMA = ("alpha-1.0-py3-none-any.whl", "beta-1.0-py3-none-any.whl", "gamma-1.0-py3-none-any.whl")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, bytes]:
    """Three stand-in wheels, big enough that a download is many chunks."""
    return wheels(tmp_path_factory.mktemp("wheels"), {"alpha": 600_000, "beta": 300_000, "gamma": 200_000})


def base(srv) -> str:
    return srv.url("").rstrip("/")


def assert_true_manifest(wh: Path) -> dict:
    """Every file manifest.json lists hashes right on disk (sha256 and size), every profile lists
    only listed files, and the PEP 503 index links exactly the listed pip files."""
    manifest = json.loads((wh / "manifest.json").read_text())
    for path, f in manifest["files"].items():
        data = (wh / path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"], path
        assert len(data) == f["size"], path
    for name, profile in manifest["profiles"].items():
        assert set(profile["files"]) <= set(manifest["files"]), name
    linked = {}
    for page in (wh / "simple").glob("*/index.html"):
        for href, sha in re.findall(r'href="\.\./\.\./([^"#]+)#sha256=([0-9a-f]{64})"', page.read_text()):
            linked[href] = sha
    assert linked == {p: f["sha256"] for p, f in manifest["files"].items() if f["kind"] == "pip"}
    return manifest


def spawn(*args, **kw) -> subprocess.Popen:
    """`envbuild ARGS` in a child process of this interpreter (ENVBUILD_DEBUG=1: a bug shows
    its traceback, which the tests look for)."""
    env = dict(os.environ, ENVBUILD_DEBUG="1")
    return subprocess.Popen(
        [sys.executable, "-m", "envbuilder", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


class Child:
    """`spawn` with its stderr read as it comes (the test waits for a line, then acts)."""

    def __init__(self, *args):
        import threading

        self.proc = spawn(*args)
        self._err: list[str] = []
        self._reader = threading.Thread(target=lambda: self._err.extend(self.proc.stderr), daemon=True)
        self._reader.start()

    @property
    def err(self) -> str:
        return "".join(self._err)

    def wait(self, timeout: float = 120) -> tuple[int, str]:
        try:
            self.proc.wait(timeout)
        finally:
            self.proc.kill()
            self._reader.join(10)
        return self.proc.returncode, self.err


def wait_for(predicate, seconds: float = 30.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds} s")
        time.sleep(0.02)


def partial_size(wh: Path, name: str) -> int:
    p = wh / "pypi" / ".partial" / name
    return p.stat().st_size if p.is_file() else 0


# ---- every fault a mirror can throw ends in a manifest that tells the truth -------------------


@pytest.mark.parametrize(
    "script, code",
    [
        pytest.param(["corrupt"] * 8, 1, id="corrupt-body"),
        pytest.param(["drop"], 0, id="dropped-mid-body"),
        pytest.param([500, 500], 0, id="500-then-ok"),
        pytest.param(["drop", "ignore-range"], 0, id="no-range-support"),
        pytest.param(["endless"] * 8, 1, id="endless-body"),
    ],
)
def test_every_mirror_fault_ends_in_a_manifest_that_hashes_right(files, tmp_path, cli, script, code):
    with FaultServer(files, script={ALPHA: script}) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        rc, _, err = cli("wheelhouse", "demo", "--lock-dir", lock, "-o", tmp_path / "wh")
    assert rc == code, err
    manifest = assert_true_manifest(tmp_path / "wh")
    assert (f"pypi/{ALPHA}" in manifest["files"]) == (code == 0)
    assert ("demo" in manifest["profiles"]) == (code == 0)
    if code:
        assert ALPHA in err and "Traceback" not in err
        assert not (tmp_path / "wh" / "pypi" / ALPHA).exists()


def test_an_endless_body_stops_at_the_size_the_lock_records(files, tmp_path, cli):
    with FaultServer(files, script={ALPHA: ["endless"] * 8}) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        rc, _, err = cli("wheelhouse", "demo", "--lock-dir", lock, "-o", tmp_path / "wh")
        sent = srv.sent_endless
    assert rc == 1
    assert f"more than the {len(files[ALPHA])} bytes the lock records" in err
    assert "removed the partial download" in err
    assert partial_size(tmp_path / "wh", ALPHA) == 0
    assert sent < 16 << 20  # it stopped reading (the server would send 64 MiB)


# ---- 1: two exports into one wheelhouse take turns --------------------------------------------


def test_two_exports_into_one_wheelhouse_at_once_take_turns(files, tmp_path, cli):
    wh = tmp_path / "wh"
    with FaultServer(files, script={ALPHA: ["drop", 404]}) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        assert cli("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)[0] == 1
        assert partial_size(wh, ALPHA) > 0  # both exports below would resume this partial
        srv.script = {ALPHA: ["stall"]}  # the first one hangs on alpha, midway
        first = Child("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)
        wait_for(srv.stalled.is_set, what="the first export's stall")
        second = Child("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)
        wait_for(lambda: "waiting for it to finish" in second.err, what="the second one waiting")
        srv.release.set()
        results = [first.wait(), second.wait()]
    for code, err in results:
        assert code == 0 and "Traceback" not in err, err
    manifest = assert_true_manifest(wh)
    assert (wh / "pypi" / ALPHA).read_bytes() == files[ALPHA]
    assert "demo" in manifest["profiles"]


def test_an_export_waiting_for_another_gives_up_after_its_wait(files, tmp_path):
    import fcntl

    from envbuilder.errors import ActionError
    from envbuilder.offline.wheelhouse import LOCK, export

    with FaultServer(files) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        (tmp_path / "wh").mkdir()
        with open(tmp_path / "wh" / LOCK, "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # another export at work
            said = []
            with pytest.raises(ActionError) as caught:
                export({"demo": lock}, tmp_path / "wh", wait=0.5, say=said.append, progress=lambda e: None)
        assert srv.log == []
    assert "waiting for it to finish" in said[0]
    assert "for more than 0.5 s" in str(caught.value) and caught.value.exit_code == 1


# ---- 2: a file whose bytes rot leaves the manifest and the index ------------------------------


def rot(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_rotted_file_leaves_the_manifest_and_index_when_its_re_export_fails(files, tmp_path, cli):
    wh = tmp_path / "wh"
    with FaultServer(files) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        assert cli("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)[0] == 0
        rot(wh / "pypi" / ALPHA)
        srv.default = 404  # and the mirror lost it
        rc, _, err = cli("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)
    assert rc == 1 and ALPHA in err
    manifest = assert_true_manifest(wh)
    assert f"pypi/{ALPHA}" not in manifest["files"] and "demo" not in manifest["profiles"]
    assert not (wh / "simple" / "alpha").exists()
    assert "alpha" not in (wh / "simple" / "index.html").read_text()
    assert "PROFILES=()" in (wh / "install.sh").read_text()


def test_exporting_another_profile_re_checks_every_listed_file(files, tmp_path, cli):
    wh = tmp_path / "wh"
    with FaultServer(files) as srv:
        one = wheel_lock(tmp_path / "one", {ALPHA: files[ALPHA], BETA: files[BETA]}, base(srv), "one")
        two = wheel_lock(tmp_path / "two", {GAMMA: files[GAMMA]}, base(srv), "two")
        assert cli("wheelhouse", "one", "--lock-dir", one, "-o", wh)[0] == 0
        rot(wh / "pypi" / BETA)
        rc, _, err = cli("wheelhouse", "two", "--lock-dir", two, "-o", wh)
    assert rc == 0, err
    manifest = assert_true_manifest(wh)
    assert f"pypi/{BETA}" not in manifest["files"] and f"pypi/{ALPHA}" in manifest["files"]
    assert set(manifest["profiles"]) == {"two"}
    assert "one is no longer complete here" in err


# ---- 3: a lock is exported only whole and unedited, checked before anything is fetched --------


def edit_a_hash(lock: Path) -> None:
    req = lock / "requirements.lock"
    text = req.read_text()
    i = text.index("--hash=sha256:") + len("--hash=sha256:")
    req.write_text(text[:i] + ("1" if text[i] == "0" else "0") + text[i + 1 :])


def truncate_pylock_and_resign(lock: Path) -> None:
    pylock = lock / "pylock.toml"
    pylock.write_text(pylock.read_text()[:120])
    resign(lock)


@pytest.mark.parametrize(
    "damage, words",
    [
        (edit_a_hash, "modified: requirements.lock"),
        (lambda lock: (lock / "requirements.lock").unlink(), "missing:"),
        (truncate_pylock_and_resign, "pylock.toml does not parse"),
    ],
)
def test_a_damaged_lock_is_refused_before_any_download(files, tmp_path, cli, damage, words):
    with FaultServer(files) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        damage(lock)
        rc, _, err = cli("wheelhouse", "demo", "--lock-dir", lock, "-o", tmp_path / "wh")
        assert srv.log == []
    assert rc == 2 and words in err and "Re-lock" in err
    assert not (tmp_path / "wh").exists()


# ---- 5: paths read from a manifest never lead outside -----------------------------------------


def test_a_manifest_entry_that_leads_outside_is_refused(files, tmp_path, cli):
    wh = tmp_path / "wh"
    with FaultServer(files) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        assert cli("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)[0] == 0
        manifest = json.loads((wh / "manifest.json").read_text())
        entry = dict(manifest["files"][f"pypi/{ALPHA}"], name="../../outside")
        manifest["files"][f"pypi/{ALPHA}"] = entry  # the index page would be written there
        (wh / "manifest.json").write_text(json.dumps(manifest))
        rc, _, err = cli("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)
    assert rc == 2 and "manifest.json is not as envbuild wrote it" in err
    assert not (tmp_path / "outside").exists()


@pytest.mark.parametrize(
    "path",
    ["pypi/../../../victim.txt", "/etc/passwd", "pypi/a/../../x", "locks/demo/lock.json", "pypi/.partial"],
)
def test_render_with_a_wheelhouse_refuses_a_crafted_path(tmp_path, path):
    from conftest import resolved
    from envbuilder.errors import UserError
    from envbuilder.lock.lockfile import wheelhouse_files

    sha = "0" * 64
    manifest = {
        "format": 1,
        "files": {path: {"kind": "pip", "name": "x", "version": "1", "size": 1, "sha256": sha}},
        "profiles": {"p40": {"input_sha256": sha, "files": [path], "built": {}}},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError) as caught:
        wheelhouse_files(resolved("p40"), tmp_path)
    assert "not as envbuild wrote it" in str(caught.value) and caught.value.exit_code == 2


# ---- 6: envbuild deletes only what it wrote, never through a name or a link -------------------


def victim(tmp_path: Path) -> Path:
    folder = tmp_path / "victim"
    (folder / "demo").mkdir(parents=True)
    (folder / "demo" / "precious.txt").write_text("keep me\n")
    (folder / "precious.txt").write_text("keep me\n")
    return folder


def test_a_profile_name_that_leads_outside_is_refused(files, tmp_path, cli):
    kept = victim(tmp_path)
    with FaultServer(files) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        rc, _, err = cli("wheelhouse", "../../victim", "--lock-dir", lock, "-o", tmp_path / "wh")
        assert srv.log == []
    assert rc == 2 and "cannot be a profile of a wheelhouse" in err
    assert (kept / "precious.txt").read_text() == "keep me\n"
    assert (kept / "demo" / "precious.txt").exists()


@pytest.mark.parametrize("link", ["locks", "simple", "locks/demo", "pypi"])
def test_a_link_planted_in_the_wheelhouse_is_not_followed(files, tmp_path, cli, link):
    wh = tmp_path / "wh"
    kept = victim(tmp_path)
    with FaultServer(files) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        assert cli("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)[0] == 0
        target = wh / link
        shutil.rmtree(target)
        target.symlink_to(kept, target_is_directory=True)
        rc, _, err = cli("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)
    assert rc == 2 and "does not write through links" in err and "Traceback" not in err
    assert sorted(p.name for p in kept.rglob("*")) == ["demo", "precious.txt", "precious.txt"]


# ---- 7: an export killed or interrupted resumes ------------------------------------------------


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "Ctrl-C"])
def test_an_interrupted_first_export_resumes(files, tmp_path, how):
    wh = tmp_path / "wh"
    with FaultServer(files, script={ALPHA: ["stall"]}) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        proc = spawn("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)
        try:
            wait_for(lambda: srv.stalled.is_set() and partial_size(wh, ALPHA) > 0, what="a stall")
            sent = time.monotonic()
            proc.send_signal(how)
            _, err = proc.communicate(timeout=30)
            took = time.monotonic() - sent
        finally:
            proc.kill()
        assert not (wh / "pypi" / ALPHA).exists()
        kept = partial_size(wh, ALPHA)
        again = spawn("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)
        out2, err2 = again.communicate(timeout=60)
        ranges = [r.range for r in srv.requests_for(ALPHA)]
    if how == signal.SIGINT:
        # (wide for a loaded machine: a Ctrl-C that waited for the stalled download would wait
        # for the 30 s communicate timeout)
        assert took < 10, f"Ctrl-C took {took:.1f} s"
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert "run the same command again to resume" in err
    assert again.returncode == 0, err2
    assert ranges[-1] == f"bytes={kept}-"  # it went on from what the first run had
    manifest = assert_true_manifest(wh)
    assert (wh / "pypi" / ALPHA).read_bytes() == files[ALPHA] and "demo" in manifest["profiles"]


# ---- 8: a full disk is one paragraph, and the run after freeing space resumes -----------------


@pytest.fixture
def small_disk(mounted):
    """A 2 MiB tmpfs (root only; skipped elsewhere, except under CI=true, where it must run)."""
    return mounted("size=2m")


def test_a_full_disk_says_what_to_free_and_the_rerun_resumes(files, tmp_path, cli, small_disk):
    big = wheels(tmp_path / "big", {"alpha": 900_000, "beta": 900_000, "gamma": 900_000})
    wh = small_disk / "wh"
    with FaultServer(big) as srv:
        lock = wheel_lock(tmp_path / "lock", big, base(srv))
        # one at a time, so that some files are whole when the disk fills
        rc, _, err = cli("wheelhouse", "demo", "--lock-dir", lock, "-o", wh, "-j", 1)
        assert rc == 1, err
        assert f"No space left on {wh}" in err and "choose another -o" in err
        assert "Traceback" not in err and "Free " in err, err
        arrived = {p.name for p in (wh / "pypi").glob("*.whl")}
        assert arrived  # some files got in before the disk filled
        subprocess.run(["mount", "-o", "remount,size=16m", small_disk], check=True)
        before = {name: len(srv.requests_for(name)) for name in big}
        rc, out, err = cli("wheelhouse", "demo", "--lock-dir", lock, "-o", wh)
        again = {name: len(srv.requests_for(name)) - before[name] for name in big}
    assert rc == 0, err
    assert all(again[name] == 0 for name in arrived)  # kept, not fetched again
    manifest = assert_true_manifest(wh)
    assert len(manifest["files"]) == 3 and "demo" in manifest["profiles"]


# ---- 9: a stalled download is reported, also when stderr is no terminal -----------------------


def test_a_stall_is_reported_every_ten_seconds_off_a_tty(files, tmp_path):
    with FaultServer(files, script={ALPHA: ["stall"]}) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        child = Child("wheelhouse", "demo", "--lock-dir", lock, "-o", tmp_path / "wh")
        wait_for(srv.stalled.is_set, what="a stall")
        stalled = time.monotonic()
        wait_for(lambda: "no bytes for" in child.err, seconds=20, what="the stall notice")
        said = time.monotonic() - stalled
        srv.release.set()
        code, err = child.wait()
    assert code == 0, err
    # not before ten seconds without a byte (its clock started with the last chunk, just before
    # the stall); the upper bound is the wait's own, wide for a loaded machine
    assert said > 9
    assert re.search(
        rf"waiting for {re.escape(ALPHA)} from 127\.0\.0\.1:{srv.port}: no bytes "
        r"for 10 s",
        err,
    ), err


def test_a_partial_folder_that_cannot_be_made_is_a_paragraph_not_an_internal_error(files, tmp_path, cli):
    """fetch_all's ActionError for a pypi/.partial it cannot make carried no `.report`, which the
    export read at once (AttributeError: an internal error, exit 1 without the reason). Found by
    holding offline/ to mypy's strict check: its failures are now FetchFailed, and any other
    ActionError is the export's own paragraph."""
    with FaultServer(files) as srv:
        lock = wheel_lock(tmp_path / "lock", files, base(srv))
        rc, _, err = cli("wheelhouse", "demo", "--lock-dir", lock, "-o", tmp_path / "wh")
        assert rc == 0, err
        (tmp_path / "wh" / "pypi" / ".partial").write_text("a file where the folder goes\n")
        rc, _, err = cli("wheelhouse", "demo", "--lock-dir", lock, "-o", tmp_path / "wh")
    assert rc == 1, err
    assert f"Cannot make {tmp_path / 'wh' / 'pypi' / '.partial'}" in err and "internal error" not in err
