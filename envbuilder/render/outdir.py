"""Writing a directory of generated files without touching what envbuild did not write.

Every directory envbuild writes (a render, a lock, a build context) gets a record,
`.envbuild-files.json`, of each file it wrote and the sha256 of the bytes it wrote. The next write
into the same directory
  - replaces a file only when it is one envbuild wrote and nobody edited since (its bytes still
    hash to the record), or when it already holds exactly the new bytes;
  - deletes only such files (ones the new set no longer has);
  - never touches anything else: a user's checkpoints, notes, or edits of a rendered file.
A directory that has no record (a project folder, an older envbuild's output) is written into
only when it is empty or nothing in it has a name envbuild is about to write. `force` overwrites
conflicting files (it still deletes nothing envbuild did not write).

The swap is recoverable: the new files are first written into a staging folder inside the
directory (same filesystem), then the new record is journaled, then each file is renamed into
place (atomic per file), then the journal becomes the record. A run killed in between leaves
old-or-new files that hash to the record or the journal (both still count as envbuild's), and the
staging folder, which the next run removes before it writes.

Nothing is written through a link envbuild did not make: the directory itself and every folder
inside it must be real folders, and the folder a new directory is created in may be a link only
of the user's own or root's (not one another user planted). A record or a file it may replace is
never read through a link. Files placed from
elsewhere (a wheelhouse's, `Checked`) are opened without following links, must be regular files
with the size and sha256 their manifest names, and enter as exactly the bytes that were checked:
a hard link to the inode that was hashed (only when nobody else may write it), else a copy made
from the checked descriptor and hashed as it is written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable

from envbuilder.errors import ActionError, EnvbuildError, UserError
from envbuilder.limits import read_upto
from envbuilder.text import shorten  # noqa: F401  (re-exported: outdir.shorten)
from envbuilder.record import Record

RECORD = ".envbuild-files.json"
JOURNAL = ".envbuild-files.next.json"
STAGING_PREFIX = ".envbuild-staging-"
FORMAT = 1
MAX_RECORD_BYTES = 16 << 20  # a record names every file of one folder: a few KB


def safe_relpath(name: str, where: str = "a generated file") -> PurePosixPath:
    """`name` as a path that stays inside its directory (relative, no `..`, no empty parts)."""
    p = PurePosixPath(name)
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or p.is_absolute()
        or any(part in ("", ".", "..") for part in name.split("/"))
    ):
        raise UserError(
            f"{where} is named {shorten(name)!r}, which would leave its directory. "
            "Names are plain relative paths without '..'; check the file that gave it."
        )
    return p


def _open_nofollow(path: Path) -> BinaryIO:
    """`path` opened for reading when it is a regular file and not a link (OSError otherwise):
    a record or a file in the directory is never read through a link envbuild did not make."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "rb")


def _sha256(path: Path) -> str | None:
    """The file's sha256, never through a link; None where it cannot be read."""
    from envbuilder.tools.digest import sha256_file

    try:
        return sha256_file(path, follow=False)[0]
    except OSError:
        return None


class Checked(Record):
    """A file to place as exactly the bytes a manifest names: `rel` inside `root` (the folder the
    user named, e.g. a wheelhouse; no link below it is followed), its size and sha256. `fix`
    ends a refusal's message (what to do)."""

    root: Path
    rel: str
    size: int
    sha256: str
    fix: str = "Replace it with the file its manifest names."


def _refuse(src: Checked, why: str) -> UserError:
    return UserError(
        f"{Path(src.root) / src.rel} {why}; envbuild places only regular files "
        f"whose bytes hash to what their manifest records. {src.fix}"
    )


def _open_checked(src: Checked) -> tuple[int, int, str]:
    """(descriptor of the file, descriptor of its folder, its name): `src.rel` opened below
    `src.root` without following any link (a FIFO opened without blocking)."""
    parts = safe_relpath(src.rel, "a placed file").parts
    try:
        dfd = os.open(src.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # (named by the user)
    except OSError as e:
        raise _refuse(src, f"cannot be opened ({src.root}: {e.strerror})") from None
    try:
        for part in parts[:-1]:
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(
                        src, f"is reached through {part}/, which is a symbolic link or not a folder"
                    ) from None
                raise _refuse(src, f"cannot be opened ({e.strerror})") from None
            os.close(dfd)
            dfd = nfd
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _refuse(src, "is a symbolic link") from None
            raise _refuse(src, f"cannot be opened ({e.strerror})") from None
    except BaseException:
        os.close(dfd)
        raise
    return fd, dfd, parts[-1]


def _hash_fd(fd: int, sink: int | None = None) -> tuple[str, int]:
    """(sha256, size) of what `fd` reads from its start; each chunk also written to `sink`."""
    h, size = hashlib.sha256(), 0
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
        size += len(chunk)
        if sink is not None:
            view = memoryview(chunk)
            while view:
                view = view[os.write(sink, view) :]
    return h.hexdigest(), size


def place_checked(src: Checked, dest: Path) -> None:
    """Put `src` at `dest` (a new name) as exactly the bytes its manifest names, or UserError
    (exit 2) naming what is wrong with it; OSError when the write itself fails."""
    fd, dfd, name = _open_checked(src)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(src, "is not a regular file")
        if st.st_size != src.size:
            raise _refuse(src, f"is {st.st_size} bytes, not the {src.size} its manifest records")
        # a hard link shares the inode: only one nobody else may write stays what was checked
        if st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            digest, size = _hash_fd(fd)
            if (digest, size) != (src.sha256, src.size):
                raise _refuse(src, "does not hash to the sha256 its manifest records")
            try:
                os.link(name, dest, src_dir_fd=dfd, follow_symlinks=False)
            except OSError:
                pass  # another file system, or no hard links here: a copy, below
            else:
                linked = os.lstat(dest)
                if (linked.st_dev, linked.st_ino) == (st.st_dev, st.st_ino):
                    return
                os.unlink(dest)  # the name was swapped since it was opened: copy what was checked
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            digest, size = _hash_fd(fd, out)
        finally:
            os.close(out)
        if (digest, size) != (src.sha256, src.size):
            os.unlink(dest)
            raise _refuse(src, "does not hash to the sha256 its manifest records")
    finally:
        os.close(fd)
        os.close(dfd)


def _refuse_links_on_the_way(out_dir: Path) -> None:
    """UserError when `out_dir` is a symbolic link, or would be created inside a link another
    user planted: envbuild does not write through a link it did not make. (The folder it would
    be created in may be a link of the user's own or root's, as the kernel's protected_symlinks
    allows: a home or scratch folder linked to where the space is.)"""
    if out_dir.is_symlink():
        raise UserError(
            f"{out_dir} is a symbolic link (to {shorten(os.readlink(out_dir))}); "
            "envbuild does not write through links it did not make. Pass the folder "
            "itself, or a new path."
        )
    if os.path.lexists(out_dir):
        return
    above = out_dir.parent
    while not os.path.lexists(above) and above != above.parent:
        above = above.parent
    try:
        st = os.lstat(above)
    except OSError:
        return  # (gone meanwhile: the mkdir says so)
    if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.geteuid()):
        raise UserError(
            f"{above} is a symbolic link of another user's (uid {st.st_uid}, to "
            f"{shorten(os.readlink(above))}), and envbuild would create {out_dir} "
            "through it; it does not write through links it did not make. Pass a "
            "path without the link (the folder it points at, if that is yours)."
        )


def _missing_folders(out_dir: Path) -> list[Path]:
    """`out_dir` and the folders above it that do not exist yet, deepest first."""
    missing, p = [], out_dir
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    return missing


def _read_record(path: Path) -> dict[str, str]:
    """{relative path: sha256} from a record or journal; {} when there is none or it is not one
    (then nothing counts as envbuild's, which only makes the write more careful)."""
    from envbuilder.model.readers import parse_json

    try:
        with _open_nofollow(path) as f:  # (a record that is a link is no record)
            data = read_upto(f, MAX_RECORD_BYTES)
        if len(data) > MAX_RECORD_BYTES:
            return {}
        doc = parse_json(data, str(path))  # (bounded: one nested 5000 deep was an internal error)
    except (OSError, ValueError, UserError):
        return {}
    files = doc.get("files") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    if not isinstance(files, dict):
        return {}
    out = {}
    for name, digest in files.items():
        try:
            safe_relpath(name)
        except UserError:
            continue  # a tampered record cannot point envbuild outside the directory
        if isinstance(digest, str):
            out[name] = digest
    return out


def _record_text(files: dict[str, str]) -> str:
    return (
        json.dumps(
            {"format": FORMAT, "written_by": "envbuild", "files": dict(sorted(files.items()))}, indent=1
        )
        + "\n"
    )


def _inside(root: Path, rel: PurePosixPath) -> Path | None:
    """root/rel when no directory on the way is a symbolic link (a link could lead the write
    outside `root`); None otherwise."""
    cur = root
    for part in rel.parts[:-1]:
        cur = cur / part
        if cur.is_symlink() or (cur.exists() and not cur.is_dir()):
            return None
    return root / rel


def clean_debris(out_dir: Path) -> None:
    """Remove the staging folders an interrupted write left (they are envbuild's by name and
    hold only envbuild's files)."""
    try:
        entries = list(out_dir.iterdir())
    except OSError:
        return
    for p in entries:
        if p.name.startswith(STAGING_PREFIX) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


def write_dir(
    out_dir: Path,
    files: dict[str, str],
    links: Mapping[str, Checked] | None = None,
    executable: frozenset[str] | set[str] = frozenset(),
    force: bool = False,
    check_only: bool = False,
    option: str = "-o",
) -> list[Path]:
    """Write `files` (text by relative path) and `links` ({relative path: Checked file}, placed
    as their checked bytes: place_checked) into `out_dir`, deleting only files an earlier write
    recorded and nobody changed since. Refuses (exit 2) before writing anything when a file it
    would replace is not envbuild's or was edited, unless `force`, or when a placed file is not
    what its manifest names (then nothing of this write stays). `check_only`: the refusals
    alone, nothing written (a command that writes the folder at its end asks first); `option`:
    the flag that names another place, as the refusals say it.

    Writes into one folder take turns (an exclusive flock on the folder, held from reading the
    record to making the journal the record): two at once each read the record, journaled their
    own files and swept the other's staging folder, so the record named one write's files while
    the folder held the other's, and the next write refused them as edited."""
    import fcntl

    out_dir = Path(out_dir)
    _refuse_links_on_the_way(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(
            f"{out_dir} exists and is not a directory. Pass {option} a new directory or one envbuild wrote."
        )
    if check_only:  # the refusals alone: nothing made, so nothing to hold
        return _write_dir_in_turn(out_dir, files, links, executable, force, True, option)
    made = _missing_folders(out_dir)  # (removed again, while empty, when this write fails)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        _remove_while_empty(made)
        raise ActionError(
            f"Cannot write into {out_dir}: {e.strerror}. Check the path, its permissions and free space."
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # (released when fd closes, also when the process dies)
        return _write_dir_in_turn(out_dir, files, links, executable, force, False, option)
    except BaseException:
        _remove_while_empty(made)
        raise
    finally:
        os.close(fd)


def _remove_while_empty(folders: list[Path]) -> None:
    """The folders a write made (deepest first), each removed while it is empty."""
    for p in folders:
        try:
            p.rmdir()
        except OSError:
            break


class WritePlan(Record):
    """What one write_dir does to a folder, decided before anything is written: the new files'
    digests, the record of the last write and an interrupted one's journal, which files are
    already there as they would be written (`unchanged`), which stand in the way (`conflicts`:
    edited, not envbuild's, a link or a folder), and which of the last write's are gone from
    this one and unchanged since (`stale`, removed at the end). `foreign`: the folder holds
    things and no record says envbuild wrote it."""

    out_dir: Path
    files: Mapping[str, str]
    links: Mapping[str, Checked]
    executable: frozenset[str]
    digests: Mapping[str, str]
    old: Mapping[str, str]
    pending: Mapping[str, str]
    conflicts: tuple[str, ...]
    unchanged: frozenset[str]
    stale: tuple[str, ...]
    foreign: bool

    @property
    def noop(self) -> bool:
        """A re-render that changes nothing writes nothing."""
        return (
            not self.links
            and not self.pending
            and not self.stale
            and self.unchanged == set(self.files)
            and dict(self.old) == dict(self.digests)
            and not (self.out_dir / JOURNAL).exists()
        )

    @property
    def written(self) -> list[Path]:
        return [self.out_dir / n for n in sorted(self.files)] + [self.out_dir / n for n in sorted(self.links)]


def _write_dir_in_turn(
    out_dir: Path,
    files: dict[str, str],
    links: Mapping[str, Checked] | None,
    executable: frozenset[str] | set[str],
    force: bool,
    check_only: bool,
    option: str,
) -> list[Path]:
    """write_dir's work, with the folder made and its lock held (write_dir removes the folders
    it made when this fails): the plan, its refusals, then (unless `check_only`) the plan
    applied."""
    links = dict(links or {})
    if not all(isinstance(src, Checked) for src in links.values()):
        raise TypeError("write_dir places only Checked files")
    if out_dir.is_dir():
        clean_debris(out_dir)
    plan = plan_write(out_dir, files, links, frozenset(executable))
    _refusals(plan, force, option)
    if check_only:
        return []
    if plan.noop:
        return [out_dir / n for n in sorted(files)]
    _apply(plan)
    return plan.written


def plan_write(
    out_dir: Path, files: Mapping[str, str], links: Mapping[str, Checked], executable: frozenset[str]
) -> WritePlan:
    """What writing `files` and `links` into `out_dir` would do, read from the folder as it is
    now (it writes nothing)."""
    names = {str(safe_relpath(n)): n for n in [*files, *links]}
    record, journal = out_dir / RECORD, out_dir / JOURNAL
    # what envbuild wrote here: the record, and a journal an interrupted write left behind
    old = _read_record(record) if out_dir.is_dir() else {}
    pending = _read_record(journal) if out_dir.is_dir() else {}

    def ours(name: str, digest: str | None) -> bool:
        return digest is not None and digest in (old.get(name), pending.get(name))

    digests = {n: hashlib.sha256(t.encode("utf-8")).hexdigest() for n, t in files.items()}
    has_record = bool(old or pending) or (record.is_file() and not record.is_symlink())
    foreign = any(p.name not in (RECORD, JOURNAL) for p in out_dir.iterdir()) if out_dir.is_dir() else False
    conflicts: list[str] = []
    unchanged: set[str] = set()  # already there with these bytes and this mode: nothing to write
    for name in sorted(names):
        target = _inside(out_dir, PurePosixPath(name))
        if target is None:
            raise UserError(
                f"{out_dir}: a directory on the way to {name} is a symbolic link or a "
                "file; envbuild does not write through links. Remove it or pass -o "
                "another directory."
            )
        try:
            st = os.lstat(target)  # (one call: a link, a folder, a file and its mode)
        except OSError:
            continue  # not there
        if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
            conflicts.append(name)
            continue
        digest = _sha256(target)
        if not (ours(name, digest) or digest == digests.get(name)):
            conflicts.append(name)
        elif digest == digests.get(name) and stat.S_IMODE(st.st_mode) == _mode_of(name, executable):
            unchanged.add(name)
    # files of the last write that this one no longer has, unchanged since: removed at the end
    stale = [
        n
        for n in sorted(set(old) | set(pending))
        if n not in names
        and (p := _inside(out_dir, PurePosixPath(n))) is not None
        and p.is_file()
        and not p.is_symlink()
        and ours(n, _sha256(p))
    ]
    return WritePlan(
        out_dir,
        files,
        links,
        executable,
        digests,
        old,
        pending,
        tuple(conflicts),
        frozenset(unchanged),
        tuple(stale),
        foreign and not has_record,
    )


def _refusals(plan: WritePlan, force: bool, option: str) -> None:
    """What stops a write before anything is written (exit 2): a folder envbuild did not write,
    edited files (both unless `force`), a directory where a file goes (always)."""
    out_dir, conflicts = plan.out_dir, list(plan.conflicts)
    named = ", ".join(conflicts[:5]) + (f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else "")
    if plan.foreign and not force:
        raise UserError(
            f"{out_dir} is not empty and was not written by envbuild (no {RECORD})"
            f"{f' and has {named}' if conflicts else ''}. envbuild writes only into new directories or ones it wrote. "
            f"Pass {option} a new or empty directory, or --force to write into this one "
            "(envbuild then overwrites only the files it renders and deletes nothing)."
        )
    if conflicts and not force:
        raise UserError(
            f"{out_dir}: {named}"
            " changed since envbuild wrote them (or envbuild did not write them). "
            "envbuild does not overwrite edits: move them away, or pass --force to "
            "overwrite them."
        )
    folders = [n for n in conflicts if Path(out_dir, n).is_dir() and not Path(out_dir, n).is_symlink()]
    if folders:
        raise UserError(
            f"{out_dir}: a directory stands where envbuild writes a file "
            f"({', '.join(n for n in conflicts if Path(out_dir, n).is_dir())}). Move it "
            "away; envbuild deletes no directories it did not make."
        )


def _apply(plan: WritePlan) -> None:
    """The plan written: every new file staged, the journal, each file renamed into place, the
    stale ones removed, the journal made the record."""
    out_dir, journal = plan.out_dir, plan.out_dir / JOURNAL
    try:
        stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out_dir))
    except OSError as e:
        raise ActionError(
            f"Cannot write into {out_dir}: {e.strerror}. Check the path, its permissions and free space."
        ) from None
    written: dict[str, str] = {}
    ready: set[Path] = set()

    def folder(d: Path) -> None:  # each folder once (a render has a few, and many files)
        if d not in ready:
            d.mkdir(parents=True, exist_ok=True)
            ready.add(d)

    try:
        for name, text in sorted(plan.files.items()):
            written[name] = plan.digests[name]
            if name in plan.unchanged:
                continue
            path = stage / name
            folder(path.parent)
            path.write_text(text, encoding="utf-8")
            path.chmod(_mode_of(name, plan.executable))
        for name, src in sorted(plan.links.items()):
            path = stage / name
            folder(path.parent)
            place_checked(src, path)
            written[name] = src.sha256
        # the journal first: from here on a killed run leaves files that hash to old or new
        write_text_atomic(journal, _record_text(written), tmp_dir=stage)
        for name in sorted(set(written) - plan.unchanged):
            target = out_dir / name
            folder(target.parent)
            os.replace(stage / name, target)
    except OSError as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise ActionError(
            f"Cannot write {out_dir}: {e.strerror}. Check free space and permissions, "
            "then run the command again: it finishes or undoes this write (files "
            "that were not envbuild's are untouched)."
        ) from None
    except EnvbuildError:  # a placed file that is not what its manifest names: nothing moved yet
        shutil.rmtree(stage, ignore_errors=True)
        raise
    for name in plan.stale:
        try:
            (out_dir / name).unlink()
        except OSError:
            pass
    _remove_empty_dirs(out_dir, list(plan.stale))
    try:
        os.replace(journal, out_dir / RECORD)
    except OSError:
        pass  # the journal still counts on the next run
    shutil.rmtree(stage, ignore_errors=True)
    try:
        out_dir.chmod(0o755)
    except OSError:
        pass


def _mode_of(name: str, executable: frozenset[str] | set[str]) -> int:
    return 0o755 if name in executable else 0o644


def write_text_atomic(
    path: Path, text: str, mode: int = 0o644, tmp_dir: Path | None = None, fsync: bool = False
) -> None:
    """`text` (UTF-8) into `path` whole or not at all: a temporary file in `tmp_dir` (default:
    beside `path`) renamed over it, so a link at `path` is replaced, not followed. `fsync`: on
    disk before the rename."""
    fd, tmp = tempfile.mkstemp(dir=tmp_dir or path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


OWNED_SUFFIX = ".envbuild-sha256"  # beside each file write_owned_file wrote: `<sha256>  <name>`
MAX_OWNED_BYTES = 64 << 20  # far above any launcher, definition, SBOM or grid page


def owned_record(path: Path) -> Path:
    """Where write_owned_file records the sha256 of the bytes it wrote to `path` (a hidden file
    beside it, in `sha256sum` format: `sha256sum -c` checks it)."""
    return path.with_name(f".{path.name}{OWNED_SUFFIX}")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _recorded_sha256(path: Path) -> str | None:
    """The sha256 that `path`'s record says envbuild wrote: read never through a link, and
    only from a record of this user's (one another user planted beside a file in a shared
    folder does not make that file envbuild's to replace)."""
    from envbuilder.limits import open_regular

    try:
        with open_regular(owned_record(path), follow=False) as f:
            if os.fstat(f.fileno()).st_uid != os.getuid():
                return None
            line = f.read(4096).decode("ascii").split("\n")[0]
    except (OSError, ValueError):
        return None
    digest, _, name = line.partition("  ")
    return digest if name == path.name and len(digest) == 64 else None


def _current_sha256(path: Path) -> str | None:
    from envbuilder.limits import read_limited

    try:
        return hashlib.sha256(read_limited(path, MAX_OWNED_BYTES, follow=False)).hexdigest()
    except (OSError, ValueError):
        return None


def write_owned_file(
    path: Path,
    text: str,
    ours: Callable[[Path], bool] | None = None,
    *,
    force: bool,
    what: str,
    mark: str = "",
) -> None:
    """`text` into the one file `path` a command's -o names (a launch script, a definition, an
    SBOM, a grid page; not a render's folder), whole or not at all. The one writer of every
    file envbuild writes outside a rendered folder:
      - it writes only a regular file: a link, a FIFO, a device or a folder at `path` is
        refused (exit 2), --force included (it is never followed, opened or replaced);
      - it records the sha256 of the bytes it wrote beside the file (owned_record), and
        replaces an existing file without `force` only when its bytes still hash to that record
        (or are the new bytes already): a file the user edited (an `#SBATCH --account` added),
        or one envbuild did not write, is left as it is (`ours(path)`, `mark`: how a file of
        this kind names envbuild, only to word the refusal);
      - the new file's mode is what `open` gives under the umask; a replaced file keeps its own.
    Its folder must exist. A failed write is exit 1 and leaves nothing half-written."""
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UserError(f"Cannot look at {path}: {e.strerror}. Check the path, or -o another file.") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UserError(f"{path} is a folder; -o names the {what} to write.")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UserError(
            f"{path} is {_kind(st.st_mode)}, not a regular file: envbuild writes the {what} only "
            "as a regular file and never replaces anything else there, --force included. "
            "Remove it, or -o another file."
        )
    if not path.parent.is_dir():
        raise UserError(
            f"The folder of {path} does not exist. Create it, or -o a file in an existing folder."
        )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    umask = os.umask(0)
    os.umask(umask)
    mode = 0o666 & ~umask
    if st is not None:
        mode = stat.S_IMODE(st.st_mode)  # (a mode the user chose, 0600 say, stays)
        now = _current_sha256(path)
        if not force and now != digest and (now is None or now != _recorded_sha256(path)):
            record = owned_record(path).name
            looks_ours = ours is None or ours(path)
            if _recorded_sha256(path) is not None and looks_ours:
                why = (
                    "and was edited since envbuild wrote it (its bytes no longer hash to what "
                    f"{record} records), so the edits are kept"
                )
            elif ours is not None and looks_ours:
                why = (
                    f"and there is no record of the bytes envbuild wrote ({record}: an older "
                    "envbuild wrote it, or it was copied here), so any edits are kept"
                )
            else:
                why = f"and envbuild did not write it ({mark or 'no record of its bytes'}), so it is left as it is"
            raise UserError(f"{path} exists {why}. Pass --force to replace it, or -o another file.")
    try:
        write_text_atomic(path, text, mode, fsync=True)
        write_text_atomic(owned_record(path), f"{digest}  {path.name}\n", 0o666 & ~umask, fsync=True)
    except OSError as e:  # (its temporary file is gone again: nothing half-written stays)
        raise ActionError(
            f"Cannot write {path}: {e.strerror}. Check the free space and permissions of "
            f"{path.parent}, or -o a file elsewhere."
        ) from None


def _remove_empty_dirs(root: Path, removed: list[str]) -> None:
    """The folders of removed files, deepest first, while they are empty (an rmdir never removes
    anything a user put there)."""
    dirs = {PurePosixPath(n).parent for n in removed}
    for d in sorted({p for d in dirs for p in [d, *d.parents] if str(p) != "."}, key=lambda p: -len(p.parts)):
        try:
            (root / d).rmdir()
        except OSError:
            pass


def folder_name(name: str, what: str) -> str:
    """`name` as one folder name (text.is_plain_name), else exit 2: a name from an overlay or a
    --from file that holds a '/' or is '..' would land outside the folder it is meant for."""
    from envbuilder.text import is_plain_name

    if not is_plain_name(name):
        raise UserError(
            f"{what} is {shorten(name)!r}, which is not a plain folder name: it would "
            "render outside out/. Rename the profile (letters, digits, '.', '_', '-')."
        )
    return name
