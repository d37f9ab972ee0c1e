"""`envbuild sbom`: a profile's CycloneDX 1.6 SBOM, from its lock (the file a locked image
carries at /opt/envbuild/sbom.cdx.json)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import click

from envbuilder.cli import complete

from envbuilder.cli.callbacks import AbsPath, file_out, not_empty
from envbuilder.cli.options import Dirs, load_matrix, override_options, say
from envbuilder.model.resolved import Overrides


@click.command()
@click.argument("profile", shell_complete=complete.profiles)
@click.option(
    "-o",
    "--out",
    type=AbsPath(dir_okay=False),
    callback=file_out,
    metavar="FILE",
    help="Write the SBOM here (default: standard output).",
)
@click.option(
    "--lock-dir",
    type=AbsPath(),
    callback=not_empty,
    metavar="DIR",
    help="The lock: DIR/<profile>/ as `envbuild lock -o DIR` writes it, or DIR itself when "
    "it is the lock (default lockfiles/<profile>, else the one shipped with envbuild), as "
    "`render --locked DIR` reads it.",
)
@click.option("--force", is_flag=True, help="Replace -o FILE even when it is not an SBOM envbuild wrote.")
@click.option(
    "--require-complete",
    is_flag=True,
    help="Refuse a lock that does not pin every part (conda, images, sources) instead of "
    "writing an SBOM that declares them missing.",
)
@override_options
def sbom(
    profile: str,
    out: str | None,
    lock_dir: str | None,
    force: bool,
    require_complete: bool,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """Write PROFILE's CycloneDX 1.6 SBOM (JSON) from its lock: every pip package (version,
    purl, sha256), the conda packages, the base images by digest, apex's and flash-attn's
    sources, and the patches applied to verl with their reasons. A lock that pins only some
    parts (the shipped pip-only locks) gives an SBOM of those, marked incomplete and naming the
    rest (--require-complete refuses it); a missing, stale or damaged lock is refused."""
    from envbuilder.lock.lockfile import sbom_of
    from envbuilder.model.resolve import resolve
    from envbuilder.lock.locate import lock_used, named_lock

    env = resolve(load_matrix(matrix_dirs), profile, overrides)
    # the lock found as `render --locked DIR` finds it (./lockfiles, else the shipped one)
    where = named_lock(env, lock_dir if lock_dir is not None else "-")
    assert where is not None
    text, missing = sbom_of(env, where, require_complete)
    say(f"{env.name}: the lock {lock_used(where)}")
    if missing:
        say(
            f"envbuild sbom: the lock in {where} does not pin {', '.join(missing)}: the SBOM "
            "declares them not locked (CycloneDX compositions: incomplete)"
        )
    dest = Path(out) if out is not None else None
    if dest is None:
        click.echo(text, nl=False)
        return
    from envbuilder.render.outdir import write_owned_file

    mark = "an SBOM envbuild wrote names envbuild among its tools"
    write_owned_file(dest, text, _ours, force=force, what="SBOM file", mark=mark)
    click.echo(f"wrote the SBOM of {env.name} ({len(text.encode()):,} bytes, sha256 {_sha(text)}) -> {dest}")


def _sha(text: str) -> str:
    from envbuilder.lock.sbom import sha256

    return sha256(text)


def _ours(path: Path) -> bool:
    """Whether `path` is a CycloneDX SBOM envbuild wrote (its tools name envbuild)."""
    from envbuilder.model.readers import read

    try:
        doc = _object(read(path, "SBOM"))
        tools = _object(_object(doc["metadata"])["tools"])["components"]
        if doc.get("bomFormat") != "CycloneDX" or not isinstance(tools, list):
            return False
        return any(_object(t).get("name") == "envbuild" for t in cast("list[object]", tools))
    except Exception:  # anything else is not ours
        return False


def _object(value: object) -> dict[str, object]:
    """A JSON object (its keys are text); TypeError for anything else."""
    if not isinstance(value, dict):
        raise TypeError(f"not a JSON object: {type(value).__name__}")
    return cast("dict[str, object]", value)
