"""`envbuild check`: does a profile with these overrides resolve (and, with --resolve, does its
whole pinned set co-resolve on the index)."""

from __future__ import annotations

import click

from envbuilder.secret import SecretUrl
from envbuilder.cli import complete
from envbuilder.cli.callbacks import secret_url
from envbuilder.cli.options import Dirs, load_matrix, override_options
from envbuilder.model.resolved import Overrides


@click.command()
@click.argument("profile", shell_complete=complete.profiles)
@click.option(
    "--resolve",
    "online",
    is_flag=True,
    help="Also resolve the whole pinned set as one solution with uv against the index, "
    "for the profile's Python and platform (needs the network and the lock extra).",
)
@click.option(
    "--index-url",
    metavar="URL",
    callback=secret_url,
    help="With --resolve: the PyPI index (default the profile's).",
)
@click.option(
    "--torch-index-url",
    metavar="URL",
    callback=secret_url,
    help="With --resolve: the "
    "PyTorch index for +cuXXX builds (default the profile's; when it does not answer, "
    "PyPI's build of the same torch version is resolved instead, and said so).",
)
@override_options
def check(
    profile: str,
    online: bool,
    index_url: SecretUrl | None,
    torch_index_url: SecretUrl | None,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """Exit 0 when PROFILE (with overrides) is a working combination; else explain, exit 2."""
    from envbuilder.model.resolve import picked_for_driver, resolve

    if online:  # (refused before anything is resolved or probed)
        from envbuilder.tools.uv import uv_bin

        uv_bin("check --resolve")
    m = load_matrix(matrix_dirs)
    env = resolve(m, profile, overrides)
    click.echo(
        f"OK: {env.asked} resolves"
        + (f" on profile {env.profile}'s stack" if env.card else "")
        + f": {env.gpu.name} (CC {env.gpu.compute_capability}), "
        f"CUDA {env.cuda.version}, torch {env.torch.version}+{env.torch.variant}, "
        f"verl {env.verl.version} with the {env.rollout} rollout, {env.dtype}."
    )
    if profile != env.profile:  # (a card's name, or the key in another case)
        from envbuilder.model.names import profile_named

        named = profile_named(m, profile)
        if named and named.why:
            click.echo(f"NOTE: {named.why}")
    picked = picked_for_driver(env, overrides)
    if picked:
        click.echo(f"NOTE: {picked} (as --verl {env.overrides.verl})")
    for w in env.warnings:
        click.echo(f"WARNING: {w}")
    if online:
        from envbuilder.lock.pip import check_co_resolves

        found = check_co_resolves(m, env, index_url, torch_index_url, say=click.echo)
        click.echo(
            f"OK: the whole pinned set co-resolves: {found.packages} packages from {found.pypi}"
            + (f" and {found.torch_index}" if found.torch_index and not found.torch_swapped else "")
            + f" for Python {found.python} on {found.platform}."
        )
