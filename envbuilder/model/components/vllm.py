"""vLLM as one building block: which vLLM a verl release's rollout installs (`choose`) and every
refusal of it on this machine (`problems`): the card's compute capability, the torch it pins
exactly (its compiled ops are built against it), verl's accepted range and any cap past it, the
CUDA major of its wheels, the Pythons it has wheels for. Facts: matrices/vllm.yaml (per
release), verl.yaml (`vllm`, `vllm_max`), stacks.yaml (the newest stack per card floor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envbuilder.model import entries as E
from envbuilder.model import resolved as R
from envbuilder.model.components import Refusal
from envbuilder.model.matrix import at_least
from envbuilder.model.versions import in_range, version_key

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.selection import Selection


def problems(m: Matrix, s: Selection, asked: str | None = None) -> list[Refusal]:
    """The refusals of the vLLM rollout of selection `s` (the resolver's Selection: rollout, gpu,
    vr, vllm_v, torch_v, build, verl_v, verl, python); `asked`: the --vllm given, which another
    rollout refuses."""
    out: list[Refusal] = []
    if s.rollout != "vllm":
        if asked:
            out.append(
                Refusal(
                    "rollout",
                    f"--vllm {asked} was given but the rollout is {s.rollout!r}",
                    "vLLM is only installed for the vllm rollout",
                    "add --rollout vllm",
                    hard=True,
                )
            )
        return out
    _cc(m, s.card, s.vr, out)
    if s.vllm_v is None:
        _choice(m, s.torch_v, s.verl_v, s.verl, out)
    elif s.vr is not None:
        _release(m, out, s.vllm_v, s.vr, s.torch_v, s.build, s.verl_v, s.verl, s.python)
    return out


def compile_cache(verl: E.VerlEntry, torch_v: str) -> R.CompileCache | None:
    """vLLM's torch.compile cache, kept on where the verl release lets the launching shell say
    so (verl.yaml `compile_cache`) and torch writes the cache's artifacts atomically."""
    cc = verl.get("compile_cache")
    if not cc or version_key(torch_v) < version_key(cc["min_torch"]):
        return None
    return R.CompileCache(env=cc["env"], value=cc["value"], why=cc["why"])


def choose(m: Matrix, torch_v: str, verl: E.VerlEntry) -> str | None:
    """The newest vLLM release that pins this torch within verl's range, or None."""
    fitting = [v for v, r in m.typed.vllm.items() if r["torch"] == torch_v and in_range(v, verl["vllm"])]
    return max(fitting, key=version_key) if fitting else None


def _choice(m: Matrix, torch_v: str, verl_v: str, verl: E.VerlEntry, out: list[Refusal]) -> None:
    pins = ", ".join(f"{v}->torch {r['torch']}" for v, r in m.typed.vllm.items())
    out.append(
        Refusal(
            "vllm-torch",
            f"no vLLM release in the matrix pins torch {torch_v} within verl {verl_v}'s range {verl['vllm']}",
            f"vLLM pins torch exactly ({pins})",
            "pick a --torch that a vLLM release pins, or --rollout hf",
            hard=True,
        )
    )


def _release(
    m: Matrix,
    out: list[Refusal],
    vllm_v: str,
    vr: E.VllmEntry,
    torch_v: str,
    build: E.TorchBuild,
    verl_v: str,
    verl: E.VerlEntry,
    python: str,
) -> None:
    t = m.typed
    if vr["torch"] != torch_v:
        same = [v for v, r in t.vllm.items() if r["torch"] == torch_v and in_range(v, verl["vllm"])]
        fix = f"use --torch {vr['torch']}" + (f" or --vllm {same[-1]}" if same else "")
        out.append(
            Refusal(
                "vllm-torch",
                f"vllm {vllm_v} with torch {torch_v} is an ABI mismatch",
                f"vllm {vllm_v} pins torch=={vr['torch']} and its compiled ops are built against "
                f"it; installing torch {torch_v} beside it (e.g. with --no-deps) breaks them",
                fix,
                hard=True,
            )
        )
    if not in_range(vllm_v, verl["vllm"]):
        fit = [v for v in m.vllm if in_range(v, verl["vllm"])]
        out.append(
            Refusal(
                "verl-vllm",
                f"verl {verl_v} does not accept vllm {vllm_v}",
                f"its setup.py allows vllm{verl['vllm']}",
                f"use --vllm {fit[-1]}" if fit else "use another --verl",
                hard=True,
            )
        )
    cap = verl.get("vllm_max")
    if cap and version_key(vllm_v) > version_key(cap["version"]):
        fit = [
            v for v in m.vllm if in_range(v, verl["vllm"]) and version_key(v) <= version_key(cap["version"])
        ]
        out.append(
            Refusal(
                "verl-vllm",
                f"verl {verl_v} cannot go past vllm {cap['version']} (asked: {vllm_v})",
                cap["why"],
                f"use --vllm {fit[-1]}" if fit else "use another --verl",
                hard=True,
            )
        )
    major = vr["wheel_cuda"].split(".")[0]
    if major != build["cuda"].split(".")[0]:
        fits = sorted(
            {b["cuda"] for b in t.torch[torch_v]["builds"].values() if b["cuda"].split(".")[0] == major},
            key=version_key,
        )
        out.append(
            Refusal(
                "vllm-cuda",
                f"vllm {vllm_v} is built for CUDA {vr['wheel_cuda']} but torch is "
                f"built for CUDA {build['cuda']}",
                "the CUDA major versions must agree",
                f"use --cuda {fits[-1]}" if fits else f"use a --torch with a CUDA {major} build",
                hard=True,
            )
        )
    if python not in vr["python"]:
        out.append(
            Refusal(
                "vllm-python",
                f"vllm {vllm_v} has no wheels for Python {python}",
                f"it supports {', '.join(vr['python'])}",
                f"use --python {vr['python'][-1]}",
                hard=True,
            )
        )


def _cc(m: Matrix, gpu: E.GpuEntry, vr: E.VllmEntry | None, out: list[Refusal]) -> None:
    t = m.typed
    floor = t.min_compute_capability
    own = vr.get("min_compute_capability") if vr else None
    if (
        own
        and at_least(gpu["compute_capability"], floor or "0.0")
        and not at_least(gpu["compute_capability"], own)
    ):
        cc = gpu["compute_capability"]
        runs = [
            (v, st)
            for v, st in t.stacks.items()
            if st.get("vllm") in t.vllm
            and at_least(cc, t.vllm[st["vllm"]].get("min_compute_capability") or floor or "0.0")
        ]
        best = max(runs, key=lambda vs: version_key(vs[0])) if runs else None
        out.append(
            Refusal(
                "vllm-cc",
                f"this vLLM release cannot run on the {gpu['name']} (CC {cc})",
                f"it supports compute capability >= {own} only",
                f"use --verl {best[0]} (its stack's vLLM {best[1]['vllm']} runs on CC {cc})"
                if best
                else "use a vLLM release older than this one",
                hard=True,
            )
        )
        return
    if floor and not at_least(gpu["compute_capability"], floor):
        hf = [v for v, r in t.verl.items() if "hf" in r["rollouts"]]
        fix = "use --rollout hf" + (
            f" with --verl {hf[-1]} (the last verl with the HF rollout)" if hf else ""
        )
        out.append(
            Refusal(
                "vllm-cc",
                f"vLLM cannot run on the {gpu['name']} (CC {gpu['compute_capability']})",
                f"vLLM supports compute capability >= {floor} only (Volta or later); its kernels "
                "are not built for this GPU",
                fix,
            )
        )
