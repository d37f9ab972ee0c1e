"""The resolver's Selection: what a profile and its overrides name, read from the matrix, the
input of every rule (model/rules.py), of the assembly (model/assemble.py) and of the components'
own refusals (model/components/*.py `problems`), declared here so all of them type it without
importing each other.

A selection is made in stages (model/stages.py), each a function that returns a new record
built from the records of the stages before it: `Versions`, `RolloutPick`, `Kernels`, `Pins`,
`EnginePick`, `TrainPlan`, `ClusterPlan` (with its `Network`) and `MemoryPick`. No stage changes
an earlier one's record: where a later stage changes the train block or adds a note, its own
record holds the new train block and its notes, and `Selection`, the frozen composition of the
eight, reads the train block of the last stage and the notes of all of them in order.

What a stage makes is frozen (tuples, read-only mappings); a record of the matrix a stage
picks (`E.VerlEntry`, ...) is the matrix's own, which nothing changes, held as it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envbuilder.model import entries as E
from envbuilder.model import resolved as R
from envbuilder.model.components import flash_attn as FA
from envbuilder.model.matrix import Entry, Matrix
from envbuilder.model.memory_plan import MemoryPlan
from envbuilder.model.names import Named
from envbuilder.model.resolved import Overrides
from envbuilder.record import Record

# a train block (matrix profiles' `train`, with what the stages add: the world's batches, the
# memory plan's choices); its values are JSON scalars of several types, as the profile's are
Train = Mapping[str, Any]


class Ask(Record):
    """What a resolution is asked: the matrix, the overrides, the profile as named (a card
    without a profile names the profile's stack, on that card) and as `--verl` stacks it
    (stages.ask), and the model table with --model's shape where the table lacks it."""

    m: Matrix
    ov: Overrides
    named: Named
    name: str  # the profile's key
    p: Mapping[str, Any]  # the profile, stacked (read-only: stages.ask makes it)
    models: Mapping[str, Entry]


class Versions(Record):
    """The card, the CUDA, torch, verl and algorithm asked for, with their records, the
    components, the Python and the torch build (stages.versions). `_v`: a version, `_rec`:
    its record."""

    gpu_key: str
    gpu: Entry  # the card's record as the memory plan takes it (`card`, typed)
    card: E.GpuEntry  # the card's record (gpus.yaml)
    cc: str
    cuda_v: str
    cuda: E.CudaEntry
    torch_v: str
    torch: E.TorchEntry
    verl_v: str
    verl: E.VerlEntry
    rollout: str
    algo: str
    algo_rec: E.AlgorithmEntry
    algo_plan: Entry  # the same record, as the memory plan takes it
    # whether the release's workers assert that each GPU's data divides every micro-batch
    engine_batches: bool
    components: Mapping[str, str]  # flash-attn, apex -> version
    python: str
    picked: tuple[str, E.TorchBuild] | None  # (variant, build) of the torch release, None: no build
    variant: str
    build: E.TorchBuild


class RolloutPick(Record):
    """The vLLM or SGLang release, the CUDAs their wheels bring, the CUDAs a --cuda suggestion
    may name, and the driver they all need (stages.rollout_pick)."""

    vllm_v: str | None
    vr: E.VllmEntry | None  # the vLLM release's record
    sglang_v: str | None
    sr: E.SglangEntry | None  # the SGLang release's record
    extra_cudas: tuple[str, ...]
    usable_cudas: tuple[str, ...]
    driver: R.Driver


class Kernels(Record):
    """The card's features, the dtype, flash-attn and where it comes from, the attention, verl's
    fused-kernel backend and token budgets (verl.yaml `speed`), apex (stages.kernels)."""

    feats: Mapping[str, bool]
    dtype: str
    fa: str | None
    fa_rec: E.FlashAttnRelease | None
    fa_choice: FA.Choice | None  # where the builder takes flash-attn from first
    attention: str
    fused: str | None  # verl's fused log-prob backend the card runs (verl.yaml speed), None: none
    dynamic_bsz: bool  # token-budget micro-batches (verl.yaml speed)
    apex_v: str | None
    apex_rec: E.ApexRelease | None

    @property
    def remove_padding(self) -> bool:
        """Whether the run unpads its micro-batches (flash-attn's varlen kernels, CC 8.0)."""
        return self.attention == "flash_attention_2" and bool(self.feats.get("remove_padding", True))


class Pins(Record):
    """verl's pins, the rollout release's, what flash-attn imports, then the profile's: later
    ones win (stages.pins)."""

    pins: Mapping[str, str]


class EnginePick(Record):
    """verl's training engine (--engine) and, on Megatron, the release's Megatron record
    (verl.yaml `megatron`; None on FSDP) (stages.engine_pick)."""

    engine: str
    megatron: E.MegatronEntry | None


class TrainPlan(Record):
    """The profile's train block (with --model), what the release's HF rollout cannot do planned
    around, the notes so far and the run overrides preflight refuses (stages.train_plan)."""

    train: Train
    notes: tuple[str, ...]
    refused: tuple[R.RefusedOverride, ...]
    lora_key: str | None
    actor_offload_ok: bool


class Network(Record):
    """What NCCL and Gloo are told (interconnects.yaml, --interconnect), and verl's own NCCL
    settings for a multi-node NVLink GPU (stages.network)."""

    interconnect: E.InterconnectEntry | None
    ic_name: str | None
    cluster_env: Mapping[str, str]
    imex_env: Mapping[str, str] | None
    notes: tuple[str, ...]


class ClusterPlan(Record):
    """The world the run shards over (--nodes, --gpus-per-node), the train block with its
    batches rounded to it and the world choices the user made (--rollout-tp, --offload, --sp,
    --host-memory, --megatron), and the network (stages.cluster_plan)."""

    nodes: int
    world: int
    train: Train
    notes: tuple[str, ...]  # the batches rounded up (the network's notes are its own)
    pinned: tuple[str, ...]  # the world choices the user made (--rollout-tp, --offload, --sp)
    megatron_layout: Mapping[str, int] | None  # --megatron's layout, taken as given; None: planned
    network: Network


class MemoryPick(Record):
    """The memory plan of the selection, and the train block with what it chose (offload,
    vLLM's share, the rollout's TP, Ulysses SP, the Megatron layout, LoRA's bf16 base), each
    change the plan made noted with its why (stages.memory_pick)."""

    plan: MemoryPlan
    bf16_base: bool  # LoRA's frozen base loads in bf16 (stages.lora_memory)
    train: Train
    notes: tuple[str, ...]


class Selection(Record):
    """What a profile and its overrides name (versions, the matrix's records, the torch build,
    the vLLM release, dtype and attention as the profile asks), and the plans made of them: the
    input of every rule. The frozen composition of the stages' records, made once by
    stages.select; its properties read each stage's fields by the names the rules use."""

    versions: Versions
    rollout_pick: RolloutPick
    kernels: Kernels
    pin_set: Pins
    engine_pick: EnginePick
    train_plan: TrainPlan
    cluster: ClusterPlan
    memory_pick: MemoryPick

    @property
    def notes(self) -> tuple[str, ...]:
        """Every stage's notes, in the order the stages made them."""
        return (
            self.train_plan.notes + self.cluster.notes + self.cluster.network.notes + self.memory_pick.notes
        )

    @property
    def gpu_key(self) -> str:
        return self.versions.gpu_key

    @property
    def gpu(self) -> Entry:
        return self.versions.gpu

    @property
    def card(self) -> E.GpuEntry:
        return self.versions.card

    @property
    def cc(self) -> str:
        return self.versions.cc

    @property
    def cuda_v(self) -> str:
        return self.versions.cuda_v

    @property
    def cuda(self) -> E.CudaEntry:
        return self.versions.cuda

    @property
    def torch_v(self) -> str:
        return self.versions.torch_v

    @property
    def torch(self) -> E.TorchEntry:
        return self.versions.torch

    @property
    def verl_v(self) -> str:
        return self.versions.verl_v

    @property
    def verl(self) -> E.VerlEntry:
        return self.versions.verl

    @property
    def rollout(self) -> str:
        return self.versions.rollout

    @property
    def algo(self) -> str:
        return self.versions.algo

    @property
    def algo_rec(self) -> E.AlgorithmEntry:
        return self.versions.algo_rec

    @property
    def components(self) -> Mapping[str, str]:
        return self.versions.components

    @property
    def python(self) -> str:
        return self.versions.python

    @property
    def picked(self) -> tuple[str, E.TorchBuild] | None:
        return self.versions.picked

    @property
    def variant(self) -> str:
        return self.versions.variant

    @property
    def build(self) -> E.TorchBuild:
        return self.versions.build

    @property
    def engine_batches(self) -> bool:
        return self.versions.engine_batches

    @property
    def vllm_v(self) -> str | None:
        return self.rollout_pick.vllm_v

    @property
    def vr(self) -> E.VllmEntry | None:
        return self.rollout_pick.vr

    @property
    def sglang_v(self) -> str | None:
        return self.rollout_pick.sglang_v

    @property
    def sr(self) -> E.SglangEntry | None:
        return self.rollout_pick.sr

    @property
    def extra_cudas(self) -> tuple[str, ...]:
        return self.rollout_pick.extra_cudas

    @property
    def usable_cudas(self) -> tuple[str, ...]:
        return self.rollout_pick.usable_cudas

    @property
    def driver(self) -> R.Driver:
        return self.rollout_pick.driver

    @property
    def feats(self) -> Mapping[str, bool]:
        return self.kernels.feats

    @property
    def dtype(self) -> str:
        return self.kernels.dtype

    @property
    def fa(self) -> str | None:
        return self.kernels.fa

    @property
    def fa_rec(self) -> E.FlashAttnRelease | None:
        return self.kernels.fa_rec

    @property
    def fa_choice(self) -> FA.Choice | None:
        return self.kernels.fa_choice

    @property
    def attention(self) -> str:
        return self.kernels.attention

    @property
    def fused(self) -> str | None:
        return self.kernels.fused

    @property
    def dynamic_bsz(self) -> bool:
        return self.kernels.dynamic_bsz

    @property
    def apex_v(self) -> str | None:
        return self.kernels.apex_v

    @property
    def apex_rec(self) -> E.ApexRelease | None:
        return self.kernels.apex_rec

    @property
    def pins(self) -> Mapping[str, str]:
        return self.pin_set.pins

    @property
    def engine(self) -> str:
        return self.engine_pick.engine

    @property
    def megatron(self) -> E.MegatronEntry | None:
        return self.engine_pick.megatron

    @property
    def refused(self) -> tuple[R.RefusedOverride, ...]:
        return self.train_plan.refused

    @property
    def lora_key(self) -> str | None:
        return self.train_plan.lora_key

    @property
    def actor_offload_ok(self) -> bool:
        return self.train_plan.actor_offload_ok

    @property
    def nodes(self) -> int:
        return self.cluster.nodes

    @property
    def world(self) -> int:
        return self.cluster.world

    @property
    def pinned(self) -> tuple[str, ...]:
        return self.cluster.pinned

    @property
    def megatron_layout(self) -> Mapping[str, int] | None:
        return self.cluster.megatron_layout

    @property
    def interconnect(self) -> E.InterconnectEntry | None:
        return self.cluster.network.interconnect

    @property
    def ic_name(self) -> str | None:
        return self.cluster.network.ic_name

    @property
    def cluster_env(self) -> Mapping[str, str]:
        return self.cluster.network.cluster_env

    @property
    def imex_env(self) -> Mapping[str, str] | None:
        return self.cluster.network.imex_env

    @property
    def memory(self) -> MemoryPlan:
        return self.memory_pick.plan

    @property
    def train(self) -> Mapping[str, Any]:
        return self.memory_pick.train
