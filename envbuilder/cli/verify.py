"""`envbuild verify`: install profiles' real pins in a throwaway venv and check them (loads only
when used: `render` never imports this)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from envbuilder.cli import complete

from envbuilder.model import gpu_tier
from envbuilder.cli.options import load_matrix, override_options, resolve_all
from envbuilder.errors import ActionError, UserError
from envbuilder.render.files import render_files

_URL = re.compile(r"^(https?://[^\s/]+(/\S*)?|file:///\S*)$")


def _url(ctx, param, value):
    if value is not None and not _URL.match(value):
        raise click.BadParameter(
            f"{value!r} is not an index URL (http://, https:// or file:///). "
            "Pass the URL of a PEP 503 simple index, e.g. "
            "https://pypi.org/simple."
        )
    return value


def row(r: dict) -> tuple[str, ...]:
    from envbuilder.machine.verify import fmt_seconds

    layers = [x for x in r["layers"] if not x.get("empty")]
    done = [x for x in layers if x["ok"]]
    if not layers:
        install = "-"
    else:
        install = f"{len(done)}/{len(layers)} layers"
        failed = [
            x["layer"] for x in layers if not x["ok"] and not (x.get("error") or "").startswith("not run")
        ]
        if failed:
            install += f" ({failed[0]} failed)"
    checks = [x for x in layers if x.get("pip_check")]
    bad = [x["layer"] for x in checks if not x["pip_check"]["ok"]]
    pip_check = "-" if not checks else (f"fails after {bad[0]}" if bad else "clean")
    p = r["patches"]
    patches = "-" if p is None else (f"{len(p['names'])} applied" if p["ok"] else "failed")
    a = r.get("audit")
    audit = "-" if a is None else ("clean" if a["ok"] else "FAILED")
    if r["imports"]:
        imports = f"{sum(i['ok'] for i in r['imports'])}/{len(r['imports'])}"
    else:
        imports = "-"
    c = r["compose"]
    if c is None:
        compose = "-"
    elif c.get("skipped"):
        compose = "skipped"
    elif c["ok"]:
        compose = f"{c['checked']}/{c['checked']} accepted"
    elif c["checked"]:
        compose = f"{c['checked'] - len(c['mismatches'])}/{c['checked']} hold"
    else:
        compose = "rejected"
    return (
        r["profile"],
        r["python"],
        install,
        pip_check,
        patches,
        audit,
        imports,
        compose,
        r.get("gpu_step") or "not run",
        fmt_seconds(r["seconds"]),
        "ok" if r["ok"] else "FAILED",
    )


def table(reports: list[dict]) -> str:
    header = (
        "PROFILE",
        "PYTHON",
        "INSTALL",
        "PIP CHECK",
        "PATCHES",
        "AUDIT",
        "IMPORTS",
        "OVERRIDES",
        "GPU STEP",
        "TIME",
        "RESULT",
    )
    rows = [header] + [row(r) for r in reports]
    widths = [max(len(x[i]) for x in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in rows]
    for r in reports:
        name = r["profile"]
        if r["torch_swapped"]:
            lines.append(f"{name}: torch {r['torch_swapped']}")
        if r.get("libcuda") and r["libcuda"] != "the host's NVIDIA driver":
            lines.append(f"{name}: libcuda: {r['libcuda']}")
        for n in r["not_installed"]:
            mods = f" (imports {', '.join(n['modules'])} not checked)" if n["modules"] else ""
            lines.append(f"{name}: not installed here: {n['component']} {n['version']}{mods}: {n['why']}")
        for f in r["failures"]:
            lines.append(f"{name}: FAILED {f}")
        if r["venv"]:
            lines.append(f"{name}: venv kept at {r['venv']}")
    lines.append(
        "GPU STEP: verl's workers ran a PPO step on a GPU with this very configuration "
        "(bench/gpu_step.py; its records ship with envbuild). Only that tier proves a "
        "training step; the columns before it prove installs, pins, patches and configs."
    )
    return "\n".join(lines)


@click.command()
@click.argument("profiles", nargs=-1, shell_complete=complete.profiles)
@click.option("--all", "all_", is_flag=True, help="Verify every profile, one after another.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report on stdout.")
@click.option(
    "--keep",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Keep the venv in DIR (a new or empty directory; with several profiles, "
    "DIR/<profile>) instead of removing it.",
)
@click.option(
    "--index-url", metavar="URL", callback=_url, help="Python package index (default: the profile's, PyPI)."
)
@click.option(
    "--torch-index-url",
    metavar="URL",
    callback=_url,
    help="PyTorch index for +cuXXX builds (default: the profile's). When it does not "
    "answer, the same versions come from the Python index, and the report says so.",
)
@click.option(
    "--skip-compose", is_flag=True, help="Do not compose the run script's overrides with verl's Hydra config."
)
@override_options
def verify(profiles, all_, as_json, keep, index_url, torch_index_url, skip_compose, overrides, matrix_dirs):
    """Install PROFILE's real pinned set in a throwaway venv and check it: each Dockerfile layer
    with pip check after it, the source patches, an import of every module of the training path
    (no GPU, no network), and the run script's overrides composed with verl's own Hydra config.

    Downloads several GB per profile (torch, its CUDA libraries, vLLM) and takes minutes; run it
    before changing a profile's pins. Exit 0 when every step passes, 1 when one fails."""
    from envbuilder.machine.verify import Options, check_keep, find_python, verify as run_verify

    if bool(profiles) == bool(all_):
        raise UserError("Name one or more profiles, or --all (not both). `envbuild list` shows them.")
    m = load_matrix(matrix_dirs)
    names = list(m.profiles) if all_ else list(dict.fromkeys(profiles))
    # all bad input is found before anything is downloaded
    envs = resolve_all(m, names, overrides, "nothing was installed")
    keeps = {}
    for env in envs:
        if keep:
            keeps[env.name] = Path(keep) / env.name if len(envs) > 1 else Path(keep)
            check_keep(keeps[env.name])
    interps = {}
    for env in envs:
        py = env.python
        if py not in interps:
            interps[py] = find_python(py)
        if interps[py] is None:
            raise UserError(
                f"No Python {py} interpreter on this machine for profile {env.name} "
                f"(looked in pyenv's versions, on PATH for python{py}, and with uv, "
                "which is not allowed to download one); install Python "
                f"{py} with venv and ensurepip (e.g. `pyenv install {py}`) and run "
                "again."
            )

    def say(line: str) -> None:
        click.echo(line, err=True)

    reports = []
    for env in envs:
        opts = Options(
            index_url=index_url,
            torch_index_url=torch_index_url,
            keep=keeps.get(env.name),
            skip_compose=skip_compose,
            say=say,
        )
        report = run_verify(env, interps[env.python], opts).as_dict()
        # the GPU tier is not run here (no GPU): what its records say of this very render
        report["gpu_step"] = gpu_tier.status(env, render_files(env), m.models)
        reports.append(report)
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
