"""The Lockfile directory (lockfiles/<profile>/): what it holds, the input hash it was made from,
writing it in one swap, and telling whether it is still current. Pure Python, no network: this is
what `envbuild lock --check` and `envbuild render --locked` need.

A lock directory (and a wheelhouse's manifest.json) may come from anyone: each of its files is
read only through parse() (readers.py: bounded, typed, against the shape `envbuild lock`
writes), never by json/yaml/toml directly.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Iterable

from envbuilder.errors import UserError
from envbuilder.render.locked import LockedContext
from envbuilder.render.outdir import Checked

# what each part's solver sees is the install plan's (render/, ranked below lock/): its layers'
# top-level requirements and conda specs, and the platforms of the profile's host
from envbuilder.render.pixi import OCI_PLATFORMS, PLATFORMS
from envbuilder.render.plan import conda_specs, lock_hint, normalize, requirements_in
from envbuilder.lock.documents import IMAGES_SHAPE, SOURCES_SHAPE, CondaLock, LockMeta, Pylock, SourcePin
from envbuilder.lock.documents import WheelhouseManifest, image_digests, source_pins
from envbuilder.record import plain
from envbuilder.text import is_plain_name
from envbuilder.model.resolved import ResolvedEnv

if TYPE_CHECKING:
    from envbuilder.model.mirrors import MirrorChoice

FORMAT = 2  # 2: inputs are what each part's solver sees, not every template and matrix file
META = "lock.json"
CONDA_LOCK = "conda-lock.yml"
REQUIREMENTS = "requirements.lock"
PYLOCK = "pylock.toml"  # written with the pip part: the same pins with file URLs (PEP 751)
SOURCES = "sources.lock"  # where apex or flash-attn is built: GitHub files' URLs and sha256
IMAGES = "images.lock"
# part -> the file that holds it ("sources" only where apex or flash-attn is built)
PARTS = {"conda": CONDA_LOCK, "pip": REQUIREMENTS, "sources": SOURCES, "images": IMAGES}
FILES = (CONDA_LOCK, REQUIREMENTS, PYLOCK, SOURCES, IMAGES)  # all that lock.json may list
MAX_FILE = 256 << 20  # far above any real lock file (a big conda-lock.yml is ~1 MiB)


def has_sources(env: ResolvedEnv) -> bool:
    """Whether the builder fetches files from GitHub that a lock pins (sources.lock)."""
    return env.needs_builder  # (the builder's extensions are what it fetches)


def parts_for(env: ResolvedEnv, parts: Iterable[str] = tuple(PARTS)) -> list[str]:
    """The parts of `parts` that `env` has (no sources part without apex or flash-attn)."""
    return [p for p in parts if p != "sources" or has_sources(env)]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def solver_inputs(env: ResolvedEnv, parts: Iterable[str] = tuple(PARTS)) -> dict[str, dict[str, object]]:
    """part -> what that part's solution depends on, and nothing else: the requirements, the
    target (Python, platform, the image's glibc and CUDA) and the upstream indexes or channels.
    Not the templates, envbuild's version or matrix facts the solver never sees, so a comment
    in the Dockerfile template or a new envbuild release leaves every lock current. A mirror
    serves the same files, so the mirror a lock was made through is not an input either. The
    solvers' versions are recorded in lock.json (`tools`), not hashed: a uv release would
    otherwise stale every lock without changing what it pins. `parts`: only these (a render
    asks the pip part's alone, and need not load the conda solver's module for it)."""
    target = {
        "platform": PLATFORMS[env.gpu.machine],  # (lock.conda.platform: the conda subdir)
        "python": env.python,
        "glibc": env.cuda.glibc,
        "cuda": env.cuda.version,
    }
    out: dict[str, dict[str, object]] = {}
    if "pip" in parts:
        out["pip"] = {
            "requirements": requirements_in(env),
            "target": target,
            "indexes": env.indexes.to_dict(),
        }
    if "conda" in parts:
        from envbuilder.lock.conda import default_channels, virtual_packages

        out["conda"] = {
            "specs": conda_specs(env),
            "channels": default_channels(env),
            "target": target,
            "virtual_packages": virtual_packages(env, env.cuda.glibc or ""),
        }
    if "images" in parts:
        out["images"] = {
            "refs": sorted(set(env.cuda.images.values())),
            "platform": OCI_PLATFORMS[env.gpu.machine],
        }
    if "sources" in parts and has_sources(env):
        out["sources"] = {
            "apex": plain(env.apex),
            "flash_attn": plain(env.flash_attn),
            "target": target,
            "torch": env.torch.version,
        }
        if env.megatron:  # (the CUDA compiler the extension builds with offline: a lock from
            # before it was pinned is stale; no other profile's inputs change)
            from envbuilder.model.components import transformer_engine as TE

            out["sources"]["toolchain"] = TE.toolchain(env)
    return out


def input_digests(env: ResolvedEnv, parts: Iterable[str]) -> dict[str, str]:
    """ "part.key" -> sha256 of that input, for the given parts (so a stale lock says which
    input of which part moved)."""
    inputs = solver_inputs(env, tuple(parts))
    return {
        f"{part}.{key}": sha256_text(json.dumps(value, sort_keys=True))
        for part in sorted(parts)
        if part in inputs
        for key, value in sorted(inputs[part].items())
    }


def input_sha256(digests: dict[str, str]) -> str:
    return sha256_text("".join(f"{label}\0{digest}\n" for label, digest in sorted(digests.items())))


def pip_sha256(env: ResolvedEnv) -> str:
    """The digest of what `env`'s pip solution depends on (solver_inputs' pip part, nothing
    else): a lock whose recorded pip inputs digest to it pins this environment's pip plan (the
    constraints a render takes, the plan a wheelhouse exports)."""
    return input_sha256(input_digests(env, ["pip"]))


def recorded_pip_sha256(meta: LockMeta) -> str | None:
    """pip_sha256 of the environment a lock (its lock.json `meta`) was solved for, from the
    input digests it recorded; None for a lock without a pip part."""
    if "pip" not in meta.parts:
        return None
    pip = {k: v for k, v in meta.inputs.items() if k.startswith("pip.")}
    return input_sha256(pip) if pip else None


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def lock_dir_in(root: Path, profile: str, writing: bool = False) -> Path:
    """The lock folder of `profile` that a folder option names: ROOT/<profile>/ (the rule of
    every folder option: `lock -o`, `render -o`, `--locked`, with one profile or --all), or ROOT
    itself when it is one lock (it holds lock.json) and ROOT/<profile>/ is not there. Reading,
    that lock may be another profile's (the caller then names it as such); `writing`, ROOT is
    taken only when its lock.json is this profile's, never to replace another's."""
    root = Path(root)
    if not (root / META).is_file() or (root / profile / META).is_file():
        return root / profile
    if writing:
        meta = read_meta(root)
        return root if meta is not None and meta.profile == profile else root / profile
    return root


def _shipped(lock_dir: Path) -> bool:
    """Whether `lock_dir` is one of the locks shipped with envbuild."""
    from envbuilder.paths import LOCK_ROOT, data_dir

    try:
        shipped = data_dir("lockfiles").resolve()
        return lock_dir.resolve().parent == shipped and shipped != LOCK_ROOT.resolve()
    except (FileNotFoundError, OSError):
        return False


def read_meta(lock_dir: Path) -> LockMeta | None:
    return _read_meta(Path(lock_dir))[0]


def _read_meta(lock_dir: Path) -> tuple[LockMeta | None, str]:
    """(lock.json, its text), (None, "") when there is none; UserError (exit 2, naming the key)
    when it is no lock.json of this format, or not in the shape `envbuild lock` writes."""
    text, why = _read_bounded(lock_dir / META)
    if text is None and why.startswith("missing:"):
        return None, ""
    if text is None:
        raise UserError(f"{lock_dir / META} is unreadable ({why}). Re-create it with `envbuild lock`.")
    meta = parse(META, text, str(lock_dir / META), shape=False)  # (readers.BadData: exit 2)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(
            f"{lock_dir / META} is not an envbuild lock of format {FORMAT}. "
            "Re-create it with `envbuild lock`."
        )
    return LockMeta.read(meta, str(lock_dir / META), RELOCK), text


def _stale(env: ResolvedEnv, meta: LockMeta, parts: Iterable[str]) -> list[str]:
    """Why a lock (its lock.json `meta`) was made for other inputs than `env` has now, for the
    `parts` it holds: another profile, or what a part's solver sees has moved."""
    out = []
    if meta.profile != env.name:
        out.append(f"is the lock of profile {meta.profile!r}, not {env.name!r}")
    locked = [p for p in parts if p in meta.parts]
    now, then = input_digests(env, locked), meta.inputs
    changed = sorted(k for k in now if now[k] != then.get(k))
    if changed:
        out.append(
            "stale: changed since locking: " + ", ".join(changed) + " (re-lock: what the solver sees moved)"
        )
    return out


def problems(env: ResolvedEnv, lock_dir: Path, parts: Iterable[str] = tuple(PARTS)) -> list[str]:
    """Why the lock in `lock_dir` is not current for `env` (empty when it is). No network.
    A part is stale when what its solver sees changed (solver_inputs), never for a template
    or a matrix fact the solution does not depend on; a lock is damaged when a file it lists
    does not hash right or does not parse (integrity)."""
    lock_dir = Path(lock_dir)
    meta, _, damaged = integrity(lock_dir)
    if meta is None:
        return [f"missing: no {lock_dir / META}"]
    parts = parts_for(env, parts)
    out = _stale(env, meta, parts)
    for part in parts:
        if part not in meta.parts:
            out.append(f"incomplete: {PARTS[part]} was not locked (made with --only {','.join(meta.parts)})")
    out += damaged
    if "pip" in meta.parts and "pip" in parts:
        for name in [PYLOCK]:
            if name not in meta.files:
                out.append(f"incomplete: no {name} (made by an older envbuild; re-lock)")
    return out


def integrity(lock_dir: Path) -> tuple[LockMeta | None, dict[str, str], list[str]]:
    """(lock.json, {name: text} of it and of the files it lists, why the directory is not as
    `envbuild lock` wrote it); lock.json None: there is no lock. The one check of a lock
    directory, which `lock --check`, `render --locked` and `wheelhouse` all use: every file
    lock.json lists is a lock file's name, present, and hashes to what lock.json recorded;
    each locked part has its file; each file parses as what it is, and the three copies of the
    pip pins agree (so a hand edit that re-signed lock.json, or a half-written file, fails)."""
    lock_dir = Path(lock_dir)
    meta, meta_text = _read_meta(lock_dir)
    if meta is None:
        return None, {}, [f"missing: no {lock_dir / META}"]
    listed, parts = meta.files, meta.parts  # (its shape: a table and a list)
    out: list[str] = []
    texts: dict[str, str] = {META: meta_text}
    for part in parts:
        if part not in PARTS:
            out.append(f"unreadable: {META} names a part {str(part)[:40]!r} envbuild does not know")
        elif PARTS[part] not in listed:
            out.append(f"incomplete: {META} lists no {PARTS[part]} for its {part} part")
    for name, digest in sorted(listed.items()):
        if name not in FILES:  # also keeps a name like ../x from leading out of the directory
            out.append(f"unreadable: {META} lists {str(name)[:80]!r}, which is no lock file")
            continue
        text, why = _read_bounded(lock_dir / name)
        if text is None:
            out.append(why)
        elif sha256_text(text) != digest:
            out.append(f"modified: {name} differs from what `envbuild lock` wrote (sha256)")
        else:
            texts[name] = text
    for name, text in texts.items():
        bad = _unparsable(name, text, str(lock_dir / name))
        if bad:
            out.append(f"unreadable: {name} {bad}")
    if not out and PYLOCK in texts:  # the pip pins, written thrice in one run, agree
        from envbuilder.lock.pins import parse as parse_requirements

        files = {
            (normalize(p.name), p.version) for p in pylock_of(texts[PYLOCK], str(lock_dir / PYLOCK)).packages
        }
        copies: dict[str, Callable[[str], set[tuple[str, str]]]] = {
            REQUIREMENTS: lambda t: {(n, e.version) for n, e in parse_requirements(t).items()},
            CONDA_LOCK: lambda t: _conda_lock_pip_pins(t, str(lock_dir / CONDA_LOCK)),
        }
        for name, pins_of in copies.items():
            pins = pins_of(texts[name]) if name in texts else files
            if pins != files:
                out.append(
                    f"modified: {name} and {PYLOCK} pin different pip packages "
                    f"({', '.join(f'{n} {v}' for n, v in sorted(pins ^ files)[:5])})"
                )
    return meta, texts, out


def _conda_lock_pip_pins(text: str, origin: str) -> set[tuple[str, str]]:
    return {(p.name, str(p.version)) for p in conda_lock_of(text, origin).package if p.manager == "pip"}


def verified(lock_dir: Path, profile: str | None = None) -> tuple[LockMeta, dict[str, str]]:
    """(lock.json, {name: text} of its files) of an intact lock (integrity), or an exit-2
    paragraph saying what is wrong with it."""
    lock_dir = Path(lock_dir)
    meta, texts, damaged = integrity(lock_dir)
    if meta is None:
        from envbuilder.paths import LOCK_ROOT

        # `lock -o ROOT` writes ROOT/<profile>/: the command that makes the lock looked for here
        root = lock_dir.parent if profile and lock_dir.name == profile else None
        make = f"envbuild lock {profile or 'PROFILE'}" + (
            f" -o {root}" if root is not None and root != LOCK_ROOT else ""
        )
        raise UserError(
            f"No lock in {lock_dir} (no {META}). Make one with `{make}` (with the same "
            "overrides), or pass the folder where it is."
        )
    if damaged:
        raise UserError(
            f"The lock in {lock_dir} is not as `envbuild lock` wrote it: "
            f"{'; '.join(damaged[:5])}"
            + (f"; and {len(damaged) - 5} more" if len(damaged) > 5 else "")
            + ". envbuild uses a lock only whole and unedited (an edit is a different "
            f"lock). Re-lock with `envbuild lock {profile or 'PROFILE'}`."
        )
    return meta, texts


def _read_bounded(path: Path) -> tuple[str | None, str]:
    """(text, "") of a regular UTF-8 file of at most MAX_FILE bytes, or (None, why not)."""
    from envbuilder.limits import NotRegularFile, TooLarge, read_limited

    try:
        data = read_limited(path, MAX_FILE)
    except FileNotFoundError:
        return None, f"missing: {path}"
    except NotRegularFile:
        return None, f"unreadable: {path} is not a regular file"
    except TooLarge:
        return None, f"unreadable: {path} is over {MAX_FILE >> 20} MiB: no file envbuild wrote"
    except OSError as e:
        return None, f"unreadable: {path}: {e.strerror}"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError:
        return None, f"unreadable: {path} is not UTF-8 text"


def _unparsable(name: str, text: str, origin: str = "") -> str | None:
    """Why a lock file's text is not what its name says, or None: the shape its readers rely
    on (every pin hashed, every file a URL and a sha256), so none of them meets a KeyError."""
    from envbuilder.model.readers import BadData

    if name == REQUIREMENTS:
        from envbuilder.lock.pins import parse as parse_requirements

        try:
            pins = parse_requirements(text)
        except Exception as e:  # whatever a truncated or garbled file raises in its parser
            detail = str(e).splitlines()[0][:120] if str(e) else ""
            return f"does not parse ({type(e).__name__}: {detail})"
        unhashed = sorted(n for n, e in pins.items() if not e.hashes)
        if not pins:
            return "pins no package"
        if unhashed:
            return f"pins {', '.join(unhashed[:5])} without a sha256"
        return None
    try:
        parse(name, text, origin or name)
    except BadData as e:
        return f"does not parse ({e.detail})"
    return None


# ---- the shapes of a lock's files: each is read only through parse(), with its shape ----------

RELOCK = (
    "It is not as `envbuild lock` wrote it: re-create the lock with `envbuild lock` (a "
    "lock is used only whole and unedited)."
)
# (each file's shape is that of its records, documents.py: what a tool (uv, conda-lock) or a newer
# envbuild adds that nothing here reads is any data there, bounded by the reader)
_SHAPES = {
    META: ("json", LockMeta.shape()),
    SOURCES: ("json", SOURCES_SHAPE),
    IMAGES: ("json", IMAGES_SHAPE),
    PYLOCK: ("toml", Pylock.shape()),
    CONDA_LOCK: ("yaml", CondaLock.shape()),
}


def parse(name: str, text: str, origin: str, shape: bool = True) -> object:
    """The content of the lock file `name` (lock.json, sources.lock, images.lock, pylock.toml,
    conda-lock.yml) read by the one bounded reader (readers.py) and checked against the shape
    `envbuild lock` writes (`shape`=False: bounds only); readers.BadData (exit 2, naming the
    key) otherwise. The same text is parsed once (integrity and the readers after it share it)."""
    return _parse(name, text, origin, shape)


@functools.lru_cache(maxsize=16)
def _parse(name: str, text: str, origin: str, shape: bool) -> object:
    from envbuilder.model import readers

    kind, spec = _SHAPES[name]
    doc: object = readers.PARSERS[kind](
        text, origin, shape=spec if shape else None, fix=RELOCK, bounds=readers.Bounds(max_bytes=MAX_FILE)
    )
    return doc


def _table(doc: object) -> Mapping[str, object]:
    if not isinstance(doc, dict):  # (parse held it to its shape: a table)
        raise TypeError(f"a lock file's shape is a table, not {type(doc).__name__}")
    return doc


def pylock_of(text: str, origin: str) -> Pylock:
    """pylock.toml's text, parsed and checked (parse), as its record."""
    return Pylock.of(_table(parse(PYLOCK, text, origin)))


def conda_lock_of(text: str, origin: str) -> CondaLock:
    return CondaLock.of(_table(parse(CONDA_LOCK, text, origin)))


def sources_of(text: str, origin: str) -> dict[str, SourcePin]:
    """sources.lock's pins by name (apex, flash-attn's wheels, TransformerEngine's sdist)."""
    return source_pins(parse(SOURCES, text, origin))


def images_of(text: str, origin: str) -> dict[str, str]:
    """images.lock: image reference -> the digest it was locked at."""
    return image_digests(parse(IMAGES, text, origin))


def write_dir(lock_dir: Path, files: dict[str, str]) -> None:
    """Write the lock's `files` into `lock_dir`: staged, then moved into place; only files an
    earlier lock wrote there (and nobody edited) are replaced or removed (outdir.write_dir)."""
    from envbuilder.render.outdir import write_dir as write

    write(lock_dir, files)


def for_render(
    env: ResolvedEnv, lock_dir: Path, wheelhouse: Path | None = None, mirror: MirrorChoice | None = None
) -> LockedContext:
    """The `locked` context of the Dockerfile template: base images by digest and the hashed
    requirement file of each install layer (copied into the build context). With a wheelhouse
    (whose locks/<profile>/ is `lock_dir`), pip installs from its files with no index, and the
    base images are pinned where the lock has them. With a `mirror` (mirrors.MirrorChoice) the
    images are the mirror's references at the digests the lock recorded upstream (a digest names
    the content, wherever it is pulled from)."""
    from envbuilder.lock.pip import layer_files
    from envbuilder.render.quoting import sh

    lock_dir = Path(lock_dir)
    # the lock that fits this render: the profile's own into this folder; a variant (overrides)
    # into a folder of its own, which would otherwise replace the profile's lock
    relock = (
        lock_hint(env.name, env.overrides)
        if env.overrides.to_dict()
        # (a shipped lock is not remade in place: ./lockfiles/<profile>, found first, replaces it)
        else f"`envbuild lock {sh(env.name)}` remakes it in ./lockfiles"
        if _shipped(lock_dir)
        else f"`envbuild lock {sh(env.name)} -o {sh(str(lock_dir.parent))}` remakes it"
    )
    meta, lock_texts = verified(lock_dir, env.name)
    stale = _stale(env, meta, parts_for(env, ("pip", "sources") if wheelhouse is not None else tuple(PARTS)))
    if stale:
        raise UserError(
            f"The lock in {lock_dir} was made for other inputs than {env.name!r} has "
            f"now ({'; '.join(stale)}). Re-lock: {relock}."
        )
    if meta.torch_swapped:
        raise UserError(
            f"The lock in {lock_dir} was solved with PyPI's torch in place of the "
            f"profile's ({meta.torch_swapped}), because the PyTorch index was out "
            "of reach: it pins everything else (a plain render uses it as constraints) "
            f"but cannot install this torch with --require-hashes. Re-lock where the PyTorch "
            f"index (or its mirror: --torch-index-url) answers: {relock}."
        )
    needed = ("pip",) if wheelhouse is not None else ("pip", "images")
    missing = [PARTS[p] for p in needed if p not in meta.parts]
    if missing:
        raise UserError(
            f"The lock in {lock_dir} has no {' and no '.join(missing)} (made with "
            f"--only {','.join(meta.parts)}); a locked Dockerfile needs "
            f"{'it' if len(needed) == 1 else 'both'}. On a machine that reaches the registry "
            f"and the indexes: {relock}."
        )
    texts = {}
    for name in (REQUIREMENTS, IMAGES, SOURCES):
        if name == IMAGES and "images" not in meta.parts:
            continue
        if name == SOURCES and not has_sources(env):
            continue
        if name == SOURCES and name not in meta.files:
            raise UserError(
                f"The lock in {lock_dir} pins no {' or '.join(_sourced(env))} (no "
                f"{SOURCES}; made by an older envbuild, or with --only without "
                f"sources). Re-lock with `envbuild lock {env.name}`."
            )
        texts[name] = lock_texts[name]  # (verified: each locked part has its file)
    images = images_of(texts[IMAGES], str(lock_dir / IMAGES)) if IMAGES in texts else {}
    pinned = {}
    for role, ref in sorted(env.cuda.images.items()):
        where = mirror.image(ref) if mirror else ref
        if ref in images:
            pinned[role] = f"{where}@{images[ref]}"
        elif IMAGES in texts:
            raise UserError(f"{lock_dir / IMAGES} has no digest for {ref}; re-lock.")
        else:
            pinned[role] = where
    requirements, uv_wheel = texts[REQUIREMENTS], None
    links: dict[str, Checked] = {}
    if wheelhouse is not None:  # the wheels built from the lock's sdists install in their place
        from envbuilder.lock.pip import replace_hashes

        links, built = wheelhouse_files(env, Path(wheelhouse))
        requirements = replace_hashes(requirements, built)
        uv_wheel = _wheelhouse_uv(env, Path(wheelhouse), links)
    layers, files = layer_files(env, requirements)
    apex_source, fa_wheels, te_source = _builder_sources(env, texts, lock_dir, wheelhouse is not None)
    from envbuilder.lock.sbom import sha256

    # what the image holds, from this lock (the wheelhouse's built wheels where they install)
    sbom_text = sbom_text_of(env, meta, lock_texts, lock_dir, requirements)
    return LockedContext(
        sbom=sbom_text,
        sbom_sha256=sha256(sbom_text),
        images=pinned,
        images_pinned=IMAGES in texts,
        layers=layers,
        files=files,
        input_sha256=meta.input_sha256,
        wheelhouse=wheelhouse is not None,
        links=links,
        apex_source=apex_source,
        flash_attn_wheels=fa_wheels,
        uv_wheel=uv_wheel,
        te_source=te_source,
    )


def _builder_sources(
    env: ResolvedEnv, texts: Mapping[str, str], lock_dir: Path, wheelhouse: bool
) -> tuple[Mapping[str, object] | None, dict[str, str] | None, Mapping[str, object] | None]:
    """What the builder stage takes from sources.lock: apex's archive, flash-attn's wheels and
    the sdist of TransformerEngine's PyTorch extension (each refused missing where it is needed)."""
    sources = sources_of(texts[SOURCES], str(lock_dir / SOURCES)) if SOURCES in texts else {}
    apex_source = sources.get("apex") if env.apex else None
    fa_wheels = None
    if env.flash_attn:
        from envbuilder.lock.sources import flash_attn_pins

        fa_wheels = flash_attn_pins(sources)
        if not fa_wheels:
            raise UserError(
                f"{lock_dir / SOURCES} pins no flash-attn wheel (made by an older "
                f"envbuild). Re-lock with `envbuild lock {env.name}`."
            )
    if env.apex and not apex_source:
        raise UserError(
            f"{lock_dir / SOURCES} pins no apex source archive. Re-lock with `envbuild lock {env.name}`."
        )
    from envbuilder.lock.sources import TE_KEY

    te_source = sources.get(TE_KEY) if env.megatron else None
    if env.megatron and wheelhouse and not te_source:
        raise UserError(
            f"{lock_dir / SOURCES} pins no sdist of TransformerEngine's PyTorch extension, which the "
            "builder compiles from the wheelhouse (a lock made without its sources part, or by an "
            "older envbuild). Re-lock with the sources part, then export the wheelhouse again."
        )
    return (
        apex_source.to_dict() if apex_source else None,
        fa_wheels,
        te_source.to_dict() if te_source else None,
    )


# what each part pins, for an SBOM that declares the parts its lock lacks
PART_HOLDS = {
    "conda": "the conda packages (Python, CUDA's nvcc and libraries)",
    "images": "the base images by digest",
    "sources": "the source archives the builder stage fetches (apex, flash-attn)",
}


def sbom_of(env: ResolvedEnv, lock_dir: Path, require_complete: bool = False) -> tuple[str, list[str]]:
    """`envbuild sbom`: (the CycloneDX SBOM of the lock in `lock_dir`, the parts it does not
    pin). A lock whose pip part is current gives an SBOM of what it pins; the parts it lacks (a
    pip-only lock: the shipped ones, made where no conda channel or registry answered) are
    declared in it as not locked, the SBOM marked incomplete. `require_complete` refuses what
    `render --locked` refuses (a lock without its images). A damaged or stale lock is refused
    either way, in render --locked's words."""
    lock_dir = Path(lock_dir)
    meta, texts = verified(lock_dir, env.name)
    missing = missing_parts(env, meta)
    present = [p for p in parts_for(env) if p not in missing]
    if require_complete or "pip" in missing or meta.torch_swapped or _stale(env, meta, present):
        return for_render(env, lock_dir).sbom, missing  # (its refusal, word for word)
    return sbom_text_of(env, meta, texts, lock_dir), missing


def pip_part(env: ResolvedEnv, lock_dir: Path) -> None:
    """Refuse (exit 2) a lock that cannot pin `env`'s pip installs: missing, damaged, without a
    pip part or stale for it (what `envbuild install --locked` needs; no images part)."""
    meta, _ = verified(lock_dir, env.name)
    if "pip" not in meta.parts:
        raise UserError(f"The lock in {lock_dir} has no pip part; re-lock with `envbuild lock {env.name}`.")
    stale = _stale(env, meta, ["pip"])
    if stale:
        raise UserError(
            f"The lock in {lock_dir} was made for other inputs than {env.name!r} has now "
            f"({'; '.join(stale)}). Re-lock with `envbuild lock {env.name}` (the same overrides)."
        )


def missing_parts(env: ResolvedEnv, meta: LockMeta) -> list[str]:
    """The parts of `env` a lock (its lock.json `meta`) does not pin."""
    missing = [p for p in parts_for(env) if p not in meta.parts]
    if has_sources(env) and "sources" not in missing and SOURCES not in meta.files:
        missing.append("sources")
    return missing


def sbom_text_of(
    env: ResolvedEnv,
    meta: LockMeta,
    texts: dict[str, str],
    lock_dir: Path,
    requirements: str | None = None,
) -> str:
    """The CycloneDX SBOM (lock/sbom.py) of the verified lock whose lock.json is `meta` and whose
    files' texts are `texts`; `requirements`: the pip pins where they differ from
    requirements.lock (a wheelhouse's built wheels in place of their sdists)."""
    from envbuilder.lock import sbom

    def origin(name: str) -> str:
        return str(Path(lock_dir) / name)

    why = {
        p: f"{PART_HOLDS[p]}: not in this lock (made with --only {','.join(meta.parts)})"
        for p in missing_parts(env, meta)
    }
    return sbom.build(
        env,
        meta,
        texts[REQUIREMENTS] if requirements is None else requirements,
        conda_lock_of(texts[CONDA_LOCK], origin(CONDA_LOCK)) if CONDA_LOCK in texts else None,
        images_of(texts[IMAGES], origin(IMAGES)) if IMAGES in texts else None,
        sources_of(texts[SOURCES], origin(SOURCES)) if has_sources(env) and SOURCES in texts else None,
        missing=why,
    )


def _wheelhouse_uv(env: ResolvedEnv, wheelhouse: Path, links: dict[str, Checked]) -> str | None:
    """The file name of the uv wheel the matrix pins when the wheelhouse carries it for this
    profile with that sha256 (its runtime stage then installs with uv), else None (pip)."""
    pin = env.uv
    name = pin.filename
    manifest = wheelhouse_manifest(wheelhouse)
    entry = manifest.files.get(f"pypi/{name}") if manifest is not None else None
    ok = f"wheelhouse/{name}" in links and entry is not None and entry.sha256 == pin.sha256
    return name if ok else None


def _sourced(env: ResolvedEnv) -> list[str]:
    return (["apex source archive"] if env.apex else []) + (["flash-attn wheel"] if env.flash_attn else [])


def wheelhouse_files(
    env: ResolvedEnv, wheelhouse: Path
) -> tuple[dict[str, Checked], dict[str, tuple[str, ...]]]:
    """({build-context path: wheelhouse file, with the size and sha256 the manifest records}
    for the pip files the profile needs, {package: ("sha256:..." of the wheel built from its
    sdist,)}). outdir.write_dir places each file only as those bytes, never through a link."""
    manifest = wheelhouse_manifest(wheelhouse)
    if manifest is None:
        raise UserError(
            f"{wheelhouse} is not an envbuild wheelhouse (no {WHEELHOUSE_MANIFEST}). "
            f"Make one with `envbuild wheelhouse {env.name} -o {wheelhouse}`."
        )
    profile = manifest.profiles.get(env.name)
    if profile is None:
        raise UserError(
            f"The wheelhouse {wheelhouse} holds no complete export of {env.name} "
            f"(it has: {', '.join(manifest.profiles) or 'none'}). Run "
            f"`envbuild wheelhouse {env.name} -o {wheelhouse}`."
        )
    built, files = profile.built or {}, manifest.files
    unbuilt = sorted(
        f.name
        for p, f in files.items()
        if p in profile.files and f.kind == "pip" and is_sdist(p) and f.name not in built
    )
    if unbuilt:
        raise UserError(
            f"The wheelhouse {wheelhouse} holds {', '.join(unbuilt)} of {env.name} as "
            "sdists only (exported by an older envbuild), which an offline build "
            "cannot build. Export it again with `envbuild wheelhouse "
            f"{env.name} -o {wheelhouse}`: that builds them into wheels."
        )
    if any(p not in files for p in profile.files) or any(p not in profile.files for p in built.values()):
        raise UserError(
            f"{wheelhouse / WHEELHOUSE_MANIFEST} names files of {env.name} it does "
            f"not list; export it again with `envbuild wheelhouse {env.name} -o "
            f"{wheelhouse}`."
        )
    hashes: dict[str, tuple[str, ...]] = {name: (f"sha256:{files[p].sha256}",) for name, p in built.items()}
    # pip files flat (pip's --find-links), source archives under sources/ (every path was
    # checked to be pypi/NAME or sources/NAME: none leads out of the build context)
    fix = (
        f"The wheelhouse was changed after its export: export it again with `envbuild "
        f"wheelhouse {env.name} -o {wheelhouse}` (or copy it again from its source)."
    )
    links: dict[str, Checked] = {}
    for p in profile.files:
        checked = Checked(Path(wheelhouse), p, files[p].size, files[p].sha256, fix)
        if p.startswith("pypi/"):
            links["wheelhouse/" + p[len("pypi/") :]] = checked
        elif p.startswith("sources/"):
            links["wheelhouse/" + p] = checked
    return links, hashes


# ---- a wheelhouse's manifest.json: the one reader (`wheelhouse` and `render --wheelhouse`) ----

WHEELHOUSE_MANIFEST = "manifest.json"
WHEELHOUSE_FORMAT = 1
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")  # a file name and a shell word
PIP_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")  # PEP 503's normalized form


def is_sdist(filename: str) -> bool:
    """A wheelhouse's pip file that is a source distribution (built into a wheel for the target)."""
    return not filename.endswith(".whl")


def wheelhouse_path(path: object) -> bool:
    """Whether `path` is where a wheelhouse keeps a file: pypi/NAME, sources/NAME or
    conda/SUBDIR/NAME, each part plain, so that joined to the wheelhouse it stays inside."""
    if not isinstance(path, str):
        return False
    parts = path.split("/")
    shape = (len(parts) == 2 and parts[0] in ("pypi", "sources")) or (len(parts) == 3 and parts[0] == "conda")
    return shape and all(is_plain_name(p) for p in parts[1:])


def wheelhouse_manifest(wheelhouse: Path) -> WheelhouseManifest | None:
    """manifest.json of `wheelhouse` (None when there is none), read by the one bounded reader
    (readers.py) into its record (documents.WheelhouseManifest), every path in it checked to stay
    inside the wheelhouse and every entry to have the shape envbuild writes; UserError (exit 2)
    otherwise, since everything that reads it joins its paths to directories and writes."""
    from envbuilder.model.readers import BadData, Bounds, parse_json

    path = Path(wheelhouse) / WHEELHOUSE_MANIFEST
    text, why = _read_bounded(path)
    if text is None and why.startswith("missing:"):
        return None
    fix = (
        "envbuild writes only files inside the wheelhouse there, so it was edited or made by "
        "something else; nothing was done with it. Export into a new directory with "
        "`envbuild wheelhouse PROFILE -o NEWDIR`."
    )
    doc: object = None
    if text is not None:
        try:
            doc = parse_json(text, str(path), fix=fix, bounds=Bounds(max_bytes=MAX_FILE))
        except BadData as e:
            why = e.detail
    if not isinstance(doc, dict):
        raise UserError(
            f"{path} is not an envbuild wheelhouse manifest "
            f"({why or 'not a JSON object'}). Export into a new directory with "
            "`envbuild wheelhouse PROFILE -o NEWDIR`."
        )
    manifest, bad = None, None
    if doc.get("format") != WHEELHOUSE_FORMAT:
        bad = f"its format is {str(doc.get('format'))[:20]!r}, not {WHEELHOUSE_FORMAT}"
    else:
        try:
            manifest = WheelhouseManifest.read(doc, str(path), fix)
        except BadData as e:
            bad = e.detail
    bad = bad or (_manifest_problem(manifest) if manifest is not None else None)
    if bad or manifest is None:
        raise UserError(f"{path} is not as envbuild wrote it: {bad}. {fix}")
    return manifest


def read_wheelhouse_manifest(wheelhouse: Path) -> dict[str, Any] | None:
    """wheelhouse_manifest as plain data (for machine/install.py, which reads it as a dict)."""
    manifest = wheelhouse_manifest(wheelhouse)
    return None if manifest is None else manifest.to_dict()


def _manifest_problem(doc: WheelhouseManifest) -> str | None:
    """What the shape cannot say of a manifest: its paths stay inside the wheelhouse, its names
    are plain (a pip one in PEP 503's form), its profiles' names too."""
    for path, f in doc.files.items():
        if not wheelhouse_path(path):
            return f"it lists a file at {path[:80]!r}, which is not a wheelhouse path"
        if not (is_plain_name(f.name) and (f.kind != "pip" or PIP_NAME.fullmatch(f.name))):
            return f"its entry for {path[:80]!r} is malformed"
        if f.built_from is not None and not wheelhouse_path(f.built_from.path):
            return f"its entry for {path[:80]!r} was built from no wheelhouse path"
    for name, p in doc.profiles.items():
        if not PROFILE_NAME.fullmatch(name):
            return f"it names a profile {name[:80]!r}, which is not a plain profile name"
        if not (
            all(wheelhouse_path(x) for x in p.files)
            and all(wheelhouse_path(v) for v in (p.built or {}).values())
        ):
            return f"its profile {name!r} lists paths that are not wheelhouse paths"
    return None
