"""torch as one building block: which of a torch release's builds the image takes for its CUDA,
and what refuses it: no build for the image's CUDA, no kernels for the card (its arch list),
no wheels for the Python.
Facts: matrices/torch.yaml (each release's builds: variant, CUDA, SASS archs, index)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envbuilder.model.components import Refusal
from envbuilder.model.matrix import cc_runs
from envbuilder.model.versions import version_key

if TYPE_CHECKING:
    from envbuilder.model.entries import GpuEntry, TorchBuild, TorchEntry
    from envbuilder.model.matrix import Matrix


def build_for(torch: TorchEntry, cuda_v: str) -> tuple[str, TorchBuild] | None:
    """The torch build for the image's CUDA: the exact one, else the newest older minor of
    its major (torch wheels carry their own CUDA runtime); None when there is none."""
    builds = torch["builds"]
    exact = [(k, b) for k, b in builds.items() if b["cuda"] == cuda_v]
    if exact:
        return exact[0]
    older = sorted(
        (
            (k, b)
            for k, b in builds.items()
            if b["cuda"].split(".")[0] == cuda_v.split(".")[0]
            and version_key(b["cuda"]) < version_key(cuda_v)
        ),
        key=lambda kb: version_key(kb[1]["cuda"]),
    )
    return older[-1] if older else None  # (apex then asks for an exact match: apex-nvcc)


def cuda_refusal(m: Matrix, torch_v: str, torch: TorchEntry, cuda_v: str) -> Refusal:
    """Why torch `torch_v` cannot run on the CUDA `cuda_v` image (no build of its for it)."""
    builds = torch["builds"]
    have = ", ".join(f"{k} (CUDA {b['cuda']})" for k, b in builds.items())
    others = [
        t for t, rec in m.typed.torch.items() if any(b["cuda"] == cuda_v for b in rec["builds"].values())
    ]
    fix = f"use --cuda {' or --cuda '.join(sorted({b['cuda'] for b in builds.values()}))}"
    if others:
        fix += f", or --torch {others[-1]} (it has a CUDA {cuda_v} build)"
    why = f"its builds are {have}"
    return Refusal("torch-cuda", f"torch {torch_v} has no build for CUDA {cuda_v}", why, fix, hard=True)


def arch_refusal(m: Matrix, gpu: GpuEntry, torch_v: str, variant: str, build: TorchBuild) -> Refusal | None:
    """Why torch's build has no kernels for this card (its SASS arch list, no PTX counted), with
    the builds that have; None when it runs."""
    cc = gpu["compute_capability"]
    if cc_runs(cc, build["archs"]):
        return None
    fixes = []  # the same torch release first, then the newest releases
    releases = sorted(m.torch, key=version_key, reverse=True)
    releases.sort(key=lambda tv: tv != torch_v)
    for tv in releases:
        for b in sorted(
            m.typed.torch[tv]["builds"].values(), key=lambda b: version_key(b["cuda"]), reverse=True
        ):
            if cc_runs(cc, b["archs"]):
                fixes.append(f"--torch {tv} --cuda {b['cuda']}")
    fix = "use " + (" or ".join(fixes[:2]) if fixes else "a GPU this build supports")
    return Refusal(
        "arch",
        f"torch {torch_v}+{variant} has no kernels for sm_{cc.replace('.', '')} ({gpu['name']})",
        f"its arch list is {';'.join(build['archs'])}; it would fail at run time with "
        "'no kernel image is available for execution on the device'",
        fix,
        hard=True,
    )


def python_refusal(torch_v: str, torch: TorchEntry, python: str, image_python: str) -> Refusal | None:
    """Why torch `torch_v` cannot be installed on Python `python` (no wheels of it for that
    Python); None when it can. The fix is the image's own Python where torch has wheels for it."""
    if python in torch["python"]:
        return None
    return Refusal(
        "torch-python",
        f"torch {torch_v} has no wheels for Python {python}",
        f"it supports {', '.join(torch['python'])}",
        f"use --python {image_python}"
        if image_python in torch["python"]
        else f"use a --torch that supports Python {python}",
        hard=True,
    )
