"""The Lockfile directory (lockfiles/<profile>/): what it holds, the input hash it was made from,
writing it in one swap, and telling whether it is still current. Pure Python, no network: this is
what `envbuild lock --check` and `envbuild render --locked` need.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import UserError
from ..resolve import ResolvedEnv

FORMAT = 2  # 2: inputs are what each part's solver sees, not every template and matrix file
META = "lock.json"
CONDA_LOCK = "conda-lock.yml"
REQUIREMENTS = "requirements.lock"
PYLOCK = "pylock.toml"  # written with the pip part: the same pins with file URLs (PEP 751)
SOURCES = "sources.lock"  # where apex or flash-attn is built: GitHub files' URLs and sha256
IMAGES = "images.lock"
# part -> the file that holds it ("sources" only where apex or flash-attn is built)
PARTS = {"conda": CONDA_LOCK, "pip": REQUIREMENTS, "sources": SOURCES, "images": IMAGES}


def has_sources(env: ResolvedEnv) -> bool:
    """Whether the builder fetches files from GitHub that a lock pins (sources.lock)."""
    return bool(env.data["apex"] or env.data["flash_attn"])


def parts_for(env: ResolvedEnv, parts=tuple(PARTS)) -> list[str]:
    """The parts of `parts` that `env` has (no sources part without apex or flash-attn)."""
    return [p for p in parts if p != "sources" or has_sources(env)]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def solver_inputs(env: ResolvedEnv) -> dict[str, dict]:
    """part -> what that part's solution depends on, and nothing else: the requirements, the
    target (Python, platform, the image's glibc and CUDA) and the upstream indexes or channels.
    Not the templates, envbuild's version or matrix facts the solver never sees, so a comment
    in the Dockerfile template or a new envbuild release leaves every lock current. A mirror
    serves the same files, so the mirror a lock was made through is not an input either. The
    solvers' versions are recorded in lock.json (`tools`), not hashed: a uv release would
    otherwise stale every lock without changing what it pins."""
    from ..plan import conda_specs, requirements_in
    from .conda import default_channels, virtual_packages

    d = env.data
    target = {"platform": "linux-64", "python": d["python"], "glibc": d["cuda"].get("glibc"),
              "cuda": d["cuda"]["version"]}
    out = {
        "pip": {"requirements": requirements_in(env), "target": target,
                "indexes": {"pypi": d["indexes"]["pypi"], "torch": d["indexes"]["torch"]}},
        "conda": {"specs": conda_specs(env), "channels": default_channels(env), "target": target,
                  "virtual_packages": virtual_packages(env, d["cuda"].get("glibc") or "")},
        "images": {"refs": sorted(set(d["cuda"]["images"].values())), "platform": "linux/amd64"},
    }
    if has_sources(env):
        out["sources"] = {"apex": d["apex"], "flash_attn": d["flash_attn"], "target": target,
                          "torch": d["torch"]["version"]}
    return out


def input_digests(env: ResolvedEnv, parts) -> dict[str, str]:
    """"part.key" -> sha256 of that input, for the given parts (so a stale lock says which
    input of which part moved)."""
    inputs = solver_inputs(env)
    return {f"{part}.{key}": sha256_text(json.dumps(value, sort_keys=True))
            for part in sorted(parts) if part in inputs
            for key, value in sorted(inputs[part].items())}


def input_sha256(digests: dict[str, str]) -> str:
    return sha256_text("".join(f"{label}\0{digest}\n" for label, digest in sorted(digests.items())))


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def read_meta(lock_dir: Path) -> dict | None:
    try:
        meta = json.loads((Path(lock_dir) / META).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{Path(lock_dir) / META} is unreadable ({e}). Re-create it with "
                        "`envbuild lock`.") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"{Path(lock_dir) / META} is not an envbuild lock of format {FORMAT}. "
                        "Re-create it with `envbuild lock`.")
    return meta


def _stale(env: ResolvedEnv, meta: dict, parts) -> list[str]:
    """Why a lock (its lock.json `meta`) was made for other inputs than `env` has now, for the
    `parts` it holds: another profile, or what a part's solver sees has moved."""
    out = []
    if meta.get("profile") != env.name:
        out.append(f"is the lock of profile {meta.get('profile')!r}, not {env.name!r}")
    locked = [p for p in parts if p in meta.get("parts", [])]
    now, then = input_digests(env, locked), meta.get("inputs", {})
    changed = sorted(k for k in now if now[k] != then.get(k))
    if changed:
        out.append("stale: changed since locking: " + ", ".join(changed)
                   + " (re-lock: what the solver sees moved)")
    return out


def problems(env: ResolvedEnv, lock_dir: Path, parts=tuple(PARTS)) -> list[str]:
    """Why the lock in `lock_dir` is not current for `env` (empty when it is). No network.
    A part is stale when what its solver sees changed (solver_inputs), never for a template
    or a matrix fact the solution does not depend on."""
    lock_dir = Path(lock_dir)
    meta = read_meta(lock_dir)
    if meta is None:
        return [f"missing: no {lock_dir / META}"]
    parts = parts_for(env, parts)
    out = _stale(env, meta, parts)
    for part in parts:
        name = PARTS[part]
        if part not in meta.get("parts", []):
            out.append(f"incomplete: {name} was not locked (made with --only "
                       f"{','.join(meta.get('parts', []))})")
            continue
        try:
            text = (lock_dir / name).read_text(encoding="utf-8")
        except OSError:
            out.append(f"missing: {lock_dir / name}")
            continue
        if sha256_text(text) != meta.get("files", {}).get(name):
            out.append(f"modified: {name} differs from what `envbuild lock` wrote (sha256)")
    if "pip" in meta.get("parts", []) and "pip" in parts:
        for name in [PYLOCK]:
            if name not in meta.get("files", {}):
                out.append(f"incomplete: no {name} (made by an older envbuild; re-lock)")
    return out


def write_dir(lock_dir: Path, files: dict[str, str]) -> None:
    """Replace `lock_dir` with exactly `files`, as one swap: all of them or, on failure, none."""
    from ..render import write_dir as swap_dir

    swap_dir(lock_dir, files, marker=META)


def for_render(env: ResolvedEnv, lock_dir: Path, wheelhouse: Path | None = None,
               mirror=None) -> dict:
    """The `locked` context of the Dockerfile template: base images by digest and the hashed
    requirement file of each install layer (copied into the build context). With a wheelhouse
    (whose locks/<profile>/ is `lock_dir`), pip installs from its files with no index, and the
    base images are pinned where the lock has them. With a `mirror` (mirrors.MirrorChoice) the
    images are the mirror's references at the digests the lock recorded upstream (a digest names
    the content, wherever it is pulled from)."""
    from .pip import layer_files

    lock_dir = Path(lock_dir)
    meta = read_meta(lock_dir)
    if meta is None:
        raise UserError(f"No lock in {lock_dir} (no {META}). Make it with `envbuild lock "
                        f"{env.name}`, or pass --locked DIR where it is.")
    stale = _stale(env, meta, parts_for(env, ("pip", "sources") if wheelhouse is not None
                                        else tuple(PARTS)))
    if stale:
        raise UserError(f"The lock in {lock_dir} was made for other inputs than {env.name!r} has "
                        f"now ({'; '.join(stale)}). Re-lock with `envbuild lock {env.name}` "
                        "(with the same overrides).")
    if meta.get("torch_swapped"):
        raise UserError(f"The lock in {lock_dir} was solved with PyPI's torch in place of the "
                        f"profile's ({meta['torch_swapped']}), because the PyTorch index was out "
                        "of reach: it pins everything else (a plain render uses it as constraints) "
                        "but cannot install this torch with --require-hashes. Re-lock with "
                        f"`envbuild lock {env.name}` where the PyTorch index (or its mirror: "
                        "--torch-index-url) answers.")
    needed = ("pip",) if wheelhouse is not None else ("pip", "images")
    missing = [PARTS[p] for p in needed if p not in meta.get("parts", [])]
    if missing:
        raise UserError(f"The lock in {lock_dir} has no {' and no '.join(missing)} (made with "
                        f"--only {','.join(meta.get('parts', []))}); a locked Dockerfile needs "
                        f"{'it' if len(needed) == 1 else 'both'}. Complete it with `envbuild lock "
                        f"{env.name}` on a machine that reaches the registry and the indexes.")
    texts = {}
    for name in (REQUIREMENTS, IMAGES, SOURCES):
        if name == IMAGES and "images" not in meta.get("parts", []):
            continue
        if name == SOURCES and not has_sources(env):
            continue
        if name == SOURCES and name not in meta.get("files", {}):
            raise UserError(f"The lock in {lock_dir} pins no {' or '.join(_sourced(env))} (no "
                            f"{SOURCES}; made by an older envbuild, or with --only without "
                            f"sources). Re-lock with `envbuild lock {env.name}`.")
        text = (lock_dir / name).read_text(encoding="utf-8")
        if sha256_text(text) != meta.get("files", {}).get(name):
            raise UserError(f"{lock_dir / name} differs from what `envbuild lock` wrote; "
                            f"re-lock with `envbuild lock {env.name}`.")
        texts[name] = text
    images = json.loads(texts[IMAGES]) if IMAGES in texts else {}
    pinned = {}
    for role, ref in sorted(env.data["cuda"]["images"].items()):
        where = mirror.image(ref) if mirror else ref
        if ref in images:
            pinned[role] = f"{where}@{images[ref]['digest']}"
        elif IMAGES in texts:
            raise UserError(f"{lock_dir / IMAGES} has no digest for {ref}; re-lock.")
        else:
            pinned[role] = where
    requirements, links = texts[REQUIREMENTS], {}
    if wheelhouse is not None:  # the wheels built from the lock's sdists install in their place
        from .pip import replace_hashes

        links, built = wheelhouse_files(env, Path(wheelhouse))
        requirements = replace_hashes(requirements, built)
    layers, files = layer_files(env, requirements)
    sources = json.loads(texts[SOURCES]) if SOURCES in texts else {}
    apex_source = sources.get("apex") if env.data["apex"] else None
    fa_wheels = None
    if env.data["flash_attn"]:
        from .sources import flash_attn_pins

        fa_wheels = flash_attn_pins(sources)
        if not fa_wheels:
            raise UserError(f"{lock_dir / SOURCES} pins no flash-attn wheel (made by an older "
                            f"envbuild). Re-lock with `envbuild lock {env.name}`.")
    if env.data["apex"] and not apex_source:
        raise UserError(f"{lock_dir / SOURCES} pins no apex source archive. Re-lock with "
                        f"`envbuild lock {env.name}`.")
    return {"images": pinned, "images_pinned": IMAGES in texts, "layers": layers, "files": files,
            "input_sha256": meta["input_sha256"], "wheelhouse": wheelhouse is not None,
            "links": links, "apex_source": apex_source, "flash_attn_wheels": fa_wheels}


def _sourced(env: ResolvedEnv) -> list[str]:
    return ((["apex source archive"] if env.data["apex"] else [])
            + (["flash-attn wheel"] if env.data["flash_attn"] else []))


def wheelhouse_files(env: ResolvedEnv,
                     wheelhouse: Path) -> tuple[dict[str, Path], dict[str, tuple[str, ...]]]:
    """({build-context path: wheelhouse file} for the pip files the profile needs, {package:
    ("sha256:..." of the wheel built from its sdist,)})."""
    try:
        manifest = json.loads((wheelhouse / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raise UserError(f"{wheelhouse} is not an envbuild wheelhouse (no readable manifest.json). "
                        f"Make one with `envbuild wheelhouse {env.name} -o {wheelhouse}`.") from None
    profile = manifest.get("profiles", {}).get(env.name)
    if profile is None:
        raise UserError(f"The wheelhouse {wheelhouse} holds no complete export of {env.name} "
                        f"(it has: {', '.join(manifest.get('profiles', {})) or 'none'}). Run "
                        f"`envbuild wheelhouse {env.name} -o {wheelhouse}`.")
    from ..wheelbuild import is_sdist

    built, files = profile.get("built") or {}, manifest.get("files", {})
    unbuilt = sorted(f["name"] for p, f in files.items()
                     if p in profile["files"] and f.get("kind") == "pip" and is_sdist(p)
                     and f.get("name") not in built)
    if unbuilt:
        raise UserError(f"The wheelhouse {wheelhouse} holds {', '.join(unbuilt)} of {env.name} as "
                        "sdists only (exported by an older envbuild), which an offline build "
                        "cannot build. Export it again with `envbuild wheelhouse "
                        f"{env.name} -o {wheelhouse}`: that builds them into wheels.")
    if any(p not in files or p not in profile["files"] for p in built.values()):
        raise UserError(f"{wheelhouse / 'manifest.json'} names built wheels of {env.name} it does "
                        f"not list; export it again with `envbuild wheelhouse {env.name} -o "
                        f"{wheelhouse}`.")
    hashes = {name: (f"sha256:{files[p]['sha256']}",) for name, p in built.items()}
    # pip files flat (pip's --find-links), source archives under sources/
    links = {}
    for p in profile["files"]:
        if p.startswith("pypi/"):
            links["wheelhouse/" + p[len("pypi/"):]] = wheelhouse / p
        elif p.startswith("sources/"):
            links["wheelhouse/" + p] = wheelhouse / p
    return links, hashes
