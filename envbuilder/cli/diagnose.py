"""`envbuild diagnose`: read an environment envbuild did not build (or did), without running
its code, say what is wrong on this machine with a fix for each, and name the nearest profile
(envbuilder/machine/diagnose.py). Exit 0 clean, 1 findings, 2 bad input."""

from __future__ import annotations

import json
from pathlib import Path

import click

from envbuilder.cli import complete
from envbuilder.cli.machine import probes_for
from envbuilder.cli.options import Dirs, load_matrix, matrix_dir_option


@click.command()
@click.option(
    "--python",
    "python",
    type=click.Path(path_type=Path, dir_okay=False),
    metavar="PATH",
    help="The environment's interpreter (PREFIX/bin/python); it is not run.",
)
@click.option(
    "--prefix",
    type=click.Path(path_type=Path, file_okay=False),
    metavar="DIR",
    help="The environment's folder (a venv or a conda prefix).",
)
@click.option(
    "--profile",
    shell_complete=complete.profiles,
    metavar="NAME",
    help="Judge against this profile (default: the one envbuild installed there, else the one "
    "for this machine's GPU that needs the fewest changes).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@matrix_dir_option
@click.pass_context
def diagnose(
    ctx: click.Context,
    python: Path | None,
    prefix: Path | None,
    profile: str | None,
    as_json: bool,
    matrix_dirs: Dirs,
) -> None:
    """What is wrong with an environment on this machine, the fix for each finding, and the
    nearest profile. Reads METADATA, torch's version.py and the extensions' ELF files; runs
    nothing of the environment. Exit 0 clean, 1 findings, 2 bad input.

    \b
    Examples:
      envbuild diagnose --python ~/venvs/rl/bin/python
      envbuild diagnose --prefix /opt/conda/envs/verl --profile p40 --json
    """
    from envbuilder.errors import ActionError, UserError
    from envbuilder.machine.detect import detect
    from envbuilder.machine.diagnose import diagnose as judge, report_json, report_lines
    from envbuilder.machine.target import prefix_of, read_target
    from envbuilder.model.names import profile_named

    if (python is None) == (prefix is None):
        raise UserError(
            "diagnose reads one environment: pass either --python PATH (its bin/python) or "
            "--prefix DIR (its folder), not both and not neither."
        )
    m = load_matrix(matrix_dirs)
    if profile is not None:
        named = profile_named(m, profile)
        if named is None:
            raise UserError(f"--profile {profile!r} is no profile of the matrix; `envbuild list` shows them.")
        profile = named.profile
    where = prefix_of(python) if python is not None else Path(prefix or ".").absolute()
    target = read_target(where)
    probes = probes_for(ctx, "diagnose")
    machine = detect(m, probes.nvml, probes.run)
    d = judge(m, target, machine, profile)
    if as_json:
        click.echo(json.dumps(report_json(d), indent=2))
    else:
        for line in report_lines(d):
            click.echo(line)
    if d.findings:
        raise ActionError(
            f"{len(d.findings)} finding(s) in {target.where}: "
            + ", ".join(dict.fromkeys(f.rule for f in d.findings))
            + "; each names its fix above."
        )
