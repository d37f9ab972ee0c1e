"""The memory plan of a selection: what the resolver's memory stage (stages.memory_pick) and the
memory rule (rules.memory_rule, which asks whether a changed profile would fit) plan with.

`Sizing` is every input of the plan that is not the train block, read off the selection's stage
records once (`sizing`); the rule asks about another world or the plan's own Megatron layout with
`Sizing._replace`, a new record, not by changing the resolver's state. The plans are kept by
their inputs, per matrix in memory (`PLANS`) and in the sealed cache across processes."""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Mapping

from envbuilder.errors import UserError
from envbuilder.model import resolved as R
from envbuilder.model.matrix import Entry, Matrix
from envbuilder.model.memory_plan import Card, MemoryPlan
from envbuilder.model.selection import (
    Ask,
    ClusterPlan,
    EnginePick,
    Kernels,
    Train,
    TrainPlan,
    Versions,
)
from envbuilder.record import Record, plain

# each matrix's memory plans by their inputs (memory_plan)
PLANS: weakref.WeakKeyDictionary[Matrix, dict[str, MemoryPlan]] = weakref.WeakKeyDictionary()


class Sizing(Record):
    """What the memory plan of a selection reads beside its train block: the card, the dtype and
    attention, the rollout, the estimator, the world, verl's batch and kernel settings, the
    user's world choices and the Megatron engine's layout."""

    gpu_key: str
    gpu: Entry
    dtype: str
    attention: str
    rollout: str
    algo: Entry  # the estimator's record (algorithms.yaml), as the plan takes it
    lora: bool  # LoRA on the HF rollout (TrainPlan.lora_key): one flat parameter
    world: int  # the whole world (LoRA's bf16 base is planned for one GPU only)
    nodes: int
    engine_batches: bool
    fused: str | None
    pinned: tuple[str, ...]
    unpadded: bool
    actor_offload_ok: bool
    engine: str
    megatron_layout: Mapping[str, int] | None


def sizing(v: Versions, k: Kernels, e: EnginePick, tp: TrainPlan, c: ClusterPlan) -> Sizing:
    """The memory plan's inputs of a selection's stages, beside its train block."""
    return Sizing(
        gpu_key=v.gpu_key,
        gpu=v.gpu,
        dtype=k.dtype,
        attention=k.attention,
        rollout=v.rollout,
        algo=v.algo_plan,
        lora=bool(tp.lora_key),
        world=c.world,
        nodes=c.nodes,
        engine_batches=v.engine_batches,
        fused=k.fused,
        pinned=c.pinned,
        unpadded=k.remove_padding,
        actor_offload_ok=tp.actor_offload_ok,
        engine=e.engine,
        megatron_layout=c.megatron_layout,
    )


def memory_plan(
    a: Ask, z: Sizing, train: Train, lora_flat: bool = False, algo: Entry | None = None
) -> MemoryPlan:
    """The memory plan of `train` under `z` (envbuilder/model/memory.py), `algo` in place of
    the selection's estimator where given."""
    mem = a.m.memory
    total: Entry | None = mem["total_mib"].get(z.gpu_key)
    card = card_size(total, z.gpu, a.ov.ecc, a.ov.gpu_memory)
    consts = dict(mem, total_gib=card.mib / 1024)
    algo = algo or z.algo
    plain_train: dict[str, object] = plain(train)  # (plain data: the plan's key and its input)
    layout = dict(z.megatron_layout) if z.megatron_layout else None
    # the same inputs give the same plan: computed once per matrix (a grid or a fix walk
    # resolves one profile under many overrides; the plan is most of a resolution's time)
    arch = a.models[str(plain_train["model"])]
    key = (
        json.dumps(
            [
                z.gpu_key,
                z.gpu,
                z.dtype,
                z.attention,
                z.rollout,
                plain_train,
                lora_flat,
                algo,
                arch,
                card.to_dict(),
            ],
            sort_keys=True,
            default=str,
        )
        + str(z.nodes)
        + str(z.engine_batches)
        + str(z.fused)
        + str((z.pinned, z.unpadded, z.actor_offload_ok, z.engine, layout))
    )
    known = PLANS.setdefault(a.m, {})
    if key in known:
        return known[key]
    env: dict[str, object] = {
        "dtype": z.dtype,
        "attention": z.attention,
        "rollout": z.rollout,
        "train": plain_train,
        "lora_flat_grads": lora_flat,
        "critic": algo["critic"],
        "rollout_n": algo["n"],
        "extra_generation": algo.get("extra_generation", False),
        "nodes": z.nodes,
        "engine_batches": z.engine_batches,
        "fused_kernels": z.fused,
        "pinned": sorted(z.pinned),
        "remove_padding": z.unpadded,
        "actor_offload_ok": z.actor_offload_ok,
        "engine": z.engine,
    }
    if layout:
        env["train"] = dict(plain_train, megatron_pinned=layout)
    rows: int = a.m.datasets["gsm8k"]["rows"]["test"]

    def compute() -> MemoryPlan:
        from envbuilder.model.memory import plan

        return plan(env, arch, consts, rows)

    out = _stored_plan([key, consts, rows], compute)._replace(card=card)
    known[key] = out  # (a record: nothing changes it)
    return out


def lora_memory(a: Ask, z: Sizing, train: Train, algo: Entry | None = None) -> tuple[MemoryPlan, bool]:
    """The memory plan of `train`, and whether LoRA's frozen base loads in bf16 for it.

    verl 0.4.x-0.5.x put the HF rollout's actor in one flat parameter (use_orig_params): an
    fp32 base, and a gradient the size of the whole model. Where that does not fit one GPU,
    the patch verl-hf-rollout-lora-wrap keeps verl's LoRA wrap policy, so each adapter is an
    FSDP unit of its own: no gradient spans the base, and the base loads in bf16
    (fsdp_config.model_dtype; the adapters stay fp32, peft's default). The GPU tier ran both
    (tests/fixtures/gpu/step). The flat configuration stays where it fits: it is the one the
    GPU tier ran a whole PPO step with."""
    flat = {k: v for k, v in train.items() if k != "actor_model_dtype"}
    plan = memory_plan(a, z, flat, lora_flat=z.lora, algo=algo)
    if plan.problems and z.lora and z.world == 1 and z.dtype == "bf16":
        slim = dict(flat, actor_model_dtype="bf16")
        return memory_plan(a, z, slim, algo=algo), True
    return plan, False


def _stored_plan(inputs: list[object], compute: Callable[[], MemoryPlan]) -> MemoryPlan:
    """compute(), the memory plan of `inputs` (plain data), kept as a sealed cache entry
    (paths.sealed_text) by the sha256 of the inputs and of memory.py's code. The plan's search
    over batch sizes is most of a profile's resolution, and every `envbuild render` resolves
    in a fresh process. Plain JSON both ways: the plan's records to_dict() and from_plain()."""
    import hashlib
    import os

    from envbuilder.paths import sealed_text, source

    try:  # (the plan's code by its paths: a plan read back needs none of it)
        h = hashlib.sha256()
        for name in ("memory.py", "memory_plan.py", "arch.py", "megatron.py"):
            h.update(source(os.path.join(os.path.dirname(__file__), name)))
        h.update(json.dumps(inputs, sort_keys=True).encode())
    except (OSError, TypeError, ValueError):  # (no source to key on, or not plain data)
        return MemoryPlan.from_plain(json.loads(json.dumps(plain(compute()))))
    data = json.loads(sealed_text("plan", h.hexdigest(), lambda: json.dumps(plain(compute()))))
    if not isinstance(data, dict):
        raise ValueError("a memory plan of the cache is no JSON object")
    return MemoryPlan.from_plain(data)


def card_size(total: Entry | None, gpu: Entry, ecc: str | None, given: int | None = None) -> Card:
    """The memory the plan counts on (--gpu-memory, else memory.yaml total_mib, else the nominal
    vram_gb) and what the board's ECC does to it: `ecc` is the --ecc override (None: the board's
    default), `given` the --gpu-memory override (MiB, as nvidia-smi reports the card)."""
    if given is not None:
        low, high = R.GPU_MEMORY_MIB
        if not low <= given <= high:
            raise UserError(
                f"--gpu-memory {given}: a card's memory is {low} to {high} MiB, as nvidia-smi's "
                "memory.total prints it (an A100 40GB: 40960)."
            )
        recorded = total["mib"] if total else int(gpu["vram_gb"] * 1024)
        return Card(
            mib=given,
            ecc="as measured",
            why=f"--gpu-memory {given} (the {gpu['name']} is recorded at {recorded} MiB)"
            + (f"; --ecc {ecc} changes nothing: the size given is the card's as it runs" if ecc else ""),
        )
    if total is None:
        return Card(
            mib=int(gpu["vram_gb"] * 1024),
            ecc="as shipped",
            why="no nvidia-smi size recorded: the nominal size"
            + (f"; --ecc {ecc} changes nothing here" if ecc else ""),
        )
    if "ecc_off_mib" not in total:
        why = (
            "the board's default"
            if ecc is None
            else f"--ecc {ecc}: no other size is recorded for this board (its ECC takes no memory, "
            "or the size with ECC off is unknown)"
        )
        return Card(mib=total["mib"], ecc="as shipped", why=why)
    if ecc == "off":
        return Card(
            mib=total["ecc_off_mib"],
            ecc="off",
            why=f"--ecc off (with ECC on, its default, the board shows {total['mib']} MiB)",
        )
    return Card(
        mib=total["mib"],
        ecc="on",
        why=f"ECC on, the board's default (--ecc off plans with {total['ecc_off_mib']} MiB)",
    )
