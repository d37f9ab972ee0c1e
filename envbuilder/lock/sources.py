"""Files from GitHub that a lock pins by sha256 (sources.lock): apex's source archive, which the
builder stage compiles, and flash-attn's prebuilt release wheels, which it installs; both
fetched through a mirror prefix where GitHub is slow or blocked.

flash-attn's wheel is named by the C++ ABI of the installed torch (torch._C._GLIBCXX_USE_CXX11_ABI),
which a lock cannot read without the torch wheel's binary, so the lock pins both ABI variants
that the release has (one may be missing) and the builder picks the one the installed torch
needs (envbuilder/images/flash_attn_wheel.py).
"""

from __future__ import annotations

import hashlib
import tarfile
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable, Union

from envbuilder.errors import ActionError, UserError
from envbuilder.model.resolved import ResolvedEnv
from envbuilder.secret import SecretUrl

# sources.lock keys of flash-attn's wheels: flash-attn-cxx11abiFALSE, flash-attn-cxx11abiTRUE
if TYPE_CHECKING:
    from envbuilder.lock.documents import SourcePin

FLASH_ATTN_KEY = "flash-attn-cxx11abi"
# a pin as sources.lock holds it: url, filename, sha256, size, ref (documents.SourcePin reads
# it back), and a flash-attn wheel's cxx11_abi
Pin = dict[str, Union[str, int, bool, None]]


class _Missing(Exception):
    pass


MAX_SOURCE_BYTES = 4 << 30  # flash-attn's release wheels are under 1 GiB, apex's archive a few MB
SOURCE_DEADLINE = 3600.0  # seconds for one file, however slowly it comes


class TarGz:
    """A .tar.gz checked as it streams: its gzip stream inflated whole (each piece dropped, at
    most 1 MiB at a time) to its end, and its first 512 bytes a tar header. `problem()` says
    what the bytes are instead (a proxy's HTML page, a file cut short), None when it is one."""

    def __init__(self) -> None:
        self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # (gzip's header and trailer)
        self.head = b""  # the first bytes as sent
        self.first = b""  # the first tar block
        self.error: str | None = None

    def feed(self, chunk: bytes) -> None:
        self.head += chunk[: 64 - len(self.head)]
        data = chunk
        while data and self.error is None and not self.inflate.eof:
            try:
                out = self.inflate.decompress(data, 1 << 20)
            except zlib.error as e:
                self.error = str(e)
                return
            self.first += out[: 512 - len(self.first)]
            data = self.inflate.unconsumed_tail

    def problem(self) -> str | None:
        from envbuilder.text import printable

        if self.head[:2] != b"\x1f\x8b":
            start = printable(self.head[:48].decode("utf-8", "replace")).replace("\n", " ")
            return f"is not a gzip tarball: it starts {start!r}" if self.head else "is empty"
        if self.error or not self.inflate.eof:
            return "is not a gzip tarball: its gzip stream is damaged or cut short"
        try:
            tarfile.TarInfo.frombuf(self.first.ljust(512, b"\0"), "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            return "is a gzip stream but not a tar archive"
        return None


def archive_problem(data: bytes) -> str | None:
    """TarGz's verdict on bytes held whole."""
    check = TarGz()
    check.feed(data)
    return check.problem()


def _sha256(
    url: str, github: str | None, what: str, missing_ok: bool = False, check: TarGz | None = None
) -> tuple[str, int]:
    """(sha256, size) of `url` fetched through the `github` prefix (net.request: hashed as it
    streams, at most MAX_SOURCE_BYTES within SOURCE_DEADLINE); with `missing_ok`, _Missing on a
    404 (any other failure: ActionError naming the mirror options); `check` sees every byte,
    and a file it says is something else is an ActionError too."""
    from envbuilder.oci import http as net
    from envbuilder.model.mirrors import github_url

    fetch = github_url(url, github)
    shown = net.redact(fetch)
    h, size = hashlib.sha256(), [0]

    def take(chunk: bytes) -> None:
        h.update(chunk)
        size[0] += len(chunk)
        if check is not None:
            check.feed(chunk)

    expect = net.Expect(what, MAX_SOURCE_BYTES, SOURCE_DEADLINE)
    fix = (
        "Pass --github-url (a GitHub mirror prefix) or --mirror with a `github` endpoint, or "
        "lock on a machine that reaches GitHub."
    )
    with net.session() as s:
        try:
            r = net.request(
                s, "GET", fetch, expect, timeout=60, sink=take, body_if=lambda status: status == 200
            )
        except net.NetError as e:
            raise ActionError(
                f"Cannot download {what} {shown} to pin its sha256 ({e.reason}). {fix}"
            ) from None
    if missing_ok and r.status == 404:
        raise _Missing(shown)
    if r.status != 200:
        raise ActionError(
            f"Cannot download {what} {shown} to pin its sha256 (it answered HTTP {r.status}). {fix}"
        )
    problem = check.problem() if check is not None else None
    if problem:  # (a proxy's or a mirror's sign-in page answers 200 too)
        raise ActionError(
            f"{what.capitalize()} {shown} {problem} ({size[0]} bytes), so nothing was locked: "
            f"the server sent a page of its own, not the file. {fix}"
        )
    return h.hexdigest(), size[0]


def apex_source(env: ResolvedEnv, github: str | None) -> Pin:
    apex = env.apex
    assert apex is not None  # (called only for a profile with apex)
    sha, size = _sha256(apex.url, github, "the apex source", check=TarGz())
    ref = apex.ref
    return {"url": apex.url, "filename": f"apex-{ref}.tar.gz", "sha256": sha, "size": size, "ref": ref}


def flash_attn_wheels(env: ResolvedEnv, github: str | None) -> dict[str, Pin]:
    """{sources.lock key: {url, filename, sha256, size, ref, cxx11_abi}} for each ABI variant of
    the target's release wheel that the release has."""
    from envbuilder.images.flash_attn_wheel import wheel_filename

    fa = env.flash_attn
    assert fa is not None  # (called only for a profile with flash-attn)
    names = {
        abi: wheel_filename(
            fa.wheel,
            fa.version,
            env.torch.version,
            env.torch.cuda,
            env.python,
            abi,
            dict(fa.cuda_tags),
            env.gpu.machine,  # (the host's: the builder names its own by platform.machine())
        )
        for abi in (False, True)
    }
    if fa.how == "index":
        raise UserError(
            f"flash-attn {fa.version} comes from a wheel index for this profile ({fa.index}), "
            "which a lock does not pin yet (only the release's wheels are pinned by sha256). "
            "Lock with --without flash-attn, or build unlocked: the builder takes the index's "
            "wheel and checks its fatbin."
        )
    if names[False] is None:
        raise UserError(
            f"flash-attn {fa.version}'s release builds no wheel for CUDA "
            f"{env.torch.cuda} (matrices/extensions.yaml, flash_attn.versions."
            f"{fa.version}.wheel_cuda), so a lock cannot pin it and the builder "
            "would compile it from the unpinned sdist. Lock with --without flash-attn, "
            "or pick a flash-attn release that builds for this CUDA."
        )
    out: dict[str, Pin] = {}
    missing: list[str] = []
    for abi, filename in names.items():
        url = f"{fa.release.rstrip('/')}/{filename}"
        try:
            sha, size = _sha256(url, github, "flash-attn's release wheel", missing_ok=True)
        except _Missing as e:
            missing.append(str(e))
            continue
        out[f"{FLASH_ATTN_KEY}{str(abi).upper()}"] = {
            "url": url,
            "filename": filename,
            "sha256": sha,
            "size": size,
            "ref": fa.version,
            "cxx11_abi": abi,
        }
    if not out:
        raise ActionError(
            f"flash-attn {fa.version}'s release has no wheel for torch "
            f"{env.torch.version} (CUDA {env.torch.cuda}), Python "
            f"{env.python}: {' and '.join(missing)} answered 404. A lock cannot pin "
            "the sdist build; lock with --without flash-attn, or another torch/Python "
            "that the release builds for."
        )
    return out


# sources.lock's key of TransformerEngine's PyTorch extension (the Megatron engine): its sdist,
# which a wheelhouse keeps as sources/<key>-<ref>.tar.gz, the sdist's own name
TE_KEY = "transformer_engine_torch"
TE_PROJECT = "transformer-engine-torch"  # (its PEP 503 name on an index)
MAX_INDEX_PAGE = 16 << 20  # a PEP 503 page of one project: a few hundred KB


def _index_page(pypi: SecretUrl, project: str) -> tuple[str, list[tuple[str, str]]]:
    """(the page's URL, [(link without its fragment, its sha256 as listed or "")]) of `project`
    on the lock's PyPI index (its PEP 503 page)."""
    import re
    from urllib.parse import urljoin

    from envbuilder.oci import http as net

    page = f"{pypi.reveal().rstrip('/')}/{project}/"
    body: list[bytes] = []
    with net.session() as s:
        try:
            r = net.request(
                s,
                "GET",
                page,
                net.Expect(f"{pypi}'s page of {project}", MAX_INDEX_PAGE, 120.0),
                headers={"Accept": "text/html"},
                timeout=60,
                sink=body.append,
                body_if=lambda status: status == 200,
            )
        except net.NetError as e:
            raise ActionError(f"Cannot read {pypi}'s page of {project} ({e.reason}).") from None
    if r.status != 200:
        raise ActionError(f"{pypi} answered HTTP {r.status} for {project}; the lock cannot pin it.")
    html = b"".join(body).decode("utf-8", "replace")
    hrefs: list[str] = re.findall(r'href="([^"]+)"', html)  # (one group: each a str)
    out = []
    for href in hrefs:
        path, _, fragment = urljoin(page, href.replace("&amp;", "&")).partition("#")
        out.append((path, fragment.partition("sha256=")[2][:64]))
    return page, out


def _pinned(pypi: SecretUrl, path: str, listed: str, what: str, ref: str, check: TarGz | None = None) -> Pin:
    """The pin of a file of the index: downloaded and hashed, its sha256 held to the listed one,
    its URL without a user part (the lock names no password)."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    sha, size = _sha256(path, None, what, check=check)
    name = unquote(path.rsplit("/", 1)[-1])
    if listed and listed != sha:
        raise ActionError(f"{name} from {pypi} hashes to {sha}, but its index lists {listed}.")
    parts = urlsplit(path)
    host = parts.hostname or ""  # (an http URL: _sha256 fetched it)
    public = urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))
    return {"url": public, "filename": name, "sha256": sha, "size": size, "ref": ref}


def te_sdist(env: ResolvedEnv, pypi: SecretUrl) -> Pin:
    """sources.lock's entry of TransformerEngine's PyTorch extension: its sdist on the lock's
    PyPI index (the PEP 503 page's link and sha256, then the file downloaded and hashed), which
    a wheelhouse carries and the builder compiles with no index (the sdist has dynamic
    requirements, so it is no pin of the pip part)."""
    mg = env.megatron
    assert mg is not None  # (called only for an environment on the Megatron engine)
    want = f"{TE_KEY}-{mg.transformer_engine}.tar.gz"  # (the wheelhouse's name for it too)
    _, links = _index_page(pypi, TE_PROJECT)
    for path, listed in links:
        if path.rsplit("/", 1)[-1] == want:
            return _pinned(pypi, path, listed, f"{TE_KEY}'s sdist", mg.transformer_engine, check=TarGz())
    raise ActionError(
        f"{pypi} has no {want} on its page of {TE_KEY}; the lock cannot pin the extension's sdist."
    )


# sources.lock's keys of the CUDA compiler's wheels and the extension's build requirements
# (model/components/transformer_engine.py TOOLCHAIN, BUILD_REQUIRES): toolchain-<project>. They
# are the build's alone, as the sdist is: what `envbuild install --from-wheelhouse` installs
# into the environment before it compiles the extension there, as the online install does
TOOLCHAIN_KEY = "toolchain-"


def _wheel_fits(filename: str, machine: str) -> bool:
    """A wheel that installs on the target: a pure one, or a manylinux one of its machine."""
    tags = filename[: -len(".whl")].split("-")
    if len(tags) < 5:
        return False
    plat = tags[-1].split(".")
    return plat == ["any"] or any(t.startswith("manylinux") and t.endswith("_" + machine) for t in plat)


def te_toolchain(env: ResolvedEnv, pypi: SecretUrl) -> dict[str, Pin]:
    """sources.lock's entries of the extension's build: PyPI's CUDA compiler for torch's CUDA X.Y
    (the newest X.Y.* release of each wheel, as the online install's `==X.Y.*` takes) and the
    newest of each build requirement, each one wheel for the target's machine, hashed."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import Version

    from envbuilder.model.components import transformer_engine as TE

    machine = env.gpu.machine
    out: dict[str, Pin] = {}
    for project in (*TE.TOOLCHAIN, *TE.BUILD_REQUIRES):
        compiler = project in TE.TOOLCHAIN
        _, links = _index_page(pypi, project)
        best: tuple[Version, str, str] | None = None
        for path, listed in links:
            name = path.rsplit("/", 1)[-1]
            if not name.endswith(".whl") or not _wheel_fits(name, machine):
                continue
            try:
                _, version, _, _ = parse_wheel_filename(name)
            except InvalidWheelFilename:
                continue
            if version.is_prerelease or (
                compiler and version.release[:2] != Version(env.torch.cuda).release[:2]
            ):
                continue
            if best is None or version > best[0]:
                best = (version, path, listed)
        if best is None:
            want = f"=={env.torch.cuda}.*" if compiler else ""
            raise ActionError(
                f"{pypi} has no {project}{want} wheel for {machine}; the lock cannot pin the CUDA "
                "compiler TransformerEngine's extension builds with."
            )
        version, path, listed = best
        out[TOOLCHAIN_KEY + project] = _pinned(pypi, path, listed, f"{project}'s wheel", str(version))
    return out


def lock_sources(
    env: ResolvedEnv,
    github: str | None = None,
    say: Callable[[str], None] = lambda msg: None,
    pypi: SecretUrl | None = None,
) -> dict[str, Pin]:
    """sources.lock's content: apex's archive and flash-attn's wheels, downloaded and hashed,
    and on the Megatron engine TransformerEngine's extension's sdist from `pypi`. The URLs are
    the upstream ones (a mirror serves the same bytes)."""
    out: dict[str, Pin] = {}
    if env.megatron and pypi is not None:
        say(f"{env.name}: {TE_KEY} {env.megatron.transformer_engine} sdist from {pypi}")
        out[TE_KEY] = te_sdist(env, pypi)
        say(f"{env.name}: PyPI's CUDA {env.torch.cuda} compiler for {TE_KEY} from {pypi}")
        out.update(te_toolchain(env, pypi))
    if env.apex:
        say(f"{env.name}: apex source {env.apex.url}" + (f" via {github}" if github else ""))
        out["apex"] = apex_source(env, github)
    if env.flash_attn:
        fa = env.flash_attn
        say(
            f"{env.name}: flash-attn {fa.version} release wheels (both C++ ABIs) from "
            f"{fa.release}" + (f" via {github}" if github else "")
        )
        out.update(flash_attn_wheels(env, github))
    return out


def flash_attn_pins(sources: Mapping[str, SourcePin]) -> dict[str, str]:
    """{file name: sha256} of the flash-attn wheels a sources.lock pins (what the builder checks)."""
    return {
        e.filename: e.sha256
        for k, e in sorted(sources.items())
        if k.startswith(FLASH_ATTN_KEY) and e.filename is not None
    }
