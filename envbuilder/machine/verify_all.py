"""Verify several profiles one after another, and the report's table: what `envbuild verify`
runs, callable without click (the command line parses, calls `verify_profiles`, prints `table`).

    reports = verify_profiles(m, ["p40"], Overrides(), VerifyFlags(), say=print)
    print(table(reports))
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from envbuilder.secret import SecretUrl
from envbuilder.errors import UserError
from envbuilder.record import Record

if TYPE_CHECKING:
    from envbuilder.machine.verify_report import VerifyReport
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import Overrides
    from envbuilder.tools.python import Interpreter


class VerifyFlags(Record):
    """What the command line says about every profile's run (machine.verify.Options, less
    `keep`, which is one folder per profile here)."""

    index_url: SecretUrl | None = None
    torch_index_url: SecretUrl | None = None
    keep: Path | None = None  # DIR, or DIR/<profile> with several profiles
    skip_compose: bool = False


def verify_profiles(
    m: Matrix,
    names: list[str],
    overrides: Overrides | None,
    flags: VerifyFlags,
    say: Callable[[str], None] = print,
) -> list[VerifyReport]:
    """Each named profile resolved, its keep folder and its Python found (all bad input before
    anything is downloaded), then installed and checked (machine.verify.verify); one report
    dict each, with the GPU tier's record of this very render under "gpu_step"."""
    from envbuilder.machine.verify import Options, check_keep, find_python, verify
    from envbuilder.model import gpu_tier
    from envbuilder.model.profiles import resolve_all
    from envbuilder.context.prepare import prepare
    from envbuilder.render.files import render_files

    envs = resolve_all(m, names, overrides, "nothing was installed", say=say)
    keeps: dict[str, Path] = {}
    for env in envs:
        if flags.keep:
            keeps[env.name] = Path(flags.keep) / env.name if len(envs) > 1 else Path(flags.keep)
            check_keep(keeps[env.name])
    interps: dict[str, Interpreter] = {}
    for env in envs:
        py = env.python
        found = interps.get(py) or find_python(py)
        if found is not None:
            interps[py] = found
        else:
            raise UserError(
                f"No Python {py} interpreter on this machine for profile {env.name} "
                f"(looked in pyenv's versions, on PATH for python{py}, and with uv, "
                "which is not allowed to download one); install Python "
                f"{py} with venv and ensurepip (e.g. `pyenv install {py}`) and run "
                "again."
            )
    reports: list[VerifyReport] = []
    for env in envs:
        opts = Options(
            index_url=flags.index_url,
            torch_index_url=flags.torch_index_url,
            keep=keeps.get(env.name),
            skip_compose=flags.skip_compose,
            say=say,
        )
        ctx = prepare(env)  # (the pins of the lock whose plan this is, as render takes them)
        report = verify(ctx, interps[env.python], opts).as_dict()
        # the GPU tier is not run here (no GPU): what its records say of this very render
        report["gpu_step"] = gpu_tier.status(env, render_files(ctx), m.models)
        reports.append(report)
    return reports


def row(r: VerifyReport) -> tuple[str, ...]:
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
    checks = [(x["layer"], check) for x in layers if (check := x.get("pip_check"))]
    bad = [layer for layer, check in checks if not check["ok"]]
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


def table(reports: Sequence[VerifyReport]) -> str:
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
    ran = [r["profile"] for r in reports if r.get("gpu_step")]
    # (the claim only under the rows it is true of: a row that says `not run` ran nothing)
    lines.append(
        (
            f"GPU STEP: for {', '.join(ran)}, verl's workers ran a PPO step on a GPU with this very "
            "configuration (bench/gpu_step.py; its records ship with envbuild)."
            if ran
            else "GPU STEP: not run for these profiles (no record of bench/gpu_step.py matches them)."
        )
        + " Only that tier proves a training step; the columns before it prove installs, pins, "
        "patches and configs."
    )
    return "\n".join(lines)
