"""An environment as `envbuild diagnose` reads it, without running any of its code: the
distributions its dist-info METADATA declares (name, version, Requires-Dist), torch's CUDA build
from torch/version.py, every compiled extension's ELF (machine/elf.py), and, where envbuild
installed it, the profile in PREFIX/envbuild/envbuild.json.

A venv, a conda prefix or an image's unpacked files all read the same: a folder with
lib/pythonX.Y/site-packages. Every file is read bounded (limits.read_limited), no link is
followed out of the folder, and the walk of site-packages stops at a count no environment has.
"""

from __future__ import annotations

import email.parser
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol, cast

from envbuilder.errors import ActionError, UserError
from envbuilder.limits import NotRegularFile, TooLarge, read_limited
from envbuilder.machine.elf import Elf, read_elf
from envbuilder.record import Record
from envbuilder.text import canonical_name, printable

if TYPE_CHECKING:
    import tarfile

MAX_METADATA = 4 << 20  # torch's METADATA is ~40 KB
MAX_SMALL = 1 << 20  # version.py, envbuild.json's profile line
MAX_FILES = 500_000  # a venv with torch, vLLM and their CUDA wheels holds ~60,000
# the packages whose libraries are not extensions built against the torch beside them: torch's
# own and NVIDIA's CUDA wheels (their GPU code is judged by the torch build's arch list)
OWN_LIBRARIES = ("torch", "torch.libs", "nvidia", "triton")
# a C++ symbol of torch's own namespaces (c10::, at::, torch::, caffe2::), mangled: what an
# extension built against torch needs from libtorch/libc10 (the only symbols diagnose compares)
TORCH_SYMBOL = re.compile(rb"_Z(?:N[KVRO]*|T[IVS]N)(?:3c10|2at|5torch|6caffe2)")
_SITE = re.compile(r"python(3\.\d+)$")
_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", re.M)
_VERSION = re.compile(r"^__version__\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.M)


class Dist(Record):
    """One installed distribution, as its dist-info says."""

    name: str  # canonical (PEP 503)
    version: str
    requires: tuple[str, ...]  # its Requires-Dist lines
    folder: str  # the dist-info folder's name


class Extension(Record):
    path: str  # relative to site-packages
    elf: Elf


class Target(Record):
    """What diagnose judges. python: X.Y from the site-packages folder's name."""

    where: str
    site: str
    python: str | None
    dists: Mapping[str, Dist]
    duplicates: tuple[tuple[str, tuple[str, ...]], ...]  # a name with 2+ dist-info folders
    torch_version: str | None
    torch_cuda: str | None  # "12.4"; None: a CPU build, or no torch
    extensions: tuple[Extension, ...]
    installed_json: str | None  # PREFIX/envbuild/envbuild.json: what envbuild installed there
    origins: Mapping[str, str] = {}  # an image's: dist-info folder -> the layer that wrote it
    image: str | None = None  # the image it was read from (where: the prefix inside it)
    # what was not read (a compiled file that is no ELF this reads, a walk stopped at
    # MAX_FILES): its checks did not see it, and the report says so
    unread: tuple[str, ...] = ()

    @property
    def site_shown(self) -> str:
        """site-packages as the user finds it (inside the image, for an image)."""
        return f"{self.where}/lib/python{self.python}/site-packages" if self.image else self.site


def prefix_of(python: Path) -> Path:
    """The environment an interpreter path belongs to (PREFIX/bin/python -> PREFIX), without
    running it or following its link (a venv's bin/python links to the base interpreter)."""
    python = Path(os.path.abspath(python))
    if python.parent.name != "bin":
        raise UserError(
            f"--python {printable(str(python))} is not an environment's bin/python (diagnose reads "
            "PREFIX/lib/pythonX.Y/site-packages beside PREFIX/bin). Pass the environment's "
            "bin/python, or its folder with --prefix."
        )
    return python.parent.parent


def site_packages(prefix: Path) -> tuple[Path, str]:
    """PREFIX/lib/pythonX.Y/site-packages and X.Y; the newest Python where there are several."""
    if not prefix.is_dir():
        raise UserError(
            f"{printable(str(prefix))} is not a folder; pass the environment's folder (a venv or a "
            "conda prefix: the one that holds bin/ and lib/)."
        )
    found = []
    lib = prefix / "lib"
    if lib.is_dir() and not lib.is_symlink():
        for d in lib.iterdir():
            m = _SITE.match(d.name)
            if m and (d / "site-packages").is_dir():
                found.append((tuple(int(p) for p in m[1].split(".")), d / "site-packages", m[1]))
    if not found:
        raise UserError(
            f"{printable(str(prefix))} holds no lib/pythonX.Y/site-packages, so it is no Python "
            "environment diagnose can read (a venv or a conda prefix has one). Pass the "
            "environment's folder, or its bin/python with --python."
        )
    _, site, version = max(found)
    return site, version


def _read(path: Path, limit: int) -> bytes | None:
    try:
        return read_limited(path, limit, follow=False)
    except (OSError, NotRegularFile, TooLarge):
        return None


def read_dists(site: Path) -> tuple[dict[str, Dist], list[tuple[str, tuple[str, ...]]]]:
    """Each distribution's dist-info METADATA (an .egg-info's PKG-INFO where that is all there
    is), by canonical name; and the names installed twice (two dist-info folders)."""
    parser = email.parser.BytesHeaderParser()
    dists: dict[str, Dist] = {}
    twice: dict[str, list[str]] = {}
    for entry in sorted(os.scandir(site), key=lambda e: e.name):
        if entry.name.endswith(".dist-info"):
            meta = Path(entry.path) / "METADATA"
        elif entry.name.endswith(".egg-info"):
            meta = Path(entry.path) / "PKG-INFO" if entry.is_dir() else Path(entry.path)
        else:
            continue
        data = _read(meta, MAX_METADATA)
        if data is None:
            continue
        msg = parser.parsebytes(data)
        name, version = msg.get("Name"), msg.get("Version")
        if not name or not version:
            continue
        dist = Dist(
            canonical_name(str(name)),
            str(version).strip(),
            tuple(map(str, msg.get_all("Requires-Dist") or ())),
            entry.name,
        )
        if dist.name in dists:
            twice.setdefault(dist.name, [dists[dist.name].version]).append(dist.version)
        dists[dist.name] = dist
    return dists, [(n, tuple(vs)) for n, vs in sorted(twice.items())]


def torch_build(site: Path) -> tuple[str | None, str | None]:
    """torch's version and the CUDA it is built with, from torch/version.py read as text."""
    data = _read(site / "torch" / "version.py", MAX_SMALL)
    if data is None:
        return None, None
    text = data.decode("utf-8", "replace")
    cuda = _CUDA.search(text)
    version = _VERSION.search(text)
    return (version[1] if version else None), (cuda[1] or cuda[2] if cuda else None) or None


def shared_objects(
    site: Path, skip: tuple[str, ...] = OWN_LIBRARIES, stopped: list[bool] | None = None
) -> Iterator[Path]:
    """Every `*.so` / `*.so.N` file under site-packages, but for the folders in `skip` (links
    are not followed; the walk stops at MAX_FILES entries, and says so in `stopped`)."""
    seen = 0
    stack = [site]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            seen += 1
            if seen > MAX_FILES:
                if stopped is not None:
                    stopped.append(True)
                return
            if e.is_dir(follow_symlinks=False):
                if folder != site or e.name not in skip:
                    stack.append(Path(e.path))
            elif e.is_file(follow_symlinks=False) and (e.name.endswith(".so") or ".so." in e.name):
                yield Path(e.path)


def torch_exports(site: Path) -> frozenset[str]:
    """The symbols the torch beside the extensions exports (torch/lib/*.so)."""
    out: set[str] = set()
    lib = site / "torch" / "lib"
    if not lib.is_dir():
        return frozenset()
    for so in sorted(lib.glob("*.so*")):
        elf = read_elf(so, symbols=TORCH_SYMBOL, gpu=False)
        if elf is not None:
            out |= elf.defined
    return frozenset(out)


def read_target(prefix: Path) -> Target:
    """The environment at `prefix`, read (never run)."""
    site, python = site_packages(prefix)
    dists, twice = read_dists(site)
    version, cuda = torch_build(site)
    extensions, unread = [], []
    walked: list[bool] = []
    for so in shared_objects(site, stopped=walked):
        elf = read_elf(so, symbols=TORCH_SYMBOL)
        if elf is not None:
            extensions.append(Extension(str(so.relative_to(site)), elf))
        else:
            unread.append(str(so.relative_to(site)))
    if walked:
        unread.append(f"(the walk of site-packages stopped at {MAX_FILES} entries)")
    installed = _read(prefix / "envbuild" / "envbuild.json", 8 << 20)
    return Target(
        str(prefix),
        str(site),
        python,
        dists,
        tuple(twice),
        version,
        cuda,
        tuple(extensions),
        installed.decode("utf-8", "replace") if installed else None,
        unread=tuple(unread),
    )


# -- an image's files, read from its registry ----------------------------------------------------

_IN_SITE = re.compile(
    r"(?:^|/)lib/python3\.\d+/site-packages/(?:[^/]+\.dist-info/(?:METADATA|RECORD)|[^/]+\.egg-info/PKG-INFO"
    r"|torch/version\.py|verl/.+\.py|.+\.so(?:\.[0-9.]+)?)$"
)
_SYSTEM = re.compile(
    r"^(?:usr/)?lib(?:64)?(?:/(?:x86_64|aarch64)-linux-gnu)?/(?:libstdc\+\+\.so\.6[0-9.]*|libc\.so\.6)$"
)
MAX_MEMBER = 8 << 30


def wanted_in_image(path: str) -> bool:
    """The files of an image diagnose reads: site-packages' METADATA, RECORD, torch's
    version.py, verl's sources, shared objects; the system's libc and libstdc++; envbuild.json."""
    return path == "etc/envbuild.json" or bool(_IN_SITE.search(path) or _SYSTEM.match(path))


class SavedImage(Protocol):
    """What diagnose reads of a Docker SDK image: its ID and `docker save`'s stream."""

    @property
    def id(self) -> str: ...
    def save(self, *, named: bool = ...) -> Iterable[bytes]: ...


def unpack_image(ref: str, root: Path, say: Callable[[str], None] = lambda line: None) -> dict[str, str]:
    """The files of `ref` that diagnose reads, unpacked under `root` (a folder of ours) layer by
    layer as an engine applies them (whiteouts remove what a lower layer added): the Docker
    engine's image when it has one by that name (as `build` made it, through `docker save`, each
    layer checked against its config's diff_id), else the registry a reference with a host names
    (each layer's bytes checked against its digest as they stream: oci/registry.py). Returns, for
    each dist-info folder, the layer that wrote it ("layer 3/5 sha256:..."). Nothing is run; no
    member is written outside `root` nor through a link; only links to a sibling are made."""
    import tempfile

    from envbuilder.engines.archive import has_registry
    from envbuilder.engines.docker import engine_image
    from envbuilder.oci.registry import fetch_layer, image_layers, session

    image, problem = engine_image(ref)
    found: SavedImage | None = image
    if found is not None:
        say(f"{ref} ({str(found.id)[:19]}) from the Docker engine")
        return _unpack_saved(ref, found, root, say)
    if not has_registry(ref):
        raise ActionError(
            f"No image {printable(ref)} in the Docker engine"
            + (f" ({problem})" if problem else " (`docker images` lists them)")
            + ", and the name has no registry host to read it from. Check the name and tag, or give "
            "HOST[:PORT]/NAME:TAG (docker.io/NAME:TAG for Docker Hub)."
        )
    origins: dict[str, str] = {}
    with session() as s:
        _, layers = image_layers(ref, s)
        for n, layer in enumerate(layers, 1):
            say(f"layer {n}/{len(layers)} {layer.digest} ({layer.size} bytes)")
            with tempfile.TemporaryFile(dir=root.parent) as blob:
                fetch_layer(ref, layer, s, blob.write)
                blob.seek(0)
                _apply_layer(blob, f"layer {n}/{len(layers)} {layer.digest}", ref, root, origins)
    return origins


def _apply_layer(blob: IO[bytes], label: str, ref: str, root: Path, origins: dict[str, str]) -> None:
    """One layer's tar (any compression tarfile reads) applied to `root`; `origins` records the
    dist-info folders it wrote."""
    import tarfile

    try:
        with tarfile.open(fileobj=blob, mode="r:*") as tar:
            for member in tar:
                rel = _member_path(member.name)
                if rel is None:
                    continue
                written = _apply(tar, member, rel, root)
                if written and rel.endswith("/METADATA") and ".dist-info/" in rel:
                    origins[rel.split("/")[-2]] = label
    except (tarfile.TarError, EOFError, OSError) as e:
        raise UserError(
            f"{label.capitalize()} of {printable(ref)} is no tar archive diagnose reads ({e}); gzip, "
            "bzip2, xz or plain tar layers are read, zstd ones are not."
        ) from None


def _unpack_saved(ref: str, image: SavedImage, root: Path, say: Callable[[str], None]) -> dict[str, str]:
    """The engine's image through `docker save` (streamed into a file of ours beside `root`: as
    large as the image): manifest.json's layers in order, each hashed (decompressed) against the
    config's rootfs.diff_ids before it is applied."""
    import gzip
    import hashlib
    import json
    import tarfile
    import tempfile

    from envbuilder.engines.docker import first_line

    origins: dict[str, str] = {}
    with tempfile.TemporaryFile(dir=root.parent) as saved:
        try:
            for chunk in image.save(named=False):
                saved.write(chunk)
        except Exception as e:  # noqa: BLE001 - the SDK raises requests' and its own errors alike
            raise ActionError(
                f"The Docker engine could not save {printable(ref)} ({first_line(e)}). Check the engine "
                "and the free space in the temporary folder, and run again."
            ) from None
        saved.seek(0)
        try:
            with tarfile.open(fileobj=saved, mode="r:") as tar:

                def member(name: str) -> IO[bytes]:
                    f = tar.extractfile(str(name))
                    if f is None:
                        raise KeyError(name)
                    return f

                manifest: object = json.loads(member("manifest.json").read(MAX_SMALL))
                config: object = json.loads(member(str(_at(manifest, 0, "Config"))).read(MAX_SMALL))
                paths, diff_ids = (
                    _strings(_at(manifest, 0, "Layers")),
                    _strings(_at(config, "rootfs", "diff_ids")),
                )
                if len(paths) != len(diff_ids):
                    raise ValueError(f"{len(paths)} layers but {len(diff_ids)} diff_ids")
                for n, (path, diff_id) in enumerate(zip(paths, diff_ids), 1):
                    label = f"layer {n}/{len(paths)} {diff_id}"
                    say(label)
                    raw = member(path)
                    gzipped = raw.read(2) == b"\x1f\x8b"
                    raw.seek(0)
                    stream = cast(IO[bytes], gzip.GzipFile(fileobj=raw)) if gzipped else raw
                    h = hashlib.sha256()
                    for chunk in iter(lambda: stream.read(1 << 20), b""):
                        h.update(chunk)
                    if "sha256:" + h.hexdigest() != diff_id:
                        raise ActionError(
                            f"Layer {n} of {printable(ref)} in the Docker engine hashes to sha256:"
                            f"{h.hexdigest()}, not its config's diff_id {diff_id}: the engine's copy is "
                            "damaged. Nothing of the image was judged. Pull or build it again."
                        )
                    _apply_layer(member(path), label, ref, root, origins)
        except (tarfile.TarError, EOFError, OSError, KeyError, IndexError, TypeError, ValueError) as e:
            raise ActionError(
                f"What the Docker engine saved of {printable(ref)} is no image archive diagnose reads "
                f"({first_line(e)}). Check the engine, or push the image to a registry and read it there."
            ) from None
    return origins


def _at(doc: object, *keys: str | int) -> object:
    """The JSON value at doc[key][key]...: KeyError or IndexError where one is missing, TypeError
    where a value on the way is no object or list to look in."""
    for key in keys:
        if isinstance(doc, dict) and isinstance(key, str):
            doc = doc[key]
        elif isinstance(doc, list) and isinstance(key, int):
            doc = doc[key]
        else:
            raise TypeError(f"{type(doc).__name__} has no {key!r}")
    return doc


def _strings(value: object) -> list[str]:
    """A JSON list of strings (TypeError where it is no such list)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"not a list of strings: {str(value)[:80]}")
    return [str(v) for v in value]


def _member_path(name: str) -> str | None:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        return None
    return "/".join(parts)


def _inside(root: Path, rel: str) -> Path | None:
    """root/rel when no folder on the way is a link (so a write stays under root)."""
    here = root
    for part in rel.split("/")[:-1]:
        here = here / part
        if here.is_symlink():
            return None
    return root / rel


def _apply(tar: tarfile.TarFile, member: tarfile.TarInfo, rel: str, root: Path) -> bool:
    """One tar member applied to `root`: a whiteout removes, a wanted file is written (True)."""
    import shutil

    from envbuilder.text import is_plain_name

    folder, _, base = rel.rpartition("/")
    if base.startswith(".wh."):
        target = _inside(root, rel)
        if target is None:
            return False
        if base == ".wh..wh..opq":  # (an opaque folder: what lower layers put there is gone)
            for child in list(target.parent.iterdir()) if target.parent.is_dir() else []:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        else:
            if base[4:] in ("", ".", ".."):  # (a whiteout of its own folder or the one above)
                return False
            gone = target.parent / base[4:]
            if gone.is_dir() and not gone.is_symlink():
                shutil.rmtree(gone)
            elif gone.exists() or gone.is_symlink():
                gone.unlink()
        return False
    if not wanted_in_image(rel):
        return False
    path = _inside(root, rel)
    if path is None or member.size > MAX_MEMBER:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    if member.issym() and is_plain_name(member.linkname):  # (libstdc++.so.6 -> libstdc++.so.6.0.30)
        os.symlink(member.linkname, path)
        return True
    if not member.isfile():
        return False
    source = tar.extractfile(member)
    if source is None:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out, 1 << 20)
    return True


def image_prefix(root: Path) -> Path:
    """The environment inside an unpacked image: the site-packages folder with torch, else the
    one with the most distributions (envbuild's images: /opt/venv)."""
    found = []
    for site in root.glob("**/lib/python3.*/site-packages"):
        if any(p.is_symlink() for p in (site, *site.parents) if root in p.parents):
            continue
        found.append(((site / "torch" / "version.py").exists(), len(list(site.glob("*.dist-info"))), site))
    if not found:
        raise UserError(
            "The image holds no lib/pythonX.Y/site-packages with packages in it, so no Python "
            "environment diagnose can read. Check the image reference."
        )
    *_, site = max(found, key=lambda f: (f[0], f[1], -len(f[2].parts)))
    prefix = site.parent.parent.parent
    made = root / "etc" / "envbuild.json"
    if made.is_file() and not (prefix / "envbuild" / "envbuild.json").exists():
        (prefix / "envbuild").mkdir(exist_ok=True)
        (prefix / "envbuild" / "envbuild.json").write_bytes(made.read_bytes())
    return prefix
