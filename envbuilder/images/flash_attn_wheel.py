"""flash-attn's prebuilt release wheel: its file name, and fetching it in the builder stage.

One place for the name: `envbuild lock` imports `wheel_filename` to pin the wheel's sha256 for
the target, and the rendered Dockerfile runs this same file (copied into the build context as
`flash_attn_wheel.py`) in the builder, where torch is installed, to fetch the wheel that the
installed torch needs. So this module uses the standard library only and imports nothing of
envbuild.

The name is the one flash-attn's own setup.py (`get_wheel_url`, in the PyPI sdists of 2.5.8,
2.6.3, 2.7.4.post1 and 2.8.3) guesses before it compiles:
  flash_attn-{version}+cu{cuda_tag}torch{torch major.minor}cxx11abi{TRUE|FALSE}-{cpXY}-{cpXY}-linux_{machine}.whl
from torch.__version__, torch.version.cuda (-> the CUDA tag: per release, see
matrices/extensions.yaml), torch._C._GLIBCXX_USE_CXX11_ABI and the running Python. The URL
template and the CUDA tags are data (matrices/extensions.yaml); they reach this script as
arguments.

Exit status when run: 0 the verified wheel is in --dest; 3 there is no such wheel (HTTP 404/403,
no CUDA tag for this torch, the server or mirror does not answer): an unlocked build compiles
from the sdist instead; 1 the file is wrong (hash, not a flash-attn wheel of that version, or
the lock pins another file): the build must stop; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib
import io
import json
import os
import re
import sys
import zipfile
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

if TYPE_CHECKING:  # (imported where they are used, as the script runs)
    import urllib.request
    from http.client import HTTPMessage
    from typing import IO

NOT_AVAILABLE, BAD_FILE, BAD_ARGS = 3, 1, 2
MAX_BYTES = 4 << 30  # the largest release wheels are under 1 GiB
_TORCH = re.compile(r"^(\d+)\.(\d+)")


class Unavailable(Exception):
    """No such wheel where we looked (exit 3)."""


class BadFile(Exception):
    """A file that must not be installed (exit 1)."""


def cuda_tag(torch_cuda: str, cuda_tags: dict[str, str]) -> str | None:
    """flash-attn's CUDA tag for a torch built with CUDA `torch_cuda` ("12.8"): the release
    builds one wheel per CUDA major (setup.py maps 11.x to 11.8 and anything else to 12.x), so
    the tag depends only on the major. None when the release has no tag for that major."""
    major = str(torch_cuda or "").split(".")[0]
    return cuda_tags.get(major) if major.isdigit() else None


def python_tag(python: str) -> str:
    """'3.10' -> 'cp310' (setup.py: f"cp{sys.version_info.major}{sys.version_info.minor}")."""
    m = re.fullmatch(r"(\d+)\.(\d+)(\.\d+)?", python)
    if not m:
        raise ValueError(f"not a Python version: {python!r}")
    return f"cp{m.group(1)}{m.group(2)}"


def wheel_filename(
    template: str,
    version: str,
    torch_version: str,
    torch_cuda: str,
    python: str,
    cxx11_abi: bool,
    cuda_tags: dict[str, str],
    machine: str = "x86_64",
) -> str | None:
    """The release wheel's file name, or None when the release builds none for this CUDA."""
    tag = cuda_tag(torch_cuda, cuda_tags)
    m = _TORCH.match(torch_version or "")
    if tag is None or not m:
        return None
    return template.format(
        version=version,
        cuda_tag=tag,
        torch=f"{m.group(1)}.{m.group(2)}",
        cxx11_abi=str(bool(cxx11_abi)).upper(),
        python=python_tag(python),
        machine=machine,
    )


# ---- in the builder ------------------------------------------------------------------------

DEADLINE_S = 3600.0  # the whole download: a mirror that sends a byte a minute never times out a read


def _redacted(url: str) -> str:
    # (text.USERINFO's rule: up to the authority's last '@', as urllib splits it)
    return re.sub(r"//[^/?#\s]*@", "//***@", url, count=1)


def _request(url: str) -> tuple[urllib.request.Request, str]:
    """(urllib Request, printable URL): user:password@ in the URL becomes Basic auth."""
    import urllib.request
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    headers = {"User-Agent": "envbuild-flash-attn"}
    if parts.username is not None:
        token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
        host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        url = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return urllib.request.Request(url, headers=headers), _redacted(url)


def _origin(url: str) -> tuple[str, str | None, int | None]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


class _Cut:
    """The sockets one download opens, shut down when its deadline passes: a read blocked on
    one returns at once (urllib's timeout bounds each read, not the whole)."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.socks: list[object] = []
        self.expired = False

    def add(self, sock: object) -> None:
        with self.lock:
            self.socks.append(sock)
            if not self.expired:
                return
        self._shut(sock)

    def expire(self) -> None:
        with self.lock:
            self.expired = True
            socks = list(self.socks)
        for sock in socks:
            self._shut(sock)

    @staticmethod
    def _shut(sock: object) -> None:
        import socket

        if not isinstance(sock, socket.socket):
            return  # (no socket: nothing to shut, as shutdown's TypeError said)
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except (OSError, TypeError):
            pass


def _opener(cut: _Cut) -> urllib.request.OpenerDirector:
    """A urllib opener whose connections `cut` can shut down, and whose redirects keep the
    Authorization header only on the same scheme, host and port (urllib's own handler sends it
    wherever a mirror redirects: the mirror's credentials to another host)."""
    import urllib.request

    def watched(base: Any) -> Any:
        class Handler(base):  # type: ignore[misc]
            def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
                class Connection(http_class):  # type: ignore[misc]
                    def connect(self) -> None:
                        super().connect()
                        cut.add(self.sock)

                return super().do_open(Connection, req, **kwargs)

        return Handler

    class SameOriginAuth(urllib.request.HTTPRedirectHandler):
        max_redirections = 10

        def redirect_request(
            self,
            req: urllib.request.Request,
            fp: IO[bytes],
            code: int,
            msg: str,
            headers: HTTPMessage,
            newurl: str,
        ) -> urllib.request.Request | None:
            new = super().redirect_request(req, fp, code, msg, headers, newurl)
            if new is not None and _origin(new.full_url) != _origin(req.full_url):
                new.remove_header("Authorization")
            return new

    return urllib.request.build_opener(
        watched(urllib.request.HTTPHandler), watched(urllib.request.HTTPSHandler), SameOriginAuth
    )


def download(url: str, dest_tmp: str, timeout: float = 60.0, attempts: int = 3) -> str:
    """Stream `url` into `dest_tmp`; returns the sha256. Unavailable for 404/403/410 at once, for
    a download not done within DEADLINE_S, and for connection failures and 5xx after `attempts`
    tries."""
    import http.client
    import threading
    import time
    import urllib.error

    req, shown = _request(url)
    last = ""
    for i in range(attempts):
        cut = _Cut()
        timer = threading.Timer(DEADLINE_S, cut.expire)
        timer.daemon = True
        timer.start()
        try:
            with _opener(cut).open(req, timeout=timeout) as r, open(dest_tmp, "wb") as f:
                h, size = hashlib.sha256(), 0
                length = r.headers.get("Content-Length") or ""
                read = getattr(r, "read1", r.read)  # (one receive at a time: the deadline is seen)
                while True:
                    chunk = read(1 << 20)
                    if cut.expired:
                        break
                    if not chunk:
                        if length.isdigit() and size != int(length):
                            raise http.client.IncompleteRead(b"", int(length) - size)
                        return h.hexdigest()
                    size += len(chunk)
                    if size > MAX_BYTES:
                        raise BadFile(f"{shown} is larger than {MAX_BYTES >> 30} GiB; not a wheel")
                    h.update(chunk)
                    f.write(chunk)
        except urllib.error.HTTPError as e:
            if e.code in (403, 404, 410):
                raise Unavailable(f"{shown} answered HTTP {e.code}") from None
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
            # refused, DNS, timeout, reset, a body cut short
            last = f"{type(e).__name__}: {_redacted(str(getattr(e, 'reason', e)))}"
        finally:
            timer.cancel()
        if cut.expired:
            raise Unavailable(
                f"{shown} sent no complete wheel within {DEADLINE_S:g} s (a mirror "
                "that stalls or sends too slowly)"
            )
        if i + 1 < attempts:
            time.sleep(2 * (i + 1))
    raise Unavailable(f"{shown} did not answer ({last}) after {attempts} tries")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def check_wheel(path: str, filename: str, version: str) -> str:
    """What can be checked without a pin: a readable zip, every file as its RECORD hashes it,
    METADATA naming flash-attn at `version` (a local +... allowed), WHEEL's tag the file name's.
    Returns METADATA's version. The RECORD travels inside the file: this proves integrity,
    not origin."""
    tag = "-".join(filename[: -len(".whl")].split("-")[-3:])
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            infos = sorted({n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")})
            if len(infos) != 1:
                raise BadFile(f"{filename} has {len(infos)} .dist-info folders, not one")
            info = infos[0]
            meta = z.read(f"{info}/METADATA").decode("utf-8", "replace")
            wheel = z.read(f"{info}/WHEEL").decode("utf-8", "replace")
            record = list(csv.reader(io.StringIO(z.read(f"{info}/RECORD").decode("utf-8"))))
            listed = set()
            for row in record:
                if not row or not row[0] or row[0].endswith("/RECORD") or len(row) < 2 or not row[1]:
                    continue
                listed.add(row[0])
                if row[0] not in names or _record_hash(z.read(row[0])) != row[1]:
                    raise BadFile(f"{filename}: {row[0]} does not match its RECORD hash")
            unlisted = [
                n
                for n in names
                if not n.endswith("/")
                and n not in listed
                and not n.endswith(("/RECORD", "/RECORD.jws", "/RECORD.p7s"))
            ]
            if unlisted:
                raise BadFile(f"{filename}: {unlisted[0]} is not in its RECORD")
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, csv.Error) as e:
        raise BadFile(f"{filename} is not a readable wheel ({type(e).__name__}: {e})") from None
    name = re.search(r"^Name:\s*(\S+)", meta, re.M)
    got = re.search(r"^Version:\s*(\S+)", meta, re.M)
    if not name or re.sub(r"[-_.]+", "-", name.group(1)).lower() != "flash-attn":
        raise BadFile(f"{filename} is not flash-attn (METADATA Name: {name and name.group(1)})")
    if not got or got.group(1).split("+")[0] != version:
        raise BadFile(f"{filename} is flash-attn {got and got.group(1)}, not {version}")
    if tag not in re.findall(r"^Tag:\s*(\S+)", wheel, re.M):
        raise BadFile(f"{filename}: its WHEEL file does not declare the tag {tag}")
    return got.group(1)


class _TorchVersion(Protocol):
    cuda: str | None


class _Torch(Protocol):  # what installed_torch reads of torch
    __version__: str
    version: _TorchVersion


def installed_torch() -> tuple[str, str, bool]:
    """(torch.__version__, torch.version.cuda, torch._C._GLIBCXX_USE_CXX11_ABI): what
    flash-attn's setup.py reads."""
    torch = cast(_Torch, importlib.import_module("torch"))
    importlib.import_module("torch.version")
    from torch._C import _GLIBCXX_USE_CXX11_ABI

    abi: object = _GLIBCXX_USE_CXX11_ABI
    return str(torch.__version__), str(torch.version.cuda or ""), bool(abi)


def fetch(
    version: str,
    release: str,
    template: str,
    cuda_tags: dict[str, str],
    pins: dict[str, str] | None,
    dest: str,
    say: Callable[[str], object] = print,
) -> str:
    """Fetch, verify and place the wheel for the installed torch into `dest`; returns its path."""
    import platform

    torch_version, torch_cuda, abi = installed_torch()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    filename = wheel_filename(
        template, version, torch_version, torch_cuda, python, abi, cuda_tags, platform.machine()
    )
    say(
        f"envbuild: flash-attn {version} for torch {torch_version} (CUDA {torch_cuda or 'none'}, "
        f"cxx11abi {str(abi).upper()}), Python {python}, {platform.machine()}"
    )
    if filename is None:
        raise Unavailable(
            f"flash-attn {version}'s release builds no wheel for torch "
            f"{torch_version} with CUDA {torch_cuda or 'none'} (tags by CUDA major: "
            f"{json.dumps(cuda_tags, sort_keys=True)})"
        )
    if pins is not None and filename not in pins:
        raise BadFile(
            f"the lock pins {', '.join(sorted(pins)) or 'no flash-attn wheel'}, but the "
            f"torch installed here needs {filename}: re-lock (envbuild lock) for this torch"
        )
    url = release.rstrip("/") + "/" + filename
    say(f"envbuild: flash-attn: fetching the prebuilt wheel {_redacted(url)}")
    os.makedirs(dest, exist_ok=True)
    tmp = os.path.join(dest, f".{filename}.part")
    try:
        sha = download(url, tmp)
        if pins is not None:
            if sha != pins[filename]:
                raise BadFile(f"{filename} has sha256 {sha}, the lock pins {pins[filename]}")
            how = f"sha256 {sha} as the lock pins it"
        else:
            how = (
                f"sha256 {sha}; checked against its own RECORD (integrity, not a pin: "
                "`envbuild lock` pins it)"
            )
        meta_version = check_wheel(tmp, filename, version)
        # named with the version its METADATA declares, as flash-attn's setup.py names the
        # release wheel it downloads, so that pip sees one version in the name and the metadata
        tag = "-".join(filename[: -len(".whl")].split("-")[-3:])
        final = os.path.join(dest, f"flash_attn-{meta_version}-{tag}.whl")
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    say(f"envbuild: flash-attn: installed the prebuilt wheel {filename} ({how}); nothing compiled")
    return final


# ---- the fatbin check: does the wheel carry SASS the card runs? ------------------------------
# `cuobjdump --list-elf FILE` prints one line per embedded cubin, as NVIDIA's CUDA Binary
# Utilities document it (section "Listing and Extracting Embedded Binaries"):
#   ELF file    1: flash_attn_2_cuda.1.sm_90.cubin
# verl's wheelhouse checks its wheels' fatbins against their arch list before upload (its
# _build.yml, "Verify wheel CUDA arch coverage"); the builder does the same for the card before
# a wheel from an index is used.
_ELF_LINE = re.compile(r"^ELF file\s+\d+:\s+\S*?\bsm_(\d+)([a-z]?)\.cubin\s*$", re.M)
NO_DEVICE_CODE = "does not contain device code"


def listed_archs(listing: str) -> set[str]:
    """The SASS archs ("9.0", "9.0a", "10.0") of a `cuobjdump --list-elf` output."""
    out = set()
    found: list[tuple[str, str]] = _ELF_LINE.findall(listing)  # (its two groups)
    for digits, suffix in found:
        out.add(f"{int(digits) // 10}.{int(digits) % 10}{suffix}")
    return out


def sass_runs(cc: str, archs: set[str]) -> bool:
    """True when one of `archs` runs on a card of `cc` ("8.9"): same major, minor at or below
    the card's; an arch-specific one ("9.0a") on that exact card only."""
    major, minor = (int(x) for x in cc.split("."))
    for a in archs:
        exact = a.endswith(("a", "f"))
        am, an = (int(x) for x in a.rstrip("af").split("."))
        if am == major and (an == minor if exact else an <= minor):
            return True
    return False


def _cuobjdump() -> str | None:
    import shutil

    found = shutil.which("cuobjdump")
    cuda = os.path.join(os.environ.get("CUDA_HOME") or "/usr/local/cuda", "bin", "cuobjdump")
    return found or (cuda if os.access(cuda, os.X_OK) else None)


def wheel_archs(path: str, cuobjdump: str) -> set[str]:
    """The SASS archs of every shared library in the wheel at `path`, as cuobjdump lists them."""
    import subprocess
    import tempfile

    archs: set[str] = set()
    libs = 0
    with zipfile.ZipFile(path) as z, tempfile.TemporaryDirectory() as tmp:
        for n, name in enumerate(z.namelist()):
            if not re.search(r"\.so(\.[\d.]+)?$", name):
                continue
            libs += 1
            target = os.path.join(tmp, f"{n}.so")
            with z.open(name) as src, open(target, "xb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            r = subprocess.run([cuobjdump, "--list-elf", target], capture_output=True, text=True, timeout=600)
            if r.returncode != 0 and NO_DEVICE_CODE not in r.stdout + r.stderr:
                raise BadFile(f"cuobjdump could not read {name}: {(r.stderr or r.stdout).strip()[-300:]}")
            archs |= listed_archs(r.stdout)
            os.remove(target)
    if not libs:
        raise BadFile(f"{os.path.basename(path)} has no shared library: not a built flash-attn")
    return archs


def check_archs(
    paths: list[str], cc: str, cuobjdump: str | None = None, say: Callable[[str], object] = print
) -> int:
    """0 when every wheel in `paths` carries SASS the card of `cc` runs (or, said so, where no
    cuobjdump is at hand); 1 when one does not."""
    tool = cuobjdump or _cuobjdump()
    if not paths:
        print("envbuild: flash-attn: ERROR: no wheel to check", file=sys.stderr)
        return BAD_FILE
    if tool is None:
        say(
            "envbuild: flash-attn: WARNING: no cuobjdump here (not a CUDA devel image?): the wheel's fatbin is not checked"
        )
        return 0
    for path in paths:
        name = os.path.basename(path)
        try:
            archs = wheel_archs(path, tool)
        except (BadFile, zipfile.BadZipFile, OSError) as e:
            print(f"envbuild: flash-attn: ERROR: {e}", file=sys.stderr)
            return BAD_FILE
        shown = ", ".join(f"sm_{a.replace('.', '')}" for a in sorted(archs)) or "no SASS"
        if not sass_runs(cc, archs):
            print(
                f"envbuild: flash-attn: ERROR: {name} carries {shown}, nothing a CC {cc} card runs "
                '("no kernel image is available" at the first attention): not installed. Point '
                "--flash-attn-index at an index built for this card, or leave it out to compile.",
                file=sys.stderr,
            )
            return BAD_FILE
        say(f"envbuild: flash-attn: {name} carries {shown}: runs on CC {cc}")
    return 0


class _CheckArgs(argparse.Namespace):
    cc: str
    cuobjdump: str | None
    wheels: list[str]


class _FetchArgs(argparse.Namespace):
    version: str
    release: str
    filename: str
    cuda_tags: str
    pins: str | None
    dest: str


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check-archs"]:
        cp = argparse.ArgumentParser(description="Check wheels' fatbins for a card (cuobjdump --list-elf).")
        cp.add_argument("--cc", required=True, help="the card's compute capability, e.g. 9.0")
        cp.add_argument("--cuobjdump", help="the cuobjdump to run (default: PATH, then CUDA_HOME/bin)")
        cp.add_argument("wheels", nargs="*")
        c = cp.parse_args(argv[1:], namespace=_CheckArgs())
        if not re.fullmatch(r"\d+\.\d", c.cc):
            print(
                f"envbuild: flash-attn: --cc {c.cc!r} is not a compute capability like 9.0", file=sys.stderr
            )
            return BAD_ARGS
        return check_archs(c.wheels, c.cc, c.cuobjdump)

    ap = argparse.ArgumentParser(
        description="Fetch flash-attn's prebuilt release wheel for the installed torch."
    )
    ap.add_argument("--version", required=True)
    ap.add_argument("--release", required=True, help="the release's download folder URL")
    ap.add_argument("--filename", required=True, help="the wheel file name template")
    ap.add_argument("--cuda-tags", required=True, help='JSON: {"12": "12"} (CUDA major -> tag)')
    ap.add_argument("--pins", help="JSON: {file name: sha256} (a locked build)")
    ap.add_argument("--dest", required=True)
    a = ap.parse_args(argv, namespace=_FetchArgs())
    try:
        cuda_tags: dict[str, str] = json.loads(a.cuda_tags)  # (the render writes both)
        pins: dict[str, str] | None = json.loads(a.pins) if a.pins else None
    except json.JSONDecodeError as e:
        print(f"envbuild: flash-attn: bad JSON argument ({e})", file=sys.stderr)
        return BAD_ARGS
    try:
        fetch(a.version, a.release, a.filename, cuda_tags, pins, a.dest)
    except Unavailable as e:
        if pins is not None:
            print(
                f"envbuild: flash-attn: ERROR: {e}. The lock pins this wheel, so a locked build "
                "does not compile instead: point the mirror's `github` endpoint (or "
                "--build-arg FLASH_ATTN_RELEASE) at a copy of the release, or build from a "
                "wheelhouse.",
                file=sys.stderr,
            )
            return BAD_FILE
        print(f"envbuild: flash-attn: no prebuilt wheel: {e}.", file=sys.stderr)
        return NOT_AVAILABLE
    except BadFile as e:
        print(f"envbuild: flash-attn: ERROR: {e}. Not installed; the build stops.", file=sys.stderr)
        return BAD_FILE
    except ImportError as e:
        print(
            f"envbuild: flash-attn: torch is not importable here ({e}); it names the wheel.", file=sys.stderr
        )
        return BAD_FILE
    return 0


if __name__ == "__main__":
    sys.exit(main())
