"""apex as one building block: which apex a profile gets, what refuses it, and how it is built.

NVIDIA's apex is built from a source archive (GitHub, through a mirror set's `github` prefix, or
the wheelhouse's copy) with its C++ and CUDA extensions, for the card's one arch
(TORCH_CUDA_ARCH_LIST), against the torch installed before it. Its setup.py refuses an nvcc
whose CUDA is not torch.version.cuda (`nvcc_problem`). A release asks for the extensions either
through variables (install: env) or setup.py's build options (install: config_settings): the
argv (`build_argv`) every route runs is made here once, and the Dockerfile's builder, the
Apptainer definition, `envbuild install`, requirements.txt, environment.yml, pixi.toml and
preflight's record print or run it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envbuilder.model import resolved as R
from envbuilder.model.components import Refusal

if TYPE_CHECKING:
    from envbuilder.model.entries import ApexRelease, ApexSection
    from envbuilder.model.resolved import Apex

NAME = "apex"  # as --with/--without take it (registry.py)


def record(section: ApexSection, version: str, rec: ApexRelease, cc: str) -> R.Apex:
    """The resolved apex of `version` (its release record `rec` of extensions.yaml's `apex`) for
    a card of compute capability `cc`."""
    return R.Apex(
        version=version,
        ref=rec["ref"],
        install=rec["install"],
        url=section["source_url"].format(ref=rec["ref"]),
        arch_list=cc,
        modules=tuple(section["training_path"]["modules"]),
    )


def nvcc_problem(section: ApexSection, torch_cuda: str, image_cuda: str) -> Refusal | None:
    """The refusal when the image's nvcc cannot build apex for this torch; None when it can."""
    if section["nvcc_must_match_torch_cuda"] and torch_cuda != image_cuda:
        return Refusal(
            "apex-nvcc",
            f"apex needs nvcc == torch.version.cuda, but the image's nvcc is {image_cuda} and torch "
            f"is built for {torch_cuda}",
            "apex's setup.py refuses a CUDA version mismatch",
            f"use --cuda {torch_cuda} or --without apex",
            hard=True,
        )
    return None


def build_env(apex: Apex) -> list[str]:
    """The variables of apex's build: the card's arch, and the extensions where the release reads
    them from the environment (install: env)."""
    out = [f"TORCH_CUDA_ARCH_LIST={apex.arch_list}"]
    if apex.install == "env":
        out += ["APEX_CPP_EXT=1", "APEX_CUDA_EXT=1"]
    return out


def build_options(apex: Apex) -> list[str]:
    """pip's arguments that ask setup.py for the extensions (install: config_settings), as argv."""
    if apex.install == "env":
        return []
    return [
        "--config-settings",
        "--build-option=--cpp_ext",
        "--config-settings",
        "--build-option=--cuda_ext",
    ]


def build_argv(apex: Apex, pip: list[str], requirement: str) -> list[str]:
    """`env VARS... PIP... --no-build-isolation OPTIONS... REQUIREMENT` as argv: `pip` is the
    installer's words (["python", "-m", "pip", "install", "-v"], or `pip wheel ... -w DIR`)."""
    return ["env", *build_env(apex), *pip, "--no-build-isolation", *build_options(apex), requirement]


def shell_command(apex: Apex, pip: str = "pip install -v", requirement: str | None = None) -> str:
    """build_argv as one shell line (each word quoted where it needs it): what the files print
    for a build by hand and the builder stage runs. `requirement` as the shell should read it
    (default: "apex @ URL", quoted)."""
    from shlex import quote

    words = [*build_env(apex), pip, "--no-build-isolation", *(quote(o) for o in build_options(apex))]
    return " ".join([*words, requirement if requirement is not None else quote(f"apex @ {apex.url}")])
