"""`envbuild detect` and `envbuild doctor`: what this machine has, and whether it is ready.

Both read the machine through probes (NVML, nvidia-smi, the docker SDK) passed in click's context
object, so tests hand them recorded answers; by default the real ones are used.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from envbuilder.cli import complete

from envbuilder.cli.options import Dirs, load_matrix, matrix_dir_option, override_options, passed_probes
from envbuilder.model.resolved import Overrides

if TYPE_CHECKING:
    from envbuilder.machine.doctor import Probes


# what the real probes import: NVML's module for the GPUs; the docker SDK and requests for doctor's
# engine, registry and network checks (pyproject's `actions` extra)
_NEEDS = {"detect": ("pynvml",), "diagnose": ("pynvml",), "doctor": ("pynvml", "docker", "requests")}


def _probes(ctx: click.Context) -> Probes:
    return probes_for(ctx, ctx.info_name or "doctor")


def probes_for(ctx: click.Context, command: str) -> Probes:
    """The probes a test passed, else the real ones, once the extra they import is installed
    (exit 2 naming it, not a machine reported as having no GPU)."""
    from envbuilder.errors import need_extra
    from envbuilder.machine.doctor import Probes

    probes = passed_probes(ctx)
    if probes is not None:
        return probes
    need_extra(command, "actions", _NEEDS.get(command, _NEEDS["doctor"]))
    return Probes()


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@matrix_dir_option
@click.pass_context
def detect(ctx: click.Context, as_json: bool, matrix_dirs: Dirs) -> None:
    """GPUs, driver, the newest CUDA it supports, and the profile that fits them best, with why."""
    from envbuilder.machine.detect import detect as detect_machine
    from envbuilder.machine.detect import machine_json, recommend, recommendation_json, report_lines

    probes = _probes(ctx)
    m = load_matrix(matrix_dirs)
    machine = detect_machine(m, probes.nvml, probes.run)
    rec = recommend(m, machine)
    if as_json:
        click.echo(
            json.dumps({**machine_json(machine), "recommendation": recommendation_json(rec)}, indent=2)
        )
        return
    for line in report_lines(machine, rec):
        click.echo(line)


@click.command()
@click.argument("profile", required=False, shell_complete=complete.profiles)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--mirror",
    shell_complete=complete.mirror_sets,
    metavar="NAME",
    help="Also check this mirror set's endpoints.",
)
@click.option(
    "--conda",
    "conda_required",
    is_flag=True,
    help="Fail (not only warn) when no conda/mamba/micromamba is on PATH.",
)
@override_options
@click.pass_context
def doctor(
    ctx: click.Context,
    profile: str | None,
    as_json: bool,
    mirror: str | None,
    conda_required: bool,
    overrides: Overrides,
    matrix_dirs: Dirs,
) -> None:
    """Is this machine ready to build and run PROFILE? Each check ✓/✗ with the fix; exit 1 if not.
    Without PROFILE: the one `envbuild detect` picks for this machine."""
    from envbuilder.machine.doctor import doctor as run_doctor, report_json
    from envbuilder.errors import ActionError

    probes = _probes(ctx)
    m = load_matrix(matrix_dirs)
    if profile is None:
        from envbuilder.cli.options import implied_profile

        profile = implied_profile(m, "doctor", probes)
    report = run_doctor(m, profile, overrides, probes, mirror, conda_required)
    failed = [c for c in report.checks if c.status == "fail"]
    if as_json:
        click.echo(json.dumps(report_json(report), indent=2))
    else:
        for c in report.checks:
            click.echo("\n".join(c.lines()))
        click.echo(("READY" if report.ready else "NOT READY") + f": profile {profile} on this machine")
    if failed:
        raise ActionError(
            f"{len(failed)} of {len(report.checks)} checks failed for {profile}: "
            f"{', '.join(c.name for c in failed)}."
        )
