"""`envbuild wheelhouse`: everything a locked environment installs, fetched once, verified, and
installable with no network.

The lock is the source of truth (pylock.toml for the pip part, conda-lock.yml for the conda part:
URLs and sha256), so no resolver runs here. The Wheelhouse directory holds

  pypi/                 the wheels (and sdists), stored once for every profile exported here,
                        and a wheel built here from each sdist (wheelbuild.py): the far side
                        never builds
  simple/               a PEP 503 index over pypi/ (pip --index-url file://.../simple works too)
  conda/<subdir>/       the conda packages, with repodata.json from rattler's indexer
  sources/              source archives the builder stage compiles (apex), by sha256
  conda/<profile>.txt   the explicit conda environment of each profile (paths relative to here)
  requirements/<profile>.lock  the lock's requirements.lock, with each built wheel's sha256 in
                        place of its sdist's (install.sh installs from it)
  locks/<profile>/      an untouched copy of the lock it was made from (render --wheelhouse
                        reads it)
  manifest.json         every file: name, version, size, sha256 (a built wheel also what it was
                        built from and how); and what each profile uses
  install.sh            on the far side: pip --no-index --require-hashes --only-binary, conda
                        --offline
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
# An existing environment at DIR (DIR/bin/python) is installed into. Else, with a conda part and
# micromamba/mamba/conda on PATH, it makes a conda env at DIR (--offline, from conda/PROFILE.txt);
# otherwise a venv at DIR from $PYTHON. The pip part then installs with pip --no-index
# --require-hashes --no-deps --only-binary=:all: from pypi/: nothing is built here (each sdist of
# the lock was built into a wheel at export), so any pip works, with no compiler and no network.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROFILES=(__PROFILES__)
PROFILE="" PREFIX=""
while (($#)); do
  case "$1" in
    --prefix) PREFIX="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; echo "profiles: ${PROFILES[*]}"; exit 0 ;;
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
if [ -x "$PREFIX/bin/python" ]; then
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
  "${PYTHON:-python3}" -m venv "$PREFIX"
  PY="$PREFIX/bin/python"
fi
if [ -f "$REQ" ]; then
  "$PY" -m pip install --isolated --no-index --find-links "$HERE/pypi" --require-hashes --no-deps \
    --only-binary=:all: -r "$REQ"
fi
echo "installed $PROFILE into $PREFIX"
'''


class ExportReport(NamedTuple):
    downloaded: list[str]
    skipped: list[str]
    bytes_transferred: int
    files: int
    built: list[str] = []  # wheels built from sdists by this export (none when all were there)


def export(profiles: dict[str, Path], out: Path, *, url_map: list[tuple[str, str]] = (),
           jobs: int = 8, progress=None, session=None, build_index: str | None = None,
           say: Callable[[str], None] = lambda m: None) -> ExportReport:
    """Fetch every file the locks of `profiles` ({name: lock dir}) pin into `out`, and build a
    wheel from every sdist among them (its backend from `build_index`, else the lock's index)."""
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
    downloaded, skipped, nbytes, failures = [], [], 0, []
    for subdir, items in groups.items():
        say(f"{subdir}: {len(items)} file(s)")
        try:
            report = fetch_all(items, out / subdir, jobs=jobs, progress=progress, session=session)
        except ActionError as e:  # record what did arrive, then report the failure
            report = e.report
            failures.append(e)
        downloaded += [f"{subdir}/{n}" for n in report.downloaded]
        skipped += [f"{subdir}/{n}" for n in report.skipped]
        nbytes += report.bytes_transferred
    present = set(downloaded) | set(skipped)
    for path in sorted(present):
        a = wanted[path]
        size = (out / path).stat().st_size
        manifest["files"][path] = {"kind": a.kind, "name": a.name, "version": a.version,
                                   "size": size, "sha256": a.sha256}
    wheels, built = _wheels_from_sdists(out, plans, present, manifest, build_index, failures, say)
    for name, (meta, arts) in plans.items():
        if name in wheels and all(a.path in present for a in arts):
            manifest["profiles"][name] = {"input_sha256": meta["input_sha256"],
                                          "files": sorted([a.path for a in arts]
                                                          + list(wheels[name].values())),
                                          "built": wheels[name]}
            _profile_files(out, name, Path(profiles[name]), meta, arts,
                           {n: manifest["files"][p]["sha256"] for n, p in wheels[name].items()})
    _simple_index(out, manifest["files"])
    if any(p.startswith("conda/") for p in present):
        _conda_index(out)
    names = " ".join(sorted(manifest["profiles"]))
    _write_text(out / "install.sh", INSTALL_SH.replace("__PROFILES__", names), 0o755)
    _write_text(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if len(failures) == 1:
        raise failures[0]
    if failures:
        cls = UserError if any(isinstance(f, UserError) for f in failures) else ActionError
        raise cls(f"The export of {', '.join(plans)} failed in {len(failures)} ways:\n"
                  + "\n".join(f"- {f}" for f in failures))
    return ExportReport(downloaded, skipped, nbytes, len(wanted) + len(
        {p for w in wheels.values() for p in w.values()}), built)


def _wheels_from_sdists(out: Path, plans: dict, present: set[str], manifest: dict,
                        build_index: str | None, failures: list, say) -> tuple[dict, list[str]]:
    """A wheel for every sdist of every profile, fit for that profile's target: one already in
    the wheelhouse (built from the same sdist sha256, its bytes hashing right), else built now.
    Returns ({profile: {package: wheel path}} for the profiles that have all of theirs, [wheels
    built now]); a build's failure goes to `failures`, its profile stays incomplete."""
    from .wheelbuild import build_wheel, is_sdist

    reserved = frozenset(p.rsplit("/", 1)[-1] for _, arts in plans.values() for p in
                         (a.path for a in arts) if p.startswith("pypi/"))
    wheels: dict[str, dict[str, str]] = {}
    built: list[str] = []
    failed: set[tuple] = set()  # (sdist, target) whose build failed in this run: not tried twice
    for name, (meta, arts) in plans.items():
        target = meta.get("target") or {}
        mine, complete = {}, True
        for a in arts:
            if a.kind != "pip" or not is_sdist(a.filename):
                continue
            key = (a.path, target.get("python"), target.get("python_platform"))
            if a.path not in present or key in failed:
                complete = False  # its download or build failed: reported already
                continue
            path = _built_wheel(out, manifest, a, target)
            if path is None:
                index = build_index or (meta.get("sources") or {}).get("pypi")
                if not index:
                    failures.append(UserError(f"The lock of {name} names no index (lock.json "
                                              "sources.pypi) to fetch the build backend of "
                                              f"{a.filename} from; pass --build-index-url."))
                    failed.add(key)
                    complete = False
                    continue
                try:
                    w = build_wheel(out / a.path, a.sha256, a.name, a.version, target, index,
                                    out / a.subdir, reserved=reserved, say=say)
                except (UserError, ActionError) as e:
                    failures.append(e)
                    failed.add(key)
                    complete = False
                    continue
                path = f"{a.subdir}/{w.filename}"
                _forget_profiles_using(manifest, path, w.sha256, keep=set(plans), say=say)
                manifest["files"][path] = {
                    "kind": "pip", "name": a.name, "version": a.version, "size": w.size,
                    "sha256": w.sha256, "built_from": {"path": a.path, "sha256": a.sha256},
                    "build": w.build}
                built.append(path)
            mine[a.name] = path
        if complete:
            wheels[name] = mine
    return wheels, built


def _built_wheel(out: Path, manifest: dict, sdist: Artifact, target: dict) -> str | None:
    """The wheelhouse's wheel built from this sdist that fits `target` and hashes right, if any."""
    from .fetch import sha256_file
    from .wheelbuild import unfit

    for path, f in sorted(manifest["files"].items()):
        if (f.get("built_from") or {}).get("sha256") == sdist.sha256 \
                and unfit(path.rsplit("/", 1)[-1], f.get("build") or {}, target) is None \
                and (out / path).is_file() and sha256_file(out / path) == f["sha256"]:
            return path
    return None


def _forget_profiles_using(manifest: dict, path: str, sha256: str, keep: set[str], say) -> None:
    """A wheel rebuilt with other bytes than the manifest had: the profiles of earlier exports
    whose requirements name the old hash are no longer complete here."""
    old = manifest["files"].get(path)
    if not old or old["sha256"] == sha256:
        return
    for name in sorted(manifest["profiles"]):
        if name not in keep and path in manifest["profiles"][name]["files"]:
            del manifest["profiles"][name]
            say(f"{path} was rebuilt with other bytes: export {name} again to use it")


def _profile_files(out: Path, name: str, lock_dir: Path, meta: dict, arts: list[Artifact],
                   built: dict[str, str]) -> None:
    """requirements/<profile>.lock, conda/<profile>.txt and locks/<profile>/ for one profile;
    `built` ({package: sha256}) are the wheels that stand in for the lock's sdists."""
    if "pip" in meta.get("parts", []):
        from .lock.pip import replace_hashes

        text = _verified_text(lock_dir, meta, L.REQUIREMENTS)
        if built:
            note = (f"# envbuild wheelhouse: {L.REQUIREMENTS} of {name}, with the sha256 of the "
                    f"wheel built here from each sdist ({', '.join(sorted(built))}) in place of "
                    "the sdist's\n")
            text = note + replace_hashes(text, {n: (f"sha256:{h}",) for n, h in built.items()})
        _write_text(out / "requirements" / f"{name}.lock", text)
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
