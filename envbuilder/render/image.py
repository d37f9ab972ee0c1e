"""What an envbuild image holds and declares, spelled once: where things are in it, the ENV it
sets and the labels it carries. The Dockerfile's steps (dockerfile.py), the Apptainer
definition, the launch files, the run script and the build's smoke test all read these.
Plain constants and three small functions (the image's tag among them): the render path
imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envbuilder.model.resolved import ResolvedEnv

VENV = "/opt/venv"  # the virtual environment every stage installs into
HOME = "/opt/envbuild"  # envbuild's scripts in the image (preflight.py, the run script)
RUN_SCRIPT = "run_ppo_gsm8k.sh"  # the launch script's file name (rendered, then copied to HOME)
PREFLIGHT = f"{HOME}/preflight.py"
RUN_SCRIPT_PATH = f"{HOME}/{RUN_SCRIPT}"
RECORD = "/etc/envbuild.json"  # the image's own resolved environment (its envbuild.json)
SBOM = f"{HOME}/sbom.cdx.json"  # the lock's CycloneDX SBOM (a --locked render's sbom.cdx.json)
SECRETS_SCRIPT = "/usr/local/bin/envbuild-secrets"  # sourced by every RUN that reaches an index
CONTEXT = "/tmp/envbuild"  # where a RUN step finds a file of the build context (bind-mounted)
WHEELS = "/wheels"  # the builder stage's compiled wheels
WHEELHOUSE = "/wheelhouse"  # a wheelhouse in the build context (render --wheelhouse)
LABEL = "io.envbuild."  # the prefix of envbuild's own labels

# The ENV every stage sets: apt asks nothing, pip skips its version check, Python writes no
# bytecode, the venv comes first on PATH.
STAGE_ENV = (
    ("DEBIAN_FRONTEND", "noninteractive"),
    ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
    ("VIRTUAL_ENV", VENV),
    ("PATH", f"{VENV}/bin:$PATH"),
)
# what of it a run reads (PATH is a run's own, with the venv put first)
_RUN_READS = ("VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")


def runtime_env(env: ResolvedEnv, defaults: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """What the runtime image's ENV sets that a run reads, as (name, value), in order: the
    stage's venv, HF_ENDPOINT (a build ARG's default), `defaults` (what a runner without the
    run script needs of its defaults), then TORCHDYNAMO_DISABLE where the GPU is below
    Triton's floor (torch.compile off)."""
    stage = dict(STAGE_ENV)
    out = [(k, stage[k]) for k in _RUN_READS]
    out.append(("HF_ENDPOINT", env.huggingface))
    out += defaults or []
    if not env.features.torch_compile:
        out.append(("TORCHDYNAMO_DISABLE", "1"))
    return out


def labels(env: ResolvedEnv, sif: bool = False) -> list[tuple[str, str]]:
    """envbuild's labels of `env`'s image (`sif`: of an Apptainer SIF made from it), key and
    value, in order. Each consumer adds what only it knows (the spec's sha256, the source)."""
    rows = (  # (key, value, on the Docker image, in the SIF)
        ("version", env.envbuild_version, False, True),
        ("profile", env.profile, True, True),
        ("gpu", env.gpu.key, True, True),
        ("gpu-name", env.gpu.name, False, True),
        ("compute-capability", env.gpu.compute_capability, True, True),
        ("cuda", env.cuda.version, True, True),
        ("torch", f"{env.torch.version}+{env.torch.variant}", True, True),
        ("verl", env.verl.version, True, True),
        ("rollout", env.rollout, True, True),
    )
    return [(LABEL + key, str(value)) for key, value, image, in_sif in rows if (in_sif if sif else image)]


def default_tag(env: ResolvedEnv, d: Mapping[str, object] | None = None) -> str:
    """envbuild/<profile or card asked for>:<12 hex of the upstream spec>: the same image whichever mirror,
    machine or builder made it (`envbuild build` names images the same way). The lock's pins and
    a mirror are left out of the spec hashed: a rendered folder's envbuild.json (which has them)
    names the image `envbuild build PROFILE` names."""
    import hashlib
    import json

    d = dict(d if d is not None else env.to_dict(), constraints=None)  # (d: env.saved_dict(...), if at hand)
    d.pop("mirror", None)
    spec = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return f"envbuild/{env.asked}:{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
