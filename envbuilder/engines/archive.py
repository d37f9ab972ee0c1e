"""Images across an air gap: `export-image` (engines/export.py: the engine's or a registry's
image) writes a built image as an OCI archive with a sidecar (`FILE.json`: image name, manifest digest, sha256 and size of the archive file);
`import-image` checks the archive against its sidecar and loads it into a registry.

The copying is skopeo's (Debian/Ubuntu `skopeo`, found on PATH): `docker-daemon:` or `docker://`
to `oci-archive:`, and `oci-archive:` to `docker://` with `--preserve-digests`, so the manifest
digest the registry serves after the import is the one the sidecar names. Loopback registries
are spoken to without TLS (as `docker push` does); every other registry with TLS verified.

The archive is written into a private folder next to FILE and published by a hard link (never
over an existing file) or, with `force`, by a rename; the sidecar is published last, so a
half-written pair never reads as a good one: an archive without its sidecar is refused.

All of skopeo's temporary files go into that private folder too (`skopeo --tmpdir`: skopeo 1.9
ignores TMPDIR and fills /var/tmp with oci*/docker-tar* copies of the image). The folder is
named after the process (`.FILE.envbuild-<pid>-XXXXXXXX`; an import's is
`envbuild-import-<pid>-XXXXXXXX` in the temporary folder) and holds a lock that envbuild and
skopeo keep while they run. A run killed on the spot (SIGKILL, a lost session) leaves it behind;
the next export into that folder (or import) removes such debris, but only what it can prove is
an earlier run's: a real folder of ours by name and owner, whose process is gone and whose lock
nobody holds.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable, TypedDict, cast

from envbuilder.model import schema as S
from envbuilder.errors import ActionError, UserError
from envbuilder.oci.registry import check_registry, check_served, is_loopback, is_registry_host

FORMAT = "envbuild-image-archive/1"
SIDECAR_SUFFIX = ".json"
MAX_SIDECAR_BYTES = 64 << 10
MAX_INDEX_BYTES = 1 << 20  # index.json / a manifest inside the archive
INNER = "image.tar"  # the archive's name inside the private folder (skopeo's path has no ':')
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
# Docker's reference grammar: [HOST[:PORT]/]PATH[:TAG][@sha256:HEX], and a repository in the
# target registry without its host, PATH[:TAG] (oci/reference.py: the one grammar)
from envbuilder.oci.reference import NAME, REFERENCE  # noqa: E402

IMAGE_ID = re.compile(r"(?:sha256:)?[0-9a-f]{12,64}")

Say = Callable[[str], None]


def sidecar_path(archive: Path) -> Path:
    return archive.with_name(archive.name + SIDECAR_SUFFIX)


def find_skopeo(which: Callable[[str], str | None] = shutil.which) -> str:
    found = which("skopeo")
    if not found:
        raise UserError(
            "skopeo is not installed: export-image and import-image copy images with "
            "it (docker-daemon/registry <-> OCI archive). Install it (Debian/Ubuntu: "
            "apt install skopeo; Fedora/RHEL: dnf install skopeo) and run again."
        )
    return found


def short(text: str, limit: int = 120) -> str:
    from envbuilder.text import shorten

    return shorten(text, limit)


def check_reference(ref: str, what: str = "IMAGE") -> str:
    """An image reference (Docker's grammar) or a local image ID, else UserError."""
    if len(ref) > 512 or not (REFERENCE.fullmatch(ref) or IMAGE_ID.fullmatch(ref)):
        raise UserError(
            f"{what} {short(ref)!r} is not an image reference: give NAME[:TAG] of an "
            "image in the Docker engine (docker images lists them), an image ID, or "
            "a registry reference HOST[:PORT]/NAME[:TAG] (lowercase names)."
        )
    return ref


def check_name(name: str) -> str:
    """A repository[:tag] for the target registry, without a registry host; adds :latest."""
    first = name.split("/", 1)[0]
    if "/" in name and is_registry_host(first):
        raise UserError(
            f"--name {short(name)!r} names a registry host ({first}): give NAME[:TAG] "
            "only, and the registry with --registry."
        )
    if len(name) > 255 or not NAME.fullmatch(name):
        raise UserError(
            f"--name {short(name)!r} is not a repository name: give NAME[:TAG], "
            "lowercase path components (letters, digits, '.', '_', '-') separated by "
            "'/', and a tag of letters, digits, '_', '.', '-'."
        )
    return name if ":" in name.rsplit("/", 1)[-1] else name + ":latest"


def has_registry(ref: str) -> bool:
    first, _, rest = ref.partition("/")
    return bool(rest) and is_registry_host(first)


def archive_name(ref: str) -> str | None:
    """The repository[:tag] an archive records for `ref` (its registry host dropped), which
    import-image uses unless --name is given; None for an image ID."""
    from envbuilder.oci.registry import parse_image

    if IMAGE_ID.fullmatch(ref):  # (Docker reads a bare 12-64 hex digits as an ID too)
        return None
    parsed = parse_image(ref)
    name = parsed.repository
    if not has_registry(ref) and name.startswith("library/") and not ref.startswith("library/"):
        name = name[len("library/") :]  # `ubuntu:22.04` as the user wrote it
    return name + (parsed.reference if parsed.reference.startswith(":") else "")


from envbuilder.tools.digest import sha256_file  # noqa: E402,F401  ((hex, size): the one hashing)


# The shapes of what an archive carries, read only through readers.py (bounded, typed): the OCI
# layout's index.json and the image manifest it names (what else they hold nothing here reads:
# any data, bounded), and the sidecar export-image writes.
_MORE = {"*": Any}
_DESCRIPTOR = {
    "mediaType?": S.Text(300),
    "digest": S.Text(200),
    "size?": S.Int(0, 1 << 50),
    "annotations?": S.MapOf(S.Text(4000)),
    **_MORE,
}
INDEX_SHAPE = {
    "schemaVersion?": S.Int(0, 1000),
    "mediaType?": S.Text(300),
    "manifests": S.ListOf(_DESCRIPTOR),
    **_MORE,
}
MANIFEST_SHAPE = {"config?": {"digest?": S.Text(200), **_MORE}, **_MORE}
_DIGEST_TEXT = S.Pattern(_DIGEST.pattern, "sha256:" + "0" * 64, "a sha256 digest")
SIDECAR_SHAPE = {
    "format": S.Text(100),
    "image?": (S.Text(1000), None),
    "name?": (S.Text(300), None),
    "source?": (S.Text(2000), None),
    "manifest_digest": _DIGEST_TEXT,
    "media_type?": (S.Text(300), None),
    "config_digest?": (_DIGEST_TEXT, None),
    "archive?": (S.Text(1000), None),
    "archive_sha256": S.SHA256,
    "archive_size": S.Int(0, 1 << 50),
    **_MORE,
}
_ARCHIVE_FIX = "It is not an OCI archive envbuild export-image wrote: copy it again, or export it again."


class _DescriptorDigest(TypedDict):
    digest: str


class Descriptor(_DescriptorDigest, total=False):
    """A manifest of an OCI index (_DESCRIPTOR: what of it is read here)."""

    mediaType: str
    annotations: dict[str, str]


class _Config(TypedDict, total=False):
    digest: str


class _Manifest(TypedDict, total=False):  # (MANIFEST_SHAPE)
    config: _Config


class IndexInfo(TypedDict):
    """An archive's one manifest (read_index)."""

    digest: str
    media_type: str
    ref_name: str | None
    config_digest: str | None


class _SidecarFields(TypedDict):
    format: str
    manifest_digest: str
    archive_sha256: str
    archive_size: int


class Sidecar(_SidecarFields, total=False):
    """An archive's sidecar, as SIDECAR_SHAPE holds it (export-image writes every key)."""

    image: str | None
    name: str | None
    source: str | None
    media_type: str | None
    config_digest: str | None
    archive: str


class Imported(TypedDict):
    """What import-image loaded (its --json)."""

    reference: str
    digest: str
    target: str
    config_digest: str | None


def index_manifests(tar: tarfile.TarFile, archive: Path, fix: str = _ARCHIVE_FIX) -> list[Descriptor]:
    """The manifests listed by the index.json of the OCI layout in `tar` (export-image's archive,
    or any OCI archive apptainer is given), read by the one bounded reader (readers.py) against
    the shape of an OCI index; UserError (exit 2) naming the key otherwise."""
    from envbuilder.model.readers import Bounds, parse_json

    member = next((m for m in tar.getmembers() if m.name in ("index.json", "./index.json")), None)
    if member is None:
        raise UserError(f"{archive} is not an OCI archive (index.json missing in it). {fix}")
    index: dict[str, object] = parse_json(
        _member_bytes(tar, member, archive, fix),
        f"{archive}: index.json",
        shape=INDEX_SHAPE,
        fix=fix,
        bounds=Bounds(max_bytes=MAX_INDEX_BYTES),
    )
    return cast(list[Descriptor], index["manifests"])  # (INDEX_SHAPE: a list of descriptors)


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo, archive: Path, fix: str) -> bytes:
    f = tar.extractfile(member) if member.isfile() and member.size <= MAX_INDEX_BYTES else None
    if f is None:
        raise UserError(f"{archive}: {member.name} in the archive is not a small file. {fix}")
    return f.read(MAX_INDEX_BYTES + 1)


def read_index(archive: Path) -> IndexInfo:
    """The archive's one manifest: {digest, media_type, ref_name, config_digest}. UserError
    when the file is not an OCI archive of one image."""
    from envbuilder.model.readers import Bounds, parse_json

    try:
        with tarfile.open(archive, "r:") as tar:
            manifests = index_manifests(tar, archive)
            if len(manifests) != 1 or not _DIGEST.fullmatch(manifests[0]["digest"]):
                raise UserError(
                    f"{archive} holds {len(manifests)} manifests (one with a sha256 "
                    "digest expected): export one image per archive."
                )
            entry = manifests[0]
            digest = entry["digest"]
            try:
                member = tar.getmember(f"blobs/sha256/{digest.split(':', 1)[1]}")
            except KeyError:
                raise UserError(
                    f"{archive} is not an OCI archive (the blob of manifest "
                    f"{digest} is missing in it). Give a file envbuild export-image "
                    "wrote."
                ) from None
            blob = _member_bytes(tar, member, archive, _ARCHIVE_FIX)
            if "sha256:" + hashlib.sha256(blob).hexdigest() != digest:
                raise UserError(
                    f"{archive}: the manifest blob does not hash to {digest}: the "
                    "archive is corrupt. Copy it again, or export it again."
                )
            manifest: _Manifest = parse_json(
                blob,
                f"{archive}: manifest {digest[:19]}",
                shape=MANIFEST_SHAPE,
                fix=_ARCHIVE_FIX,
                bounds=Bounds(max_bytes=MAX_INDEX_BYTES),
            )
    except (tarfile.TarError, OSError) as e:
        raise UserError(
            f"{archive} is not a readable OCI archive ({type(e).__name__}: "
            f"{short(str(e), 160)}). Copy it again, or export it again."
        ) from None
    config = (manifest.get("config") or {}).get("digest")
    return {
        "digest": digest,
        "media_type": entry.get("mediaType", ""),
        "ref_name": (entry.get("annotations") or {}).get("org.opencontainers.image.ref.name"),
        "config_digest": config if isinstance(config, str) and _DIGEST.fullmatch(config) else None,
    }


# a work folder of an export (next to its archive) and of an import (in the temporary folder):
# its name says which process made it; tempfile's eight random characters end it
EXPORT_WORK = re.compile(r"(?s)\..{1,40}\.envbuild-(?P<pid>[0-9]{1,10})-[a-z0-9_]{8}")
IMPORT_WORK = re.compile(r"envbuild-import-(?P<pid>[0-9]{1,10})-[a-z0-9_]{8}")
WORK_LOCK = "lock"


class Work:
    """A private folder (0700) for one skopeo run and every temporary file of it, named after
    this process and locked (flock) while envbuild or the skopeo it starts runs; `close`
    removes it."""

    def __init__(self, parent: Path, prefix: str):
        self.path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
        try:
            self.lock = os.open(
                self.path / WORK_LOCK,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            fcntl.flock(self.lock, fcntl.LOCK_EX)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self.lock)  # (after: a lock nobody holds marks debris)


def _running(pid: int) -> bool:
    if pid <= 0:
        return True  # (not a process of ours: kept)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process, or one we may not signal: it runs
    return True


def clean_debris(parent: Path, pattern: re.Pattern[str]) -> list[Path]:
    """Remove the work folders in `parent` that runs killed on the spot left (their skopeo
    temporary files inside); returns them. Only what is provably an earlier run's goes: a name
    `pattern` matches, a real folder (no link) owned by this user, whose process no longer runs
    and whose lock nobody holds. Anything else is left as it is."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if not m:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        pid = int(m["pid"])
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or pid == os.getpid() or _running(pid):
            continue
        try:
            fd = os.open(
                os.path.join(entry.path, WORK_LOCK),
                os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
            )
        except FileNotFoundError:
            fd = None  # killed before it made its lock
        except OSError:
            continue
        try:
            if fd is not None:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as e:
                    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                        continue  # a skopeo it started still runs
                    raise
            shutil.rmtree(entry.path, ignore_errors=True)  # (never follows a link inside)
            removed.append(Path(entry.path))
        except OSError:
            continue
        finally:
            if fd is not None:
                os.close(fd)
    return removed


def skopeo_argv(skopeo: str, work: Work) -> list[str]:
    """skopeo and its global options: every temporary file of the run inside `work`."""
    return [skopeo, "--tmpdir", str(work.path)]


def run_skopeo(
    argv: list[str],
    say: Say,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    work: Work | None = None,
) -> tuple[int, str]:
    """Run skopeo, its progress lines through `say`; (rc, last lines). Ctrl-C stops it. With
    `work`, skopeo holds its lock too, so that the folder is not taken for debris while it runs
    (also when envbuild itself was killed)."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        cwd=cwd,
        env=dict(os.environ, **(env or {})),
        pass_fds=(work.lock,) if work else (),
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            del lines[:-20]
            say("  " + line.rstrip("\n"))
        return proc.wait(), "\n".join(lines[-8:])
    except BaseException:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise


def skopeo_error(line: str) -> str:
    m = re.search(r'msg="(.*)"', line)
    return m.group(1) if m else line


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(src: Path, dest: Path, force: bool) -> None:
    """Move `src` to `dest`: over an existing file only with `force`; otherwise by a hard link,
    which fails rather than overwrite (a rename where the file system has no hard links)."""
    if force:
        os.replace(src, dest)
        return
    try:
        os.link(src, dest)
    except FileExistsError:
        raise UserError(
            f"{dest} exists (written meanwhile?); nothing was overwritten. Remove "
            "it, pick another -o, or pass --force."
        ) from None
    except OSError:  # no hard links here (vfat, some network file systems)
        if os.path.lexists(dest):
            raise UserError(
                f"{dest} exists; nothing was overwritten. Remove it, pick another -o, or pass --force."
            ) from None
        os.rename(src, dest)
        return
    os.unlink(src)


def read_sidecar(archive: Path) -> Sidecar:
    """The sidecar of `archive`, read by the one bounded reader (readers.py) against the shape
    export-image writes; UserError (exit 2) naming what is wrong otherwise."""
    from envbuilder.model.readers import BadData, Bounds, check_shape, read

    side = sidecar_path(archive)
    if not side.is_file():
        raise UserError(
            f"{archive} has no sidecar {side.name} next to it, so its integrity "
            "cannot be checked. Copy the sidecar with the archive (export-image "
            "writes both), or export the image again."
        )
    fix = "It is not a sidecar export-image wrote, or it was edited: copy it again from the source."
    raw: object = read(side, "The sidecar", fix=fix, bounds=Bounds(max_bytes=MAX_SIDECAR_BYTES))
    bad = []
    data: dict[str, object] = raw if isinstance(raw, dict) else {}
    if not isinstance(raw, dict) or data.get("format") != FORMAT:
        bad.append(f"format (expected {FORMAT})")
    if not _DIGEST.fullmatch(str(data.get("manifest_digest", ""))):
        bad.append("manifest_digest")
    if not _HEX64.fullmatch(str(data.get("archive_sha256", ""))):
        bad.append("archive_sha256")
    if not isinstance(data.get("archive_size"), int) or isinstance(data.get("archive_size"), bool):
        bad.append("archive_size")
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not NAME.fullmatch(name)):
        bad.append("name")
    if bad:
        raise UserError(
            f"{side} has no valid {', '.join(bad)}: not a sidecar export-image "
            "wrote, or it was edited. Copy it again from the source."
        )
    try:
        check_shape(data, SIDECAR_SHAPE, str(side), fix)
    except BadData as e:
        raise UserError(
            f"{side}: {e.detail}: not a sidecar export-image wrote, or it was "
            "edited. Copy it again from the source."
        ) from None
    return cast(Sidecar, data)  # (held to SIDECAR_SHAPE just above)


def verify_archive(archive: Path, data: Sidecar, say: Say) -> IndexInfo:
    """The archive's bytes against its sidecar: size, sha256, then the manifest inside.
    UserError (exit 2: corrupt input) on any mismatch."""
    size = archive.stat().st_size
    if size != data["archive_size"]:
        raise UserError(
            f"{archive} is {size} bytes but its sidecar says {data['archive_size']}: "
            "the archive is incomplete or corrupt (a copy cut short?). Copy it again "
            "from the source; nothing was loaded."
        )
    say(f"checking the sha256 of {archive} ({size / 2**20:.1f} MiB)")
    sha, _ = sha256_file(archive)
    if sha != data["archive_sha256"]:
        raise UserError(
            f"{archive} has sha256 {sha}, but its sidecar says "
            f"{data['archive_sha256']}: the archive is corrupt or was changed. Copy "
            "it again from the source (or export it again); nothing was loaded."
        )
    info = read_index(archive)
    if info["digest"] != data["manifest_digest"]:
        raise UserError(
            f"{archive} holds manifest {info['digest']} but its sidecar names "
            f"{data['manifest_digest']}: the two do not belong together. Copy both "
            "again from the source; nothing was loaded."
        )
    return info


def import_image(archive: Path, registry: str, name: str | None, say: Say) -> Imported:
    """Check `archive` against its sidecar and copy it into `registry` as `name` (default: the
    name the archive recorded). Returns {reference, digest, target}."""
    if not str(archive):
        raise UserError(
            "ARCHIVE is empty: give the .tar export-image wrote (its sidecar FILE.tar.json next to it)."
        )
    archive = Path(archive)
    if archive.name in ("", ".", "..") or not archive.is_file():
        if archive.name in ("", ".", ".."):
            raise UserError(
                f"ARCHIVE {str(archive)!r} names a folder, not a file: give the .tar "
                "export-image wrote (its sidecar FILE.tar.json next to it)."
            )
        raise UserError(
            f"{archive} is not a file. Give the .tar export-image wrote (its sidecar "
            f"{sidecar_path(archive).name} next to it)."
        )
    data = read_sidecar(archive)
    if name is None:
        recorded = data.get("name")
        if not recorded:
            raise UserError(
                f"{archive} records no image name (it was exported by image ID): "
                "give one with --name NAME:TAG."
            )
        name = recorded
    target_name = check_name(name)
    skopeo = find_skopeo()
    registry = registry.rstrip("/")
    check_registry(registry.split("/", 1)[0], "--registry", "nothing was loaded")
    verify_archive(archive, data, say)
    target = f"{registry}/{target_name}"
    digest = data["manifest_digest"]
    say(f"loading {archive} ({digest[:19]}) into {target}")
    # skopeo unpacks the whole archive into its temporary folder: ours, in the temporary folder
    tmp = Path(tempfile.gettempdir())
    clean_debris(tmp, IMPORT_WORK)
    try:
        work = Work(tmp, "envbuild-import-")
    except OSError as e:
        raise ActionError(
            f"Cannot make a temporary folder in {tmp}: {e.strerror}. Free space "
            "there, or point TMPDIR at a folder with room for the unpacked image; "
            "nothing was loaded."
        ) from None
    try:
        (work.path / INNER).symlink_to(archive.resolve())
        tls = ["--dest-tls-verify=false"] if is_loopback(registry) else []
        rc, tail = run_skopeo(
            [
                *skopeo_argv(skopeo, work),
                "copy",
                "--preserve-digests",
                *tls,
                "--digestfile",
                "digest",
                f"oci-archive:{INNER}",
                f"docker://{target}",
            ],
            say,
            cwd=work.path,
            env={"TMPDIR": str(work.path)},
            work=work,
        )
        if rc != 0:
            raise ActionError(
                f"skopeo could not load {archive} into {target} (exit {rc}): "
                f"{skopeo_error(tail.splitlines()[-1] if tail else '')}. Check the "
                f"registry (its logs, free space, credentials) and the free space "
                f"in {tmp}, and run again."
            )
        pushed = (work.path / "digest").read_text().strip()
    except OSError as e:
        raise ActionError(
            f"Cannot use the temporary folder {work.path}: {e.strerror}. Free "
            f"space in {tmp} (or point TMPDIR elsewhere) and run again."
        ) from None
    finally:
        work.close()
    if pushed != digest:
        raise ActionError(
            f"skopeo pushed {target} as {pushed}, not {digest} as exported. The "
            "registry may rewrite manifests; check it and run again."
        )
    check_served(target, digest, "loading", "import")
    repo = target.rsplit(":", 1)[0]
    return {
        "reference": f"{repo}@{digest}",
        "digest": digest,
        "target": target,
        "config_digest": data.get("config_digest"),
    }
