"""The pip part of a lock: `uv pip compile` for the TARGET (its Python, its glibc), with hashes,
and the split of requirements.lock into the Dockerfile's install layers."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

from ..errors import ActionError, UserError
from ..resolve import ResolvedEnv

# Dockerfile install layers, most expensive first; each installs what its roots pull in that no
# earlier layer installed.
LAYERS = ("torch", "vllm", "verl-deps", "verl")
# What the builder stage installs beside torch to compile apex / flash-attn; locked with the rest
# so a locked or offline build pins them too. Installed in the builder only, never at run time.
BUILD_TOOLS = ("packaging", "ninja", "wheel", "setuptools", "psutil")
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")
_NETWORK = ("Failed to fetch", "error sending request", "Connection refused", "dns error",
            "timed out", "Could not connect", "tcp connect error", "operation timed out")


class Locked(NamedTuple):
    version: str
    hashes: tuple[str, ...]
    parents: frozenset[str]  # packages that pull this one in ("" = asked for directly)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.split("[")[0]).lower()


def layer_roots(env: ResolvedEnv) -> dict[str, list[str]]:
    """The requirements each install layer asks for, as the unlocked Dockerfile does."""
    d = env.data
    return {
        "torch": list(d["torch"]["packages"]),
        "vllm": [f"vllm=={d['vllm']['version']}"] if d["vllm"] else [],
        "verl-deps": [f"{name}=={version}" for name, version in d["verl"]["pins"].items()],
        "verl": [f"verl=={d['verl']['version']}"],
    }


def needs_builder(env: ResolvedEnv) -> bool:
    return bool(env.data["apex"] or env.data["flash_attn"])


def requirements_in(env: ResolvedEnv) -> str:
    reqs = [r for layer in layer_roots(env).values() for r in layer]
    if needs_builder(env):
        reqs += list(BUILD_TOOLS)
    return "".join(f"{r}\n" for r in reqs)


def python_platform(glibc: str) -> str:
    return f"x86_64-manylinux_{glibc.replace('.', '_')}"


def uv_bin() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        import shutil

        found = shutil.which("uv")
        if not found:
            raise UserError("uv is not installed; `envbuild lock` resolves the pip part with it. "
                            "Install the lock extras: pip install 'envbuild[lock]'.") from None
        return found


def uv_version() -> str:
    out = subprocess.run([uv_bin(), "--version"], capture_output=True, text=True).stdout.split()
    return out[1] if len(out) > 1 else "unknown"


def _uv_env() -> dict[str, str]:
    """The caller's environment minus uv's index settings: the lock names its indexes itself."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("UV_") and k not in ("UV_CACHE_DIR", "UV_NATIVE_TLS",
                                                     "UV_HTTP_TIMEOUT", "UV_CONCURRENT_DOWNLOADS"))}
    env["UV_PYTHON_DOWNLOADS"] = "never"  # wheels resolve from tags; never fetch a CPython
    return env


def compile_args(profile: str, python: str, glibc: str, pypi: str, torch: str | None) -> list[str]:
    args = ["--no-config", "--python-version", python, "--python-platform", python_platform(glibc),
            "--no-python-downloads", "--custom-compile-command", f"envbuild lock {profile}",
            "--index-url", pypi]
    if torch:
        # uv searches --extra-index-url before --index-url; first-match takes a name from the
        # first index that has the version asked for (the torch index for `+cuXXX`) and falls
        # back to the next when it has the name but not the version (numpy on the torch index).
        args += ["--extra-index-url", torch, "--index-strategy", "unsafe-first-match"]
    return args


def _run_uv(args: list[str], cwd: Path, indexes: list[str]) -> None:
    try:
        proc = subprocess.run([uv_bin(), "pip", "compile", *args], cwd=cwd, env=_uv_env(),
                              capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise ActionError(f"uv pip compile did not finish within an hour against "
                          f"{', '.join(indexes)}.") from None
    if proc.returncode == 0:
        return
    msg = proc.stderr.strip()[-3000:]
    if any(s in msg for s in _NETWORK):
        raise ActionError(f"Cannot reach the package index ({', '.join(indexes)}) to lock the pip "
                          f"part:\n{msg}\nCheck the URL, or pass --index-url / --torch-index-url "
                          "a mirror that answers.")
    raise UserError(f"The pip part cannot be resolved against {', '.join(indexes)}:\n{msg}\n"
                    "A pin in the matrix has no release (or no wheel for this Python and "
                    "platform) on these indexes.")


def load_toml(text: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads(text)


def compile_lock(env: ResolvedEnv, glibc: str, pypi: str, torch: str | None) -> tuple[str, str, dict]:
    """(requirements.lock text, pylock.toml text, pylock.toml as a dict): the hashed pins, and
    one artifact URL + sha256 per package (PEP 751)."""

    indexes = [pypi] + ([torch] if torch else [])
    args = compile_args(env.name, env.data["python"], glibc, pypi, torch)
    with tempfile.TemporaryDirectory(prefix="envbuild-lock-") as tmp:
        tmp = Path(tmp)
        (tmp / "requirements.in").write_text(requirements_in(env), encoding="utf-8")
        _run_uv(["requirements.in", *args, "--generate-hashes", "--quiet", "-o",
                 "requirements.lock"], tmp, indexes)
        # pylock.toml (PEP 751): the one file per package that fits the target, with its URL
        _run_uv(["requirements.in", *args, "--quiet", "-o", "pylock.toml"], tmp, indexes)
        text = (tmp / "requirements.lock").read_text(encoding="utf-8")
        pylock_text = (tmp / "pylock.toml").read_text(encoding="utf-8")
        pylock = load_toml(pylock_text)
    locked = {(n, p.version) for n, p in parse(text).items()}
    other = {(normalize(p["name"]), p["version"]) for p in pylock.get("packages", [])}
    if locked != other:
        raise ActionError("uv gave two different resolutions for the same input "
                          f"(requirements.lock vs pylock.toml: {sorted(locked ^ other)}); the "
                          "index changed while locking. Run envbuild lock again.")
    return text, pylock_text, pylock


def parse(text: str) -> dict[str, Locked]:
    """requirements.lock (uv's format, annotated) -> {normalized name: Locked}."""
    out: dict[str, Locked] = {}
    name = version = None
    hashes: list[str] = []
    parents: set[str] = set()
    in_via = False

    def flush():
        if name:
            out[name] = Locked(version, tuple(hashes), frozenset(parents))

    for line in text.splitlines():
        m = _REQ.match(line)
        if m:
            flush()
            name, version, hashes, parents, in_via = normalize(m[1]), m[2], [], set(), False
            hashes += _HASH.findall(line)
            continue
        stripped = line.strip()
        hashes += _HASH.findall(stripped)
        if stripped.startswith("# via"):
            rest = stripped[len("# via"):].strip()
            in_via = not rest
            if rest:
                parents.add("" if rest.startswith("-r ") else normalize(rest))
        elif in_via and stripped.startswith("#   "):
            rest = stripped[4:].strip()
            parents.add("" if rest.startswith("-r ") else normalize(rest))
        elif not stripped.startswith("#"):
            in_via = False
    flush()
    return out


def replace_hashes(text: str, hashes: dict[str, tuple[str, ...]]) -> str:
    """requirements.lock text with the hash list of each package in `hashes` ({normalized
    name: ("sha256:...", ...)}) replaced: the requirement line keeps its pin and marker, the
    comments stay. Every name must be pinned in the text."""
    out: list[str] = []
    seen: set[str] = set()
    lines = iter(text.splitlines())
    for line in lines:
        m = _REQ.match(line)
        name = normalize(m[1]) if m else None
        if name not in hashes:
            out.append(line)
            continue
        statement = [line]
        while statement[-1].rstrip().endswith("\\"):  # the requirement's continuation lines
            nxt = next(lines, None)
            if nxt is None:
                break
            statement.append(nxt)
        head = _HASH.sub("", statement[0]).rstrip().removesuffix("\\").rstrip()
        new = [head] + [f"    --hash={h}" for h in hashes[name]]
        out.append(" \\\n".join(new))
        seen.add(name)
    missing = sorted(set(hashes) - seen)
    if missing:
        raise UserError(f"requirements.lock pins no {', '.join(missing)}, which pylock.toml "
                        "pins; the lock is inconsistent. Re-lock with `envbuild lock`.")
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def layers(env: ResolvedEnv, locked: dict[str, Locked]) -> dict[str, list[str]]:
    """Each layer's packages: the closure of its roots over the lock's dependency edges, minus
    what an earlier layer installs. Anything left over goes into the last layer. The builder's
    `build` layer is the closure of the build tools on its own (it may overlap the others)."""
    children: dict[str, set[str]] = {}
    for name, entry in locked.items():
        for parent in entry.parents:
            children.setdefault(parent, set()).add(name)

    def closure(roots, skip=frozenset()) -> set[str]:
        todo = [normalize(_REQ.match(r)[1]) if _REQ.match(r) else normalize(r) for r in roots]
        mine: set[str] = set()
        while todo:
            n = todo.pop()
            if n in skip or n in mine or n not in locked:
                continue
            mine.add(n)
            todo += children.get(n, ())
        return mine

    done: set[str] = set()
    out: dict[str, list[str]] = {}
    for layer, roots in layer_roots(env).items():
        mine = closure(roots, frozenset(done))
        done |= mine
        out[layer] = sorted(mine)
    build = closure(BUILD_TOOLS) if needs_builder(env) else set()
    out[LAYERS[-1]] = sorted(set(out[LAYERS[-1]]) | (set(locked) - done - build))
    if needs_builder(env):
        out["build"] = sorted(build)
    return out


def layer_files(env: ResolvedEnv, text: str) -> tuple[dict[str, str | None], dict[str, str]]:
    """({layer: file name or None when the layer is empty}, {file name: hashed requirements})."""
    locked = parse(text)
    names, files = {}, {}
    for layer, packages in layers(env, locked).items():
        if not packages:
            names[layer] = None
            continue
        fname = f"locked-{layer}.txt"
        body = [f"# envbuild lock of {env.name}: the {layer} layer, from requirements.lock. "
                "Install with: pip install --no-deps --require-hashes -r " + fname]
        for n in packages:
            entry = locked[n]
            body.append(" \\\n".join([f"{n}=={entry.version}"] +
                                     [f"    --hash={h}" for h in entry.hashes]))
        names[layer] = fname
        files[fname] = "\n".join(body) + "\n"
    return {k.replace("-", "_"): v for k, v in names.items()}, files


def pip_artifact(package: dict) -> tuple[str, str]:
    """(url, sha256) of the artifact conda-lock.yml records for a pylock.toml package: a
    platform wheel before a pure one, a wheel before the sdist."""
    wheels = sorted(package.get("wheels", []),
                    key=lambda w: (w["url"].rsplit("-", 1)[-1] == "any.whl", w["url"]))
    art = wheels[0] if wheels else package.get("sdist")
    if not art:
        raise ActionError(f"pylock.toml has no file for {package['name']}; cannot lock it.")
    return art["url"], art["hashes"]["sha256"]
