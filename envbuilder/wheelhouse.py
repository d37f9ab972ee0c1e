"""`envbuild wheelhouse`: everything a locked environment installs, fetched once, verified, and
installable with no network.

The lock is the source of truth (pylock.toml for the pip part, conda-lock.yml for the conda part:
URLs and sha256), so no resolver runs here. The Wheelhouse directory holds

  pypi/                 the wheels (and sdists), stored once for every profile exported here
  simple/               a PEP 503 index over pypi/ (pip --index-url file://.../simple works too)
  conda/<subdir>/       the conda packages, with repodata.json from rattler's indexer
  sources/              source archives the builder stage compiles (apex), by sha256
  conda/<profile>.txt   the explicit conda environment of each profile (paths relative to here)
  locks/<profile>/      a copy of the lock it was made from (render --wheelhouse reads it)
  manifest.json         every file: name, version, size, sha256; and what each profile uses
  install.sh            on the far side: pip --no-index --require-hashes, conda --offline
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, NamedTuple
from urllib.parse import unquote, urlsplit

from .errors import ActionError, UserError
from .lock import lockfile as L

MANIFEST = "manifest.json"
FORMAT = 1


class Artifact(NamedTuple):
    kind: str  # pip | conda | source
    name: str
    version: str
    url: str
    sha256: str
    size: int | None
    subdir: str  # pypi, or conda/<platform>

    @property
    def filename(self) -> str:
        if self.kind == "source":  # GitHub's archive URLs end in the bare ref (25.08.tar.gz)
            return f"{self.name}-{self.version}.tar.gz"
        return unquote(urlsplit(self.url).path.rsplit("/", 1)[-1])

    @property
    def path(self) -> str:
        return f"{self.subdir}/{self.filename}"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _verified_text(lock_dir: Path, meta: dict, name: str) -> str:
    try:
        text = (lock_dir / name).read_text(encoding="utf-8")
    except OSError:
        raise UserError(f"{lock_dir / name} is missing; re-make the lock with `envbuild lock`.") from None
    if L.sha256_text(text) != meta.get("files", {}).get(name):
        raise UserError(f"{lock_dir / name} differs from what `envbuild lock` wrote (sha256); "
                        "a wheelhouse exports only what a lock pinned. Re-lock.")
    return text


def artifacts(lock_dir: Path) -> tuple[dict, list[Artifact]]:
    """(lock.json, every file the lock pins with its URL and sha256)."""
    from .lock.pip import load_toml

    lock_dir = Path(lock_dir)
    meta = L.read_meta(lock_dir)
    if meta is None:
        raise UserError(f"No lock in {lock_dir} (no {L.META}). Make one with `envbuild lock "
                        "PROFILE`, or pass --lock-dir where it is.")
    out: list[Artifact] = []
    if "pip" in meta.get("parts", []):
        if L.PYLOCK not in meta.get("files", {}):
            raise UserError(f"The lock in {lock_dir} has no {L.PYLOCK} (made by an older envbuild), "
                            "so it names no file URLs. Re-lock with `envbuild lock`.")
        for p in load_toml(_verified_text(lock_dir, meta, L.PYLOCK)).get("packages", []):
            files = p.get("wheels") or ([p["sdist"]] if p.get("sdist") else [])
            if not files:
                raise UserError(f"{lock_dir / L.PYLOCK}: {p['name']} has no file to download.")
            for f in files:
                out.append(Artifact("pip", normalize(p["name"]), p["version"], f["url"],
                                    f["hashes"]["sha256"], f.get("size"), "pypi"))
    if L.SOURCES in meta.get("files", {}):  # source archives the builder compiles (apex)
        for name, src in sorted(json.loads(_verified_text(lock_dir, meta, L.SOURCES)).items()):
            out.append(Artifact("source", name, src.get("ref", ""), src["url"], src["sha256"],
                                src.get("size"), "sources"))
    if "conda" in meta.get("parts", []):
        import yaml

        doc = yaml.safe_load(_verified_text(lock_dir, meta, L.CONDA_LOCK))
        for p in doc.get("package", []):
            if p.get("manager") != "conda":
                continue
            platform = urlsplit(p["url"]).path.rstrip("/").split("/")[-2]
            out.append(Artifact("conda", p["name"], str(p["version"]), p["url"],
                                p["hash"]["sha256"], None, f"conda/{platform}"))
    if not out:
        raise UserError(f"The lock in {lock_dir} pins no packages (parts: "
                        f"{', '.join(meta.get('parts', [])) or 'none'}).")
    return meta, out


def mirrored_urls(url: str, url_map: list[tuple[str, str]]) -> tuple[str, ...]:
    """The URL through each mirror prefix that matches it, in order, then the URL itself."""
    urls = [to + url[len(frm):] for frm, to in url_map if url.startswith(frm)]
    return tuple(dict.fromkeys(urls + [url]))


def _read_manifest(out: Path) -> dict:
    try:
        doc = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"format": FORMAT, "files": {}, "profiles": {}}
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{out / MANIFEST} is unreadable ({e}); export into a new directory.") from None
    if doc.get("format") != FORMAT:
        raise UserError(f"{out / MANIFEST} is not an envbuild wheelhouse manifest of format {FORMAT}.")
    return doc


def _write_text(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(mode)
    os.replace(tmp, path)


def _simple_index(out: Path, files: dict) -> None:
    """PEP 503 pages for every pip file in the manifest (regenerated whole each export)."""
    projects: dict[str, list[str]] = {}
    for path, f in sorted(files.items()):
        if f["kind"] == "pip":
            projects.setdefault(f["name"], []).append(path)
    simple = out / "simple"
    if simple.exists():
        shutil.rmtree(simple)
    links = "".join(f'    <a href="{html.escape(n)}/">{html.escape(n)}</a><br>\n' for n in projects)
    _write_text(simple / "index.html", f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    for name, paths in projects.items():
        body = "".join(f'    <a href="../../{html.escape(p)}#sha256={files[p]["sha256"]}">'
                       f'{html.escape(p.rsplit("/", 1)[-1])}</a><br>\n' for p in paths)
        _write_text(simple / name / "index.html",
                    f"<!DOCTYPE html>\n<html><body>\n{body}</body></html>\n")


def _conda_index(out: Path) -> None:
    from .lock.rattler_worker import call

    result = call({"op": "index", "channel_dir": str(out / "conda")})
    if "ok" not in result:
        raise ActionError(f"rattler could not index {out / 'conda'}: {next(iter(result.values()))}")


INSTALL_SH = r'''#!/usr/bin/env bash
# Offline install from this envbuild wheelhouse: no index, no network; every file hash-checked.
#   ./install.sh [PROFILE] [--prefix DIR]        (PYTHON=python3.10 picks the venv's Python)
# With a conda part and micromamba/mamba/conda on PATH it makes a conda env at DIR (--offline,
# from conda/PROFILE.txt); otherwise a venv at DIR from $PYTHON. The pip part then installs with
# pip --no-index --require-hashes --no-deps from pypi/.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROFILES=(__PROFILES__)
PROFILE="" PREFIX=""
while (($#)); do
  case "$1" in
    --prefix) PREFIX="$2"; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; echo "profiles: ${PROFILES[*]}"; exit 0 ;;
    *) PROFILE="$1"; shift ;;
  esac
done
if [ -z "$PROFILE" ]; then
  if [ "${#PROFILES[@]}" -ne 1 ]; then
    echo "install.sh: this wheelhouse holds ${PROFILES[*]}; name one: ./install.sh PROFILE" >&2; exit 2
  fi
  PROFILE="${PROFILES[0]}"
fi
REQ="$HERE/requirements/$PROFILE.lock"
[ -f "$REQ" ] || [ -f "$HERE/conda/$PROFILE.txt" ] || { echo "install.sh: no profile $PROFILE here (have: ${PROFILES[*]})" >&2; exit 2; }
PREFIX="${PREFIX:-$HERE/env-$PROFILE}"
PY=""
if [ -f "$HERE/conda/$PROFILE.txt" ]; then
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
  "${PYTHON:-python3}" -m venv "$PREFIX"
  PY="$PREFIX/bin/python"
fi
if [ -f "$REQ" ]; then
  "$PY" -m pip install --isolated --no-index --find-links "$HERE/pypi" --require-hashes --no-deps -r "$REQ"
fi
echo "installed $PROFILE into $PREFIX"
'''


class ExportReport(NamedTuple):
    downloaded: list[str]
    skipped: list[str]
    bytes_transferred: int
    files: int


def export(profiles: dict[str, Path], out: Path, *, url_map: list[tuple[str, str]] = (),
           jobs: int = 8, progress=None, session=None,
           say: Callable[[str], None] = lambda m: None) -> ExportReport:
    """Fetch every file the locks of `profiles` ({name: lock dir}) pin into `out`."""
    from .fetch import FetchItem, fetch_all

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory; pass -o a wheelhouse directory.")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).exists():
        raise UserError(f"{out} is not empty and is not a wheelhouse (no {MANIFEST}); pass -o a "
                        "new or empty directory, or an existing wheelhouse.")
    plans = {name: artifacts(lock_dir) for name, lock_dir in profiles.items()}
    wanted: dict[str, Artifact] = {}
    for _, arts in plans.values():
        for a in arts:
            other = wanted.setdefault(a.path, a)
            if other.sha256 != a.sha256:
                raise UserError(f"Two locks pin {a.path} with different sha256 ({other.sha256} vs "
                                f"{a.sha256}); export them into separate wheelhouses.")
    manifest = _read_manifest(out)
    for path, a in wanted.items():
        old = manifest["files"].get(path)
        if old and old["sha256"] != a.sha256:
            raise UserError(f"{out / path} is in this wheelhouse with another sha256 than the lock "
                            "pins; export into a new directory.")
    groups: dict[str, list[FetchItem]] = {}
    for path, a in sorted(wanted.items()):
        groups.setdefault(a.subdir, []).append(
            FetchItem(a.filename, a.sha256, mirrored_urls(a.url, list(url_map)), a.size))
    downloaded, skipped, nbytes, failure = [], [], 0, None
    for subdir, items in groups.items():
        say(f"{subdir}: {len(items)} file(s)")
        try:
            report = fetch_all(items, out / subdir, jobs=jobs, progress=progress, session=session)
        except ActionError as e:  # record what did arrive, then report the failure
            report, failure = e.report, e
        downloaded += [f"{subdir}/{n}" for n in report.downloaded]
        skipped += [f"{subdir}/{n}" for n in report.skipped]
        nbytes += report.bytes_transferred
    present = set(downloaded) | set(skipped)
    for path in sorted(present):
        a = wanted[path]
        size = (out / path).stat().st_size
        manifest["files"][path] = {"kind": a.kind, "name": a.name, "version": a.version,
                                   "size": size, "sha256": a.sha256}
    for name, (meta, arts) in plans.items():
        if all(a.path in present for a in arts):
            manifest["profiles"][name] = {"input_sha256": meta["input_sha256"],
                                          "files": sorted(a.path for a in arts)}
            _profile_files(out, name, Path(profiles[name]), meta, arts)
    _simple_index(out, manifest["files"])
    if any(p.startswith("conda/") for p in present):
        _conda_index(out)
    names = " ".join(sorted(manifest["profiles"]))
    _write_text(out / "install.sh", INSTALL_SH.replace("__PROFILES__", names), 0o755)
    _write_text(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if failure is not None:
        raise failure
    return ExportReport(downloaded, skipped, nbytes, len(wanted))


def _profile_files(out: Path, name: str, lock_dir: Path, meta: dict, arts: list[Artifact]) -> None:
    """requirements/<profile>.lock, conda/<profile>.txt and locks/<profile>/ for one profile."""
    if "pip" in meta.get("parts", []):
        _write_text(out / "requirements" / f"{name}.lock",
                    (lock_dir / L.REQUIREMENTS).read_text(encoding="utf-8"))
    conda = [a for a in arts if a.kind == "conda"]
    if conda:
        lines = ["# envbuild wheelhouse: the conda part of " + name + " (install.sh makes the "
                 "paths absolute)", "@EXPLICIT"]
        lines += [f"./{a.path}#{_md5(out / a.path)}" for a in conda]
        _write_text(out / "conda" / f"{name}.txt", "\n".join(lines) + "\n")
    dest = out / "locks" / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in sorted(meta.get("files", {})) + [L.META]:
        shutil.copy2(lock_dir / f, dest / f)


def _md5(path: Path) -> str:
    import hashlib

    h = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
