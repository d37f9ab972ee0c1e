"""verl as one building block: what refuses a verl release on this selection (the Python its
wheel accepts, the rollouts it has and envbuild can install, the torch its own code needs, the
training path the matrix records for the rollout). Its batch arithmetic is model/batches.py's
and its recorded patches are matrices/verl.yaml's `patches`, which the resolver selects.
Facts: matrices/verl.yaml."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envbuilder.model.components import Refusal
from envbuilder.model.matrix import cc_runs
from envbuilder.model.versions import in_range, version_key

if TYPE_CHECKING:
    from envbuilder.model.entries import VerlEntry
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.selection import Selection

# Rollouts whose packages the matrix knows how to pin (hf needs none, vllm: matrices/vllm.yaml,
# sglang: matrices/sglang.yaml, the release verl's `sglang` extra pins).
INSTALLABLE_ROLLOUTS = ("hf", "vllm", "sglang")


def problems(m: Matrix, s: Selection) -> list[Refusal]:
    """The refusals of verl release `s.verl_v` (the resolver's Selection: verl, python, torch,
    torch_v, cuda_v, cc, rollout)."""
    out: list[Refusal] = []
    spec = s.verl.get("python")
    if spec and not in_range(s.python, spec):
        fit = [
            c
            for c, rec in m.typed.cuda.items()
            if in_range(rec["python"], spec) and any(b["cuda"] == c for b in s.torch["builds"].values())
        ]
        out.append(
            Refusal(
                "verl-python",
                f"verl {s.verl_v} does not install on Python {s.python}",
                s.verl.get("python_why") or f"its wheel says Requires-Python {spec}",
                (
                    f"use --cuda {fit[-1]} (its image ships Python {m.typed.cuda[fit[-1]]['python']})"
                    if fit
                    else "use another --verl"
                ),
                hard=True,
            )
        )
    _rollout(m, s.verl_v, s.verl, s.rollout, out)
    _torch(m, s.verl_v, s.verl, s.torch_v, s.cuda_v, s.cc, out)
    _training_path(s.verl_v, s.verl, s.rollout, out)
    return out


def _rollout(m: Matrix, verl_v: str, verl: VerlEntry, rollout: str, out: list[Refusal]) -> None:
    if rollout not in INSTALLABLE_ROLLOUTS:
        out.append(
            Refusal(
                "rollout",
                f"the {rollout!r} rollout is not one envbuild can install yet",
                "the matrix holds no release facts (torch pin, hardware floor) for it, so an "
                "image would lack it",
                "use --rollout vllm or --rollout hf",
                hard=True,
            )
        )
        return
    if rollout in verl["rollouts"]:
        return
    having = [v for v, r in m.typed.verl.items() if rollout in r["rollouts"]]
    fix = f"use --verl {having[-1]}" if having else "choose another rollout"
    others = [r for r in verl["rollouts"] if r != rollout and r in INSTALLABLE_ROLLOUTS]
    if others:
        fix += f", or --rollout {others[0]}"
    why = f"its rollouts are {', '.join(verl['rollouts'])}"
    if verl.get("rollouts_why"):
        why += f" ({verl['rollouts_why']})"
    out.append(Refusal("rollout", f"verl {verl_v} has no {rollout!r} rollout", why, fix, hard=True))


def _training_path(verl_v: str, verl: VerlEntry, rollout: str, out: list[Refusal]) -> None:
    if rollout in verl["rollouts"] and rollout not in verl["training_path"]["rollouts"]:
        out.append(
            Refusal(
                "training-path",
                f"the matrix records no training path for verl {verl_v}'s {rollout!r} rollout",
                "preflight and the smoke test would not import the "
                "rollout's modules, so a broken rollout would show only once training starts",
                f"add verl.{verl_v}.training_path.rollouts.{rollout} (the modules verl's FSDP "
                "workers import for it, read from the release's wheel)",
                hard=True,
            )
        )


def _torch(
    m: Matrix, verl_v: str, verl: VerlEntry, torch_v: str, cuda_v: str, cc: str, out: list[Refusal]
) -> None:
    """verl's own code imports torch APIs that its METADATA does not pin (torch comes from
    the image), so no resolver catches this: the matrix records the floor."""
    spec = verl["torch"]
    if in_range(torch_v, spec):
        return
    fits = [t for t in sorted(m.torch, key=version_key) if in_range(t, spec)]
    same_cuda = [
        t
        for t in fits
        if any(b["cuda"] == cuda_v and cc_runs(cc, b["archs"]) for b in m.typed.torch[t]["builds"].values())
    ]
    older = [v for v, r in m.typed.verl.items() if in_range(torch_v, r["torch"])]
    fix = (
        f"use --torch {same_cuda[0]} (it has a CUDA {cuda_v} build)"
        if same_cuda
        else f"use --torch {fits[0]} with a --cuda it is built for"
        if fits
        else "use another torch"
    )
    if older:
        fix += f", or --verl {older[-1]}"
    out.append(
        Refusal(
            "verl-torch",
            f"verl {verl_v} needs torch{spec}, not {torch_v}",
            verl.get("torch_why")
            or f"its own code imports torch APIs newer than {torch_v} (see {verl['torch_source']})",
            fix,
            hard=True,
        )
    )
