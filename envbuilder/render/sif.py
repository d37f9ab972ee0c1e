"""The rendered folder's `apptainer.def`: the image built by Apptainer alone, from the profile's
CUDA base image and the same install steps as the Dockerfile, for clusters that have Apptainer
and no Docker (`envbuild apptainer` wraps an image Docker built and pushed; this needs none).

`apptainer build PROFILE.sif apptainer.def`, run in the rendered folder: %files copies the
folder's constraints and scripts in, %post makes the venv from the image's Python (from apt only
where the base image lacks it, the version checked as the Dockerfile checks it), installs each
pip step within the lock's constraints (pip, with the Dockerfile's indexes), builds apex and
flash-attn where the profile has them (the base is then the devel image, with nvcc), applies
verl's recorded patches and runs the precision audit; %test is the build's smoke test.
The steps are decided here, as data; the template (templates/apptainer-base.def.j2) prints them.
"""

from __future__ import annotations

from typing import Any

from envbuilder.images import SIDECAR
from envbuilder.model.resolved import ResolvedEnv
from envbuilder.render import steps as S
from envbuilder.render.image import HOME, VENV, runtime_env
from envbuilder.render.plan import InstallPlan
from envbuilder.render.quoting import sh


def _pip(env: ResolvedEnv, plan: InstallPlan, torch: bool) -> str:
    """pip's index flags, as the Dockerfile's step gives them (the PyTorch index first for the
    steps that install within torch's pins)."""
    if plan.torch_index and torch:
        return f"--index-url {sh(plan.torch_index)} --extra-index-url {sh(plan.pypi)}"
    return f"--index-url {sh(plan.pypi)}"


def post_steps(env: ResolvedEnv, plan: InstallPlan) -> list[tuple[str, str]]:
    """(comment, command) for %post: the install's steps (render/steps.py), each as one line."""
    py = f"{VENV}/bin/python"
    out: list[tuple[str, str]] = []
    for step in S.install_steps(env, plan):
        if isinstance(step, S.Venv):
            out += _venv(step.python, py)
        elif isinstance(step, S.PipLayer):
            constraints = " ".join(f"-c {HOME}/{ly.constraints_file}" for ly in step.within)
            torch = any(ly.name == "torch" for ly in step.within)
            reqs = " ".join(sh(r) for r in step.layer.requirements)
            out.append(
                (
                    f"{step.layer.name}: within the lock's constraints of this step and the earlier ones",
                    f"{py} -m pip install {_pip(env, plan, torch)} {constraints} {reqs}",
                )
            )
        elif isinstance(step, S.Compile) and step.component == S.APEX:
            out.append(
                (
                    f"apex {step.version}: compiled against this torch (nvcc {env.cuda.version}, the devel base)",
                    S.compile_shell(env, step, f"{VENV}/bin/pip install"),
                )
            )
        elif isinstance(step, S.Compile) and step.component == S.TRANSFORMER_ENGINE:
            out.append(
                (
                    f"TransformerEngine's PyTorch extension {step.version}: compiled for sm_{step.arch} "
                    "(an sdist only; its dependencies are the Megatron layer's)",
                    S.compile_shell(env, step, f"{py} -m pip install {_pip(env, plan, True)}"),
                )
            )
        elif isinstance(step, S.Compile):
            within = " ".join(f"-c {HOME}/{ly.constraints_file}" for ly in plan.layers)
            out.append(
                (
                    f"flash-attn {step.version}: compiled for sm_{step.arch} (hours without a prebuilt wheel)",
                    S.compile_shell(env, step, f"{py} -m pip install {_pip(env, plan, True)} {within}"),
                )
            )
        elif step.script == S.PATCHES:
            names = ", ".join(p.name for p in env.patches)
            out.append((f"verl's recorded patches ({names})", f"{py} {HOME}/{step.script}"))
        else:
            out.append(("the precision audit: a finding stops the build", f"{py} {HOME}/{step.script}"))
    return out


def _venv(want: str, py: str) -> list[tuple[str, str]]:
    return [
        (
            f"Python {want}: the image's own; from apt only when the base image lacks it",
            "if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then "
            "apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip "
            "python3-dev ca-certificates; fi",
        ),
        ("the venv every step installs into", f"python3 -m venv {VENV}"),
        (
            f"the pins and wheels are for Python {want}: another base Python stops the build",
            f'got="$({py} -c \'import sys; print("%d.%d" % sys.version_info[:2])\')"; '
            f'if [ "$got" != {sh(want)} ]; then echo "envbuild: the base image\'s python3 is Python $got, '
            f'the pins are for {want}" >&2; exit 1; fi',
        ),
    ]


def context(env: ResolvedEnv, plan: InstallPlan, run_script: str) -> dict[str, Any]:
    """What templates/apptainer-base.def.j2 prints."""
    images = env.cuda.images
    base = images["devel"] if env.needs_builder else images["runtime"]
    files = [f"{layer.constraints_file} {HOME}/{layer.constraints_file}" for layer in plan.layers]
    scripts = ["preflight.py", run_script, "audit_precision.py"]
    if env.patches:
        scripts.append("apply_patches.py")
    if env.dataset:
        scripts.append("prepare_gsm8k.py")
    scripts.append(SIDECAR)  # (the data the scripts read, beside them)
    files += [f"{name} {HOME}/{name}" for name in scripts]
    files.append("envbuild.json /etc/envbuild.json")
    return {
        "base": base,
        "files": files,
        "post": post_steps(env, plan),
        # what the Docker image's ENV sets that a run reads, and the run script's allocator default
        "environment": runtime_env(
            env,
            [("PYTORCH_CUDA_ALLOC_CONF", env.cuda_alloc_conf.value)]
            if env.cuda_alloc_conf and env.cuda_alloc_conf.value
            else [],
        ),
        "path": f"{VENV}/bin",
        "test": f"python {HOME}/preflight.py --smoke",
        "run": f"{HOME}/{run_script}",
    }
