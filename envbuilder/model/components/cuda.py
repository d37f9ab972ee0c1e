"""The CUDA image as one building block: the driver it needs (its CUDA's, or a newer wheel's),
how a given driver runs it (natively, under minor-version compatibility, or not), the stacks a
driver runs, and what refuses it: a driver too old for it, a Python its image does not ship.
Facts: matrices/cuda.yaml (each CUDA's images, driver floors, Python, glibc), stacks.yaml."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from envbuilder.model import entries as E
from envbuilder.model import resolved as R
from envbuilder.model.components import Refusal
from envbuilder.model.matrix import Matrix, cc_runs
from envbuilder.model.versions import version_key


def stacks_for_driver(m: Matrix, driver: str) -> list[tuple[str, str]]:
    """The stacks (stacks.yaml, by verl release) whose CUDA this driver runs, newest first, each
    with how: natively or under minor-version compatibility (12.x on >= 525.60.13)."""
    out = []
    for v, st in sorted(m.typed.stacks.items(), key=lambda vs: version_key(vs[0]), reverse=True):
        rec = m.typed.cuda.get(st["cuda"])
        if rec is None:
            continue
        if version_key(driver) >= version_key(rec["min_driver"]):
            out.append((v, f"{st['cuda']} runs on this driver"))
        elif version_key(driver) >= version_key(rec["compat_driver"]):
            out.append((v, f"{st['cuda']} runs on this driver under minor-version compatibility"))
    return out


def driver_info(
    m: Matrix, cuda_v: str, cuda: Mapping[str, object], extra_cudas: Sequence[str], drv: str | None
) -> R.Driver:
    """The driver the image needs (its CUDA's, or the vLLM wheel's if newer) and, with
    --driver, how the given one runs it: native, minor-version compatibility, too old.
    (`cuda`: the record of `cuda_v`, for a CUDA the matrix does not list.)"""
    need = max([cuda_v, *extra_cudas], key=version_key)
    need_rec: Mapping[str, object] = m.typed.cuda.get(need) or cuda
    min_driver, compat_driver = str(need_rec["min_driver"]), str(need_rec["compat_driver"])
    info = R.Driver(min_driver=min_driver, compat_driver=compat_driver, for_cuda=need)
    if drv is None:
        return info
    if version_key(drv) >= version_key(min_driver):
        mode = "native"
    elif version_key(drv) >= version_key(compat_driver):
        mode = "minor-version-compatibility"
    else:
        mode = "too-old"
    return info._replace(mode=mode, driver=drv)


def driver_refusal(m: Matrix, info: R.Driver, drv: str | None, usable_cudas: Sequence[str]) -> Refusal | None:
    """Why the given driver (--driver) cannot run the image's CUDA, with the CUDA and the stacks
    it does run; None when it runs it (natively or under minor-version compatibility)."""
    if info.mode != "too-old" or drv is None:  # (too-old: --driver given)
        return None
    need = info.for_cuda
    usable = set(usable_cudas)
    native = [
        c for c, r in m.typed.cuda.items() if c in usable and version_key(drv) >= version_key(r["min_driver"])
    ]
    compat = [
        c
        for c, r in m.typed.cuda.items()
        if c in usable and c not in native and version_key(drv) >= version_key(r["compat_driver"])
    ]
    fix = f"upgrade the driver to >= {info.min_driver}"
    if native:
        fix += f", or use --cuda {max(native, key=version_key)}"
    elif compat:
        fix += (
            f", or use --cuda {max(compat, key=version_key)} (runs on this driver under "
            "minor-version compatibility)"
        )
    # the stacks this driver runs, newest first (the fix walk keeps those that resolve)
    for v, how in stacks_for_driver(m, drv)[:2]:
        fix += f" or use --verl {v} (its stack's CUDA {how})"
    return Refusal(
        "driver",
        f"driver {drv} is too old for CUDA {need}",
        f"CUDA {need} needs >= {info.min_driver} (or >= "
        f"{info.compat_driver} under minor-version compatibility)",
        fix,
    )


def python_refusal(
    m: Matrix, cuda_v: str, cuda: E.CudaEntry, python: str, torch: E.TorchEntry, cc: str
) -> Refusal | None:
    """Why a venv of Python `python` cannot be made in the CUDA `cuda_v` image (its system Python
    is another), with the CUDA images that ship it and have a torch build for the card."""
    if python == cuda["python"]:
        return None
    same = [
        c
        for c, rec in m.typed.cuda.items()
        if rec["python"] == python
        and any(b["cuda"] == c and cc_runs(cc, b["archs"]) for b in torch["builds"].values())
    ]
    return Refusal(
        "image-python",
        f"the CUDA {cuda_v} image ({cuda['images']['runtime']}) ships Python {cuda['python']}, not {python}",
        "the image's system Python is the one the venv is made from",
        f"use --python {cuda['python']}" + (f" or --cuda {same[-1]}" if same else ""),
        hard=True,
    )
