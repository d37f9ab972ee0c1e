"""`envbuild lock`: pin a profile's environment to exact artifacts, for its target machine.

lockfiles/<profile>/ holds
  conda-lock.yml     the conda part (python, pip, nvcc where something is compiled) solved with
                     py-rattler for the target's virtual packages, and the pip part's pins with
                     URL + sha256, in conda-lock's own format (its models and writer)
  requirements.lock  the pip part from `uv pip compile --generate-hashes` for the target's
                     Python and glibc, through the profile's indexes
  pylock.toml        the same pins as PEP 751 with each file's URL and sha256 (what
                     `envbuild wheelhouse` downloads)
  sources.lock       files from GitHub releases: apex's source archive (where apex is compiled)
                     and flash-attn's prebuilt wheels (both C++ ABIs); on the Megatron engine
                     TransformerEngine's extension's sdist and PyPI's CUDA compiler wheels for
                     torch's CUDA (with the build's requirements) that it is built with offline;
                     each URL and sha256
  images.lock        the digest of every base image, from the registry's v2 API
  lock.json          the input hash (resolved env + templates + matrices), tool versions, sources

Only this module's lightweight parts load for `--check` and `render --locked`; rattler,
conda_lock, requests and uv load inside the steps that use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from envbuilder.model.resolved import ResolvedEnv
from envbuilder.lock import lockfile as L
from envbuilder.lock.documents import Json, LockMeta, LockTarget
from envbuilder.record import Record
from envbuilder.secret import SecretUrl

if TYPE_CHECKING:
    from envbuilder.model.mirrors import MirrorChoice

SOLVERS = ("rattler", "conda-lock")


class Sources(Record):
    """Where a lock reads from: the profile's own endpoints, a mirror set's, or the flags'."""

    pypi: SecretUrl  # (lock.json names it without its user:password@)
    torch: SecretUrl | None
    channels: tuple[str, ...]
    # one HOST[/PREFIX] for every image, or {upstream registry: HOST[/PREFIX]} from a mirror set
    registry_mirror: str | dict[str, Any] | None
    github: str | None = None  # a prefix that replaces https://github.com (apex, flash-attn)


def sources_for(
    env: ResolvedEnv,
    index_url: SecretUrl | None = None,
    torch_index_url: SecretUrl | None = None,
    channels: Iterable[str] = (),
    registry_mirror: str | dict[str, Any] | None = None,
    mirror: MirrorChoice | None = None,
    github_url: str | None = None,
) -> Sources:
    """Flags first, then the mirror set (`mirrors.MirrorChoice`), then the profile's own."""
    from envbuilder.lock.conda import default_channels

    pypi = index_url or SecretUrl((mirror and mirror.pypi) or env.indexes.pypi)
    torch = None
    if env.indexes.torch:
        torch = torch_index_url or SecretUrl(
            mirror.pytorch.format(variant=env.torch.variant)
            if mirror and mirror.pytorch
            else env.indexes.torch
        )
    if not channels:
        channels = default_channels(env)
        if mirror and mirror.conda:  # nvidia/label/cuda-X goes through the nvidia mirror
            channels = list(dict.fromkeys(_mirrored_channel(c, mirror.conda) for c in channels))
    registry = (
        registry_mirror
        or ({k: v for k, v in sorted(mirror.registries.items()) if v} if mirror else None)
        or None
    )
    github = github_url or (mirror.github if mirror and mirror.github else None)
    return Sources(pypi, torch, tuple(channels), registry, github)


def _mirrored_channel(channel: str, conda: dict[str, Any]) -> str:
    name, _, label = channel.partition("/")
    base: str | None = conda.get(channel) or conda.get(name)
    if not base:
        return channel
    return base.rstrip("/") + (f"/{label}" if label and channel not in conda else "")


def _bare(value: Json, strip: Callable[[str], str]) -> Json:
    """`value` (a str, or lists and dicts of them) with `strip` applied to every string."""
    if isinstance(value, str):
        return strip(value)
    if isinstance(value, Mapping):
        return {k: _bare(v, strip) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_bare(v, strip) for v in value]
    return value


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def lock_profile(
    env: ResolvedEnv,
    glibc: str,
    sources: Sources,
    out_dir: Path,
    *,
    parts: Iterable[str] = tuple(L.PARTS),
    solver: str = "rattler",
    swap_torch: bool = False,
    say: Callable[[str], None] = lambda msg: None,
    beat: float = 12.0,
) -> LockMeta:
    """Solve, pin and write lockfiles for `env` into `out_dir`; returns lock.json's content.
    `swap_torch` solves the pip part with PyPI's build of the profile's torch version: such a
    lock pins everything else (render's constraints) but cannot install the +cuXXX torch.
    Each part says when it starts, a line every `beat` seconds while it runs, and its time."""
    from envbuilder.render.plan import torch_swap
    from envbuilder.model.mirrors import redacted
    from envbuilder.text import without_credentials
    from envbuilder.progress import Heartbeat

    say_plain = say
    say = lambda msg: say_plain(redacted(msg))  # noqa: E731  (a URL's user:password@ as ***@)
    from envbuilder.lock.conda import platform, virtual_packages
    from envbuilder.lock.pins import parse
    from envbuilder.lock.pip import python_platform

    parts = L.parts_for(env, parts)
    digests = L.input_digests(env, parts)
    input_sha = L.input_sha256(digests)
    vpkgs = virtual_packages(env, glibc)
    files: dict[str, str] = {}
    tools = {"envbuild": env.envbuild_version}
    pylock = None
    parents: dict[str, frozenset[str]] = {}
    swapped = torch_swap(env) if swap_torch else None
    if "pip" in parts:
        from envbuilder.lock.pip import compile_lock
        from envbuilder.tools.uv import uv_version

        say(
            f"{env.name}: pip part: uv pip compile for Python {env.python} on "
            f"{python_platform(glibc, env.gpu.machine)} via {sources.pypi}"
            + (f" + {sources.torch}" if sources.torch and not swapped else "")
            + (f" (torch {swapped})" if swapped else "")
        )
        with Heartbeat(f"{env.name}: pip part", say, every=beat):
            files[L.REQUIREMENTS], files[L.PYLOCK], pylock = compile_lock(
                env, glibc, sources.pypi, sources.torch, swap_torch=bool(swapped)
            )
        parents = {n: e.parents for n, e in parse(files[L.REQUIREMENTS]).items()}
        tools["uv"] = uv_version()
    if "sources" in parts and L.has_sources(env):
        from envbuilder.lock.sources import lock_sources

        with Heartbeat(f"{env.name}: sources", say, every=beat):
            files[L.SOURCES] = L.dumps(lock_sources(env, sources.github, say, sources.pypi))
    if "conda" in parts:
        import tempfile

        from envbuilder.lock.conda import solve_conda_lock, solve_rattler, write_conda_lock

        say(
            f"{env.name}: conda part: {solver} for {', '.join(f'{k}={v}' for k, v in vpkgs.items())} "
            f"from {', '.join(sources.channels)}"
        )
        solve = solve_rattler if solver == "rattler" else solve_conda_lock
        with Heartbeat(f"{env.name}: conda part", say, every=beat):
            records = solve(env, list(sources.channels), vpkgs)
        with tempfile.TemporaryDirectory(prefix="envbuild-lock-") as tmp:
            files[L.CONDA_LOCK] = write_conda_lock(
                Path(tmp) / L.CONDA_LOCK,
                records,
                pylock,
                parents,
                channels=list(sources.channels),
                input_sha256=input_sha,
                profile=env.name,
                vpkgs=vpkgs,
                subdir=platform(env),
            )
        tools["conda-lock"] = _version("conda-lock")
        if solver == "rattler":
            tools["py-rattler"] = _version("py-rattler")
    if "images" in parts:
        from envbuilder.lock.images import lock_images

        refs = sorted(set(env.cuda.images.values()))
        where = sources.registry_mirror or "their own registries"
        if isinstance(where, dict):
            where = ", ".join(f"{k} via {v}" for k, v in where.items())
        say(f"{env.name}: images: {', '.join(refs)} from {where}")
        with Heartbeat(f"{env.name}: images", say, every=beat):
            files[L.IMAGES] = L.dumps(lock_images(refs, sources.registry_mirror))
        tools["requests"] = _version("requests")
    solved_from: dict[str, Json] = {
        **(
            {"pypi": sources.pypi.public, "torch": sources.torch.public if sources.torch else None}
            if "pip" in parts
            else {}
        ),
        **({"github": sources.github} if "pip" in parts and L.has_sources(env) else {}),
        **({"channels": list(sources.channels)} if "conda" in parts else {}),
        **({"registry_mirror": sources.registry_mirror} if "images" in parts else {}),
    }
    meta = LockMeta(
        format=L.FORMAT,
        profile=env.name,
        input_sha256=input_sha,
        torch_swapped=swapped or None,
        inputs=digests,
        parts=tuple(sorted(parts)),
        solver=solver if "conda" in parts else None,
        target=LockTarget(platform(env), env.python, python_platform(glibc, env.gpu.machine), vpkgs),
        # where it was solved from, never with a URL's user:password@ (lock.json is committed)
        sources={k: _bare(v, without_credentials) for k, v in solved_from.items()},
        tools=tools,
        files={name: L.sha256_text(text) for name, text in sorted(files.items())},
    )
    files[L.META] = L.dumps(meta.to_dict())
    L.write_dir(out_dir, files)
    return meta
