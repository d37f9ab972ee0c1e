"""The pip part of a lock: `uv pip compile` for the TARGET (its Python, its glibc), with hashes,
and the split of requirements.lock into the Dockerfile's install layers."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from envbuilder.errors import ActionError, UserError
from envbuilder.lock.documents import Pylock, PylockPackage
from envbuilder.record import Record
from envbuilder.secret import SecretUrl, secret
from envbuilder.render.plan import (
    BUILD_TOOLS,  # noqa: F401  (re-exported or a fixture)
    LAYERS,  # noqa: F401  (re-exported or a fixture)
    REQ,
    layer_roots,  # noqa: F401  (re-exported or a fixture)
    normalize,
    requirements_in,
)
from envbuilder.lock.pins import HASH, Locked, layers, parse
from envbuilder.model.resolved import ResolvedEnv
from envbuilder.tools.uv import uv_bin, uv_env, uv_version  # noqa: F401  (lock.pip.uv_bin for callers)

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix

_NETWORK = (
    "Failed to fetch",
    "error sending request",
    "Connection refused",
    "dns error",
    "timed out",
    "Could not connect",
    "tcp connect error",
    "operation timed out",
)


def python_platform(glibc: str, machine: str = "x86_64") -> str:
    return f"{machine}-manylinux_{glibc.replace('.', '_')}"


def compile_args(profile: str, python: str, glibc: str, torch: bool, machine: str = "x86_64") -> list[str]:
    """uv pip compile's options for the target; its indexes go in its environment (`index_env`:
    no password in argv), `torch`: with a PyTorch index besides PyPI."""
    args = [
        "--no-config",
        "--python-version",
        python,
        "--python-platform",
        python_platform(glibc, machine),
        "--no-python-downloads",
        "--custom-compile-command",
        f"envbuild lock {profile}",
    ]
    if torch:
        # uv searches the extra index (the torch one) before the index; first-match takes a name
        # from the first index that has the version asked for (the torch index for `+cuXXX`) and
        # falls back to the next when it has the name but not the version (numpy on the torch index).
        args += ["--index-strategy", "unsafe-first-match"]
    return args


def _run_uv(args: list[str], cwd: Path, indexes: list[SecretUrl]) -> None:
    """uv pip compile `args` from `indexes` (PyPI's, then the PyTorch one), given to it in its
    environment."""
    from envbuilder.oci.http import redact
    from envbuilder.tools.run import TooMuchMemory, run
    from envbuilder.tools.uv import index_env

    env = {**uv_env(), **index_env(indexes[0], indexes[1] if len(indexes) > 1 else None)}
    try:
        # (bounded: uv reads an index page whole, and one that never ends filled the memory)
        proc = run([uv_bin(), "pip", "compile", *args], cwd=cwd, env=env, timeout=3600)
    except subprocess.TimeoutExpired:
        raise ActionError(
            f"uv pip compile did not finish within an hour against {', '.join(map(str, indexes))}."
        ) from None
    except TooMuchMemory as e:
        raise ActionError(
            f"uv pip compile was stopped: it {e} reading "
            f"{', '.join(map(str, indexes))}. An index that sends a page without end "
            "does that; check the index (or its mirror) in a browser, or pass "
            "another with --index-url."
        ) from None
    if proc.returncode == 0:
        return
    msg = proc.stderr.strip()[-3000:]
    down = [i for i in indexes if i.public.startswith(("http://", "https://")) and not index_answers(i)]
    if down or any(s in msg for s in _NETWORK):
        raise ActionError(
            redact(
                unreachable(down or indexes, torch=indexes[1] if len(indexes) > 1 else None)
                + f"\nuv said:\n{msg}"
            )
        )
    raise UserError(
        redact(
            f"The pip part cannot be resolved against {', '.join(map(str, indexes))}:\n{msg}\n"
            "A pin in the matrix has no release (or no wheel for this Python and "
            "platform) on these indexes."
        )
    )


def unreachable(down: list[SecretUrl], torch: SecretUrl | None) -> str:
    """What does not answer, by name (not every index the lock uses), and each way on: a mirror
    for it, and for the PyTorch index PyPI's build of the same torch, with what that costs."""
    lines = [
        f"Cannot lock the pip part: {', '.join(map(str, down))} "
        f"{'does' if len(down) == 1 else 'do'} not answer from here."
    ]
    if any(d != torch for d in down):
        lines.append(
            "Fix: pass --index-url a PyPI mirror that answers (or --mirror NAME; `envbuild mirrors list`)."
        )
    if torch in down:
        lines.append(
            "For the PyTorch index: pass --torch-index-url a mirror of it, or "
            "--torch-from-pypi to solve with PyPI's build of the same torch version. Its "
            "CUDA is PyPI's (e.g. 12.4 for torch 2.6.0, not the profile's +cu118), so "
            "that lock pins everything else as constraints and cannot be used --locked "
            "or exported to a wheelhouse without --accept-pypi-torch."
        )
    return "\n".join(lines)


def _compile(
    env: ResolvedEnv,
    glibc: str,
    pypi: SecretUrl,
    torch: SecretUrl | None,
    swap_torch: bool,
    outputs: dict[str, list[str]],
) -> dict[str, str]:
    """Run `uv pip compile` of the plan once per output file ({name: extra args}) for the
    target's Python and platform; {name: text}. `swap_torch`: PyPI's build of the profile's
    torch version, no PyTorch index."""
    if swap_torch:
        torch = None
    indexes = [pypi] + ([torch] if torch else [])
    args = compile_args(env.name, env.python, glibc, bool(torch), env.gpu.machine)
    with tempfile.TemporaryDirectory(prefix="envbuild-lock-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "requirements.in").write_text(requirements_in(env, swap_torch), encoding="utf-8")
        for i, (name, extra) in enumerate(outputs.items()):
            argv = ["requirements.in", *args, *extra, "--quiet", "-o", name]
            if i == 0:
                _run_uv(argv, tmp, indexes)
                continue
            # the later outputs from the index pages and metadata the first run left in uv's
            # cache: a release published in between (or a cached page one run revalidated and
            # the other did not) cannot make two formats of one lock differ
            try:
                _run_uv([*argv, "--offline"], tmp, indexes)
            except (UserError, ActionError):
                _run_uv(argv, tmp, indexes)  # (something was not cached: the index, as before)
        return {name: (tmp / name).read_text(encoding="utf-8") for name in outputs}


def co_resolve(
    env: ResolvedEnv, glibc: str, pypi: SecretUrl, torch: SecretUrl | None, swap_torch: bool = False
) -> dict[str, Locked]:
    """Resolve the whole pinned set with uv for the target's Python and platform, as one
    solution; UserError naming the conflict when there is none."""
    return parse(_compile(env, glibc, pypi, torch, swap_torch, {"resolved.txt": []})["resolved.txt"])


class CoResolved(Record):
    """What `check --resolve` found: how many packages the one solution holds, the indexes it
    came from (`torch_swapped`: PyPI's torch resolved in place of the profile's +cuXXX build,
    the PyTorch index being out of reach), for which Python and platform."""

    packages: int
    pypi: str
    torch_index: str | None
    torch_swapped: bool
    python: str
    platform: str


def check_co_resolves(
    m: Matrix,
    env: ResolvedEnv,
    index_url: SecretUrl | None = None,
    torch_index_url: SecretUrl | None = None,
    say: Callable[[str], None] = print,
) -> CoResolved:
    """`check --resolve` as a library: the whole pinned set of `env` resolved with uv as one
    solution for its target's Python and platform (glibc of its CUDA image), from `index_url`
    and `torch_index_url` (default the profile's). A PyTorch index that does not answer is
    said (`say`) and PyPI's build of the same torch resolved in its place. UserError naming the
    conflict when there is no solution."""
    from envbuilder.render.plan import torch_swap

    glibc = target_glibc(m, env)
    pypi = index_url or SecretUrl(env.indexes.pypi)
    torch_index = torch_index_url or secret(env.indexes.torch)
    swap = bool(torch_index and not index_answers(torch_index))
    if swap:
        say(
            f"note: the PyTorch index {torch_index} does not answer; resolving torch "
            f"{torch_swap(env)} in its place: the rest of the set is the profile's."
        )
    found = co_resolve(env, glibc, pypi, torch_index, swap)
    return CoResolved(
        len(found),
        str(pypi),
        str(torch_index) if torch_index else None,
        swap,
        env.python,
        python_platform(glibc, env.gpu.machine),
    )


def index_answers(url: str | SecretUrl, timeout: float = 5.0) -> bool:
    """Whether a PEP 503 index answers: net.index_answers, the one rule verify uses too."""
    from envbuilder.oci.http import index_answers as answers

    return answers(url, timeout)


UV_EXPORT_FIX = (
    "uv's export is not in the shape envbuild reads (PEP 751's pylock.toml); nothing was "
    "written. Report it, with `uv --version`."
)


def load_toml(text: str) -> dict[str, object]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib
    doc: dict[str, object] = tomllib.loads(text)
    return doc


def compile_lock(
    env: ResolvedEnv, glibc: str, pypi: SecretUrl, torch: SecretUrl | None, swap_torch: bool = False
) -> tuple[str, str, Pylock]:
    """(requirements.lock text, pylock.toml text, pylock.toml's record): the hashed pins, and
    one artifact URL + sha256 per package (PEP 751). `swap_torch`: solve with PyPI's build of
    the profile's torch version (no PyTorch index)."""

    # pylock.toml (PEP 751): the one file per package that fits the target, with its URL
    out = _compile(
        env, glibc, pypi, torch, swap_torch, {"requirements.lock": ["--generate-hashes"], "pylock.toml": []}
    )
    text, pylock_text = out["requirements.lock"], out["pylock.toml"]
    pylock = Pylock.read(load_toml(pylock_text), "uv's pylock.toml", UV_EXPORT_FIX)
    locked = {(n, p.version) for n, p in parse(text).items()}
    other = {(normalize(p.name), p.version) for p in pylock.packages}
    if locked != other:
        raise ActionError(
            "uv gave two different resolutions for the same input "
            f"(requirements.lock vs pylock.toml: {sorted(locked ^ other)}); the "
            "index changed while locking. Run envbuild lock again."
        )
    return text, pylock_text, pylock


def replace_hashes(text: str, hashes: dict[str, tuple[str, ...]]) -> str:
    """requirements.lock text with the hash list of each package in `hashes` ({normalized
    name: ("sha256:...", ...)}) replaced: the requirement line keeps its pin and marker, the
    comments stay. Every name must be pinned in the text."""
    out: list[str] = []
    seen: set[str] = set()
    lines = iter(text.splitlines())
    for line in lines:
        m = REQ.match(line)
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
        head = HASH.sub("", statement[0]).rstrip().removesuffix("\\").rstrip()
        new = [head] + [f"    --hash={h}" for h in hashes[name]]
        out.append(" \\\n".join(new))
        seen.add(name)
    missing = sorted(set(hashes) - seen)
    if missing:
        raise UserError(
            f"requirements.lock pins no {', '.join(missing)}, which pylock.toml "
            "pins; the lock is inconsistent. Re-lock with `envbuild lock`."
        )
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def layer_files(env: ResolvedEnv, text: str) -> tuple[dict[str, str | None], dict[str, str]]:
    """({layer: file name or None when the layer is empty}, {file name: hashed requirements})."""
    locked = parse(text)
    names: dict[str, str | None] = {}
    files: dict[str, str] = {}
    for layer, packages in layers(env, locked).items():
        if not packages:
            names[layer] = None
            continue
        fname = f"locked-{layer}.txt"
        body = [
            f"# envbuild lock of {env.name}: the {layer} layer, from requirements.lock. "
            "Install with: pip install --no-deps --require-hashes -r " + fname
        ]
        for n in packages:
            entry = locked[n]
            body.append(" \\\n".join([f"{n}=={entry.version}"] + [f"    --hash={h}" for h in entry.hashes]))
        names[layer] = fname
        files[fname] = "\n".join(body) + "\n"
    return names, files


def _neg(build: tuple[int, str] | tuple[()]) -> tuple[int, str]:
    """A sort key that puts the highest build tag first (no tag last)."""
    return (-build[0], build[1]) if build else (1, "")


def _build_tag(url: str) -> tuple[int, str] | tuple[()]:
    """A wheel file's build tag ((3, "") for torch-2.10.0-3-cp312-...whl), () when it has none
    or its name does not parse."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        return parse_wheel_filename(url.rsplit("/", 1)[-1].split("#", 1)[0])[2]
    except InvalidWheelFilename:
        return ()


def pip_artifact(package: PylockPackage | Mapping[str, object]) -> tuple[str, str]:
    """(url, sha256) of the artifact conda-lock.yml records for a pylock.toml package: a
    platform wheel before a pure one, of the same tags the one with the highest build tag (pip
    and uv install that one: torch 2.10.0's x86_64 `-3` rebuilds beside the untagged files,
    torch.yaml build_tag210), a wheel before the sdist."""
    p = (
        package if isinstance(package, PylockPackage) else PylockPackage.of(package)
    )  # (plain: as uv writes it)
    wheels = sorted(
        p.wheels, key=lambda w: (w.url.rsplit("-", 1)[-1] == "any.whl", _neg(_build_tag(w.url)), w.url)
    )
    art = wheels[0] if wheels else p.sdist
    if not art:
        raise ActionError(f"pylock.toml has no file for {p.name}; cannot lock it.")
    return art.url, art.hashes.sha256


def target_glibc(matrix: Matrix, env: ResolvedEnv) -> str:
    """The glibc of the profile's CUDA image (cuda.yaml), the platform a lock is solved for."""
    cuda_v = env.cuda.version
    glibc: str | None = (matrix.cuda.get(cuda_v) or {}).get("glibc")
    if not glibc:
        raise UserError(
            f"{matrix.where('cuda', cuda_v)}: cuda.{cuda_v} has no `glibc` fact (the C "
            f"library of its Ubuntu {env.cuda.ubuntu} image); a lock is "
            "solved for it. Add it with its source."
        )
    return glibc
