"""PyPI's JSON API, as `envbuild refresh` reads it (through net's one session: a size cap and a
deadline on every answer, each checked for the shape refresh reads).

Per release, the metadata comes from `/pypi/<name>/<version>/json`; where an index serves only
the project page (`/pypi/<name>/json`, as some mirrors and proxies do), from the release's
wheel: its `*.dist-info/METADATA`, read with HTTP range requests (a few hundred KB of a
400 MB wheel: the zip's directory and that one member), as pip's lazy wheel does.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Iterable, Mapping, TypedDict, cast

from envbuilder.errors import ActionError
from envbuilder.secret import SecretUrl

if TYPE_CHECKING:
    from envbuilder.oci.http import BundleSession


DEFAULT_INDEX = "https://pypi.org"


MAX_PROJECT_BYTES = 64 << 20  # ray's project page is 1.5 MB


MAX_METADATA_BYTES = 4 << 20


MAX_WHEEL_READ_BYTES = 64 << 20  # what a zip directory and one METADATA can take of a wheel


WORKERS = 8


class PyPIFile(TypedDict, total=False):
    """A file of a release in PyPI's project JSON, in what refresh reads (each field of its kind
    or null, as _check_project checked it)."""

    filename: str | None
    url: str | None
    yanked: bool | str | None
    yanked_reason: str | None
    requires_python: str | None
    size: int | None


class ProjectInfo(TypedDict, total=False):
    version: str | None


class Project(TypedDict, total=False):
    """PyPI's project JSON (`/pypi/<name>/json`) in what refresh reads: `info.version` and the
    files of each release (null for none)."""

    info: ProjectInfo | None
    releases: dict[str, list[PyPIFile] | None]


# One release's metadata: {"requires_python", "requires_dist", "from"} where it was read (the
# per-release JSON or the wheel's METADATA), {"error": why} where it was not.
ReleaseMeta = TypedDict(
    "ReleaseMeta",
    {"requires_python": "str | None", "requires_dist": "list[str]", "from": str, "error": str},
    total=False,
)


class _Local(threading.local):
    session: BundleSession | None = None  # (each thread's own)


class PyPIJson:
    """GETs on `<index>/pypi/<name>/json` and `<index>/pypi/<name>/<version>/json` through
    net.session (retries, proxies, CAs), each body within its cap and every exchange within
    `deadline`; an index that does not answer, or answers something that is not PyPI's project
    JSON (HTML, a list, a release that is a string, files of the wrong kind), is an exit-1
    paragraph naming the URL without its credentials."""

    def __init__(self, base: str | SecretUrl, timeout: float):
        # (the HTTP layer: the one place, with index_env, that reads the password)
        self.base = base.reveal() if isinstance(base, SecretUrl) else base
        self.timeout = timeout
        self.deadline = max(60.0, 4 * timeout)  # a whole answer, however slowly it drips
        self._local = _Local()

    def session(self) -> BundleSession:
        s = self._local.session
        if s is None:
            from envbuilder.oci.http import session

            s = self._local.session = session(user_agent="envbuild-refresh")
        return s

    def _get(self, url: str, limit: int, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status, body bytes; empty for a status >= 400); net.NetError when the index does
        not answer, answers more than `limit` bytes, or not within the deadline."""
        from envbuilder.oci import http as net

        expect = net.Expect("PyPI's JSON API answer", limit, self.deadline)
        r = net.request(self.session(), "GET", url, expect, headers=headers, timeout=self.timeout)
        return r.status, (r.body if r.status < 400 else b"")

    def projects(self, names: Iterable[str]) -> dict[str, Project]:
        from envbuilder.oci import http as net

        out: dict[str, Project] = {}
        shown = net.redact(self.base)
        for name in names:
            url = f"{self.base}/pypi/{name}/json"
            try:
                status, body = self._get(url, MAX_PROJECT_BYTES)
            except net.NetError as e:
                if e.kind == "too-large":
                    raise ActionError(
                        f"{e}: not PyPI's project JSON for {name}. Pass "
                        "--index-url the root of PyPI's JSON API."
                    ) from None
                raise ActionError(
                    f"{shown} does not answer for {name} ({e.reason}): envbuild "
                    f"refresh reads PyPI's JSON API there ({e.url}). Check the "
                    "network and proxy settings (HTTPS_PROXY), or pass --index-url "
                    "an index that serves that API (PyPI itself, or a mirror that "
                    "does, such as devpi)."
                ) from None
            if status == 404:
                raise ActionError(
                    f"{net.redact(url)} answered 404: {shown} serves no JSON API "
                    f"page for {name}. --index-url takes the root of PyPI's JSON "
                    f"API ({DEFAULT_INDEX}), not a simple index; pass one that "
                    "serves /pypi/<name>/json."
                )
            if status >= 400:
                raise ActionError(
                    f"{net.redact(url)} answered HTTP {status}: the index refused "
                    "the JSON API request. Try again later, or pass another "
                    "--index-url."
                )
            try:
                doc = _check_project(net.json_object(body, url, "PyPI's project JSON"), url)
            except net.BadAnswer as e:
                raise ActionError(
                    f"{e.url} is not PyPI's project JSON: it {e.detail}. The "
                    "index answered something else (a login page, a proxy's "
                    "error?); pass --index-url the root of PyPI's JSON API."
                ) from None
            out[name] = doc
        return out

    def metadata_of(
        self, wanted: dict[str, list[str]], projects: Mapping[str, Project]
    ) -> dict[str, dict[str, ReleaseMeta]]:
        from concurrent.futures import ThreadPoolExecutor

        jobs = [(pkg, v) for pkg, versions in wanted.items() for v in versions]
        with ThreadPoolExecutor(WORKERS) as pool:
            got = list(pool.map(lambda job: self.metadata(job[0], job[1], projects[job[0]]), jobs))
        out: dict[str, dict[str, ReleaseMeta]] = {}
        for (pkg, v), md in zip(jobs, got):
            out.setdefault(pkg, {})[v] = md
        return out

    def metadata(self, name: str, version: str, project: Project) -> ReleaseMeta:
        """{"requires_python", "requires_dist", "from"}, or {"error": why}."""
        from envbuilder.oci import http as net

        url = f"{self.base}/pypi/{name}/{version}/json"
        shown = net.redact(url)
        try:
            status, body = self._get(url, MAX_METADATA_BYTES * 4)
        except net.NetError as e:
            if e.kind == "too-large":
                return {"error": str(e)}
            raise ActionError(
                f"{shown} did not answer ({e.reason}) after the project pages "
                "did: the index or the network failed midway. Run refresh again; "
                "pass --timeout more seconds on a slow link."
            ) from None
        if status < 400:
            try:
                got: object = net.json_object(body, url, "PyPI's release JSON").get("info")
                info = _object(got)
                if info is None:
                    raise net.BadAnswer(url, f"has {net.kind_of(got)} for `info`, not an object")
                rp, rd = info.get("requires_python"), info.get("requires_dist")
                if rp is not None and not isinstance(rp, str):
                    raise net.BadAnswer(url, f"has {net.kind_of(rp)} for `info.requires_python`")
                texts = _texts(rd)
                if rd is not None and texts is None:
                    raise net.BadAnswer(url, "has `info.requires_dist` that is no list of text")
                return {"requires_python": rp or None, "requires_dist": texts or [], "from": url}
            except net.BadAnswer as e:
                return {"error": f"{e.url} is not PyPI's release JSON: it {e.detail}"}
        if status != 404:
            return {"error": f"{shown} answered HTTP {status}"}
        return self.from_wheel(name, version, project)

    def from_wheel(self, name: str, version: str, project: Project) -> ReleaseMeta:
        import zipfile
        import zlib

        from envbuilder.oci import http as net

        files = (project.get("releases") or {}).get(version) or []
        wheels: list[tuple[str, str, int | None]] = []  # (filename, url, size)
        for f in files:
            filename, link = f.get("filename") or "", f.get("url")
            if filename.endswith(".whl") and link:
                wheels.append((filename, link, f.get("size")))
        if not wheels:
            return {
                "error": "no per-release JSON at this index (404) and no wheel to read "
                "METADATA from (PyPI has only its sdist)"
            }
        filename, link, size = min(
            wheels, key=lambda w: (not re.search(r"linux.*x86_64|none-any", w[0]), w[0])
        )
        from urllib.parse import urljoin

        url = urljoin(f"{self.base}/pypi/{name}/json", link)
        try:
            text = _wheel_metadata(self, url, size)
        except (
            net.NetError,
            ValueError,
            OSError,
            KeyError,
            EOFError,
            zipfile.BadZipFile,
            zlib.error,
            NotImplementedError,
            RuntimeError,
        ) as e:
            # (a file that is no zip, a truncated or corrupt one, a compression or encryption
            # zipfile does not read: the wheel cannot give its METADATA)
            return {
                "error": f"no per-release JSON at this index (404), and the METADATA of "
                f"{filename} could not be read ({_why(e)})"
            }
        import email.parser

        msg = email.parser.Parser().parsestr(text, headersonly=True)
        return {
            "requires_python": msg.get("Requires-Python") or None,
            "requires_dist": msg.get_all("Requires-Dist") or [],
            "from": f"{filename} METADATA (no per-release JSON at this index)",
        }


_FILE_FIELDS = {
    "filename": (str,),
    "url": (str,),
    "yanked": (bool, str),
    "yanked_reason": (str,),
    "requires_python": (str,),
    "size": (int,),
}


def _object(value: object) -> dict[str, object] | None:
    """A JSON object (its keys are text), or None for any other value."""
    return cast("dict[str, object]", value) if isinstance(value, dict) else None


def _texts(value: object) -> list[str] | None:
    """A JSON list of text, or None for any other value."""
    if not isinstance(value, list):
        return None
    texts = [v for v in cast("list[object]", value) if isinstance(v, str)]
    return texts if len(texts) == len(value) else None


def _check_project(doc: Mapping[str, object], url: str) -> Project:
    """`doc` as PyPI's project JSON, or net.BadAnswer unless it has that shape in what refresh
    reads: `info` an object (its `version` text), `releases` an object of lists of file objects
    whose filename, url, yanked, yanked_reason, requires_python and size are of their kinds."""
    from envbuilder.oci.http import BadAnswer, kind_of

    got = doc.get("info")
    info = _object(got)
    if got is not None and info is None:
        raise BadAnswer(url, f"has {kind_of(got)} for `info`, not an object")
    if info and info.get("version") is not None and not isinstance(info["version"], str):
        raise BadAnswer(url, f"has {kind_of(info['version'])} for `info.version`, not text")
    got = doc.get("releases")
    releases = _object(got)
    if releases is None:
        raise BadAnswer(
            url,
            "has no `releases` object"
            if got is None
            else f"has {kind_of(got)} for `releases`, not an object",
        )
    for version, files in releases.items():
        if files is None:
            continue
        if not isinstance(files, list):
            raise BadAnswer(url, f"has {kind_of(files)} for release {version[:60]!r}, not a list of files")
        for i, item in enumerate(cast("list[object]", files)):
            f = _object(item)
            if f is None:
                raise BadAnswer(
                    url, f"has {kind_of(item)} as file {i} of release {version[:60]!r}, not an object"
                )
            for key, kinds in _FILE_FIELDS.items():
                value = f.get(key)
                bad_size = key == "size" and (
                    isinstance(value, bool) or (isinstance(value, int) and value < 0)
                )
                if value is not None and (not isinstance(value, kinds) or bad_size):
                    raise BadAnswer(
                        url, f"has {kind_of(value)} for `{key}` of file {i} of release {version[:60]!r}"
                    )
    return cast(Project, doc)  # (its shape, checked above)


class _RangeFile:
    """A remote file as zipfile reads it: every read one HTTP range request (through
    net.request: the body at most what was asked for, within the index's deadline)."""

    def __init__(self, index: PyPIJson, url: str, size: int):
        self.index, self.url, self.size, self.pos, self.fetched = index, url, size, 0, 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        if self.pos < 0:
            raise ValueError(f"a seek before the start of the file ({self.pos})")
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        from envbuilder.oci import http as net

        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        self.fetched += end - self.pos
        if self.fetched > MAX_WHEEL_READ_BYTES:
            raise ValueError(f"reading its METADATA took more than {MAX_WHEEL_READ_BYTES >> 20} MB")
        expect = net.Expect("a range of a wheel", end - self.pos, self.index.deadline)
        try:
            r = net.request(
                self.index.session(),
                "GET",
                self.url,
                expect,
                headers={"Range": f"bytes={self.pos}-{end - 1}"},
                timeout=self.index.timeout,
            )
        except net.NetError as e:
            if e.kind == "too-large":
                raise ValueError(
                    f"a range request returned more than the {end - self.pos} bytes asked for"
                ) from None
            raise
        if r.status != 206:
            raise ValueError(
                f"the file server answered HTTP {r.status} to a range "
                "request (no partial reads: not downloading the whole wheel)"
            )
        if len(r.body) != end - self.pos:
            raise ValueError(f"a range request returned {len(r.body)} bytes, not {end - self.pos}")
        self.pos = end
        return r.body


def _wheel_metadata(index: PyPIJson, url: str, size: int | None) -> str:
    import zipfile

    from envbuilder.oci import http as net

    if not size:
        r = net.request(
            index.session(), "HEAD", url, net.STATUS, timeout=index.timeout, deadline=index.deadline
        )
        headers: Mapping[str, str] = r.headers  # (requests' case-insensitive headers)
        length = headers.get("Content-Length") or ""
        size = int(length) if length.isdigit() else 0
        if r.status >= 400 or not size:
            raise ValueError(f"HEAD answered HTTP {r.status} without a length")
    with zipfile.ZipFile(_RangeFile(index, url, int(size))) as z:
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
