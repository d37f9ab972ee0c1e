"""The rules: each reads the selection (model/selection.py) and adds what it finds wrong to the
`Findings`, in RULES' order, which is the order their findings are reported.

Pure: reads only the Matrix. Every rule reads its threshold from the data; no GPU name or
version is spelled out here. A Violation says what, why and a concrete fix; `hard` ones stay
errors under --allow-unsupported (the combination cannot work at all), the others become
warnings that are written into the rendered files. A rule changes no selection: a note it has
for the rendered files goes into the findings (`Findings.notes`), after the selection's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from envbuilder.model import flags as F
from envbuilder.model.components import Refusal
from envbuilder.model.components import cuda as CUDA
from envbuilder.model.components import flash_attn as FA
from envbuilder.model.components import registry as COMPONENTS
from envbuilder.model.components import sglang as SGLANG
from envbuilder.model.components import torch as TORCH
from envbuilder.model.components import verl as VERL
from envbuilder.model.components import vllm as VLLM
from envbuilder.model.matrix import Entry
from envbuilder.model.memory_plan import MemoryPlan
from envbuilder.model.selection import Ask, Selection
from envbuilder.model.sizing import Sizing, lora_memory, sizing
from envbuilder.model.stages import layout_words
from envbuilder.model.versions import in_range, ranges_overlap, version_key
from envbuilder.record import Record


class Violation(Record):
    """A broken rule: what, why and a concrete fix; `hard` ones survive --allow-unsupported."""

    rule: str
    what: str
    why: str
    fix: str
    hard: bool = False

    def text(self) -> str:
        return f"{self.what}: {self.why}. Fix: {self.fix}."


class Findings:
    """What the rules find of one selection, in the order they find it: the violations and the
    notes the rules add for the rendered files. Not a record: the rules' working list, which
    each rule adds to in turn (judge makes one per resolution and returns it)."""

    def __init__(self, a: Ask) -> None:
        self.ask = a
        self.m, self.ov, self.p, self.name, self.named, self.models = (
            a.m,
            a.ov,
            a.p,
            a.name,
            a.named,
            a.models,
        )
        self.v: list[Violation] = []
        self.notes: list[str] = []

    def refuse(self, x: Refusal | None) -> None:
        """A building block's refusal (model/components/), as the block made it."""
        if x is not None:
            self.add(x.code, x.what, x.why, x.fix, hard=x.hard)

    def add(self, rule: str, what: str, why: str, fix: str, hard: bool = False) -> None:
        self.v.append(Violation(rule, what, why, fix, hard))


def judge(a: Ask, s: Selection) -> Findings:
    """Every rule over the selection, in RULES' order."""
    found = Findings(a)
    for rule in RULES:
        rule(found, s)
    return found


def pypi_name_rule(r: Findings, pins: Mapping[str, str]) -> None:
    """A pin of a name that PyPI gives to another project (dependencies.yaml pypi_names)."""
    names = r.m.typed.pypi_names or {}
    for pkg in sorted(pins):
        rec = names.get(pkg.split("[", 1)[0].lower())
        if rec:
            r.add(
                "pypi-name",
                f"{pkg}=={pins[pkg]} from PyPI is not the {pkg} a training environment means",
                rec["is"],
                rec["fix"],
                hard=True,
            )


def shared_dependency_rule(r: Findings, packages: Mapping[str, str]) -> None:
    """Two installed packages whose requirements on one dependency cannot both hold (pip
    installs them in different layers without noticing), or a pin outside a requirement."""
    needs: dict[str, list[tuple[str, str]]] = {}
    for pkg, ver in sorted(packages.items()):
        rec = r.m.typed.requires.get(pkg, {}).get(ver)
        for dep, spec in sorted((rec["needs"] if rec else {}).items()):
            needs.setdefault(dep, []).append((f"{pkg}=={ver}", spec))
    for dep, wants in sorted(needs.items()):
        pinned = packages.get(dep)
        if pinned is not None:
            for who, spec in wants:
                if not in_range(pinned, spec):
                    r.add(
                        "shared-dependency",
                        f"{dep}=={pinned} is pinned but {who} needs {dep}{spec}",
                        "pip would install one and break the other "
                        "(`pip check` fails; uv refuses to resolve it)",
                        f"pin {dep} inside {spec}, or choose another {who.split('==')[0]}",
                        hard=True,
                    )
            continue
        for i, (who_a, spec_a) in enumerate(wants):
            for who_b, spec_b in wants[i + 1 :]:
                if not ranges_overlap(spec_a, spec_b):
                    r.add(
                        "shared-dependency",
                        f"{who_a} and {who_b} cannot be installed together",
                        f"{who_a} needs {dep}{spec_a}, {who_b} needs "
                        f"{dep}{spec_b}; installed in separate layers every step exits 0 "
                        "and the result is broken",
                        f"pin {who_b.split('==')[0]} (or "
                        f"{who_a.split('==')[0]}) to a release whose {dep} requirement "
                        "meets the other's, in the profile's `pins`",
                        hard=True,
                    )


def selection_sizing(s: Selection) -> Sizing:
    """The memory plan's inputs of a selection (the ones its memory stage planned with)."""
    return sizing(s.versions, s.kernels, s.engine_pick, s.train_plan, s.cluster)


# the rank a memory refusal's LoRA fix offers (verl's LoRA examples use 32 to 64)
LORA_FIX_RANK = 32


def memory_rule(r: Findings, s: Selection) -> None:
    """When no batch fits the GPU (the selection's memory plan, envbuilder/model/memory.py): why,
    and which change to the profile would fit. Each change is asked of a new train block or a
    new Sizing (another world, the plan's own Megatron layout); the selection stays as it is."""
    a, gpu, train, mem = r.ask, s.gpu, s.train, s.memory
    if not mem.problems:
        return
    z = selection_sizing(s)

    def fits(algo: Entry | None = None, on: Sizing = z, **changes: Any) -> bool:
        changed = dict(train, **changes)
        if "param_offload" in changes:  # the actor's only where its rollout allows it
            changed["actor_param_offload"] = changes["param_offload"] and s.actor_offload_ok
        return not lora_memory(a, on, changed, algo)[0].problems

    host = None
    # without a critic (GRPO: no critic weights, gradients or Adam state) a run fits where
    # the critic's state does not: the seed 4090 report's 7B LoRA run is that case
    grpo = r.m.algorithms.get("grpo")
    critic_free = (
        s.algo_rec["critic"]
        and grpo is not None
        and version_key(s.verl_v) >= version_key(grpo["since"])
        and fits(algo=grpo)
    )
    size = r.models[train["model"]]["parameters"]
    moe = bool(r.models[train["model"]].get("experts"))
    # (the largest that fits, of the same kind where one does: a dense model for a dense one,
    # a mixture for a mixture)
    smaller = [
        (rec["parameters"], name)
        for _, _, name, rec in sorted(
            (bool(rec.get("experts")) == moe, rec["parameters"], name, rec)
            for name, rec in r.m.models.items()
            if rec["parameters"] < size and fits(model=name)
        )
    ]
    prompt, response = train["max_prompt_length"], train["max_response_length"]
    shorter = None
    while prompt + response > 128:
        prompt, response = max(prompt // 2, 32), max(response // 2, 32)
        if fits(max_prompt_length=prompt, max_response_length=response):
            shorter = f"--max-prompt-length {prompt} --max-response-length {response} (shorter sequences)"
            break
    # more GPUs shard the state: more of them in the node, up to what a node holds
    # (gpus.yaml max_per_node, else 8), then more nodes (--gpus-per-node, --nodes: flags)
    per_node, nodes = train["n_gpus"], z.nodes
    most = max(int(gpu.get("max_per_node", 8)), per_node)

    def divides(world: int) -> bool:
        return not (train["train_batch_size"] % world or train["ppo_mini_batch_size"] % world)

    more = next(
        (
            f"--gpus-per-node {n} (the state sharded over {n} GPUs fits)"
            for n in (2, 4, 8, 16)
            if per_node < n <= most and divides(n * nodes) and fits(n_gpus=n)
        ),
        None,
    ) or next(
        (
            f"--nodes {k} (the state sharded over {k} × {per_node} GPUs fits)"
            for k in (2, 4, 8, 16)
            if k > nodes and divides(k * per_node) and fits(on=z._replace(nodes=k))
        ),
        None,
    )
    if not mem.host.fits:
        need = math.ceil(mem.host.gib / (1 - mem.margin))
        host = f"pass --host-memory {need} where each node has {need} GiB for offload"
    # LoRA adapters in place of every weight (verl's own examples train the largest dense models
    # so; a mixture's experts as vLLM LoRA are not offered: no record here says they serve)
    lora = (
        f"--lora-rank {LORA_FIX_RANK} (LoRA adapters: the frozen base needs no gradients or Adam state)"
        if not train.get("lora_rank") and not moe and z.engine != "megatron" and fits(lora_rank=LORA_FIX_RANK)
        else None
    )
    fix = memory_fix(host, smaller, more, bool(critic_free), lora, shorter)
    if z.megatron_layout:  # (the user's layout: the plan's own may fit)
        own = lora_memory(a, z._replace(megatron_layout=None), train)[0]
        if not own.problems and own.megatron:
            fix = f"drop --megatron (the plan's own layout, {layout_words(own.megatron)}, fits); or {fix}"
    r.add(
        "memory",
        f"{train['model']} does not fit the {gpu['name']} ({mem.gpu_total_gib:.0f} GiB) even at batch 1",
        memory_why(r, mem),
        fix,
    )


def memory_why(r: Findings, mem: MemoryPlan) -> str:
    """Why a plan does not fit: its worst phase against the budget, with the choices tried
    and the three largest terms, and the command that prints the whole budget."""
    worst = max(mem.problems, key=lambda p: p.gib - p.budget_gib)
    phase = next((p for p in mem.phases if p.phase == worst.phase), None)
    top = sorted((phase or mem.host).terms, key=lambda t: -t.gib)[:3]
    where = "per GPU at batch 1" if phase else "a node's host"
    choices = mem.choices
    tried = [
        f"{k} {dict(v) if isinstance(v := choice.value, Mapping) else v}"  # (a layout as the JSON's dict)
        for k in sorted(choices._fields)
        if k != "gpu_memory_utilization" and (choice := getattr(choices, k)) is not None
    ]
    return (
        f"its {worst.phase} phase needs {worst.gib:.1f} GiB {where} "
        f"against {worst.budget_gib:.1f} GiB usable, with {', '.join(tried)} ("
        + ", ".join(f"{t.term} {t.gib:.1f}" for t in top)
        + "; `envbuild show "
        f"{r.named.gpu or r.name} --memory --allow-unsupported` prints the whole budget)"
    )


def memory_fix(
    host: str | None,
    smaller: list[tuple[int, str]],
    more: str | None,
    critic_free: bool,
    lora: str | None = None,
    shorter: str | None = None,
) -> str:
    """A memory refusal's fix, cheapest first: GRPO where the critic is what does not fit, the
    model on a larger world, LoRA adapters of the same model, a smaller model of the table,
    shorter sequences, then more host memory for offload."""
    fix = host or "a GPU with more memory"
    if shorter:
        fix = f"use {shorter}; or {fix}"
    if smaller:  # (a model of the table: --model takes it, and the fix walk checks it)
        fix = f"use --model {smaller[-1][1]} (a smaller model from the table); or {fix}"
    if lora:
        fix = f"use {lora}; or {fix}"
    if more:  # (the model the user asked for, on a larger world, first)
        fix = f"use {more}; or {fix}"
    if critic_free:
        fix = f"use --algo grpo (no critic to train: it fits); or {fix}"
    return fix


# -- the rules: each takes the selection and adds what it finds wrong ----------------------------


def _rule_torch_cuda(r: Findings, s: Selection) -> None:
    if s.picked is None:
        r.refuse(TORCH.cuda_refusal(r.m, s.torch_v, s.torch, s.cuda_v))


def _rule_python(r: Findings, s: Selection) -> None:
    torch, cuda, python, m = s.torch, s.cuda, s.python, r.m
    r.refuse(TORCH.python_refusal(s.torch_v, torch, python, cuda["python"]))
    r.refuse(CUDA.python_refusal(m, s.cuda_v, cuda, python, torch, s.cc))


def _rule_arch(r: Findings, s: Selection) -> None:
    if s.picked:
        r.refuse(TORCH.arch_refusal(r.m, s.card, s.torch_v, s.variant, s.build))


def _rule_machine(r: Findings, s: Selection) -> None:
    """An aarch64 host (GH200, GB200) runs a stack only where PyPI serves aarch64 CUDA wheels of
    its torch (torch.yaml pypi_aarch64: a CPU build up to 2.10.0, cu130 from 2.11.0) and of its
    vLLM (vllm.yaml aarch64: from 0.10.2); the extensions are planned for x86_64 only."""
    machine, t = s.card.get("machine", "x86_64"), r.m.typed
    if machine == "x86_64":
        return
    why = []
    built = s.torch.get("pypi_aarch64")
    if built == "cpu":
        why.append(f"PyPI's {machine} torch {s.torch_v} is a CPU build (no CUDA)")
    elif not built:
        why.append(f"no {machine} CUDA build of torch {s.torch_v} on PyPI is recorded")
    elif s.picked and s.variant != built:
        why.append(f"PyPI's {machine} torch {s.torch_v} is its {built} build, not {s.variant}")
    if s.rollout == "vllm" and s.vllm_v and not t.vllm[s.vllm_v].get("aarch64"):
        why.append(f"vLLM {s.vllm_v} publishes no {machine} wheel on PyPI")
    if s.rollout == "sglang":
        why.append(f"SGLang's {machine} wheels are not checked here")
    # (flash-attn from a wheel index that builds for this machine, verl's wheelhouse: no gap)
    comps = sorted(
        c for c in s.components if not (c == "flash-attn" and s.fa_choice and s.fa_choice.how == FA.INDEX)
    )
    if comps:
        why.append(
            f"{' and '.join(comps)} {'is' if len(comps) == 1 else 'are'} planned for x86_64 only (wheel names, builds)"
        )
    if not why:
        r.notes.append(
            f"{machine}: PyPI serves this stack's {machine} CUDA wheels (torch {s.torch_v} {built}"
            + (f", vLLM {s.vllm_v}" if s.vllm_v else "")
            + f"), and `envbuild check {r.name} --resolve` co-resolves the pins for {machine}; "
            "the image installs uv's aarch64 wheel, and `envbuild lock` solves for "
            f"{machine} (lockfiles/{r.name} where shipped)"
        )
        return
    fits = [
        v
        for v, st in sorted(t.stacks.items(), key=lambda kv: version_key(kv[0]))
        if st["torch"] in t.torch and t.torch[st["torch"]].get("pypi_aarch64", "").startswith("cu")
    ]
    r.add(
        "machine",
        f"the {s.card['name']} is an {machine} system, which verl {s.verl_v}'s stack "
        f"(torch {s.torch_v}" + (f", vLLM {s.vllm_v}" if s.vllm_v else "") + ") cannot serve from PyPI",
        "; ".join(why),
        f"use --verl {fits[-1]}"
        if fits
        else "use NVIDIA's aarch64 NGC PyTorch image (nvcr.io/nvidia/pytorch)",
        hard=True,
    )


def _rule_verl(r: Findings, s: Selection) -> None:
    """verl's refusals: the verl block's (model/components/verl.py)."""
    for x in VERL.problems(r.m, s):
        r.refuse(x)


def _rule_vllm(r: Findings, s: Selection) -> None:
    """The vLLM rollout's refusals: the vLLM block's (model/components/vllm.py)."""
    for x in VLLM.problems(r.m, s, r.ov.vllm):
        r.refuse(x)


def _rule_sglang(r: Findings, s: Selection) -> None:
    """The SGLang rollout's refusals: the SGLang block's (model/components/sglang.py)."""
    for x in SGLANG.problems(r.m, s):
        r.refuse(x)


def _rule_driver(r: Findings, s: Selection) -> None:
    r.refuse(CUDA.driver_refusal(r.m, s.driver, r.ov.driver, s.usable_cudas))


def _rule_bf16(r: Findings, s: Selection) -> None:
    if r.p["dtype"] == "bf16" and not s.card["bf16"]:
        r.add(
            "bf16",
            f"bf16 on the {s.card['name']} (CC {s.cc})",
            f"native bfloat16 needs CC >= {r.m.typed.features['bf16']['min_compute_capability']}",
            "set dtype to fp16 or fp32 in the profile",
        )


def _rule_extensions(r: Findings, s: Selection) -> None:
    for x in COMPONENTS.problems(r.m, s):
        r.refuse(x)
    r.notes.extend(COMPONENTS.notes(r.m, s))


def _rule_shared_dependencies(r: Findings, s: Selection) -> None:
    named = {"torch": s.torch_v, **({"vllm": s.vllm_v} if s.vllm_v else {})}
    named.update({"sglang": s.sglang_v} if s.sglang_v else {})
    pypi_name_rule(r, s.pins)
    shared_dependency_rule(r, {**named, **s.pins})


def _rule_algorithm(r: Findings, s: Selection) -> None:
    a = s.algo_rec
    if version_key(s.verl_v) < version_key(a["since"]):
        newer = [v for v in r.m.verl if version_key(v) >= version_key(a["since"])]
        r.add(
            "algorithm-release",
            f"verl {s.verl_v} has no {s.algo} estimator",
            f"{s.algo} came with verl {a['since']} (its AdvantageEstimator)",
            (f"use --verl {newer[-1]}" if newer else "use another --algo") + " or --algo grpo",
            hard=True,
        )
    if a.get("refused"):
        r.add(
            "algorithm-reward",
            f"{s.algo} cannot train on this recipe",
            a["refused"],
            "use --algo grpo",
            hard=True,
        )


def _rule_cluster(r: Findings, s: Selection) -> None:
    ic = s.interconnect
    if s.nodes > 1 and ic and ic["scope"] != "cluster":
        r.add(
            "interconnect",
            f"--interconnect {s.ic_name} joins the GPUs of one node, but the run spans {s.nodes} nodes",
            "the nodes talk over a network: InfiniBand, RoCE or TCP",
            "use --interconnect tcp or --interconnect ib or --interconnect roce",
            hard=True,
        )


def _rule_model(r: Findings, s: Selection) -> None:
    t = s.train
    longest = r.models[t["model"]]["max_position_embeddings"]
    need = t["max_prompt_length"] + t["max_response_length"]
    if need > longest:
        prompt = t["max_prompt_length"]
        shorter = (
            f"use --max-response-length {longest - prompt} (the model's {longest} tokens less the "
            f"{prompt}-token prompts)"
            if longest - prompt >= F.SEQ_MIN
            else f"use --max-prompt-length {longest // 2} --max-response-length {longest - longest // 2}"
        )
        r.add(
            "model-context",
            f"{t['model']} reads at most {longest} tokens, but the run's "
            f"prompts and responses take {need} ({prompt} + {t['max_response_length']})",
            "max_position_embeddings in its config.json bounds prompt + response",
            f"{shorter}; or a model with a longer context",
            hard=True,
        )


def _rule_memory(r: Findings, s: Selection) -> None:
    if any(v.rule == "model-context" for v in r.v):
        return  # (a plan of sequences the model cannot read says nothing more)
    memory_rule(r, s)


# In the order their findings are reported.
RULES = (
    _rule_machine,
    _rule_torch_cuda,
    _rule_python,
    _rule_arch,
    _rule_verl,
    _rule_vllm,
    _rule_sglang,
    _rule_driver,
    _rule_bf16,
    _rule_extensions,
    _rule_shared_dependencies,
    _rule_algorithm,
    _rule_cluster,
    _rule_model,
    _rule_memory,
)
