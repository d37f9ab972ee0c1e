"""TransformerEngine, the building block verl's Megatron engine runs its layers on.

It ships in two parts (https://pypi.org/project/transformer-engine/ and its siblings): the core
library as a binary wheel per CUDA major (transformer-engine-cu13, manylinux x86_64), which the
Megatron pip layer installs, and the PyTorch extension, transformer_engine_torch, published as
an sdist only, which is compiled against the environment's torch. Its setup.py first tries to
download a prebuilt wheel from GitHub (unreachable behind the firewalls this tool is for, and
built for every arch); NVTE_PYTORCH_FORCE_BUILD=TRUE makes it build, NVTE_CUDA_ARCHS=<sm> for
the card's one arch, and CPATH names the cuDNN and NCCL headers of the nvidia-* wheels torch
installs (the CUDA devel image has nvcc but no cuDNN). It installs
with --no-deps: its own requirements (the core wheel, einops, onnx, onnxscript, pydantic,
nvdlfw-inspect) are the Megatron layer's pins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envbuilder.model.resolved import ResolvedEnv

COMPONENT = "transformer-engine"
DIST = "transformer_engine_torch"
FORCE_BUILD = "NVTE_PYTORCH_FORCE_BUILD=TRUE"
# the compile of transformer_engine_torch 2.12.0 for sm_90 (28 objects, nvcc and g++): 10 min 32 s
# on this project's 2-core machine (MAX_JOBS=2, nvcc 13.0.88 from PyPI's nvidia-cuda-nvcc, by
# `envbuild verify h100 --engine megatron`, 2026-12-07); a builder with more cores divides it
BUILD_MINUTES_2_CORES = 11
CORE_MINUTES = BUILD_MINUTES_2_CORES * 2  # (what a builder of N cores divides by N)


def build_env(env: ResolvedEnv) -> list[str]:
    """The variables of the extension's build for the card: PyTorch only, the card's one arch, a
    build where setup.py would download (CPATH comes on top: include_path)."""
    mg = env.megatron
    assert mg is not None  # (called only for an environment on the Megatron engine)
    return [
        "NVTE_FRAMEWORK=pytorch",
        f"NVTE_CUDA_ARCHS={mg.te_arch}",
        FORCE_BUILD,
    ]


def build_argv(env: ResolvedEnv, pip: list[str], requirement: str | None = None) -> list[str]:
    """THE command that compiles the extension into the environment `pip` installs into (or, with
    `pip wheel ... -w DIR`, into a wheel), as words: its variables, pip, no build isolation (it
    builds against the installed torch) and no dependencies (the Megatron layer pins them).
    `requirement`: the sdist to build (a wheelhouse's file) in place of the index's release."""
    mg = env.megatron
    assert mg is not None
    return [
        *build_env(env),
        *pip,
        "--no-build-isolation",
        "--no-deps",
        requirement or f"{DIST}=={mg.transformer_engine}",
    ]


# Its build takes the CUDA toolkit's include folder alone where there is a toolkit (2.12.0
# build_tools/utils.py get_cuda_include_dirs), so cuDNN's and NCCL's headers, which the devel image
# lacks and torch's nvidia-* wheels bring, reach the compilers through CPATH: every
# site-packages/nvidia/*/include folder of the environment's Python
NVIDIA_INCLUDES = (
    "import glob, os, nvidia; "
    "print(os.pathsep.join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'include')))))"
)


def include_path(site: str) -> str:
    """CPATH for the build, from a site-packages folder (as NVIDIA_INCLUDES prints it)."""
    import glob
    import os

    return os.pathsep.join(sorted(glob.glob(os.path.join(site, "nvidia", "*", "include"))))


def build_command(
    env: ResolvedEnv, pip: str = "pip install", python: str = "python", requirement: str | None = None
) -> str:
    """build_argv as one shell line (by hand, apptainer's %post, the builder stage), CPATH set
    from the environment's nvidia-* wheels by `python`."""
    return f'CPATH="$({python} -c "{NVIDIA_INCLUDES}")" ' + " ".join(build_argv(env, [pip], requirement))


def build_shell(
    env: ResolvedEnv, wheels: str, indent: str = "    ", sdist: tuple[str, str] | None = None
) -> list[str]:
    """The builder's lines that compile the extension into a wheel in `wheels`, saying first the
    time it expects for this machine's cores (min(nproc, MAX_JOBS) jobs). `sdist`: (path, sha256)
    of the lock's sdist in a wheelhouse, checked, then built with no index."""
    mg = env.megatron
    assert mg is not None
    m = CORE_MINUTES
    lines = [
        f'{indent}jobs="$(nproc)"; [ "$jobs" -gt "${{MAX_JOBS:-$jobs}}" ] && jobs="$MAX_JOBS";',
        f'{indent}echo "envbuild: transformer-engine: compiling {DIST} {mg.transformer_engine} from its '
        f"{'wheelhouse' if sdist else 'PyPI'} sdist for sm_{mg.te_arch} only with $jobs jobs: expect about "
        f'$(( ({m} + jobs - 1) / jobs )) min ({m} core-minutes)";',
    ]
    if sdist:
        path, sha = sdist
        lines.append(f'{indent}echo "{sha}  {path}" | sha256sum -c - >/dev/null;')
        pip = f"pip wheel -v --no-index -w {wheels}"
        return [*lines, f"{indent}MAX_JOBS=$jobs {build_command(env, pip, requirement=path)}"]
    return [*lines, f"{indent}MAX_JOBS=$jobs {build_command(env, f'pip wheel -v -w {wheels}')}"]


# PyPI's CUDA compiler, for a machine without the toolkit (envbuild verify and install without
# Docker): nvcc and its front end's headers, NVVM, and libcu++ (`nv/target`, which cuda_fp16.h
# includes); each unpacks into site-packages/nvidia/cu<major>/ beside the runtime's headers and
# libraries torch's wheels installed, which then is a CUDA_HOME nvcc and TransformerEngine's
# build both accept. The build also needs setuptools, pybind11 and ninja (no build isolation).
TOOLCHAIN = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl")
BUILD_REQUIRES = ("setuptools", "pybind11", "ninja", "wheel")


def toolchain(env: ResolvedEnv) -> list[str]:
    """The toolchain's requirements for torch's CUDA (X.Y: any patch release of it)."""
    return [f"{name}=={env.torch.cuda}.*" for name in TOOLCHAIN] + list(BUILD_REQUIRES)


def toolchain_home(env: ResolvedEnv, site: str) -> str:
    """The CUDA_HOME the toolchain's wheels make under a site-packages folder."""
    return f"{site}/nvidia/cu{env.torch.cuda.split('.')[0]}"
