"""`envbuild wheelhouse`: everything a locked environment installs, fetched once, verified, and
installable with no network.

The lock is the source of truth (pylock.toml for the pip part, conda-lock.yml for the conda part:
URLs and sha256), so no resolver runs here. The Wheelhouse directory holds

  pypi/                 the wheels (and sdists), stored once for every profile exported here,
                        and a wheel built here from each sdist (wheelbuild.py): the far side
                        never builds
  simple/               a PEP 503 index over pypi/ (pip --index-url file://.../simple works too)
  conda/<subdir>/       the conda packages, with repodata.json from rattler's indexer
  sources/              what the builder stage fetches from GitHub, by sha256: apex's
                        source archive, flash-attn's release wheels
  conda/<profile>.txt   the explicit conda environment of each profile (paths relative to here)
  requirements/<profile>.lock  the lock's requirements.lock, with each built wheel's sha256 in
                        place of its sdist's (install.sh installs from it)
  locks/<profile>/      an untouched copy of the lock it was made from (render --wheelhouse
                        reads it)
  manifest.json         every file: name, version, size, sha256 (a built wheel also what it was
                        built from and how); and what each profile uses
  install.sh            on the far side: pip --no-index --require-hashes --only-binary, conda
                        --offline
  .envbuild-wheelhouse.lock  held (flock) by the one export writing here; made first, so that a
                        directory an export was killed in is known as a wheelhouse and resumed

A file enters manifest.json only once its bytes on disk hash right, and leaves it (and the
index) when they no longer do: each export re-checks what the manifest lists. envbuild deletes
only files it wrote here, by name, and never writes through a link.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import html
import json
import os
import re
import shutil
import time
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable, Iterator
from urllib.parse import unquote, urljoin, urlsplit

from envbuilder.secret import SecretUrl
from envbuilder.text import is_plain_name
from envbuilder.errors import ActionError, EnvbuildError, UserError
from envbuilder.images import SIDECAR
from envbuilder.lock import lockfile as L
from envbuilder.lock.documents import BuiltFrom, LockMeta, LockTarget, WheelhouseFile, WheelhouseManifest
from envbuilder.lock.documents import WheelhouseProfile
from envbuilder.record import Record
from envbuilder.render.quoting import sh

if TYPE_CHECKING:
    from collections.abc import Sequence

    import requests

    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import Uv
    from envbuilder.offline.fetch import ProgressCallback

Say = Callable[[str], None]

MANIFEST = L.WHEELHOUSE_MANIFEST
FORMAT = L.WHEELHOUSE_FORMAT
LOCK = ".envbuild-wheelhouse.lock"
WAIT_FOR_OTHER = 3600.0  # seconds an export waits for another one writing into the same place


class Artifact(Record):
    kind: str  # pip | conda | source
    name: str
    version: str
    url: str
    sha256: str
    size: int | None
    subdir: str  # pypi, or conda/<platform>

    @property
    def filename(self) -> str:
        if self.kind == "source" and not self.url.endswith(".whl"):
            # GitHub's archive URLs end in the bare ref (25.08.tar.gz); release wheels
            # (flash-attn's) keep their own name, which the builder looks for
            return f"{self.name}-{self.version}.tar.gz"
        return unquote(urlsplit(self.url).path.rsplit("/", 1)[-1])

    @property
    def path(self) -> str:
        return f"{self.subdir}/{self.filename}"


from envbuilder.text import canonical_name as normalize  # noqa: E402  (PEP 503, one place)


class LockPlan(Record):
    meta: LockMeta  # lock.json
    artifacts: list[Artifact]
    texts: dict[str, str]  # every file of the lock as it was verified, lock.json too


def artifacts(lock_dir: Path, profile: str | None = None) -> LockPlan:
    """The lock in `lock_dir`, verified whole (lockfile.verified), with every file it pins: its
    URL, sha256 and the path it gets in a wheelhouse (checked to stay inside it)."""
    lock_dir = Path(lock_dir)
    meta, texts = L.verified(lock_dir, profile)
    out: list[Artifact] = []
    if "pip" in meta.parts:
        if L.PYLOCK not in texts:
            raise UserError(
                f"The lock in {lock_dir} has no {L.PYLOCK} (made by an older envbuild), "
                "so it names no file URLs. Re-lock with `envbuild lock`."
            )
        for p in L.pylock_of(texts[L.PYLOCK], str(lock_dir / L.PYLOCK)).packages:
            files = p.wheels or ((p.sdist,) if p.sdist else ())
            if not files:
                raise UserError(f"{lock_dir / L.PYLOCK}: {p.name} has no file to download.")
            for f in files:
                out.append(
                    Artifact("pip", normalize(p.name), p.version, f.url, f.hashes.sha256, f.size, "pypi")
                )
    if L.SOURCES in texts:  # GitHub files the builder uses (apex, flash-attn)
        for name, src in sorted(L.sources_of(texts[L.SOURCES], str(lock_dir / L.SOURCES)).items()):
            out.append(
                Artifact(
                    "source",
                    name,
                    src.ref if src.ref is not None else "",
                    src.url,
                    src.sha256,
                    src.size,
                    "sources",
                )
            )
    if "conda" in meta.parts:
        for c in L.conda_lock_of(texts[L.CONDA_LOCK], str(lock_dir / L.CONDA_LOCK)).package:
            if c.manager != "conda":
                continue
            if not c.hash.sha256:
                raise UserError(
                    f"{lock_dir / L.CONDA_LOCK}: {c.name} has no sha256, so its "
                    "download cannot be checked. Re-lock with `envbuild lock`."
                )
            platform = ([""] + urlsplit(c.url).path.rstrip("/").split("/"))[-2]
            out.append(
                Artifact("conda", c.name, str(c.version), c.url, c.hash.sha256, None, f"conda/{platform}")
            )
    if not out:
        raise UserError(
            f"The lock in {lock_dir} pins no packages (parts: {', '.join(meta.parts) or 'none'})."
        )
    for a in out:  # a name from a lock becomes a path here: it must stay where it belongs
        size_ok = a.size is None or (isinstance(a.size, int) and a.size >= 0)
        if not (
            L.wheelhouse_path(a.path)
            and is_plain_name(a.name)
            and size_ok
            and (a.kind != "pip" or L.PIP_NAME.fullmatch(a.name))
        ):
            raise UserError(
                f"The lock in {lock_dir} pins {a.name[:60]!r} from {a.url[:120]}, "
                f"which would be stored as {a.path[:120]!r}: not a plain file name "
                "inside the wheelhouse (or a malformed size). envbuild never writes "
                "outside it; re-lock with `envbuild lock`."
            )
    return LockPlan(meta, out, texts)


def mirrored_urls(url: str, url_map: list[tuple[str, str]]) -> tuple[str, ...]:
    """The URL through each mirror prefix that matches it, in order, then the URL itself."""
    urls = [to + url[len(frm) :] for frm, to in url_map if url.startswith(frm)]
    return tuple(dict.fromkeys(urls + [url]))


class _Manifest:
    """manifest.json while an export changes it: files and profiles added and dropped, then
    written whole (text)."""

    def __init__(self, doc: WheelhouseManifest | None) -> None:
        self.files: dict[str, WheelhouseFile] = dict(doc.files) if doc is not None else {}
        self.profiles: dict[str, WheelhouseProfile] = dict(doc.profiles) if doc is not None else {}

    def text(self) -> str:
        doc = WheelhouseManifest(FORMAT, self.files, self.profiles)
        return json.dumps(doc.to_dict(), indent=2, sort_keys=True) + "\n"


def _read_manifest(out: Path) -> _Manifest:
    return _Manifest(L.wheelhouse_manifest(out))  # every path checked to stay inside `out`


def _real_dir(out: Path, rel: str) -> Path:
    """out/rel, made of real directories (made where missing). A link or a file on the way is
    refused: envbuild never follows a name out of the wheelhouse."""
    cur = out
    for part in rel.split("/"):
        cur = cur / part
        if not cur.is_symlink() and not cur.exists():
            cur.mkdir(exist_ok=True)
        if cur.is_symlink() or not cur.is_dir():
            raise UserError(
                f"{cur} is a symbolic link or a file where the wheelhouse keeps a "
                "directory; envbuild does not write through links. Move it away, or "
                "export into a new directory."
            )
    return cur


def _write_text(out: Path, rel: str, text: str, mode: int = 0o644) -> None:
    """out/rel written whole or not at all (a temporary file renamed over it)."""
    from envbuilder.render.outdir import write_text_atomic

    folder, _, name = rel.rpartition("/")
    parent = _real_dir(out, folder) if folder else out
    write_text_atomic(parent / name, text, mode)  # (over a link, the link is replaced)


def _simple_index(out: Path, files: Mapping[str, WheelhouseFile]) -> None:
    """PEP 503 pages for every pip file in the manifest: each project's page rewritten, the
    pages of projects no longer listed removed (only the index.html envbuild writes)."""
    projects: dict[str, list[str]] = {}
    for path, f in sorted(files.items()):
        if f.kind == "pip":
            projects.setdefault(f.name, []).append(path)
    simple = _real_dir(out, "simple")
    for folder in sorted(simple.iterdir()):
        page = folder / "index.html"
        if (
            folder.name not in projects
            and folder.is_dir()
            and not folder.is_symlink()
            and page.is_file()
            and not page.is_symlink()
        ):
            page.unlink()
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when nothing else is in it
    links = "".join(f'    <a href="{html.escape(n)}/">{html.escape(n)}</a><br>\n' for n in projects)
    _write_text(out, "simple/index.html", f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    for name, paths in projects.items():
        body = "".join(
            f'    <a href="../../{html.escape(p)}#sha256={files[p].sha256}">'
            f"{html.escape(p.rsplit('/', 1)[-1])}</a><br>\n"
            for p in paths
        )
        _write_text(
            out, f"simple/{name}/index.html", f"<!DOCTYPE html>\n<html><body>\n{body}</body></html>\n"
        )


def _conda_index(out: Path) -> None:
    from envbuilder.lock.rattler_worker import call

    result = call({"op": "index", "channel_dir": str(out / "conda")})
    if "ok" not in result:
        raise ActionError(f"rattler could not index {out / 'conda'}: {next(iter(result.values()))}")


INSTALL_SH = r"""#!/usr/bin/env bash
# Offline install from this envbuild wheelhouse: no index, no network; every file hash-checked.
#   ./install.sh [PROFILE] [--prefix DIR]        (PYTHON=python3.10 picks the venv's Python)
# An existing environment at DIR (DIR/bin/python) is installed into. Else, with a conda part and
# micromamba/mamba/conda on PATH, it makes a conda env at DIR (--offline, from conda/PROFILE.txt);
# otherwise a venv at DIR from $PYTHON, or from the first of pythonX.Y and python3 that is the
# Python the lock was solved for. A Python of another version is refused before anything is
# installed (the lock's wheels are for one Python). The pip part then installs with pip --no-index
# --require-hashes --no-deps --only-binary=:all: from pypi/: nothing is built here (each sdist of
# the lock was built into a wheel at export), so any pip works, with no compiler and no network.
set -euo pipefail
# only the environment's own code: a checkout on PYTHONPATH (or a user site) would be what pip
# calls installed and what apply_patches.py patches, outside the environment
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONUSERBASE
export PYTHONNOUSERSITE=1
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROFILES=(__PROFILES__)
declare -A LOCK_PYTHON=(__PYTHONS__)  # the Python each profile's lock was solved for
PROFILE="" PREFIX=""
while (($#)); do
  case "$1" in
    --prefix) PREFIX="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; echo "profiles: ${PROFILES[*]}"; exit 0 ;;
    *) PROFILE="$1"; shift ;;
  esac
done
if [ -z "$PROFILE" ]; then
  if [ "${#PROFILES[@]}" -ne 1 ]; then
    echo "install.sh: this wheelhouse holds ${PROFILES[*]}; name one: ./install.sh PROFILE" >&2; exit 2
  fi
  PROFILE="${PROFILES[0]}"
fi
case " ${PROFILES[*]} " in  # only a profile whose every file is here and hashes right
  *" $PROFILE "*) ;;
  *) echo "install.sh: no complete profile $PROFILE here (have: ${PROFILES[*]})" >&2; exit 2 ;;
esac
REQ="$HERE/requirements/$PROFILE.lock"
PREFIX="${PREFIX:-$HERE/env-$PROFILE}"
WANT="${LOCK_PYTHON[$PROFILE]:-}"
py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
refuse_python() {  # $1: the Python found, $2: its version
  echo "install.sh: the $PROFILE lock is for Python $WANT, and $1 is Python ${2:-(not runnable)}:" \
       "its wheels would not install there. Install Python $WANT (e.g. apt-get install" \
       "python$WANT python$WANT-venv, or uv python install $WANT) and run again, or point" \
       "PYTHON at it: PYTHON=/path/to/python$WANT ./install.sh $PROFILE" >&2
  exit 2
}
PY=""
if [ -x "$PREFIX/bin/python" ]; then
  got="$(py_version "$PREFIX/bin/python")"
  if [ -n "$WANT" ] && [ "$got" != "$WANT" ]; then refuse_python "$PREFIX/bin/python" "$got"; fi
  echo "install.sh: installing into the existing environment at $PREFIX" >&2
  PY="$PREFIX/bin/python"
elif [ -f "$HERE/conda/$PROFILE.txt" ]; then
  TOOL="$(command -v micromamba || command -v mamba || command -v conda || true)"
  if [ -n "$TOOL" ]; then
    explicit="$(mktemp)"; trap 'rm -f "$explicit"' EXIT
    sed "s#^\./#file://$HERE/#" "$HERE/conda/$PROFILE.txt" > "$explicit"
    "$TOOL" create --yes --offline --prefix "$PREFIX" --file "$explicit"
    PY="$PREFIX/bin/python"
  else
    echo "install.sh: no micromamba/mamba/conda on PATH: skipping the conda part, using python3" >&2
  fi
fi
if [ -z "$PY" ]; then
  BASE="${PYTHON:-}"
  if [ -z "$BASE" ]; then  # the lock's Python by name, else python3 if it is that version
    for cand in ${WANT:+"python$WANT"} python3; do
      if command -v "$cand" >/dev/null && { [ -z "$WANT" ] || [ "$(py_version "$cand")" = "$WANT" ]; }; then
        BASE="$cand"; break
      fi
    done
    if [ -z "$BASE" ]; then refuse_python "python3" "$(py_version python3)"; fi
  elif [ -n "$WANT" ] && [ "$(py_version "$BASE")" != "$WANT" ]; then
    refuse_python "$BASE" "$(py_version "$BASE")"
  fi
  echo "install.sh: a venv at $PREFIX from $BASE (Python ${WANT:-$(py_version "$BASE")})" >&2
  "$BASE" -m venv "$PREFIX"
  PY="$PREFIX/bin/python"
else
  got="$(py_version "$PY")"
  if [ -n "$WANT" ] && [ "$got" != "$WANT" ]; then refuse_python "$PY" "$got"; fi
fi
# pip's RECORD is written last: without it a venv step was stopped (Ctrl-C) while seeding pip,
# or the environment was made without pip (uv venv); seed it, or no re-run could go on
if ! compgen -G "$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/pip-*.dist-info/RECORD" >/dev/null; then
  echo "install.sh: $PY has no whole pip: seeding it (python -m ensurepip)" >&2
  "$PY" -m ensurepip
fi
if [ -f "$REQ" ]; then
  "$PY" -m pip install --isolated --no-index --find-links "$HERE/pypi" --require-hashes --no-deps \
    --only-binary=:all: -r "$REQ"
fi
# verl's recorded patches for this GPU, then the precision audit, as the image's build does
S="$HERE/scripts/$PROFILE"
if [ -f "$S/__AUDIT__" ]; then
  for script in __FINISH__; do  # (the install's last steps, render/steps.py: each the profile has)
    if [ -f "$S/$script" ]; then "$PY" "$S/$script"; fi
  done
else
  echo "install.sh: this wheelhouse has no patch scripts for $PROFILE (its lock pins another verl" \
       "than the profile): render the same variant (envbuild render $PROFILE ...) and run its" \
       "apply_patches.py and audit_precision.py with $PY" >&2
fi
echo "installed $PROFILE into $PREFIX"
"""


def _install_sh(names: str, pythons: str) -> str:
    """install.sh for the profiles `names` (bash words) of Pythons `pythons` (an associative
    array's pairs): after the pip part, the install's scripts in render/steps.py's order."""
    from envbuilder.render.steps import AUDIT, FINISH

    return (
        INSTALL_SH.replace("__PROFILES__", names)
        .replace("__PYTHONS__", pythons)
        .replace("__FINISH__", " ".join(FINISH))
        .replace("__AUDIT__", AUDIT)
    )


def uv_artifacts(
    pin: Uv, plans: dict[str, LockPlan], build_index: str | None, session: requests.Session | None, say: Say
) -> list[Artifact]:
    """The uv wheel `pin` names (file name and sha256; the matrix's defaults.uv), found on the
    index the locks were made from (or `build_index`, a mirror's) as every pip file of a lock
    is, and then fetched and verified like them. None there: [] and a warning; a build from
    this wheelhouse then installs with pip (render says so in the Dockerfile). Each index's
    uv/ page is read through net.request: at most net.INDEX_PAGE's cap, within its deadline."""
    from envbuilder.oci import http as net

    filename = pin.filename
    indexes = [build_index] + [p.meta.source("pypi") for p in plans.values()]
    own = session is None
    s = session or net.session()
    try:
        for index in dict.fromkeys(i for i in indexes if i and i.startswith(("http://", "https://"))):
            page = index.rstrip("/") + "/uv/"
            try:
                r = net.request(s, "GET", page, net.INDEX_PAGE, timeout=30)
            except net.NetError as e:
                if e.kind in ("too-large", "deadline"):
                    say(f"warning: {e}: not looking for uv there")
                continue
            if r.status != 200:
                continue
            hrefs: list[str] = re.findall(r'href="([^"]+)"', r.body.decode("utf-8", "replace"))
            for href in hrefs:
                url = urljoin(page, html.unescape(href)).split("#", 1)[0]
                if unquote(urlsplit(url).path.rsplit("/", 1)[-1]) == filename:
                    return [Artifact("pip", "uv", pin.version, url, pin.sha256, pin.size, "pypi")]
    finally:
        if own:
            s.close()
    say(
        f"warning: no index of these locks serves {filename} (uv {pin.version}, which the "
        "Dockerfile's runtime stage installs with): this wheelhouse holds no uv, and a build "
        "from it installs with pip. Pass --build-index-url an index that serves it."
    )
    return []


class ExportReport(Record):
    downloaded: list[str]
    skipped: list[str]
    bytes_transferred: int
    files: int
    built: list[str] = []  # wheels built from sdists by this export (none when all were there)
    tar: Path | None = None  # OUT.tar, when asked for


def export(
    profiles: dict[str, Path],
    out: Path,
    *,
    url_map: Sequence[tuple[str, str]] = (),
    jobs: int = 8,
    progress: ProgressCallback | None = None,
    session: requests.Session | None = None,
    build_index: str | None = None,
    say: Say = lambda m: None,
    tar: bool = False,
    wait: float = WAIT_FOR_OTHER,
    uv: Uv | None = None,
    scripts: Mapping[str, Mapping[str, str]] | None = None,
) -> ExportReport:
    """Fetch every file the locks of `profiles` ({name: lock dir}) pin into `out`, and build a
    wheel from every sdist among them (its backend from `build_index`, else the lock's index).
    One export at a time writes into `out` (another one waits up to `wait` seconds); one that
    was stopped (Ctrl-C, killed, a full disk) is resumed by the next. `tar`: also OUT.tar.
    `uv` (resolved.Uv, the matrix's defaults.uv pin): also the uv wheel a Dockerfile's runtime stage installs
    with, for every profile (uv_artifacts).
    `scripts` ({profile: {file name: text}}): the rendered apply_patches.py and
    audit_precision.py of each profile, written to scripts/<profile>/ for install.sh to run after
    the installs (export_profiles renders them where the lock pins the profile's verl)."""
    from envbuilder.errors import EnvbuildError
    from envbuilder.oci.http import redact

    def shown(message: str, told: Say = say) -> None:  # no index's or mirror's password printed
        told(redact(message))

    try:
        return _export(
            profiles,
            Path(out),
            url_map,
            jobs,
            progress,
            session,
            build_index,
            shown,
            tar,
            wait,
            uv,
            scripts or {},
        )
    except EnvbuildError as e:  # a build index's or mirror's user:password@ named in a failure
        e.args = (redact(str(e)),)
        raise


def _export(
    profiles: dict[str, Path],
    out: Path,
    url_map: Sequence[tuple[str, str]],
    jobs: int,
    progress: ProgressCallback | None,
    session: requests.Session | None,
    build_index: str | None,
    say: Say,
    tar: bool,
    wait: float,
    uv: Uv | None,
    scripts: Mapping[str, Mapping[str, str]],
) -> ExportReport:
    """export()'s work, its messages redacted."""
    for name in profiles:
        if not L.PROFILE_NAME.fullmatch(name):
            raise UserError(
                f"{name[:80]!r} cannot be a profile of a wheelhouse: it names files "
                "there (requirements/NAME.lock, locks/NAME/) and a word of install.sh, "
                "so it is letters, digits, '.', '_', '+' and '-', starting with a "
                "letter or digit. Export it under a plain name."
            )
    plans = {name: artifacts(lock_dir, name) for name, lock_dir in profiles.items()}
    if uv:
        tools = uv_artifacts(uv, plans, build_index, session, say)
        for plan in plans.values():
            plan.artifacts.extend(tools)
    wanted: dict[str, Artifact] = {}
    for plan in plans.values():
        for a in plan.artifacts:
            other = wanted.setdefault(a.path, a)
            if other.sha256 != a.sha256:
                raise UserError(
                    f"Two locks pin {a.path} with different sha256 ({other.sha256} vs "
                    f"{a.sha256}); export them into separate wheelhouses."
                )
    with _exclusive(out, say, wait):
        try:
            report = _export_into(
                out, plans, wanted, url_map, jobs, progress, session, build_index, say, scripts
            )
            return report._replace(tar=write_tar(out)) if tar else report
        except KeyboardInterrupt:
            say(
                f"Interrupted: the export into {out} stopped. What arrived whole is kept, and "
                "partial downloads stay in its .partial/ folders: run the same command again "
                "to resume."
            )
            raise
        except OSError as e:  # writing the wheelhouse itself (a full disk, permissions)
            raise _write_error(out, e, wanted) from None


@contextlib.contextmanager
def _exclusive(out: Path, say: Say, wait: float) -> Iterator[None]:
    """Hold `out`'s lock file (flock) while an export writes there: a second export into the
    same directory waits, and gives up after `wait` seconds. The lock file is made before
    anything else, so it also marks the directory as a wheelhouse (complete or not): an export
    killed before it wrote manifest.json is resumed, not refused."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory; pass -o a wheelhouse directory.")
    if out.is_dir() and not (out / LOCK).exists() and not (out / MANIFEST).exists() and any(out.iterdir()):
        raise UserError(
            f"{out} is not empty and is not a wheelhouse (no {MANIFEST}); pass -o a "
            "new or empty directory, or an existing wheelhouse."
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise _write_error(out, e, {}) from None
    try:
        if not _try_lock(fd):
            holder = _holder(fd)
            limit = f"{wait / 60:.0f} min" if wait >= 60 else f"{wait:g} s"
            say(
                f"Another envbuild export{holder} is writing into {out}: waiting for it to "
                f"finish (at most {limit}; Ctrl-C stops waiting)."
            )
            deadline = time.monotonic() + wait
            while not _try_lock(fd):
                if time.monotonic() >= deadline:
                    raise ActionError(
                        f"Another envbuild export{holder} has been writing into "
                        f"{out} for more than {wait:g} s, so this one did not "
                        "start. Let it finish (or stop it), then run this command "
                        "again; it resumes from what is there."
                    )
                time.sleep(0.2)
        with contextlib.suppress(OSError):  # who holds it, for a waiting export's message
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # (releases the lock; a killed process's lock goes with it)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        return f" (pid {int(os.pread(fd, 32, 0).decode().strip())})"
    return ""


class _Fetched(Record):
    """What the downloads of one export brought (fetch checked every byte): the paths fetched
    and found, the bytes moved, the failures met, and whether the disk filled."""

    downloaded: tuple[str, ...]
    skipped: tuple[str, ...]
    nbytes: int
    failures: tuple[EnvbuildError, ...]
    no_space: bool

    @property
    def present(self) -> set[str]:
        return set(self.downloaded) | set(self.skipped)


def _export_into(
    out: Path,
    plans: dict[str, LockPlan],
    wanted: dict[str, Artifact],
    url_map: Sequence[tuple[str, str]],
    jobs: int,
    progress: ProgressCallback | None,
    session: requests.Session | None,
    build_index: str | None,
    say: Say,
    scripts: Mapping[str, Mapping[str, str]],
) -> ExportReport:
    """export()'s work, while it holds `out`'s lock: the folders and the manifest checked, the
    files fetched, sdists built into wheels, each complete profile's files written, then the
    index pages, install.sh and the manifest."""
    manifest = _read_manifest(out)
    _check_existing(out, plans, wanted, manifest)
    got = _fetch(out, wanted, url_map, jobs, progress, session, say)
    present, failures = got.present, list(got.failures)  # (a build's failure joins them)
    for path in sorted(present):
        a = wanted[path]
        manifest.files[path] = WheelhouseFile(
            a.kind, a.name, a.version, (out / path).stat().st_size, a.sha256
        )
    wheels, built = (
        ({}, [])
        if got.no_space
        else _wheels_from_sdists(out, plans, present, manifest, build_index, failures, say)
    )
    _keep_only_valid(out, manifest, present | {p for w in wheels.values() for p in w.values()}, say)
    _write_profiles(out, plans, present, wheels, manifest, scripts, say)
    _simple_index(out, manifest.files)
    if any(p.startswith("conda/") for p in present):
        _conda_index(out)
    names = " ".join(map(sh, sorted(manifest.profiles)))  # one bash word each, whatever the name
    pythons = " ".join(
        f"[{sh(n)}]={sh(e.python or '')}"
        for n, e in sorted(manifest.profiles.items())
        if re.fullmatch(r"3\.\d+", e.python or "")
    )
    _write_text(out, "install.sh", _install_sh(names, pythons), 0o755)
    _write_text(out, MANIFEST, manifest.text())
    _raise_failures(out, plans, wanted, got.no_space, failures)
    return ExportReport(
        list(got.downloaded),
        list(got.skipped),
        got.nbytes,
        len(wanted) + len({p for w in wheels.values() for p in w.values()}),
        built,
    )


def _check_existing(
    out: Path, plans: dict[str, LockPlan], wanted: dict[str, Artifact], manifest: _Manifest
) -> None:
    """Before any download: a link planted in the wheelhouse's folders is refused, and so is a
    file already here under another sha256 than the lock pins."""
    for folder in (
        "simple",
        "requirements",
        "locks",
        *(f"locks/{n}" for n in plans),
        *{a.subdir for a in wanted.values()},
    ):
        _real_dir(out, folder)
    for path, a in wanted.items():
        old = manifest.files.get(path)
        if old and old.sha256 != a.sha256:
            raise UserError(
                f"{out / path} is in this wheelhouse with another sha256 than the lock "
                "pins; export into a new directory."
            )


def _fetch(
    out: Path,
    wanted: dict[str, Artifact],
    url_map: Sequence[tuple[str, str]],
    jobs: int,
    progress: ProgressCallback | None,
    session: requests.Session | None,
    say: Say,
) -> _Fetched:
    """Every wanted file fetched into its folder, a folder at a time; a failure is recorded
    with what did arrive, and a full disk stops the rest (no other group could land)."""
    from envbuilder.offline.fetch import FetchFailed, FetchItem, fetch_all

    groups: dict[str, list[FetchItem]] = {}
    for _path, a in sorted(wanted.items()):
        groups.setdefault(a.subdir, []).append(
            FetchItem(a.filename, a.sha256, mirrored_urls(a.url, list(url_map)), a.size)
        )
    downloaded: list[str] = []
    skipped: list[str] = []
    nbytes = 0
    failures: list[EnvbuildError] = []
    no_space = False
    for subdir, items in groups.items():
        say(f"{subdir}: {len(items)} file(s)")
        try:
            report = fetch_all(items, _real_dir(out, subdir), jobs=jobs, progress=progress, session=session)
        except FetchFailed as e:  # record what did arrive, then report the failure
            report = e.report
            failures.append(e)
            no_space = e.no_space
        downloaded += [f"{subdir}/{n}" for n in report.downloaded]
        skipped += [f"{subdir}/{n}" for n in report.skipped]
        nbytes += report.bytes_transferred
        if no_space:
            break
    return _Fetched(tuple(downloaded), tuple(skipped), nbytes, tuple(failures), no_space)


def _write_profiles(
    out: Path,
    plans: dict[str, LockPlan],
    present: set[str],
    wheels: dict[str, dict[str, str]],
    manifest: _Manifest,
    scripts: Mapping[str, Mapping[str, str]],
    say: Say,
) -> None:
    """Each profile whose every file is here: its manifest entry, lock files and scripts; a
    profile listed before that is no longer complete is taken off the list."""
    for name, plan in plans.items():
        if name in wheels and all(a.path in present for a in plan.artifacts):
            manifest.profiles[name] = WheelhouseProfile(
                files=tuple(sorted([a.path for a in plan.artifacts] + list(wheels[name].values()))),
                input_sha256=plan.meta.input_sha256,
                python=plan.meta.python or "",
                built=wheels[name],
            )
            _profile_files(out, name, plan, {n: manifest.files[p].sha256 for n, p in wheels[name].items()})
            _profile_scripts(out, name, scripts.get(name) or {})
    for name, entry in sorted(manifest.profiles.items()):  # complete, or not listed
        if any(p not in manifest.files for p in entry.files):
            del manifest.profiles[name]
            say(
                f"{name} is no longer complete here (a file it uses is missing or damaged): "
                f"export {name} again"
            )


def _raise_failures(
    out: Path,
    plans: dict[str, LockPlan],
    wanted: dict[str, Artifact],
    no_space: bool,
    failures: list[EnvbuildError],
) -> None:
    """The export's failures, once everything that did arrive is recorded: a full disk first,
    one failure as itself, several as one message (a user's error where any is one)."""
    if no_space:
        raise _no_space(out, wanted)
    if len(failures) == 1:
        raise failures[0]
    if failures:
        cls = UserError if any(isinstance(f, UserError) for f in failures) else ActionError
        raise cls(
            f"The export of {', '.join(plans)} failed in {len(failures)} ways:\n"
            + "\n".join(f"- {f}" for f in failures)
        )


def _keep_only_valid(out: Path, manifest: _Manifest, checked: set[str], say: Say) -> None:
    """Drop from the manifest every file whose bytes on disk no longer hash right (and remove
    the file: the manifest says envbuild wrote it, and its bytes are wrong). `checked`: the
    paths this export verified already."""
    from envbuilder.offline.fetch import sha256_file

    for path, f in sorted(manifest.files.items()):
        if path in checked:
            continue
        file = out / path
        try:
            ok = file.is_file() and not file.is_symlink() and sha256_file(file) == f.sha256
        except OSError:
            ok = False
        if not ok:
            del manifest.files[path]
            say(f"{path} is missing or no longer hashes right: it leaves the manifest and the index")
            if file.is_file() and not file.is_symlink():
                file.unlink()


def _missing_bytes(out: Path, wanted: dict[str, Artifact]) -> tuple[int, int]:
    """(bytes still to fetch for the files not here, less what their partial downloads hold;
    how many of them have no size in the lock)."""
    need = unknown = 0
    for path, a in wanted.items():
        if (out / path).is_file():
            continue
        if a.size is None:
            unknown += 1
            continue
        partial = out / a.subdir / ".partial" / a.filename
        need += max(a.size - (partial.stat().st_size if partial.is_file() else 0), 0)
    return need, unknown


def _no_space(out: Path, wanted: dict[str, Artifact]) -> ActionError:
    from envbuilder.offline.fetch import human_size

    need, unknown = _missing_bytes(out, wanted)
    try:
        free = shutil.disk_usage(out).free
    except OSError:
        free = 0
    if need:
        ask = (
            f"the files still missing need about {human_size(need)}"
            + (f" (and {unknown} of a size the lock does not record)" if unknown else "")
            + f". Free {human_size(max(need - free, 1 << 20))} or more there"
        )
    else:
        ask = "Free space there"
    return ActionError(
        f"No space left on {out} ({human_size(free)} free): {ask}, or choose "
        "another -o. Then run the same command again: the export resumes from "
        "what arrived (nothing that arrived is lost)."
    )


def _write_error(out: Path, e: OSError, wanted: dict[str, Artifact]) -> ActionError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return _no_space(out, wanted)
    return ActionError(
        f"Cannot write the wheelhouse {out}: {e.strerror}"
        + (f" ({e.filename})" if e.filename else "")
        + ". Check "
        "the directory's permissions, then run the same command again: it resumes "
        "from what arrived."
    )


def _wheels_from_sdists(
    out: Path,
    plans: dict[str, LockPlan],
    present: set[str],
    manifest: _Manifest,
    build_index: str | None,
    failures: list[EnvbuildError],
    say: Say,
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """A wheel for every sdist of every profile, fit for that profile's target: one already in
    the wheelhouse (built from the same sdist sha256, its bytes hashing right), else built now.
    Returns ({profile: {package: wheel path}} for the profiles that have all of theirs, [wheels
    built now]); a build's failure goes to `failures`, its profile stays incomplete."""
    from envbuilder.offline.wheelbuild import build_wheel

    reserved = frozenset(a.filename for plan in plans.values() for a in plan.artifacts if a.subdir == "pypi")
    wheels: dict[str, dict[str, str]] = {}
    built: list[str] = []
    failed: set[tuple[str, object, object]] = (
        set()
    )  # (sdist, target) whose build failed in this run: not tried twice
    for name, plan in plans.items():
        meta = plan.meta
        target = meta.target or LockTarget()
        as_read: Mapping[str, object] = target.to_dict()  # (wheelbuild reads it as lock.json holds it)
        mine, complete = {}, True
        for a in plan.artifacts:
            if a.kind != "pip" or not L.is_sdist(a.filename):
                continue
            key = (a.path, target.python, target.python_platform)
            if a.path not in present or key in failed:
                complete = False  # its download or build failed: reported already
                continue
            path = _built_wheel(out, manifest, a, as_read)
            if path is None:
                index = build_index or meta.source("pypi")
                if not index:
                    failures.append(
                        UserError(
                            f"The lock of {name} names no index (lock.json "
                            "sources.pypi) to fetch the build backend of "
                            f"{a.filename} from; pass --build-index-url."
                        )
                    )
                    failed.add(key)
                    complete = False
                    continue
                try:
                    w = build_wheel(
                        out / a.path,
                        a.sha256,
                        a.name,
                        a.version,
                        as_read,
                        index,
                        out / a.subdir,
                        reserved=reserved,
                        say=say,
                    )
                except (UserError, ActionError) as e:
                    failures.append(e)
                    failed.add(key)
                    complete = False
                    continue
                path = f"{a.subdir}/{w.filename}"
                _forget_profiles_using(manifest, path, w.sha256, keep=set(plans), say=say)
                manifest.files[path] = WheelhouseFile(
                    "pip", a.name, a.version, w.size, w.sha256, BuiltFrom(a.path, a.sha256), w.build
                )
                built.append(path)
            mine[a.name] = path
        if complete:
            wheels[name] = mine
    return wheels, built


def _built_wheel(out: Path, manifest: _Manifest, sdist: Artifact, target: Mapping[str, object]) -> str | None:
    """The wheelhouse's wheel built from this sdist that fits `target` and hashes right, if any."""
    from envbuilder.offline.fetch import sha256_file
    from envbuilder.offline.wheelbuild import unfit

    for path, f in sorted(manifest.files.items()):
        if (
            f.built_from is not None
            and f.built_from.sha256 == sdist.sha256
            and unfit(path.rsplit("/", 1)[-1], f.build or {}, target) is None
            and (out / path).is_file()
            and sha256_file(out / path) == f.sha256
        ):
            return path
    return None


def _forget_profiles_using(manifest: _Manifest, path: str, sha256: str, keep: set[str], say: Say) -> None:
    """A wheel rebuilt with other bytes than the manifest had: the profiles of earlier exports
    whose requirements name the old hash are no longer complete here."""
    old = manifest.files.get(path)
    if not old or old.sha256 == sha256:
        return
    for name in sorted(manifest.profiles):
        if name not in keep and path in manifest.profiles[name].files:
            del manifest.profiles[name]
            say(f"{path} was rebuilt with other bytes: export {name} again to use it")


SCRIPTS = ("apply_patches.py", "audit_precision.py", SIDECAR)  # (the two scripts and the data they read)


def _profile_scripts(out: Path, name: str, texts: Mapping[str, str]) -> None:
    """scripts/<profile>/: the profile's rendered patch and audit scripts, which install.sh runs
    after the installs; a script the profile no longer has (or none, for a lock of another verl)
    is removed, so install.sh never runs a stale one."""
    dest = _real_dir(out, f"scripts/{name}")
    for file in SCRIPTS:
        if file in texts:
            _write_text(out, f"scripts/{name}/{file}", texts[file])
        elif (dest / file).is_file() and not (dest / file).is_symlink():
            (dest / file).unlink()


def _profile_files(out: Path, name: str, plan: LockPlan, built: dict[str, str]) -> None:
    """requirements/<profile>.lock, conda/<profile>.txt and locks/<profile>/ for one profile;
    `built` ({package: sha256}) are the wheels that stand in for the lock's sdists. Written from
    the lock's texts as they were verified, not read again."""
    meta, arts, texts = plan.meta, plan.artifacts, plan.texts
    if "pip" in meta.parts:
        from envbuilder.lock.pip import replace_hashes

        text = texts[L.REQUIREMENTS]
        if built:
            note = (
                f"# envbuild wheelhouse: {L.REQUIREMENTS} of {name}, with the sha256 of the "
                f"wheel built here from each sdist ({', '.join(sorted(built))}) in place of "
                "the sdist's\n"
            )
            text = note + replace_hashes(text, {n: (f"sha256:{h}",) for n, h in built.items()})
        _write_text(out, f"requirements/{name}.lock", text)
    conda = [a for a in arts if a.kind == "conda"]
    if conda:
        lines = [
            "# envbuild wheelhouse: the conda part of " + name + " (install.sh makes the paths absolute)",
            "@EXPLICIT",
        ]
        lines += [f"./{a.path}#{_md5(out / a.path)}" for a in conda]
        _write_text(out, f"conda/{name}.txt", "\n".join(lines) + "\n")
    # locks/<profile>/: the lock's files, and no file of an earlier lock it no longer has (only
    # lock file names are ever removed there)
    dest = _real_dir(out, f"locks/{name}")
    for f in L.FILES:
        if f not in texts and (dest / f).is_file() and not (dest / f).is_symlink():
            (dest / f).unlink()
    for f, text in sorted(texts.items()):
        _write_text(out, f"locks/{name}/{f}", text)


def _md5(path: Path) -> str:
    import hashlib

    h = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_tar(out: Path) -> Path:
    """OUT.tar beside OUT: sorted members, no owners or times, so the same files give the same
    bytes. Hidden files (the lock file, temporary files) and partial downloads stay out."""
    import tarfile

    tar_path = out.with_name(out.name + ".tar")
    tmp = tar_path.with_name(f".{tar_path.name}.tmp")

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in out.rglob("*") if not p.name.startswith(".")):
            if ".partial" in path.relative_to(out).parts:
                continue
            tar.add(path, arcname=f"{out.name}/{path.relative_to(out)}", recursive=False, filter=clean)
    tmp.replace(tar_path)
    return tar_path


def export_profiles(
    m: Matrix,
    profiles: list[str],
    out: Path,
    *,
    lock_dir: Path | None = None,
    mirror: str | None = None,
    url_map: Sequence[tuple[str, str]] = (),
    build_index: str | SecretUrl | None = None,
    jobs: int = 8,
    tar: bool = False,
    accept_pypi_torch: bool = False,
    accept_partial: bool = False,
    say: Callable[[str], None] = lambda m: None,
) -> ExportReport:
    """`envbuild wheelhouse` as a library: the lock of each profile (`lock_dir`, for one
    profile: DIR/<profile>/ as `lock -o DIR` wrote it, or DIR itself; else the project's
    lockfiles/<profile>, then the shipped one) checked to carry what the profile installs
    (offline.checks.lock_shortfalls: every refusal named at once, before anything is fetched),
    then exported into `out` (export) with the matrix's uv pin. `mirror`: its endpoints are
    tried before the lock's own URLs (after `url_map`), and its PyPI endpoint serves the build
    backends unless `build_index` says otherwise."""
    from envbuilder.model.resolve import uv_pin
    from envbuilder.offline.checks import known_profiles_or_locks, lock_shortfalls, url_map_for_mirror
    from envbuilder.lock.locate import find_lock, lock_used

    if lock_dir and len(profiles) > 1:
        raise UserError("--lock-dir names one lock; export several profiles from lockfiles/<profile>.")
    if jobs < 1:
        raise UserError("--jobs must be at least 1.")
    shown = str(SecretUrl(build_index)) if build_index else ""
    # (as text from here on: each sdist build's uv gets it through index_env, its probes through net)
    build_index = build_index.reveal() if isinstance(build_index, SecretUrl) else build_index
    if build_index and not build_index.startswith(("http://", "https://", "file://")):
        raise UserError(
            f"--build-index-url {shown!r} is not an index URL; pass the "
            "http(s):// or file:// URL of a PEP 503 index that serves the build "
            "backends (e.g. https://pypi.org/simple or your mirror's)."
        )
    maps = list(url_map)
    if mirror:
        from envbuilder.model import mirrors as M

        body = M.get_set(m, mirror)
        maps += url_map_for_mirror(body)
        build_index = build_index or next(iter(body.get("pypi") or []), None)
    if not lock_dir:  # a name without a lock is most often a typo of a profile
        known_profiles_or_locks(m, profiles)
    locks = {p: find_lock(p, lock_dir or None) for p in profiles}
    for p, d in locks.items():
        if (d / L.META).is_file():
            say(f"{p}: the lock {lock_used(d)}")
    refusals = [
        why for p, d in locks.items() for why in lock_shortfalls(m, p, d, accept_pypi_torch, accept_partial)
    ]
    if refusals:
        raise UserError(
            "Not exported: the wheelhouse would not hold what the profile installs.\n"
            + "\n".join(f"  - {r}" for r in refusals)
        )
    # the uv wheel the Dockerfiles' runtime stage installs with (the matrix's pin), carried too
    uv = uv_pin(m.defaults or {})
    scripts = {p: profile_scripts(m, p, d, say) for p, d in locks.items()}
    return export(
        locks, out, url_map=maps, jobs=jobs, build_index=build_index, say=say, tar=tar, uv=uv, scripts=scripts
    )


def profile_scripts(m: Matrix, profile: str, lock_dir: Path, say: Callable[[str], None]) -> dict[str, str]:
    """The profile's rendered apply_patches.py and audit_precision.py, for install.sh: only where
    the lock pins the verl the profile resolves to (a lock of a variant, another verl, gets none,
    and install.sh says how to patch it)."""
    from envbuilder.errors import EnvbuildError
    from envbuilder.context.prepare import prepare
    from envbuilder.model.resolve import resolve
    from envbuilder.render.files import render_files

    try:
        env = resolve(m, profile)
    except EnvbuildError:  # a lock of a profile this matrix lacks (or cannot resolve as shipped)
        say(f"{profile}: not a profile this matrix resolves: install.sh will not patch its verl")
        return {}
    _, texts = L.verified(lock_dir, profile)  # (the lock read whole and checked, as export reads it)
    text = texts.get(L.REQUIREMENTS, "")
    pinned = re.search(r"^verl==([^\s;\\]+)", text, re.M)
    if not pinned or pinned.group(1) != env.verl.version:
        say(
            f"{profile}: the lock pins verl {pinned.group(1) if pinned else '(none)'}, the profile "
            f"verl {env.verl.version}: install.sh will not patch it (render that variant and run "
            "its apply_patches.py and audit_precision.py)"
        )
        return {}
    # (prepared as every render is, within this lock's pins: the scripts read none of them)
    files = render_files(prepare(env, pins_from=("the wheelhouse's lock", lock_dir)))
    return {name: files[name] for name in SCRIPTS if name in files}
