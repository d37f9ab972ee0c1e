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


# ---- 2: an output folder that is a link is not written through ---------------------------------


@pytest.mark.parametrize("how", ["out-is-a-link", "parent-is-anothers-link"])
def test_an_output_folder_reached_through_a_link_is_refused(run_envbuild, tmp_path, how):
    """The profile's folder under -o (OUT/<profile>/) a planted link to an empty folder, or a
    new folder under a link another user planted (out/ in a shared folder). Before: the render
    went into the link's target, exit 0. Failed before the fix: yes."""
    target = tmp_path / "victim"
    target.mkdir()
    if how == "out-is-a-link":
        out = tmp_path / "out"
        out.mkdir()
        link = out / PROFILE  # the very folder `render PROFILE -o out` writes into
    else:
        link = tmp_path / "out"
        out = link / "p"
    link.symlink_to(target, target_is_directory=True)
    if how == "parent-is-anothers-link":
        if os.geteuid() != 0:
            _unavailable("a link owned by another user can only be made by root")
        os.lchown(link, 65534, 65534)
    r = run_envbuild("render", PROFILE, "-o", out)
    assert r.returncode == 2, r.stderr
    assert "symbolic link" in r.stderr and str(link) in r.stderr
    assert list(target.iterdir()) == []


def test_a_new_folder_under_a_link_of_ones_own_is_written(run_envbuild, tmp_path):
    """A home or scratch folder that is the user's own link (or root's) stays usable: only the
    folder written into must not be a link. (A guard for the fix: it passed before.)"""
    target = tmp_path / "scratch"
    target.mkdir()
    link = tmp_path / "home"
    link.symlink_to(target, target_is_directory=True)
    r = run_envbuild("render", PROFILE, "-o", link / "envs")
    assert r.returncode == 0, r.stderr
    assert (target / "envs" / PROFILE / "Dockerfile").is_file()


def test_a_record_that_is_a_link_is_no_record(run_envbuild, tmp_path):
    """A planted .envbuild-files.json that links to a record elsewhere, claiming the user's
    notes as envbuild's files. Before: read through the link, and the notes deleted as a stale
    file of an earlier render (exit 0). Failed before the fix: yes."""
    out = tmp_path / "out" / PROFILE  # where `render PROFILE -o out` writes
    out.mkdir(parents=True)
    notes = out / "notes.txt"
    notes.write_text("my notes\n")
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(
        json.dumps(
            {
                "format": 1,
                "written_by": "envbuild",
                "files": {"notes.txt": hashlib.sha256(notes.read_bytes()).hexdigest()},
            }
        )
    )
    (out / ".envbuild-files.json").symlink_to(elsewhere)
    r = run_envbuild("render", PROFILE, "-o", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert "was not written by envbuild" in r.stderr
    assert notes.read_text() == "my notes\n" and sorted(p.name for p in out.iterdir()) == [
        ".envbuild-files.json",
        "notes.txt",
    ]


# ---- 3: a registry is a registry, not bake settings ----------------------------------------------

EVIL_REGISTRIES = [
    "reg.example:5000,type=local,dest=/tmp/stolen",
    "reg.example:5000 x",
    "reg.example/Upper",
    "reg.example:99999",
    "http://reg.example:5000",
    "reg.example:5000/a//b",
    "reg.example:5000\n",
    "reg.example:５０００",
]


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
    assert r.returncode == 2, (
        r.stderr,
        (tmp_path / "bake" / "docker-bake.hcl").read_text()
        if (tmp_path / "bake" / "docker-bake.hcl").exists()
        else "",
    )
    assert where in r.stderr and "HOST[:PORT]" in r.stderr
    assert not (tmp_path / "bake").exists()


@pytest.mark.parametrize(
    "value",
    [
        "localhost:5000",
        "127.0.0.1:5000",
        "reg.example.com",
        "reg.example.com:443/team/sub-path",
        "[::1]:5000",
        "ghcr.io/my-org",
    ],
)
def test_a_registry_of_host_port_path_is_baked_as_given(run_envbuild, tmp_path, value):
    """(A guard for the fix: these passed before and still do.)"""
    r = run_envbuild(
        "bake", PROFILE, "-o", tmp_path / "bake", "--registry", value, env={"XDG_CONFIG_HOME": str(tmp_path)}
    )
    assert r.returncode == 0, r.stderr
    hcl = (tmp_path / "bake" / "docker-bake.hcl").read_text()
    assert f'variable "REGISTRY" {{\n  default = {json.dumps(value)}\n}}' in hcl


# ---- 4: ENVBUILD_DOCKER_TIMEOUT is a number of seconds ----------------------------------------


@pytest.mark.parametrize("value", ["abc", "", "-5", "0", "1e3", "٣٠٠", "99999999999999999999"])
def test_a_docker_timeout_that_is_no_number_is_named(run_envbuild, tmp_path, value):
    """Before: 'Cannot reach the Docker engine ... invalid literal for int()', exit 1 (and ''
    or '٣٠٠' were taken). Failed before the fix: yes."""
    # (DOCKER_HOST names no daemon: a value taken as a number never reaches a real engine)
    r = run_envbuild(
        "build",
        PROFILE,
        "--engine",
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


# ---- 5 and 6: export-image keeps its temporary work in one folder of its own ------------------


def tiny_image(repo: str = "test/tiny", tag: str = "1") -> dict:
    """An OCI image of one small layer: its manifest and blobs, by digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"hello from the air gap\n"
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    layer = gzip.compress(raw, mtime=0)

    def digest(b: bytes) -> str:
        return "sha256:" + hashlib.sha256(b).hexdigest()

    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [digest(raw)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": digest(layer),
                    "size": len(layer),
                }
            ],
        }
    ).encode()
    return {
        "repo": repo,
        "tag": tag,
        "manifest": manifest,
        "digest": digest(manifest),
        "blobs": {digest(config): config, digest(layer): layer},
        "layer": digest(layer),
    }


class OciRegistry:
    """A read-only registry on 127.0.0.1 serving one image (the v2 API a pull uses: /v2/, the
    manifest by tag or digest, blobs). `stall_layer` layer GETs send 10 bytes, then hang until
    `release` is set (and send the rest), so a test can act while skopeo is mid-copy."""

    def __init__(self, image: dict, stall_layer: int = 0):
        self.image, self.stall_layer = image, stall_layer
        self.stalled, self.release = threading.Event(), threading.Event()
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.answer(False)

            def do_GET(self):
                self.answer(True)

            def answer(self, body: bool):
                im, path = registry.image, self.path.split("?", 1)[0]
                manifests = f"/v2/{im['repo']}/manifests/"
                blobs = f"/v2/{im['repo']}/blobs/"
                if path == "/v2/":
                    return self.send(200, b"{}", "application/json", body)
                if path in (manifests + im["tag"], manifests + im["digest"]):
                    return self.send(
                        200,
                        im["manifest"],
                        "application/vnd.oci.image.manifest.v1+json",
                        body,
                        {"Docker-Content-Digest": im["digest"]},
                    )
                blob = im["blobs"].get(path[len(blobs) :]) if path.startswith(blobs) else None
                if blob is None:
                    return self.send(404, b"", "text/plain", body)
                if body and path.endswith(im["layer"]) and registry.stall_layer > 0:
                    registry.stall_layer -= 1
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(blob)))
                    self.send_header("Content-Type", "application/octet-stream")
                    self.end_headers()
                    self.wfile.write(blob[:10])
                    self.wfile.flush()
                    registry.stalled.set()
                    registry.release.wait(120)
                    self.wfile.write(blob[10:])
                    return
                self.send(200, blob, "application/octet-stream", body)

            def send(self, code, data, kind, body, headers=None):
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", kind)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True

    @property
    def ref(self) -> str:
        im = self.image
        return f"127.0.0.1:{self._httpd.server_address[1]}/{im['repo']}:{im['tag']}"

    def __enter__(self):
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def skopeo():
    found = shutil.which("skopeo")
    if not found:
        _unavailable("skopeo is not installed (apt install skopeo; tests/infra/provision.sh does)")
    return found


def export_env(tmp_path: Path) -> dict:
    # no Docker engine: the loopback reference is read from its registry
    return clean_env(
        ENVBUILD_DEBUG="1", XDG_CONFIG_HOME=str(tmp_path), DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock"
    )


def spawn_export(tmp_path: Path, ref: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [envbuild_exe(), "export-image", ref, "-o", str(out)],
        env=export_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_export(tmp_path: Path, ref: str, out: Path | str, timeout: float = 120):
    r = subprocess.run(
        [envbuild_exe(), "export-image", ref, "-o", str(out)],
        env=export_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback (most recent call last)" not in r.stderr, r.stderr
    return r


SKOPEO_TEMPS = ("oci", "docker-tar", "oci-archive", "container_images")


def skopeo_temps() -> set[Path]:
    """What skopeo (containers/image) leaves in the shared temporary folders when killed."""
    found = set()
    for folder in {Path("/var/tmp"), Path(tempfile.gettempdir())}:
        try:
            found |= {p for p in folder.iterdir() if p.name.startswith(SKOPEO_TEMPS)}
        except OSError:
            pass
    return found


def test_a_killed_export_leaves_nothing_outside_its_folder_and_the_next_run_cleans_it(tmp_path, skopeo):
    """SIGKILL to export-image and its skopeo mid-copy. Before: skopeo's /var/tmp/oci* folder
    stayed (skopeo 1.9 ignores TMPDIR) and so did .base.tar.envbuild-*; the next run removed
    neither. Failed before the fix: yes."""
    out = tmp_path / "images"
    out.mkdir()
    before = skopeo_temps()
    with OciRegistry(tiny_image(), stall_layer=1) as registry:
        proc = spawn_export(tmp_path, registry.ref, out / "base.tar")
        leaked: set[Path] = set()
        try:
            assert registry.stalled.wait(60), proc.communicate(timeout=5)
            time.sleep(0.5)  # skopeo has made its temporary folders by now
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            leaked = skopeo_temps() - before
            assert not leaked, f"skopeo's temporary files outside export-image's folder: {leaked}"
            debris = [p.name for p in out.iterdir()]
            assert len(debris) == 1 and debris[0].startswith(".base.tar.envbuild-"), debris
            r = run_export(tmp_path, registry.ref, out / "base.tar")
        finally:
            for p in leaked:  # (what the unfixed code left in /var/tmp)
                shutil.rmtree(p, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["base.tar", "base.tar.json"]


def test_an_export_running_beside_keeps_its_folder(tmp_path, skopeo):
    """A second export into the same folder removes only what a dead run left: the live one's
    folder (its lock held, its process running) stays, and both finish. (A guard for the fix,
    not an attack: it passed before, when nothing was removed.)"""
    out = tmp_path / "images"
    out.mkdir()
    with OciRegistry(tiny_image(), stall_layer=1) as registry:
        first = spawn_export(tmp_path, registry.ref, out / "a.tar")
        try:
            assert registry.stalled.wait(60)
            live = [p for p in out.iterdir() if p.name.startswith(".a.tar.envbuild-")]
            r = run_export(tmp_path, registry.ref, out / "b.tar")
            assert r.returncode == 0, r.stderr
            assert all(p.is_dir() for p in live) and first.poll() is None
            registry.release.set()
            _, err = first.communicate(timeout=60)
        finally:
            first.kill()
    assert first.returncode == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["a.tar", "a.tar.json", "b.tar", "b.tar.json"]


def test_debris_that_is_not_provably_ours_is_left_alone(tmp_path, skopeo):
    """Folders that look like an export's but belong to another user, are links, or whose
    process still runs are kept. (A guard for the fix: nothing was removed before.)"""
    out = tmp_path / "images"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep me\n")
    live = subprocess.Popen(["sleep", "60"])
    try:
        kept = [
            out / f".x.tar.envbuild-{live.pid}-abcdefgh",  # its process runs
            out / ".y.tar.envbuild-1-abcdefgh",
        ]  # pid 1: init, always running
        for folder in kept:
            folder.mkdir()
        link = out / ".z.tar.envbuild-999999999-abcdefgh"
        link.symlink_to(victim, target_is_directory=True)
        kept.append(link)
        if os.geteuid() == 0:  # another user's folder (making one needs root)
            theirs = out / ".w.tar.envbuild-999999998-abcdefgh"
            theirs.mkdir()
            os.chown(theirs, 65534, 65534)
            kept.append(theirs)
        with OciRegistry(tiny_image()) as registry:
            r = run_export(tmp_path, registry.ref, out / "base.tar")
        assert r.returncode == 0, r.stderr
    finally:
        live.kill()
        live.wait()
    assert all(os.path.lexists(p) for p in kept)
    assert (victim / "keep").read_text() == "keep me\n"


@pytest.fixture
def mounted(tmp_path):
    """mounted(options) -> a fresh tmpfs with those mount options (root only)."""
    if os.geteuid() != 0:
        _unavailable("a read-only or full folder needs a tmpfs mount, which needs root")
    mounts = []

    def mount(options: str) -> Path:
        mnt = tmp_path / f"mnt{len(mounts)}"
        mnt.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", mnt], capture_output=True, text=True
        )
        if r.returncode != 0:
            _unavailable(f"mount -t tmpfs failed: {r.stderr.strip()}")
        mounts.append(mnt)
        return mnt

    yield mount
    for mnt in mounts:
        subprocess.run(["umount", "-l", mnt], check=False)


def full_folder(mount) -> Path:
    """A tmpfs with no byte free."""
    mnt = mount("size=64k")
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # no space left
    finally:
        os.close(fd)
    return mnt


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_export_into_a_read_only_or_full_folder_is_exit_1_and_writes_nothing(tmp_path, skopeo, mounted, kind):
    """Before: an internal error (OSError from mkdtemp) for a read-only folder. Failed before
    the fix: yes (read-only); full: skopeo's own error, exit 1, before and after."""
    folder = mounted("ro,size=64k") if kind == "read-only" else full_folder(mounted)
    before = sorted(p.name for p in folder.iterdir())
    with OciRegistry(tiny_image()) as registry:
        r = run_export(tmp_path, registry.ref, folder / "image.tar")
    assert r.returncode == 1, r.stderr
    assert str(folder) in r.stderr and "internal error" not in r.stderr
    assert sorted(p.name for p in folder.iterdir()) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["export-image", "foo:1", "-o", ""],
        ["export-image", "foo:1", "-o", "/"],
        ["import-image", ""],
        ["import-image", "/"],
        ["apptainer", PROFILE, "--image", "127.0.0.1:5000/envbuild/t4@sha256:" + "a" * 64, "-o", ""],
        ["apptainer", PROFILE, "--oci-archive", ""],
    ],
    ids=[
        "export-o-empty",
        "export-o-root",
        "import-empty",
        "import-root",
        "apptainer-o-empty",
        "apptainer-archive-empty",
    ],
)
def test_an_empty_or_nameless_path_is_exit_2(run_envbuild, tmp_path, argv):
    """Before: 'internal error ... PosixPath('.') has an empty name' (export-image -o '',
    import-image '' and '/'); apptainer -o '' said '. is a folder', --oci-archive '' called the
    current folder no OCI archive (exit 2, the wrong thing named). Failed before the fix: yes,
    except export-image -o '/', which click already refused (kept as a guard)."""
    r = run_envbuild(*argv, env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert "internal error" not in r.stderr
    assert any(w in r.stderr for w in ("is empty", "file name", "is a directory", "not a file")), r.stderr


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_apptainer_into_a_read_only_or_full_folder_is_exit_1_and_leaves_no_file(
    run_envbuild, tmp_path, mounted, kind
):
    """Before: an internal error (OSError: Read-only file system / No space left). Failed
    before the fix: yes."""
    folder = mounted("ro,size=64k") if kind == "read-only" else full_folder(mounted)
    before = sorted(p.name for p in folder.iterdir())
    r = run_envbuild(
        "apptainer",
        PROFILE,
        "--image",
        "127.0.0.1:5000/envbuild/t4@sha256:" + "a" * 64,
        "-o",
        folder / "t4.def",
        env={"XDG_CONFIG_HOME": str(tmp_path)},
    )
    assert r.returncode == 1, r.stderr
    assert str(folder / "t4.def") in r.stderr
    assert sorted(p.name for p in folder.iterdir()) == before


# ---- 7: detect reads only ASCII digits from nvidia-smi ------------------------------------------


@pytest.mark.parametrize(
    "row",
    [
        "0, Tesla T4, 7.5, ²4000, 535.54.03",
        "0, Tesla T4, 7.5, １５３６０, 535.54.03",
        "٠, Tesla T4, 7.5, 15360, 535.54.03",
        "0, Tesla T4, ７.５, 15360, 535.54.03",
        "0, Tesla T4, 7.5, 15360, ٥٣٥.٥٤.٠٣",
    ],
    ids=["superscript", "fullwidth-memory", "arabic-index", "fullwidth-cc", "arabic-driver"],
)
def test_nvidia_smi_printing_other_digits_is_named_not_an_internal_error(tmp_path, row):
    """A real nvidia-smi stand-in (a script on PATH) run by detect. Before: ValueError (an
    internal error) for '²', or the other digits taken as numbers. Failed before the fix: yes."""
    from click.testing import CliRunner

    from envbuilder.cli import cli
    from envbuilder.machine.doctor import Probes
    from test_detect import NO_NVML

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --query-gpu=*) printf '%s\\n' '{row}' ;;\n"
        "  *) echo '| NVIDIA-SMI 535.54.03  Driver Version: 535.54.03  "
        "CUDA Version: 12.2 |' ;;\n"
        "esac\n",
        encoding="utf-8",
    )
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    r = CliRunner().invoke(cli, ["detect"], obj=Probes(nvml=NO_NVML), env=env)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == 0, r.output
    assert "nvidia-smi printed a line envbuild cannot read" in r.output
    assert ascii(row) in r.output and "0-9" in r.output
