"""What `envbuild wheelhouse` checks before it downloads anything: which lock a profile exports
(the project's, else the shipped one), whether that lock carries what the profile installs (a
torch swapped for PyPI's, a part it lacks), and the URL maps a mirror set gives."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from envbuilder.errors import UserError

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix


def _table(value: object) -> Mapping[str, object]:
    """A mapping of the matrix's (checked by its schema), or {} where there is none."""
    return value if isinstance(value, dict) else {}


def _texts(value: object) -> list[str]:
    """A list of strings of the matrix's (checked by its schema), or [] where there is none."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def url_map_for_mirror(body: Mapping[str, object]) -> list[tuple[str, str]]:
    """Prefix rewrites that send a lock's upstream URLs through a mirror set's endpoints."""
    out = []
    for endpoint in _texts(body.get("pytorch")):
        if "{variant}" in endpoint:
            out.append(("https://download.pytorch.org/whl/", endpoint.split("{variant}")[0]))
    for endpoint in _texts(body.get("pypi")):
        if endpoint.rstrip("/").endswith("/simple"):  # PEP 503 mirrors keep PyPI's /packages/ paths
            out.append(
                (
                    "https://files.pythonhosted.org/packages/",
                    endpoint.rstrip("/")[: -len("simple")] + "packages/",
                )
            )
    for endpoint in _texts(body.get("github")):  # GitHub files (apex archive, flash-attn wheels)
        out.append(("https://github.com/", endpoint.rstrip("/") + "/"))
    for channel, endpoints in _table(body.get("conda")).items():
        for endpoint in _texts(endpoints):
            out.append((f"https://conda.anaconda.org/{channel}/", endpoint.rstrip("/") + "/"))
    return [(a, b) for a, b in out if a != b]


def url_maps(values: tuple[str, ...]) -> list[tuple[str, str]]:
    out = []
    for v in values:
        frm, sep, to = v.partition("=")
        if not sep or not frm or not to:
            raise UserError(f"--url-map {v!r} is not FROM=TO (two URL prefixes).")
        out.append((frm, to))
    return out


def lock_shortfalls(
    m: Matrix, profile: str, lock_dir: Path, accept_pypi_torch: bool, accept_partial: bool
) -> list[str]:
    """Why exporting this lock would carry something other than what the profile installs: a
    torch swapped for PyPI's build (what that means: its CUDA and driver floor), a part the
    profile needs and the lock lacks. Empty when nothing is short, or the user accepted it."""
    from envbuilder.lock.lockfile import parts_for, pip_sha256, read_meta, recorded_pip_sha256
    from envbuilder.model.components.registry import built
    from envbuilder.model.resolve import resolve

    try:
        meta = read_meta(Path(lock_dir))  # (the one reader of lock.json)
    except (OSError, ValueError, UserError):
        return []  # no readable lock: export's own check names it
    if meta is None:
        return []
    import re

    out = []
    swapped = meta.torch_swapped
    if swapped and not accept_pypi_torch:
        asked = re.match(r"([0-9][0-9.]*)\+(cu\d+)", str(swapped))
        t = _table(m.torch.get(asked.group(1)) if asked else None)
        builds = _table(t.get("builds"))
        mine = _table(builds.get(asked.group(2))) if asked else {}
        pypi = _table(builds.get(str(t.get("pypi_default") or "")))
        cuda = pypi.get("cuda")
        what = ""
        if asked is not None and mine and isinstance(cuda, str) and cuda in m.cuda:
            c = _table(m.cuda[cuda])
            what = (
                f" PyPI's torch {asked.group(1)} is its CUDA {cuda} build (the "
                f"nvidia-*-cu{cuda.split('.')[0]} runtime; driver >= "
                f"{c.get('compat_driver') or c.get('min_driver')}), not the {asked.group(2)} build "
                f"for CUDA {mine.get('cuda')} that {profile} is made for."
            )
        out.append(
            f"{lock_dir}: torch is a swap ({swapped}): the PyTorch index was out of reach "
            f"when it was locked.{what} Fix: re-lock where the PyTorch index or its mirror "
            f"answers (`envbuild lock {profile} --torch-index-url URL`, or --mirror NAME), "
            "or pass --accept-pypi-torch to export it as it is."
        )
    if profile not in m.profiles:
        return out
    env = resolve(m, profile)
    if recorded_pip_sha256(meta) != pip_sha256(env):
        return out  # a lock of a variant (lock --without apex ...): its parts are its own
    missing = [p for p in parts_for(env, ("conda", "sources")) if p not in meta.parts]
    if missing and not accept_partial:
        names = {
            "conda": "conda part (conda-lock.yml)",
            "sources": "source archive of " + " or ".join(c.name for c in built(env)),
        }
        reach = {
            "conda": "the conda channels (or --channel a mirror)",
            "sources": "GitHub (or --github-url a mirror)",
        }
        out.append(
            f"{lock_dir}: no {' and no '.join(names[p] for p in missing)}: it was made with "
            f"--only {','.join(meta.parts)}, so the far side would have to "
            f"fetch {'them' if len(missing) > 1 else 'it'}. Fix: `envbuild lock {profile}` "
            f"where {' and '.join(reach[p] for p in missing)} can be reached, or pass "
            "--accept-partial."
        )
    return out


def known_profiles_or_locks(m: Matrix, profiles: Iterable[str]) -> None:
    """Each name is a profile of the matrix or has a lock under lockfiles/; otherwise the
    refusal suggests the profile it most likely means (a name without a lock is most often a
    typo of a profile)."""
    from envbuilder.errors import UserError
    from envbuilder.paths import LOCK_ROOT

    from envbuilder.lock.locate import find_lock

    for p in profiles:
        if p not in m.profiles and not (LOCK_ROOT / p).is_dir() and not find_lock(p).is_dir():
            from envbuilder.model.names import suggest

            raise UserError(
                f"Unknown profile {p!r}; {suggest(p, list(m.profiles))}known: "
                f"{', '.join(m.profiles)}. Or pass --lock-dir for a lock elsewhere."
            )
