"""SGLang as one building block: which SGLang a verl release's rollout installs, what refuses it on
this machine, and what the install layer asks for.

The release is the one verl's `sglang` extra pins (matrices/verl.yaml); its facts are
matrices/sglang.yaml's (the torch it pins, its Python, the glibc of its wheels, its kernel
wheel's SASS arches and CUDA). The install layer asks for `sglang[extras]==V` and the kernel
wheel, pinned (render/plan.py's sglang layer); the resolver adds each refusal `problems` finds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from envbuilder.model import resolved as R
from envbuilder.model.components import Refusal
from envbuilder.model.matrix import at_least, cc_runs
from envbuilder.model.versions import in_range, version_key

if TYPE_CHECKING:
    from envbuilder.model.entries import SglangEntry
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.selection import Selection


def record(version: str, sr: SglangEntry) -> R.Sglang:
    extras = f"[{','.join(sr['extras'])}]" if sr.get("extras") else ""
    k = sr["kernel"]
    return R.Sglang(
        version=version,
        torch=sr["torch"],
        requirement=f"sglang{extras}=={version}",
        kernel=f"{k['package']}=={k['version']}",
    )


def of(m: Matrix, verl_v: str) -> str | None:
    """The SGLang release verl's `sglang` extra pins (verl.yaml), None where none is recorded."""
    verl = m.typed.verl.get(verl_v)
    sglang = verl.get("sglang") if verl else None
    return sglang["version"] if sglang else None


def kernel_runs(gpu_cc: str, archs: list[str]) -> bool:
    """True when one of a kernel wheel's SASS arches runs on `gpu_cc`: "9.0a" (arch-specific
    features) on CC 9.0 only, "8.0" on 8.0 and later minors of major 8 (no PTX: nothing else)."""
    exact = [a[:-1] for a in archs if a.endswith("a")]
    return gpu_cc in exact or cc_runs(gpu_cc, [a for a in archs if not a.endswith("a")])


def cuda_flag(m: Matrix, torch_v: str, cuda_v: str) -> str:
    """ "" when torch `torch_v` has a build for CUDA `cuda_v`, else " --cuda C" (its newest)."""
    torch = m.typed.torch.get(torch_v)
    builds = torch["builds"] if torch else {}
    cudas = sorted({b["cuda"] for b in builds.values()} & set(m.cuda), key=version_key)
    return "" if cuda_v in cudas or not cudas else f" --cuda {cudas[-1]}"


def problems(m: Matrix, s: Selection) -> list[Refusal]:
    """The SGLang rollout (sglang.yaml, verl.yaml `sglang`): a release verl's extra pins that
    can be installed beside it, kernels for this GPU, the torch, Python, glibc and CUDA its
    wheels are built for. Each refusal names the change that works (fixes.checked keeps it).
    Each refusal is hard; `s` is the resolver's Selection (rollout,
    verl_v, verl, sglang_v, sr, cc, gpu, torch_v, python, cuda, cuda_v, build)."""
    out: list[Refusal] = []
    if s.rollout != "sglang" or "sglang" not in s.verl["rollouts"]:
        return out  # (no such rollout in the release: rollout_rule said so)
    rec = s.verl.get("sglang")
    if rec is None or s.sr is None:
        out.append(
            Refusal(
                "sglang",
                f"the matrix records no SGLang release for verl {s.verl_v}",
                "without the release verl's sglang extra pins there is nothing to install",
                f"add verl.{s.verl_v}.sglang (the version, from the wheel's METADATA) and its "
                "facts in sglang.yaml, or use --rollout vllm",
                hard=True,
            )
        )
        return out
    sr, cc = s.sr, s.cc

    def working(ok: Callable[[SglangEntry], bool]) -> list[str]:
        """`--verl V --torch T` for the verl releases, newest first, whose SGLang installs
        beside them and passes `ok(sglang release)`."""
        found = []
        t = m.typed
        for v in sorted(t.verl, key=version_key, reverse=True):
            other = t.verl[v].get("sglang")
            srv = t.sglang.get(other["version"]) if other else None
            if "sglang" in t.verl[v]["rollouts"] and other and srv and not other.get("refused") and ok(srv):
                found.append(f"--verl {v} --torch {srv['torch']}{cuda_flag(m, srv['torch'], s.cuda_v)}")
        return found

    if rec.get("refused"):
        fixes = working(lambda srv: kernel_runs(cc, srv["kernel"]["archs"]))[:1]
        fixes += [f"--rollout {x}" for x in ("vllm", "hf") if x in s.verl["rollouts"]]
        out.append(
            Refusal(
                "sglang-verl",
                f"verl {s.verl_v}'s SGLang rollout cannot be installed",
                f"{rec['refused']} (" + ", ".join(u for u in rec["source"].split(", ") if "://" in u) + ")",
                "use " + " or ".join(fixes) if fixes else "use another --verl",
                hard=True,
            )
        )
        return out
    kernel = sr["kernel"]
    if not (at_least(cc, sr["min_compute_capability"]) and kernel_runs(cc, kernel["archs"])):
        fixes = [f"--rollout {x}" for x in ("vllm", "hf") if x in s.verl["rollouts"] or x == "hf"]
        fixes += working(lambda srv: kernel_runs(cc, srv["kernel"]["archs"]))[:1]
        out.append(
            Refusal(
                "sglang-cc",
                f"SGLang {s.sglang_v} cannot run on the {s.card['name']} (CC {cc})",
                f"its compiled ops ({kernel['package']} {kernel['version']}) are built for sm_"
                + ", sm_".join(a.replace(".", "") for a in kernel["archs"])
                + f" only, with no PTX (the floor is CC {sr['min_compute_capability']}; SGLang "
                "itself refuses GPUs below sm75)",
                "use " + " or ".join(fixes),
                hard=True,
            )
        )
        return out  # (a card it cannot run on: nothing else about the install matters)
    if sr["torch"] != s.torch_v:
        out.append(
            Refusal(
                "sglang-torch",
                f"sglang {s.sglang_v} with torch {s.torch_v} is an ABI mismatch",
                f"verl {s.verl_v}'s sglang extra pins sglang=={s.sglang_v}, which pins "
                f"torch=={sr['torch']}; its {kernel['package']} ops are built against that torch",
                f"use --torch {sr['torch']}{cuda_flag(m, sr['torch'], s.cuda_v)}",
                hard=True,
            )
        )
    if not in_range(s.python, sr["python"]):
        out.append(
            Refusal(
                "sglang-python",
                f"sglang {s.sglang_v} does not install on Python {s.python}",
                f"its wheel says Requires-Python {sr['python']}",
                "use another --verl"
                if not working(lambda srv: in_range(s.python, srv["python"]))
                else "use " + working(lambda srv: in_range(s.python, srv["python"]))[0],
                hard=True,
            )
        )
    glibc = s.cuda.get("glibc")
    if sr.get("glibc") and glibc and version_key(glibc) < version_key(sr["glibc"]):
        newer = [
            c
            for c, rec_ in m.typed.cuda.items()
            if version_key(rec_.get("glibc") or "0") >= version_key(sr["glibc"])
        ]
        out.append(
            Refusal(
                "sglang-glibc",
                f"sglang {s.sglang_v} has no wheel for the CUDA {s.cuda_v} image's glibc {glibc}",
                f"its wheels are manylinux_{sr['glibc'].replace('.', '_')} (glibc >= {sr['glibc']})",
                f"use --cuda {newer[-1]}" if newer else "use another --verl",
                hard=True,
            )
        )
    wheel_cuda = sr.get("wheel_cuda")
    if wheel_cuda and wheel_cuda.split(".")[0] != s.build["cuda"].split(".")[0]:
        out.append(
            Refusal(
                "sglang-cuda",
                f"sglang {s.sglang_v}'s kernels are built for CUDA {wheel_cuda} but torch is built "
                f"for CUDA {s.build['cuda']}",
                "the CUDA major versions must agree",
                f"use --cuda {wheel_cuda}",
                hard=True,
            )
        )
    return out
