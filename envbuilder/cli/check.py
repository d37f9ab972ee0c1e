"""`envbuild check`: does a profile with these overrides resolve (and, with --resolve, does its
whole pinned set co-resolve on the index)."""

from __future__ import annotations

import click

from envbuilder.cli import complete
from envbuilder.cli.callbacks import no_empty_url
from envbuilder.cli.options import load_matrix, override_options


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
    callback=no_empty_url,
    help="With --resolve: the PyPI index (default the profile's).",
)
@click.option(
    "--torch-index-url",
    metavar="URL",
    callback=no_empty_url,
    help="With --resolve: the "
    "PyTorch index for +cuXXX builds (default the profile's; when it does not answer, "
    "PyPI's build of the same torch version is resolved instead, and said so).",
)
@override_options
def check(profile, online, index_url, torch_index_url, overrides, matrix_dirs):
    """Exit 0 when PROFILE (with overrides) is a working combination; else explain, exit 2."""
    from envbuilder.model.resolve import resolve

    m = load_matrix(matrix_dirs)
    env = resolve(m, profile, overrides)
    click.echo(
        f"OK: {profile} resolves: {env.gpu.name} (CC {env.gpu.compute_capability}), "
        f"CUDA {env.cuda.version}, torch {env.torch.version}+{env.torch.variant}, "
        f"verl {env.verl.version} with the {env.rollout} rollout, {env.dtype}."
    )
    for w in env.warnings:
        click.echo(f"WARNING: {w}")
    if online:
        from envbuilder.lock import target_glibc
        from envbuilder.lock.pip import co_resolve, index_answers, python_platform
        from envbuilder.render.plan import torch_swap

        glibc = target_glibc(m, env)
        pypi = index_url or env.indexes.pypi
        torch_index = torch_index_url or env.indexes.torch
        swap = bool(torch_index) and not index_answers(torch_index)
        if swap:
            click.echo(
                f"note: the PyTorch index {torch_index} does not answer; resolving torch "
                f"{torch_swap(env)} in its place: the rest of the set is the profile's."
            )
        found = co_resolve(env, glibc, pypi, torch_index, swap)
        click.echo(
            f"OK: the whole pinned set co-resolves: {len(found)} packages from {pypi}"
            + (f" and {torch_index}" if torch_index and not swap else "")
            + f" for Python {env.python} on {python_platform(glibc)}."
        )
