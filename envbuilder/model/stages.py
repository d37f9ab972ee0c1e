"""The resolver's selection, in stages: what a profile and its overrides name, read from the
matrix, with nothing judged (an unknown version is bad input, a UserError; every judgement is a
rule's, model/rules.py).

Each stage is a function of the `Ask` and of the records of the stages before it, and returns a
new frozen record (model/selection.py): `versions`, `rollout_pick`, `kernels`, `pins`,
`engine_pick`, `train_plan`, `cluster_plan` (with `network`), `memory_pick`. `select` runs them
in that order and composes their records into the `Selection` the rules and the assembly read.
A stage that changes what an earlier one made (the train block: the world's batches, the user's
world choices, the memory plan's choices; a note) returns its own copy, never changing the
earlier record."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar

from envbuilder.errors import UserError
from envbuilder.model import entries as E
from envbuilder.model import flags as F
from envbuilder.model import resolved as R
from envbuilder.model.components import cuda as CUDA
from envbuilder.model.components import flash_attn as FA
from envbuilder.model.components import registry as COMPONENTS
from envbuilder.model.components import sglang as SGLANG
from envbuilder.model.components import torch as TORCH
from envbuilder.model.components import vllm as VLLM
from envbuilder.model.matrix import Entry, Matrix, at_least
from envbuilder.model.memory_plan import MemoryPlan
from envbuilder.model.names import profile_named, suggest, unknown_name_hint
from envbuilder.model.resolved import Overrides
from envbuilder.model.selection import (
    Ask,
    ClusterPlan,
    EnginePick,
    Kernels,
    MemoryPick,
    Network,
    Pins,
    RolloutPick,
    Selection,
    Train,
    TrainPlan,
    Versions,
)
from envbuilder.model.sizing import Sizing, lora_memory, sizing
from envbuilder.model.versions import in_range, version_key

T = TypeVar("T")


def ask(m: Matrix, profile_name: str, ov: Overrides) -> Ask:
    """What is asked: the profile a name means (a card's name: the nearest profile's stack, on
    that card), as `--verl` stacks it, and the model table with --model's shape."""
    named = profile_named(m, profile_name)
    if named is None:
        raise UserError(
            f"Unknown profile {profile_name!r}; {unknown_name_hint(m, profile_name)}"
            f"Known profiles: {', '.join(m.profiles)}, or a GPU's name (H100, RTX 4090, "
            "A100-SXM4-40GB). `envbuild list` shows them; add your own with --matrix-dir."
        )
    # the model table, with --model's shape where the table lacks it (its config.json)
    models: Mapping[str, Entry] = m.models
    if ov.model and ov.model not in m.models:
        if not ov.model_arch:
            raise UserError(
                f"--model {ov.model!r} is not in the model table "
                f"({', '.join(m.models)}) and its shape was not read. Pass a hub "
                "repo id or a folder holding its config.json."
            )
        models = {**m.models, ov.model: dict(ov.model_arch)}
    p = stacked(m, ov, m.profiles[named.profile])
    return Ask(
        m=m,
        ov=ov,
        named=named,
        name=named.profile,
        p=MappingProxyType(p),
        models=MappingProxyType(dict(models)),
    )


def stacked(m: Matrix, ov: Overrides, p: Entry) -> Entry:
    """The profile as `--verl X` asks: where X is not the profile's own verl and stacks.yaml
    has X's whole pinned set (CUDA, torch, rollout, vLLM, Python, components, pins), those
    replace the profile's, so `--verl 0.6.1` on a verl 0.9 profile is the 0.6.1 stack and not
    verl 0.6.1 beside torch 2.11. The other overrides still apply on top."""
    want = ov.verl
    stack = (m.sections.get("stacks") or {}).get(want) if want else None
    if stack is None or want == p["verl"]:
        return p
    q = dict(
        p,
        verl=want,
        cuda=stack["cuda"],
        torch=stack["torch"],
        rollout=stack["rollout"],
        pins=dict(stack.get("pins") or {}),
    )
    for key in ("vllm", "python"):
        q.pop(key, None)
        if key in stack:
            q[key] = stack[key]
    comps, theirs = dict(p["components"]), stack.get("components") or {}
    if "flash-attn" not in theirs:
        comps.pop("flash-attn", None)  # another torch: the profile's flash-attn may not fit
    floor = (m.flash_attn or {}).get("min_compute_capability", "0.0")
    cc = m.gpus[p["gpu"]]["compute_capability"]
    comps.update(
        {
            name: version
            for name, version in theirs.items()
            if not (name == "flash-attn" and not at_least(cc, floor))
        }
    )
    q["components"] = comps
    q["optional_components"] = {
        k: v for k, v in (p.get("optional_components") or {}).items() if k != "flash-attn"
    }
    return q


def pick(kind: str, table: Mapping[str, T], value: str, by_name: bool = False) -> T:
    """The record of `value` in `table` (a section of the matrix), or a clear error naming
    the known ones (by name as the matrix lists them, else by version)."""
    if value not in table:
        known = list(table) if by_name else sorted(table, key=version_key)
        raise UserError(
            f"{kind} {value!r} is not in the matrix; {suggest(value, known)}known: "
            f"{', '.join(known)}. Add it in a --matrix-dir overlay if you need it."
        )
    return table[value]


def release(kind: str, version: str, releases: Mapping[str, T]) -> T:
    """A component's release record (apex, flash-attn), or a clear error naming the known ones."""
    if version not in releases:
        raise UserError(
            f"{kind} {version!r} is not in the matrix; known: {', '.join(releases)}. "
            "Add it in a --matrix-dir overlay if you need it."
        )
    return releases[version]


def legacy_trainer(verl: E.VerlEntry, algo: E.AlgorithmEntry) -> tuple[str, ...]:
    """`trainer.use_v1=False` where the release's default trainer (v1) never computes what the
    estimator needs (algorithms.yaml `v1: false`, verl.yaml `trainer_v1`), else nothing."""
    v1 = verl.get("trainer_v1")
    if v1 and algo.get("v1", True) is False:
        return (f"{v1['key']}=False",)
    return ()


def rounded_batch(train: E.TrainBlock, world: int) -> int:
    """The train batch a profile's `train` block takes on `world` GPUs: the mini-batch rounded up
    to a multiple of the world, the batch to a multiple of that (cluster_plan)."""
    mini = min(train["ppo_mini_batch_size"], train["train_batch_size"])
    mini = -(-mini // world) * world
    return int(-(-train["train_batch_size"] // mini) * mini)


def layout_words(lay: Mapping[str, int]) -> str:
    """A Megatron layout in words (megatron.Layout.words)."""
    from envbuilder.model.megatron import Layout

    return Layout(**lay).words()


# -- the stages, in the order select runs them ---------------------------------------------------


def select(a: Ask) -> Selection:
    """What the profile and the overrides name, read from the matrix, with nothing judged: the
    versions and their records, the rollout's release, the kernels and precision, the pins, the
    engine, then the HF-rollout, cluster and memory plans. Each stage's record is new; the
    selection is their composition."""
    v = versions(a)
    r = rollout_pick(a, v)
    k = kernels(a, v)
    pn = pins(a, v, r, k)
    e = engine_pick(a, v)
    tp = train_plan(a, v)
    c = cluster_plan(a, v, k, e, tp)
    mp = memory_pick(a, sizing(v, k, e, tp, c), v, e, tp, c)
    return Selection(
        versions=v,
        rollout_pick=r,
        kernels=k,
        pin_set=pn,
        engine_pick=e,
        train_plan=tp,
        cluster=c,
        memory_pick=mp,
    )


def versions(a: Ask) -> Versions:
    """The card, the CUDA, torch, verl and algorithm asked for, with their records, the
    components, the Python and the torch build."""
    ov, p, m, t = a.ov, a.p, a.m, a.m.typed
    gpu_key = a.named.gpu or str(p["gpu"])  # (the card asked for: its identity and memory)
    card = t.gpus[gpu_key]
    cuda_v, torch_v = ov.cuda or str(p["cuda"]), ov.torch or str(p["torch"])
    verl_v, rollout = ov.verl or str(p["verl"]), ov.rollout or str(p["rollout"])
    cuda = pick("CUDA", t.cuda, cuda_v)
    torch = pick("torch", t.torch, torch_v)
    verl = pick("verl", t.verl, verl_v)
    algo = ov.algo or str(p.get("algorithm", "gae"))
    algo_rec = pick("algorithm (--algo)", t.algorithms, algo, by_name=True)
    batches = verl.get("batches")
    # the profile's compiled components with --with / --without applied (registry.select)
    optional: dict[str, str] = p.get("optional_components", {})
    components = COMPONENTS.select(m, dict(p["components"]), optional, ov.with_, ov.without, torch_v)
    picked = TORCH.build_for(torch, cuda_v)
    variant, build = picked or (f"cu{cuda_v.replace('.', '')}", {"cuda": cuda_v, "archs": []})
    return Versions(
        gpu_key=gpu_key,
        gpu=m.gpus[gpu_key],
        card=card,
        cc=card["compute_capability"],
        cuda_v=cuda_v,
        cuda=cuda,
        torch_v=torch_v,
        torch=torch,
        verl_v=verl_v,
        verl=verl,
        rollout=rollout,
        algo=algo,
        algo_rec=algo_rec,
        algo_plan=m.algorithms[algo],
        engine_batches=bool(batches and batches["engine"]),
        components=MappingProxyType(components),
        python=ov.python or str(p.get("python") or cuda["python"]),
        picked=picked,
        variant=variant,
        build=build,
    )


def rollout_pick(a: Ask, v: Versions) -> RolloutPick:
    """The vLLM or SGLang release, the CUDAs their wheels bring, the CUDAs a --cuda
    suggestion may name, and the driver they all need."""
    ov, p, m, t = a.ov, a.p, a.m, a.m.typed
    vllm_v: str | None = None
    vr: E.VllmEntry | None = None
    extra_cudas: list[str] = []
    if v.rollout == "vllm":
        given: str | None = ov.vllm or p.get("vllm")
        vllm_v = given or VLLM.choose(m, v.torch_v, v.verl)
        if vllm_v:
            vr = pick("vllm", t.vllm, vllm_v)
            if vr["wheel_cuda"] in m.cuda:
                extra_cudas.append(vr["wheel_cuda"])
    sglang_v = SGLANG.of(m, v.verl_v) if v.rollout == "sglang" else None
    sr = t.sglang.get(sglang_v) if sglang_v else None
    wheel_cuda = sr.get("wheel_cuda") if sr else None
    if wheel_cuda and wheel_cuda in m.cuda:
        extra_cudas.append(wheel_cuda)
    # CUDAs a --cuda suggestion may name: the torch release has a build for them, and the
    # vLLM wheel (if any) shares their major
    usable_cudas = tuple(
        c
        for c in m.cuda
        if any(b["cuda"] == c for b in v.torch["builds"].values())
        and all(c.split(".")[0] == x.split(".")[0] for x in extra_cudas)
    )
    return RolloutPick(
        vllm_v=vllm_v,
        vr=vr,
        sglang_v=sglang_v,
        sr=sr,
        extra_cudas=tuple(extra_cudas),
        usable_cudas=usable_cudas,
        driver=CUDA.driver_info(m, v.cuda_v, v.cuda, extra_cudas, ov.driver),
    )


def kernels(a: Ask, v: Versions) -> Kernels:
    """The card's features, dtype, flash-attn and where it comes from, the attention,
    verl's fused-kernel backend and token budgets (verl.yaml `speed`), apex."""
    t, p = a.m.typed, a.p
    fa_section = t.flash_attn
    feats = {k: at_least(v.cc, f["min_compute_capability"]) for k, f in t.features.items()}
    dtype = str(p["dtype"])
    if dtype == "auto":
        dtype = "bf16" if v.card["bf16"] else ("fp16" if v.card["fp16_fast"] else "fp32")
    fa = v.components.get("flash-attn")
    fa_rec = release("flash-attn", fa, COMPONENTS.required(fa_section)["versions"]) if fa else None
    fa_choice = (
        FA.choose(
            COMPONENTS.required(fa_section),
            fa,
            cc=v.cc,
            torch_v=v.torch_v,
            torch_cuda=v.build["cuda"],
            python=v.python,
            machine=v.card.get("machine") or "x86_64",
            index=a.ov.flash_attn_index,
        )
        if fa
        else None
    )
    fa_usable = fa is not None and at_least(v.cc, COMPONENTS.required(fa_section)["min_compute_capability"])
    attention = str(p["attention"])
    if attention == "auto":
        attention = "flash_attention_2" if fa_usable else "sdpa"
    # verl's speed settings (verl.yaml `speed`): the first fused-kernel backend the card runs
    speed = v.verl.get("speed")
    fused = next(
        (
            f["backend"]
            for f in (speed["fused_kernels"] if speed else ())
            if at_least(v.cc, f["min_compute_capability"])
        ),
        None,
    )
    apex_v = v.components.get("apex")
    return Kernels(
        feats=MappingProxyType(feats),
        dtype=dtype,
        fa=fa,
        fa_rec=fa_rec,
        fa_choice=fa_choice,
        attention=attention,
        fused=fused,
        dynamic_bsz=bool(speed and speed["dynamic_bsz"]),
        apex_v=apex_v,
        apex_rec=release("apex", apex_v, COMPONENTS.required(t.apex)["versions"]) if apex_v else None,
    )


def pins(a: Ask, v: Versions, r: RolloutPick, k: Kernels) -> Pins:
    """verl's pins, then the vLLM release's own pairings, then what flash-attn imports, then
    the profile's: later ones win."""
    t = a.m.typed
    out = dict(v.verl["pins"])
    if r.vllm_v:
        out.update(t.vllm[r.vllm_v].get("pins") or {})
    if r.sr:  # SGLang pins what it shares exactly (transformers), then what verl's extra adds
        out.update(r.sr.get("pins") or {})
        out.update(v.verl["sglang"].get("pins") or {})
    if k.fa:  # its wheel installs with --no-deps: what it imports at run time is pinned here
        out.update(COMPONENTS.required(t.flash_attn).get("runtime_pins") or {})
    profile_pins: dict[str, str] = a.p.get("pins", {})
    out.update(profile_pins)
    return Pins(pins=MappingProxyType(out))


def engine_pick(a: Ask, v: Versions) -> EnginePick:
    """--engine megatron: the release's Megatron record, refused where it cannot run (no
    record for this verl, the card below TransformerEngine's floor, a machine without its
    wheels, a Python megatron-core has no wheel for)."""
    ov = a.ov
    engine = ov.engine or "fsdp"
    if ov.megatron and engine != "megatron":
        raise UserError(
            f"--megatron {','.join(ov.megatron)}: a Megatron layout needs --engine megatron. "
            "Add --engine megatron, or drop --megatron."
        )
    if engine != "megatron":
        return EnginePick(engine=engine, megatron=None)
    rec = v.verl.get("megatron")
    have = sorted(ver for ver, r in a.m.typed.verl.items() if r.get("megatron"))
    if not rec:
        raise UserError(
            f"--engine megatron: envbuild has no Megatron stack for verl {v.verl_v} (megatron-core, "
            "TransformerEngine and the bridge are pinned per release). Use --verl "
            + " or --verl ".join(have)
            + ", or drop --engine megatron (the FSDP engine)."
        )
    _megatron_runs(v, rec)
    return EnginePick(engine=engine, megatron=rec)


def _megatron_runs(v: Versions, rec: E.MegatronEntry) -> None:
    """A UserError where the selection cannot run the release's Megatron stack: the card below
    TransformerEngine's floor, a machine without its wheels, another CUDA major, a Python
    megatron-core has no wheel for, a rollout other than vLLM."""
    machine = v.card.get("machine") or "x86_64"
    if not at_least(v.cc, rec["min_compute_capability"]):
        raise UserError(
            f"--engine megatron on the {v.card['name']} (compute capability {v.cc}): TransformerEngine "
            f"{rec['transformer_engine']}, which verl's Megatron engine runs on, supports compute "
            f"capability {rec['min_compute_capability']} (Ampere) and later. Drop --engine megatron: "
            "the FSDP engine trains on this card."
        )
    if machine not in rec["machines"]:
        raise UserError(
            f"--engine megatron on {machine}: TransformerEngine {rec['transformer_engine']}'s core "
            f"wheel (transformer-engine-cu13) is published for {', '.join(rec['machines'])} only. "
            "Drop --engine megatron (the FSDP engine), or train on an x86_64 host."
        )
    if v.build["cuda"].split(".")[0] != rec["cuda_major"]:
        raise UserError(
            f"--engine megatron with torch {v.torch_v} for CUDA {v.build['cuda']}: TransformerEngine "
            f"{rec['transformer_engine']}'s core wheel is built for CUDA {rec['cuda_major']}. Use --cuda "
            f"{rec['cuda_major']}.0, or drop --engine megatron."
        )
    if not in_range(v.python, rec["python"]):
        raise UserError(
            f"--engine megatron with Python {v.python}: megatron-core "
            f"{rec['packages']['megatron-core']} needs Python {rec['python']}. Add --python 3.12."
        )
    if v.rollout != "vllm":
        raise UserError(
            f"--engine megatron with the {v.rollout} rollout: envbuild plans the Megatron engine "
            "with vLLM's rollout only. Add --rollout vllm."
        )


def train_plan(a: Ask, v: Versions) -> TrainPlan:
    """The profile's train block (with --model), and what the release's HF rollout cannot do,
    planned around (verl.yaml hf_rollout): the actor's parameters stay on the GPU where generate
    cannot load them back, LoRA gets use_orig_params=True where one flat parameter holds base
    and adapters; and the run overrides that would undo either, for preflight to refuse. Its
    notes end with the legacy trainer's, where the estimator needs it."""
    ov, models = a.ov, a.models
    train = dict(a.p["train"])
    if ov.model and ov.model != train["model"]:
        from envbuilder.model.architectures import scaled_vram_gb

        was = models[train["model"]]["parameters"]
        train["model"] = ov.model
        train["model_vram_gb"] = scaled_vram_gb(train["model_vram_gb"], was, models[ov.model]["parameters"])
    notes: list[str] = []
    refused: list[R.RefusedOverride] = []
    lora_key = None
    if a.named.gpu:
        notes.append(a.named.why)
    if ov.model and ov.model.startswith("/"):
        notes.append(
            f"the model is the folder {ov.model}, which the image does not "
            f"hold: mount it at the same path (docker run -v "
            f"{ov.model}:{ov.model}:ro ...)"
        )
    hf = v.verl.get("hf_rollout") if v.rollout == "hf" else None
    off, lora = (hf.get("offload"), hf.get("lora")) if hf else (None, None)
    actor_offload_ok = not (off and not off["works"])
    train["actor_param_offload"] = train["param_offload"] and actor_offload_ok
    where = f"verl {v.verl_v}'s HF rollout"
    if off and not off["works"]:  # (not actor_offload_ok)
        key = "actor_rollout_ref.actor.fsdp_config.param_offload"
        if train["param_offload"]:
            notes.append(
                f"{key}=False although the profile offloads parameters (the critic's "
                f"and the reference's still are): {off['why']}. The memory plan "
                "keeps the actor's weights on the GPU in every phase"
            )
        refused.append(
            R.RefusedOverride(
                key=key,
                value="true",
                why=f"{where} cannot generate from an offloaded actor: {off['why']}",
                fix="leave it False (the memory plan keeps the actor's weights on "
                f"the GPU: envbuild show {a.named.gpu or a.name} --memory), offload the optimizer instead, or use "
                f"the vLLM rollout on a GPU of CC >= {a.m.min_compute_capability}",
            )
        )
    if lora and train["lora_rank"]:
        lora_key = lora["key"]
        notes.append(f"{lora['key']}=True for LoRA on the HF rollout: {lora['why']}")
        refused.append(
            R.RefusedOverride(
                key=lora["key"],
                value="false",
                why=f"{where} cannot wrap LoRA then: {lora['why']}",
                fix=f"leave {lora['key']}=True as the run script sets it",
            )
        )
    if legacy_trainer(v.verl, v.algo_rec):
        notes.append(
            f"trainer.use_v1=False: {v.algo} on verl {v.verl_v} needs the legacy trainer, "
            f"since {v.verl['trainer_v1']['why']}"
        )
    return TrainPlan(
        train=MappingProxyType(train),
        notes=tuple(notes),
        refused=tuple(refused),
        lora_key=lora_key,
        actor_offload_ok=bool(actor_offload_ok),
    )


def cluster_plan(a: Ask, v: Versions, k: Kernels, e: EnginePick, tp: TrainPlan) -> ClusterPlan:
    """--nodes and --gpus-per-node: the world the run shards over (the memory plan divides
    every role's state by it; verl splits the batches evenly over it, so they are rounded
    up to a multiple), the user's world choices checked against it, and --interconnect: what
    NCCL and Gloo are told (network)."""
    ov = a.ov
    nodes = ov.nodes or 1
    per_node = ov.gpus_per_node or tp.train["n_gpus"]
    if nodes < 1 or per_node < 1 or nodes > 1024 or per_node > 64:
        raise UserError(
            f"--nodes {nodes} --gpus-per-node {per_node}: a run takes 1 to 1024 nodes of 1 to 64 GPUs each."
        )
    train, notes = round_batches(a, dict(tp.train, n_gpus=per_node), nodes, per_node)
    train, pinned, layout = world_flags(a, v, k, e, train, nodes)
    return ClusterPlan(
        nodes=nodes,
        world=nodes * per_node,
        train=MappingProxyType(train),
        notes=notes,
        pinned=pinned,
        megatron_layout=MappingProxyType(layout) if layout is not None else None,
        network=network(a, v, nodes, per_node),
    )


def round_batches(
    a: Ask, train: Train, nodes: int, per_node: int
) -> tuple[dict[str, object], tuple[str, ...]]:
    """A copy of `train` with the mini-batch a multiple of the world (verl splits it evenly over
    the GPUs), then the train batch a multiple of the mini-batch (else the last mini-batch is
    short and its micro-batches do not divide it: envbuilder/model/batches.py), and a note of
    each batch rounded up; a world whose step takes more prompts than the data set has is
    refused."""
    t, world, notes = dict(train), nodes * per_node, []
    t["ppo_mini_batch_size"] = min(t["ppo_mini_batch_size"], t["train_batch_size"])
    for key, unit, why in (
        ("ppo_mini_batch_size", world, f"of the {world} GPUs (verl splits it evenly over them)"),
        ("train_batch_size", 0, "of the mini-batch (each step is a whole number of mini-batches)"),
    ):
        unit = unit or t["ppo_mini_batch_size"]
        if t[key] % unit:
            was, t[key] = t[key], -(-t[key] // unit) * unit
            label = (
                "actor_rollout_ref.actor.ppo_mini_batch_size"
                if key == "ppo_mini_batch_size"
                else "data.train_batch_size"
            )
            notes.append(f"{label} {t[key]}: the profile's {was} rounded up to a multiple {why}")
    gsm8k = a.m.typed.datasets.get("gsm8k")
    rows = gsm8k["rows"]["train"] if gsm8k else None
    if rows and t["train_batch_size"] > rows:
        p_train = a.p["train"]
        fits = next(
            (w for w in range(world - 1, 0, -1) if rounded_batch(p_train, w) <= rows),
            0,
        )
        raise UserError(
            f"--nodes {nodes} --gpus-per-node {per_node}: on {world} GPUs a step takes "
            f"data.train_batch_size {t['train_batch_size']} prompts (each GPU needs a share of "
            f"every mini-batch), more than GSM8K's {rows} training rows. verl's dataloader "
            "drops the last partial batch, so not one step would run. "
            + (f"Use at most {fits} GPUs in all" if fits else "Use fewer GPUs")
            + " (--nodes × --gpus-per-node), or train on a larger data set."
        )
    return t, tuple(notes)


def world_flags(
    a: Ask, v: Versions, k: Kernels, e: EnginePick, train: Train, nodes: int
) -> tuple[dict[str, object], tuple[str, ...], dict[str, int] | None]:
    """--rollout-tp, --offload, --sp, --host-memory and --megatron: the choices the memory plan
    would make, made by the user (the plan takes them as given: ClusterPlan.pinned), each
    checked against the world and the model's heads as vLLM and verl require; and what the plan
    sizes for, --max-prompt-length, --max-response-length and --lora-rank. A copy of `train`
    with them, the choices made, and --megatron's layout (None: the plan's)."""
    ov, t = a.ov, dict(train)
    pinned: list[str] = []
    arch = a.models[t["model"]]
    heads, kv, per_node = arch["attention_heads"], arch["kv_heads"], t["n_gpus"]

    def splits(flag: str, n: int, what: str) -> None:
        if per_node % n or heads % n or not (kv % n == 0 or n % kv == 0):
            from envbuilder.model.arch import Arch
            from envbuilder.model.memory import split_ways

            ways = split_ways(per_node, Arch(t["model"], arch), per_node)
            raise UserError(
                f"{flag} {n}: {what} over {n} GPUs needs a number that divides the {per_node} GPUs "
                f"of a node and {t['model']}'s {heads} attention heads ({kv} KV heads: a divisor "
                f"or a multiple of them). Use {flag} " + " or ".join(map(str, ways)) + "."
            )

    if ov.rollout_tp is not None:
        if v.rollout != "vllm":
            raise UserError(
                f"--rollout-tp {ov.rollout_tp}: the {v.rollout} rollout generates on each GPU alone; "
                "tensor parallelism is vLLM's. Drop --rollout-tp, or use --rollout vllm."
            )
        splits("--rollout-tp", ov.rollout_tp, "splitting each vLLM engine")
        t["rollout_tp"] = ov.rollout_tp
        pinned.append("rollout_tp")
    if ov.offload:
        words = set(ov.offload)
        if not words <= set(F.OFFLOAD) or ("none" in words and len(words) > 1):
            raise UserError(
                f"--offload {','.join(ov.offload)}: offload takes params, optimizer or both "
                "(params,optimizer), or none alone. Use one of those."
            )
        t["param_offload"], t["optimizer_offload"] = "params" in words, "optimizer" in words
        pinned.append("offload")
    if ov.sp is not None and e.megatron and ov.sp > 1:
        raise UserError(
            f"--sp {ov.sp}: Ulysses sequence parallelism is the FSDP engine's; the Megatron engine "
            f"splits a sequence with context parallelism. Use --megatron cp={ov.sp}, or drop --sp."
        )
    if ov.sp is not None:
        splits("--sp", ov.sp, "splitting each sequence (Ulysses)")
        if ov.sp > 1 and not k.remove_padding:
            raise UserError(
                f"--sp {ov.sp}: verl's Ulysses sequence parallelism needs use_remove_padding, which "
                f"runs on flash-attn's varlen kernels; this render uses {k.attention} attention. "
                "Add --with flash-attn (CC 8.0 and up), or drop --sp."
            )
        t["sequence_parallel"] = ov.sp
        pinned.append("sequence_parallel")
    if ov.host_memory is not None:
        t["host_memory_gib"] = ov.host_memory
    for key in ("max_prompt_length", "max_response_length"):
        if getattr(ov, key) is not None:
            t[key] = getattr(ov, key)
    if ov.lora_rank is not None:
        if ov.lora_rank and e.megatron:
            raise UserError(
                f"--lora-rank {ov.lora_rank}: envbuild plans LoRA on the FSDP engine only (the "
                "Megatron engine's memory plan has no adapters). Drop --engine megatron, or drop --lora-rank."
            )
        t["lora_rank"] = ov.lora_rank
    layout = None
    if ov.megatron and e.megatron:
        layout = megatron_flag(a, t, nodes, ov.megatron)
        pinned.append("megatron")
    return t, tuple(pinned), layout


def megatron_flag(a: Ask, t: Train, nodes: int, words: tuple[str, ...]) -> dict[str, int]:
    """--megatron tp=N,pp=N,ep=N,cp=N: checked against the model and the world as
    megatron-core checks it (model/megatron.py fits_model)."""
    from envbuilder.model.arch import Arch
    from envbuilder.model.megatron import Layout, fits_model

    given: dict[str, int] = {}
    for w in words:
        key, _, value = w.partition("=")
        if key not in ("tp", "pp", "ep", "cp") or not value.isdigit() or int(value) < 1 or key in given:
            raise UserError(
                f"--megatron {','.join(words)}: a layout is tp=N,pp=N,ep=N,cp=N (each at most once, "
                "each a whole number from 1). Use e.g. --megatron tp=2,pp=1,ep=8."
            )
        given[key] = int(value)
    lay = Layout(**given)
    per_node, world = t["n_gpus"], t["n_gpus"] * nodes
    why = fits_model(Arch(t["model"], a.models[t["model"]]), lay, per_node, world)
    if why:
        raise UserError(
            f"--megatron {','.join(words)}: {why} ({t['model']} on {world} GPUs). Drop --megatron "
            "and the plan chooses a layout that fits, or give one that divides them."
        )
    out: dict[str, int] = lay.to_dict()
    return out


def network(a: Ask, v: Versions, nodes: int, per_node: int) -> Network:
    """--interconnect: what NCCL and Gloo are told (interconnects.yaml), with
    NCCL_P2P_DISABLE=1 for several GPUs per node of a card without peer-to-peer (or a
    driver on which its P2P transport hangs), and verl's own NCCL settings for a
    multi-node NVLink GPU."""
    ov, card, notes = a.ov, v.card, []
    name = ov.interconnect or ("tcp" if nodes > 1 else None)
    table = a.m.typed.interconnects
    interconnect = pick("interconnect (--interconnect)", table, name, by_name=True) if name else None
    if nodes > 1 and not ov.interconnect:
        notes.append(
            f"the {nodes} nodes talk over plain TCP (NCCL_IB_DISABLE=1): pass "
            "--interconnect ib or roce where they have an RDMA network"
        )
    env = dict(interconnect["env"] if interconnect else {})
    p2p_driver, drv = card.get("p2p_driver"), ov.driver
    if per_node > 1 and card.get("p2p") is False:
        env["NCCL_P2P_DISABLE"] = "1"
        notes.append(
            f"NCCL_P2P_DISABLE=1: {per_node} {card['name']}s in a node have no "
            "peer-to-peer (NCCL's P2P transport hangs on them)"
        )
    elif per_node > 1 and p2p_driver and (drv is None or version_key(drv) < version_key(p2p_driver)):
        env["NCCL_P2P_DISABLE"] = "1"
        notes.append(
            f"NCCL_P2P_DISABLE=1: {per_node} {card['name']}s in a node, and NCCL's P2P "
            f"transport hangs on them with drivers older than {p2p_driver} "
            + (f"(--driver {drv})" if drv else f"(pass --driver; from {p2p_driver} it stays on)")
        )
    # verl's own NCCL settings for a multi-node NVLink GPU, which the launchers set where
    # `when` holds (an HGX B200 has no IMEX channels and keeps NVLS)
    nccl = v.verl.get("nccl_env")
    imex_env = None
    if nccl and card.get("mnnvl") and at_least(v.cc, nccl["min_compute_capability"]):
        imex_env = MappingProxyType(dict(sorted(nccl["env"].items())))
    if table and interconnect and interconnect.get("note"):
        notes.append(f"{name}: {interconnect['note']}")
    return Network(
        interconnect=interconnect,
        ic_name=name,
        cluster_env=MappingProxyType(dict(sorted(env.items()))),
        imex_env=imex_env,
        notes=tuple(notes),
    )


def memory_pick(a: Ask, z: Sizing, v: Versions, e: EnginePick, tp: TrainPlan, c: ClusterPlan) -> MemoryPick:
    """The memory plan of the cluster plan's train block (with LoRA's bf16 base where the flat
    one does not fit), and the train block with what it chose."""
    plan, bf16_base = lora_memory(a, z, c.train)
    train, notes = apply_choices(plan, v, e, tp, c)
    if bf16_base:
        train["actor_model_dtype"] = "bf16"
        notes += (
            "++actor_rollout_ref.actor.fsdp_config.model_dtype=bf16 and the patch "
            "verl-hf-rollout-lora-wrap: with an fp32 base in one flat parameter the model does "
            "not fit, so the frozen base loads in bf16 and each LoRA adapter (fp32) is an FSDP "
            "unit of its own; the reference is the same weights with the adapters off",
        )
    return MemoryPick(plan=plan, bf16_base=bf16_base, train=MappingProxyType(train), notes=notes)


def apply_choices(
    plan: MemoryPlan, v: Versions, e: EnginePick, tp: TrainPlan, c: ClusterPlan
) -> tuple[dict[str, object], tuple[str, ...]]:
    """What the memory plan chose (offload, vLLM's share, the rollout's TP, Ulysses SP) into
    a copy of the cluster plan's train block, the block the run plan prints; a choice the plan
    changed is noted with its why."""
    t, ch, notes = dict(c.train), plan.choices, []
    for key, offload in (
        ("param_offload", ch.param_offload),
        ("optimizer_offload", ch.optimizer_offload),
    ):
        if offload is not None and offload.value != t[key]:
            t[key] = offload.value
            notes.append(f"{key}: {offload.why}")
    t["actor_param_offload"] = t["param_offload"] and tp.actor_offload_ok
    if v.rollout == "vllm":
        t["gpu_memory_utilization"] = ch.gpu_memory_utilization.value
    if e.engine == "megatron" and ch.megatron is not None:
        layout = dict(ch.megatron.value, etp=1)
        t["megatron"] = MappingProxyType(layout)
        if not c.megatron_layout:
            notes.append(f"Megatron layout {layout_words(layout)}: {ch.megatron.why}")
    for key, split in (("rollout_tp", ch.rollout_tp), ("sequence_parallel", ch.sequence_parallel)):
        if split is not None and split.value > 1:
            t[key] = split.value
            if key not in c.pinned:
                notes.append(f"{key} {split.value}: {split.why}")
        else:
            t.pop(key, None)
    return t, tuple(notes)
