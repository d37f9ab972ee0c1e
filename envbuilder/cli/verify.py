"""`envbuild verify`: install profiles' real pins in a throwaway venv and check them (loads only
when used: `render` never imports this)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from envbuilder.secret import SecretUrl
from envbuilder.cli import complete
from envbuilder.cli.callbacks import AbsPath, index_url
from envbuilder.cli.options import Dirs, load_matrix, override_options, say
from envbuilder.errors import ActionError, UserError
from envbuilder.model.resolved import Overrides


@click.command()
@click.argument("profiles", nargs=-1, shell_complete=complete.profiles)
@click.option("--all", "all_", is_flag=True, help="Verify every profile, one after another.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
@click.option(
    "--keep",
    type=AbsPath(path_type=Path),
    metavar="DIR",
    help="Keep the venv in DIR (a new or empty directory; with several profiles, "
    "DIR/<profile>) instead of removing it.",
)
@click.option(
    "--index-url",
    metavar="URL",
    callback=index_url,
    help="Python package index (default: the profile's, PyPI).",
)
@click.option(
    "--torch-index-url",
    metavar="URL",
    callback=index_url,
    help="PyTorch index for +cuXXX builds (default: the profile's). When it does not "
    "answer, the same versions come from the Python index, and the report says so.",
)
@click.option(
    "--skip-compose", is_flag=True, help="Do not compose the run script's overrides with verl's Hydra config."
)
@click.option(
    "--platform",
    metavar="OS/ARCH",
    help="linux/arm64 (GH200, GB200): install the aarch64 wheels of the compiled core within the "
    "lock and import them under QEMU, from an x86_64 machine (needs --rootfs).",
)
@click.option(
    "--rootfs",
    type=AbsPath(path_type=Path, file_okay=False),
    metavar="DIR",
    help="With --platform: a Debian arm64 root with python3 (debootstrap --arch=arm64).",
)
@override_options
def verify(
    profiles: tuple[str, ...],
    all_: bool,
    as_json: bool,
    keep: Path | None,
    index_url: SecretUrl | None,
    torch_index_url: SecretUrl | None,
    skip_compose: bool,
    platform: str | None,
    rootfs: Path | None,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """Install PROFILE's real pinned set in a throwaway venv and check it: each Dockerfile layer
    with pip check after it, the source patches, an import of every module of the training path
    (no GPU, no network), and the run script's overrides composed with verl's own Hydra config.

    Downloads several GB per profile (torch, its CUDA libraries, vLLM) and takes minutes; run it
    before changing a profile's pins. Exit 0 when every step passes, 1 when one fails."""
    from envbuilder.machine.verify_all import VerifyFlags, table, verify_profiles

    if bool(profiles) == bool(all_):
        raise UserError("Name one or more profiles, or --all (not both). `envbuild list` shows them.")
    if platform or rootfs:
        return emulated(profiles, platform, rootfs, as_json, index_url, overrides, matrix_dirs)
    from envbuilder.tools.uv import uv_bin

    uv_bin("verify")  # (before any venv is made or index probed)
    m = load_matrix(matrix_dirs)
    names = list(m.profiles) if all_ else list(dict.fromkeys(profiles))
    flags = VerifyFlags(index_url, torch_index_url, keep, skip_compose)
    reports = verify_profiles(m, names, overrides, flags, say=say)
    ok = all(r["ok"] for r in reports)
    if as_json:
        click.echo(json.dumps({"ok": ok, "profiles": reports}, indent=2))
    else:
        click.echo(table(reports))
    if not ok:
        bad = [r["profile"] for r in reports if not r["ok"]]
        raise ActionError(
            f"{len(bad)} of {len(reports)} profile(s) failed verification "
            f"({', '.join(bad)}); the report above says which step and why."
        )


def emulated(
    profiles: tuple[str, ...],
    platform: str | None,
    rootfs: Path | None,
    as_json: bool,
    index_url: SecretUrl | None,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """--platform linux/arm64 --rootfs DIR: machine.emulated's check of one Grace profile."""
    from envbuilder.machine.emulated import check_inputs, verify_emulated
    from envbuilder.model.resolve import resolve

    if not (platform and rootfs) or len(profiles) != 1:
        raise UserError(
            "--platform and --rootfs go together, with one profile: verify gh200 --platform linux/arm64 --rootfs DIR."
        )
    env = resolve(load_matrix(matrix_dirs), profiles[0], overrides)
    check_inputs(env, platform, rootfs)
    report = verify_emulated(env, rootfs, say=say, index_url=index_url)
    click.echo(
        json.dumps(report, indent=2)
        if as_json
        else f"{env.name}: aarch64 under QEMU: {'ok' if report['ok'] else 'FAILED'}"
    )
    if not report["ok"]:
        raise ActionError(
            f"{env.name}: the aarch64 check under QEMU failed (the report above says which part)."
        )
