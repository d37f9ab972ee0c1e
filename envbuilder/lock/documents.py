"""The JSON documents envbuild writes and reads back, each declared once as a record: lock.json
(`LockMeta`) and a wheelhouse's manifest.json (`WheelhouseManifest`).

Each record carries the check of every field's value (`_checks`, schema.py's specs); `shape()`
makes of them the shape readers.check_shape holds a file to (a key a file may leave out is
`absent()`, a record nested in another is checked as its own shape, and any key a newer
envbuild or a tool adds is any data, bounded by the reader). `read()` is the one way in: the
parsed document checked against that shape, then turned into the record, so every value reached
through one has the type its field declares. `to_dict()` is the one way out (the writers dump it
with sorted keys).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Union

if TYPE_CHECKING:
    from typing_extensions import Self, TypeAlias

from envbuilder.model import schema as S
from envbuilder.record import Record

# a JSON value as the readers give it back through a record (lists as tuples, objects read-only)
Json: TypeAlias = Union[str, int, float, bool, None, Sequence["Json"], Mapping[str, "Json"]]

# what a tool (uv, conda-lock) or a newer envbuild adds that nothing here reads: any data, bounded
# by the reader (depth, lengths, finite numbers)
MORE: dict[str, object] = {"*": Any}
TEXT = S.Text(4000)
SIZE = S.Int(0, 1 << 44)


class Document(Record):
    """A record read from a file: `_checks` holds each field's spec (schema.py), in the order
    the shape checks them (the first mismatch named is the same as ever)."""

    _checks: ClassVar[Mapping[str, object]] = {}

    @classmethod
    def shape(cls) -> dict[str, object]:
        """The shape readers.check_shape holds the document to."""
        absent = cls.absent()
        return {**{f + ("?" if f in absent else ""): spec for f, spec in cls._checks.items()}, **MORE}

    @classmethod
    def read(cls, data: object, origin: str, fix: str) -> Self:
        """`data` (parsed by readers.py) checked against shape(), as this record; readers.BadData
        (exit 2, naming the key) when it is not in that shape."""
        from envbuilder.model.readers import check_shape

        check_shape(data, cls.shape(), origin, fix)
        assert isinstance(data, dict)  # (the shape is a mapping's)
        return cls.of(data)

    @classmethod
    def of(cls, data: Mapping[str, object]) -> Self:
        """The record of checked plain data (a record that holds records in a mapping says how)."""
        return cls.from_plain(data)


# ---- lock.json ----------------------------------------------------------------------------------


class LockTarget(Document):
    """lock.json's `target`: what the lock was solved for."""

    platform: str | None = None  # the conda subdir (linux-64)
    python: str | None = None
    python_platform: str | None = None  # uv's --python-platform
    virtual_packages: Mapping[str, str] | None = None
    _omit_none = ("platform", "python", "python_platform", "virtual_packages")
    _checks = {"platform": TEXT, "python": TEXT, "python_platform": TEXT, "virtual_packages": S.MapOf(TEXT)}


class LockMeta(Document):
    """lock.json: the lock's inputs (each part's digest), parts, target, sources, tools and the
    sha256 of every file it holds."""

    format: int
    profile: str
    input_sha256: str
    inputs: Mapping[str, str]  # "part.key" -> sha256 (lockfile.input_digests)
    parts: tuple[str, ...]
    files: Mapping[str, str]  # file name -> sha256
    plan_sha256: str | None = None  # (written up to 0.1: what pip_sha256 now derives from `inputs`)
    torch_swapped: str | None = None  # PyPI's torch in place of the profile's (render.plan.torch_swap)
    solver: str | None = None  # the conda part's (null without one)
    target: LockTarget | None = None
    sources: Mapping[str, Json] | None = None  # where it was solved from, no user:password@
    tools: Json = None  # tool -> version
    _omit_none = ("plan_sha256", "torch_swapped", "target", "sources", "tools")
    _absent = ("plan_sha256", "torch_swapped", "solver", "target", "sources", "tools")
    _checks = {
        "format": int,
        "profile": S.NAME,
        "input_sha256": S.SHA256,
        "plan_sha256": S.SHA256,
        "torch_swapped": (TEXT, None),
        "inputs": S.MapOf(S.SHA256, key=S.Pattern(r"[a-z_]+\.[a-z_]+", "pip.requirements")),
        "parts": S.ListOf(S.Text(200)),
        "solver": (S.NAME, None),
        "target": LockTarget.shape(),
        "sources": {
            "pypi?": (TEXT, None),
            "torch?": (TEXT, None),
            "github?": (TEXT, None),
            "channels?": S.ListOf(TEXT),
            "registry_mirror?": S.Tree(TEXT),
            **MORE,
        },
        "tools": S.Tree(TEXT),
        "files": S.MapOf(S.SHA256),
    }

    def source(self, key: str) -> str | None:
        """sources.`key` where it is a URL (pypi, torch, github), else None."""
        value = (self.sources or {}).get(key)
        return value if isinstance(value, str) else None

    @property
    def python(self) -> str | None:
        return self.target.python if self.target else None


# ---- a wheelhouse's manifest.json -----------------------------------------------------------------

WH_PATH = S.Text(1000)  # (lockfile.wheelhouse_path checks each: pypi/NAME, sources/NAME, conda/SUB/NAME)
KINDS = ("pip", "conda", "source")


class BuiltFrom(Document):
    """The sdist a wheel of the wheelhouse was built from."""

    path: str
    sha256: str
    _checks = {"path": WH_PATH, "sha256": S.SHA256}


class WheelhouseFile(Document):
    """A file the wheelhouse holds (manifest.json's `files`), with its provenance when it is a
    wheel built there: `build` is wheelbuild's record of how (backend, interpreter, machine,
    glibc, ...), kept whole."""

    kind: str  # pip | conda | source
    name: str
    version: str
    size: int
    sha256: str
    built_from: BuiltFrom | None = None
    build: Mapping[str, object] | None = None
    _omit_none = ("built_from", "build")
    _checks = {
        "kind": S.OneOf(KINDS),
        "name": S.Text(300),
        "version": S.Text(200),
        "size": SIZE,
        "sha256": S.SHA256,
        "built_from": BuiltFrom.shape(),
        "build": {"python?": S.Text(100), "machine?": S.Text(100), "glibc?": S.Text(100), **MORE},
    }


class WheelhouseProfile(Document):
    """A profile exported whole into the wheelhouse (manifest.json's `profiles`)."""

    files: tuple[str, ...]  # the wheelhouse paths it installs
    input_sha256: str | None = None
    python: str | None = None
    built: Mapping[str, str] | None = None  # package -> the path of the wheel built from its sdist
    _omit_none = ("input_sha256", "python", "built")
    _checks = {
        "input_sha256": S.SHA256,
        "python": S.Text(100),
        "files": S.ListOf(WH_PATH),
        "built": (S.MapOf(WH_PATH), None),
    }


class WheelhouseManifest(Document):
    """A wheelhouse's manifest.json: every file it holds, and each profile exported whole."""

    format: int
    files: Mapping[str, WheelhouseFile]  # wheelhouse path -> the file
    profiles: Mapping[str, WheelhouseProfile]
    _checks = {
        "format": int,
        "files": S.MapOf(WheelhouseFile.shape(), key=WH_PATH),
        "profiles": S.MapOf(WheelhouseProfile.shape(), key=S.Text(200)),
    }

    @classmethod
    def of(cls, data: Mapping[str, object]) -> Self:
        files = {p: WheelhouseFile.of(f) for p, f in objects(data["files"])}
        profiles = {n: WheelhouseProfile.of(e) for n, e in objects(data["profiles"])}
        return cls.from_plain({**data, "files": files, "profiles": profiles})


def objects(table: object) -> Iterator[tuple[str, Mapping[str, object]]]:
    """The entries of a checked table of objects (MapOf of a record's shape)."""
    assert isinstance(table, dict)
    for key, value in table.items():
        assert isinstance(key, str) and isinstance(value, dict)
        yield key, value


# ---- the lock's other files: what envbuild reads of them (uv's and conda-lock's formats) ---------

URL_TEXT = S.Pattern(
    r"https?://(?:(?![\"'`$\\])[!-~])+",
    "https://files.pythonhosted.org/...",
    "a plain http(s) URL (no space, quote or shell character)",
    4000,
)
FILE_NAME = r"[A-Za-z0-9][A-Za-z0-9._+-]*"


class FileHashes(Document):
    sha256: str
    _checks = {"sha256": S.SHA256}


class PylockFile(Document):
    """A wheel or sdist of pylock.toml (PEP 751): where it is and its sha256."""

    url: str
    hashes: FileHashes
    size: int | None = None
    _omit_none = ("size",)
    _checks = {"url": URL_TEXT, "hashes": FileHashes.shape(), "size": (SIZE, None)}


class PylockPackage(Document):
    name: str
    version: str = ""  # (required in a file: not `absent`)
    wheels: tuple[PylockFile, ...] = ()
    sdist: PylockFile | None = None
    _absent = ("wheels", "sdist")
    _checks = {
        "name": S.PACKAGE,
        "version": S.Text(200),
        "wheels": S.ListOf(PylockFile.shape()),
        "sdist": PylockFile.shape(),
    }


class Pylock(Document):
    """pylock.toml, uv's export of the pip part: every package with its files."""

    packages: tuple[PylockPackage, ...]
    _checks = {"packages": S.ListOf(PylockPackage.shape())}


class CondaHash(Document):
    sha256: str | None = None
    md5: str | None = None
    _omit_none = ("sha256", "md5")
    _checks = {"sha256": (S.SHA256, None), "md5": (S.Text(64), None)}


class CondaPackage(Document):
    """A package of conda-lock.yml: a conda one, or a pip pin of the same lock."""

    name: str
    version: str | int | float | bool  # (YAML may read a version as a number)
    manager: str  # conda | pip
    url: str
    hash: CondaHash
    _checks = {
        "name": S.Text(300),
        "version": S.Scalar(),
        "manager": S.OneOf(("conda", "pip")),
        "url": URL_TEXT,
        "hash": CondaHash.shape(),
    }


class CondaLock(Document):
    """conda-lock.yml, in conda-lock's own format."""

    package: tuple[CondaPackage, ...]
    _checks = {"package": S.ListOf(CondaPackage.shape())}


class SourcePin(Document):
    """A file of sources.lock that the builder fetches from GitHub (or an sdist from PyPI)."""

    url: str
    sha256: str
    filename: str | None = None
    size: int | None = None
    ref: str | None = None
    _omit_none = ("filename", "size", "ref")
    _checks = {
        "url": URL_TEXT,
        "sha256": S.SHA256,
        "filename": S.Pattern(FILE_NAME, "apex-25.08.tar.gz", "a plain file name", 255),
        "size": (SIZE, None),
        "ref": S.Text(200),
    }


SOURCES_SHAPE = S.MapOf(SourcePin.shape(), key=S.NAME)  # sources.lock: name -> SourcePin


class ImagePin(Document):
    digest: str
    _checks = {"digest": S.Pattern(r"sha256:[0-9a-f]{64}", "sha256:...")}


# images.lock: image reference -> ImagePin (schema.check takes any spec as a key; MapOf's annotation
# names only Pattern | OneOf)
IMAGES_SHAPE = S.MapOf(ImagePin.shape(), key=S.Text(500))


def source_pins(doc: object) -> dict[str, SourcePin]:
    """sources.lock's checked content (SOURCES_SHAPE) as records."""
    return {k: SourcePin.of(v) for k, v in objects(doc)}


def image_digests(doc: object) -> dict[str, str]:
    """images.lock's checked content (IMAGES_SHAPE): image reference -> digest."""
    return {k: ImagePin.of(v).digest for k, v in objects(doc)}
