"""`envbuild refresh`: the matrix against PyPI's JSON API, and the fetching it needs (loads only
when used; requests is imported inside). The comparison itself is envbuilder/upstream/refresh.py.

Per release, the metadata comes from `/pypi/<name>/<version>/json`; where an index serves only
the project page (`/pypi/<name>/json`, as some mirrors and proxies do), from the release's
wheel: its `*.dist-info/METADATA`, read with HTTP range requests (a few hundred KB of a
400 MB wheel: the zip's directory and that one member), as pip's lazy wheel does.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import click

from envbuilder.cli.options import load_matrix, matrix_dir_option
from envbuilder.errors import ActionError, EnvbuildError, UserError
from envbuilder.text import redact as redacted

DEFAULT_INDEX = "https://pypi.org"
MAX_PROJECT_BYTES = 64 << 20  # ray's project page is 1.5 MB
MAX_METADATA_BYTES = 4 << 20
MAX_WHEEL_READ_BYTES = 64 << 20  # what a zip directory and one METADATA can take of a wheel
WORKERS = 8


def _index_url(ctx, param, value):
    if value is not None and not value.strip():  # (a careless "$MIRROR" is no default)
        raise click.BadParameter("is empty. Pass the root of an index that serves PyPI's JSON "
                                 f"API, or leave --index-url out for {DEFAULT_INDEX}.")
    value = (value or DEFAULT_INDEX).strip()
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
        raise click.BadParameter(f"{value!r} is not an http(s) URL. Pass the root of an index "
                                 f"that serves PyPI's JSON API, e.g. {DEFAULT_INDEX}.")
    value = value.rstrip("/")
    return value[: -len("/simple")] if value.endswith("/simple") else value


@click.command()
@click.option("--index-url", default=DEFAULT_INDEX, show_default=True, callback=_index_url,
              metavar="URL", help="Root of PyPI's JSON API (<URL>/pypi/<name>/json); a trailing "
              "/simple is dropped.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option("--markdown", is_flag=True, help="The report as one Markdown code block (the "
              "refresh workflow's pull request body): nothing the index wrote renders there.")
@click.option("--write-overlay", "overlay_dir", type=click.Path(path_type=Path), metavar="DIR",
              help="Write DIR/refresh.yaml: a --matrix-dir overlay of the mechanical fixes, the "
                   "rest as a commented TODO report, for review. matrices/ is never edited.")
@click.option("--newest", default=3, show_default=True, type=click.IntRange(0, 50),
              help="Read the metadata of this many of the newest releases past the matrix's "
                   "(torch, vllm, verl, flash-attn); older new ones are listed by version only.")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(1, 600),
              help="Seconds to wait for each answer of the index.")
@matrix_dir_option
def refresh(index_url, as_json, markdown, overlay_dir, newest, timeout, matrix_dirs):
    """What PyPI says now about torch, vllm, verl, flash-attn, transformers and ray, against the
    matrix: new releases, changed pins, contradicted facts. Prints the drift; edits nothing."""
    from envbuilder.upstream import refresh as R

    import importlib.util

    if importlib.util.find_spec("packaging") is None:  # (PyPI's requirement strings)
        raise UserError("envbuild refresh reads PyPI's requirement strings (PEP 508) with the "
                        "'packaging' package, which is not installed here. Install it: "
                        "`pip install packaging`.")
    if as_json and markdown:
        raise UserError("--json and --markdown are two forms of the one report; pass one.")
    if overlay_dir is not None:
        _check_overlay_dir(Path(overlay_dir), matrix_dirs)
    m = load_matrix(matrix_dirs)
    index = PyPIJson(index_url, timeout)
    shown = redacted(index_url)  # (an index URL's user:password@ is printed as ***@)
    say = (lambda text: None) if as_json else (lambda text: click.echo(text, err=True))
    say(f"reading {shown}/pypi/<name>/json for {', '.join(R.PACKAGES)} ...")
    projects = index.projects(R.PACKAGES)
    wanted = R.wanted_metadata(m, projects, newest)
    say(f"reading the metadata of {sum(map(len, wanted.values()))} releases ...")
    metadata = index.metadata_of(wanted, projects)
    report = {"index": shown, **R.compare(m, projects, metadata, where=m.where)}
    if overlay_dir is not None:
        path = _write_overlay(Path(overlay_dir), R.overlay_text(report, m, _sources_of(m)),
                              matrix_dirs)
        report["overlay"] = str(path)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(R.markdown(report) if markdown else R.text(report), nl=False)


@click.command()
@click.argument("overlay", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="The profiles and what changed, as JSON.")
@matrix_dir_option
def affected(overlay, as_json, matrix_dirs):
    """The profiles whose environment the matrix overlay OVERLAY changes (refresh's pull request
    runs `check --resolve` and `verify` on these): each profile resolved with and without it, and
    again with `--verl X` for every stack (stacks.yaml), compared field by field. A profile the
    overlay breaks is affected too. One name a line; nothing when the overlay changes nothing."""
    from envbuilder.model.resolve import Overrides, resolve

    base, over = load_matrix(matrix_dirs), load_matrix((*matrix_dirs, overlay))
    stacks = sorted({*(base.sections.get("stacks") or {}), *(over.sections.get("stacks") or {})})
    found: dict[str, list[str]] = {}
    for name in over.profiles:
        for verl in (None, *stacks):
            ov = Overrides(verl=verl) if verl else Overrides()
            got = []
            for m in (base, over):
                try:
                    got.append(resolve(m, name, ov).to_dict() if name in m.profiles else None)
                except EnvbuildError as e:
                    got.append(f"refused: {str(e).splitlines()[0]}")
            if got[0] != got[1]:
                what = (sorted(k for k in got[1] if got[0].get(k) != got[1].get(k))
                        if all(isinstance(g, dict) for g in got) else [str(got[1])])
                found.setdefault(name, []).append(f"{'--verl ' + verl if verl else 'as shipped'}: "
                                                  f"{', '.join(what)}")
    if as_json:
        click.echo(json.dumps({"overlay": str(overlay), "affected": found}, indent=2, sort_keys=True))
        return
    for name in found:
        click.echo(name)


# -- the overlay file ------------------------------------------------------------------------

def _check_overlay_dir(folder: Path, matrix_dirs) -> None:
    from envbuilder.upstream import refresh as R
    from envbuilder.paths import data_dir

    shipped = data_dir("matrices").resolve()
    target = folder.resolve()
    if target == shipped or shipped in target.parents:
        raise UserError(f"--write-overlay {folder} is envbuild's own matrices folder: refresh "
                        "never edits the shipped matrix. Pass another folder (e.g. "
                        "--write-overlay refresh) and fold reviewed facts into matrices/ by hand.")
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--write-overlay {folder} exists and is not a folder. Pass a folder: "
                        "refresh writes refresh.yaml into it.")
    existing = folder / "refresh.yaml"
    if existing.is_symlink() or (existing.exists() and not existing.is_file()):
        raise UserError(f"{existing} is not a regular file; refresh writes only a file of its "
                        "own there. Remove it or pass another folder.")
    if existing.is_file():
        with open(existing, encoding="utf-8", errors="replace") as f:
            head = f.read(len(R.OVERLAY_HEADER))
        if head != R.OVERLAY_HEADER:
            raise UserError(f"{existing} exists and was not written by envbuild refresh (it "
                            f"does not start with {R.OVERLAY_HEADER!r}); refresh overwrites only "
                            "its own file. Move it away or pass another folder.")


def _sources_of(m):
    """(section, key) -> its file's `sources:` map, to write a copied record's sources as URLs."""
    from envbuilder.limits import load_yaml, read_text_bounded

    cache: dict[str, dict] = {}

    def sources(section: str, key: str) -> dict:
        path = m.origin.get((section, key))
        if not path:
            return {}
        if path not in cache:
            doc = load_yaml(read_text_bounded(Path(path), "matrix file"), path) or {}
            cache[path] = doc.get("sources") or {}
        return cache[path]

    return sources


def _write_overlay(folder: Path, text: str, matrix_dirs) -> Path:
    """Write folder/refresh.yaml after checking that the matrix loads with it (a copy that the
    schema refuses would be a bug of refresh's, not a fact to review)."""
    import shutil
    import tempfile

    from envbuilder.model import matrix
    from envbuilder.render.outdir import write_text_atomic

    stage = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".refresh-", dir=folder))
        write_text_atomic(stage / "refresh.yaml", text, fsync=True)
        matrix._load(matrix.matrix_files((*map(Path, matrix_dirs), stage)))
        os.replace(stage / "refresh.yaml", folder / "refresh.yaml")  # (whole, or the old one)
    except OSError as e:
        raise _write_error(folder, e) from None
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
    return folder / "refresh.yaml"


def _write_error(folder: Path, e: OSError) -> EnvbuildError:
    """A folder that cannot take refresh.yaml: exit 2 where the folder refuses writes (the
    user's choice of folder), exit 1 where the disk failed (full, an I/O error)."""
    import errno

    why = e.strerror or type(e).__name__
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
        return UserError(f"--write-overlay {folder}: cannot write refresh.yaml there ({why}). "
                         "Nothing was written. Pass --write-overlay a folder you can write.")
    return ActionError(f"--write-overlay {folder}: writing refresh.yaml failed ({why}); any "
                       "refresh.yaml there is as it was. Free space there (or pass another "
                       "folder) and run refresh again.")


# -- PyPI's JSON API -----------------------------------------------------------------------------

class PyPIJson:
    """GETs on `<index>/pypi/<name>/json` and `<index>/pypi/<name>/<version>/json` through
    net.session (retries, proxies, CAs), each body within its cap and every exchange within
    `deadline`; an index that does not answer, or answers something that is not PyPI's project
    JSON (HTML, a list, a release that is a string, files of the wrong kind), is an exit-1
    paragraph naming the URL without its credentials."""

    def __init__(self, base: str, timeout: float):
        self.base, self.timeout = base, timeout
        self.deadline = max(60.0, 4 * timeout)  # a whole answer, however slowly it drips
        self._local = threading.local()

    def session(self):
        s = getattr(self._local, "session", None)
        if s is None:
            from envbuilder.oci.http import session

            s = self._local.session = session(user_agent="envbuild-refresh")
        return s

    def _get(self, url: str, limit: int, headers: dict | None = None):
        """(status, body bytes; empty for a status >= 400); net.NetError when the index does
        not answer, answers more than `limit` bytes, or not within the deadline."""
        from envbuilder.oci import http as net

        expect = net.Expect("PyPI's JSON API answer", limit, self.deadline)
        r = net.request(self.session(), "GET", url, expect, headers=headers,
                        timeout=self.timeout)
        return r.status, (r.body if r.status < 400 else b"")

    def projects(self, names) -> dict[str, dict]:
        from envbuilder.oci import http as net

        out = {}
        shown = net.redact(self.base)
        for name in names:
            url = f"{self.base}/pypi/{name}/json"
            try:
                status, body = self._get(url, MAX_PROJECT_BYTES)
            except net.NetError as e:
                if e.kind == "too-large":
                    raise ActionError(f"{e}: not PyPI's project JSON for {name}. Pass "
                                      "--index-url the root of PyPI's JSON API.") from None
                raise ActionError(f"{shown} does not answer for {name} ({e.reason}): envbuild "
                                  f"refresh reads PyPI's JSON API there ({e.url}). Check the "
                                  "network and proxy settings (HTTPS_PROXY), or pass --index-url "
                                  "an index that serves that API (PyPI itself, or a mirror that "
                                  "does, such as devpi).") from None
            if status == 404:
                raise ActionError(f"{net.redact(url)} answered 404: {shown} serves no JSON API "
                                  f"page for {name}. --index-url takes the root of PyPI's JSON "
                                  f"API ({DEFAULT_INDEX}), not a simple index; pass one that "
                                  "serves /pypi/<name>/json.")
            if status >= 400:
                raise ActionError(f"{net.redact(url)} answered HTTP {status}: the index refused "
                                  "the JSON API request. Try again later, or pass another "
                                  "--index-url.")
            try:
                doc = net.json_object(body, url, "PyPI's project JSON")
                _check_project(doc, url)
            except net.BadAnswer as e:
                raise ActionError(f"{e.url} is not PyPI's project JSON: it {e.detail}. The "
                                  "index answered something else (a login page, a proxy's "
                                  "error?); pass --index-url the root of PyPI's JSON API."
                                  ) from None
            out[name] = doc
        return out

    def metadata_of(self, wanted: dict[str, list[str]], projects: dict) -> dict:
        from concurrent.futures import ThreadPoolExecutor

        jobs = [(pkg, v) for pkg, versions in wanted.items() for v in versions]
        with ThreadPoolExecutor(WORKERS) as pool:
            got = list(pool.map(lambda job: self.metadata(*job, projects[job[0]]), jobs))
        out: dict[str, dict] = {}
        for (pkg, v), md in zip(jobs, got):
            out.setdefault(pkg, {})[v] = md
        return out

    def metadata(self, name: str, version: str, project: dict) -> dict:
        """{"requires_python", "requires_dist", "from"}, or {"error": why}."""
        from envbuilder.oci import http as net

        url = f"{self.base}/pypi/{name}/{version}/json"
        shown = net.redact(url)
        try:
            status, body = self._get(url, MAX_METADATA_BYTES * 4)
        except net.NetError as e:
            if e.kind == "too-large":
                return {"error": str(e)}
            raise ActionError(f"{shown} did not answer ({e.reason}) after the project pages "
                              "did: the index or the network failed midway. Run refresh again; "
                              "pass --timeout more seconds on a slow link.") from None
        if status < 400:
            try:
                info = net.json_object(body, url, "PyPI's release JSON").get("info")
                if not isinstance(info, dict):
                    raise net.BadAnswer(url, f"has {net.kind_of(info)} for `info`, not an object")
                rp, rd = info.get("requires_python"), info.get("requires_dist")
                if rp is not None and not isinstance(rp, str):
                    raise net.BadAnswer(url, f"has {net.kind_of(rp)} for `info.requires_python`")
                if rd is not None and not (isinstance(rd, list)
                                           and all(isinstance(r, str) for r in rd)):
                    raise net.BadAnswer(url, "has `info.requires_dist` that is no list of text")
                return {"requires_python": rp or None, "requires_dist": rd or [], "from": url}
            except net.BadAnswer as e:
                return {"error": f"{e.url} is not PyPI's release JSON: it {e.detail}"}
        if status != 404:
            return {"error": f"{shown} answered HTTP {status}"}
        return self.from_wheel(name, version, project)

    def from_wheel(self, name: str, version: str, project: dict) -> dict:
        import zipfile
        import zlib

        from envbuilder.oci import http as net

        files = (project.get("releases") or {}).get(version) or []
        wheels = [f for f in files if str(f.get("filename", "")).endswith(".whl") and f.get("url")]
        if not wheels:
            return {"error": "no per-release JSON at this index (404) and no wheel to read "
                    "METADATA from (PyPI has only its sdist)"}
        wheel = min(wheels, key=lambda f: (not re.search(r"linux.*x86_64|none-any", f["filename"]),
                                           f["filename"]))
        from urllib.parse import urljoin

        url = urljoin(f"{self.base}/pypi/{name}/json", wheel["url"])
        try:
            text = _wheel_metadata(self, url, wheel.get("size"))
        except (net.NetError, ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile,
                zlib.error, NotImplementedError, RuntimeError) as e:
            # (a file that is no zip, a truncated or corrupt one, a compression or encryption
            # zipfile does not read: the wheel cannot give its METADATA)
            return {"error": f"no per-release JSON at this index (404), and the METADATA of "
                    f"{wheel['filename']} could not be read ({_why(e)})"}
        import email.parser

        msg = email.parser.Parser().parsestr(text, headersonly=True)
        return {"requires_python": msg.get("Requires-Python") or None,
                "requires_dist": msg.get_all("Requires-Dist") or [],
                "from": f"{wheel['filename']} METADATA (no per-release JSON at this index)"}


_FILE_FIELDS = {"filename": (str,), "url": (str,), "yanked": (bool, str), "yanked_reason": (str,),
                "requires_python": (str,), "size": (int,)}


def _check_project(doc: dict, url: str) -> None:
    """net.BadAnswer unless `doc` has the shape of PyPI's project JSON in what refresh reads:
    `info` an object (its `version` text), `releases` an object of lists of file objects whose
    filename, url, yanked, yanked_reason, requires_python and size are of their kinds."""
    from envbuilder.oci.http import BadAnswer, kind_of

    info = doc.get("info")
    if info is not None and not isinstance(info, dict):
        raise BadAnswer(url, f"has {kind_of(info)} for `info`, not an object")
    if info and info.get("version") is not None and not isinstance(info["version"], str):
        raise BadAnswer(url, f"has {kind_of(info['version'])} for `info.version`, not text")
    releases = doc.get("releases")
    if not isinstance(releases, dict):
        raise BadAnswer(url, "has no `releases` object" if releases is None else
                        f"has {kind_of(releases)} for `releases`, not an object")
    for version, files in releases.items():
        if files is None:
            continue
        if not isinstance(files, list):
            raise BadAnswer(url, f"has {kind_of(files)} for release {version[:60]!r}, not a "
                                 "list of files")
        for i, f in enumerate(files):
            if not isinstance(f, dict):
                raise BadAnswer(url, f"has {kind_of(f)} as file {i} of release "
                                     f"{version[:60]!r}, not an object")
            for key, kinds in _FILE_FIELDS.items():
                value = f.get(key)
                bad_size = key == "size" and (isinstance(value, bool) or
                                              (isinstance(value, int) and value < 0))
                if value is not None and (not isinstance(value, kinds) or bad_size):
                    raise BadAnswer(url, f"has {kind_of(value)} for `{key}` of file {i} of "
                                         f"release {version[:60]!r}")


class _RangeFile:
    """A remote file as zipfile reads it: every read one HTTP range request (through
    net.request: the body at most what was asked for, within the index's deadline)."""

    def __init__(self, index: PyPIJson, url: str, size: int):
        self.index, self.url, self.size, self.pos, self.fetched = index, url, size, 0, 0

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=0):
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        if self.pos < 0:
            raise ValueError(f"a seek before the start of the file ({self.pos})")
        return self.pos

    def read(self, n=-1):
        from envbuilder.oci import http as net

        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        self.fetched += end - self.pos
        if self.fetched > MAX_WHEEL_READ_BYTES:
            raise ValueError(f"reading its METADATA took more than {MAX_WHEEL_READ_BYTES >> 20} MB")
        expect = net.Expect("a range of a wheel", end - self.pos, self.index.deadline)
        try:
            r = net.request(self.index.session(), "GET", self.url, expect,
                            headers={"Range": f"bytes={self.pos}-{end - 1}"},
                            timeout=self.index.timeout)
        except net.NetError as e:
            if e.kind == "too-large":
                raise ValueError(f"a range request returned more than the {end - self.pos} "
                                 "bytes asked for") from None
            raise
        if r.status != 206:
            raise ValueError(f"the file server answered HTTP {r.status} to a range "
                             "request (no partial reads: not downloading the whole wheel)")
        if len(r.body) != end - self.pos:
            raise ValueError(f"a range request returned {len(r.body)} bytes, not {end - self.pos}")
        self.pos = end
        return r.body


def _wheel_metadata(index: PyPIJson, url: str, size: int | None) -> str:
    import zipfile

    from envbuilder.oci import http as net

    if not size:
        r = net.request(index.session(), "HEAD", url, net.STATUS, timeout=index.timeout,
                        deadline=index.deadline)
        length = r.headers.get("Content-Length") or ""
        size = int(length) if length.isdigit() else 0
        if r.status >= 400 or not size:
            raise ValueError(f"HEAD answered HTTP {r.status} without a length")
    with zipfile.ZipFile(_RangeFile(index, url, int(size))) as z:  # type: ignore[arg-type]
        names = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(names) != 1:
            raise ValueError(f"{len(names)} *.dist-info/METADATA members")
        info = z.getinfo(names[0])
        if info.file_size > MAX_METADATA_BYTES:
            raise ValueError(f"METADATA is {info.file_size} bytes")
        return z.read(info).decode("utf-8", errors="replace")


def _why(e: Exception) -> str:
    from envbuilder.oci.http import redact

    text = " ".join(str(e).split()) or type(e).__name__
    return redact(f"{type(e).__name__}: {text[:300]}")
