"""The resolver's Selection: what a profile and its overrides name, read from the matrix, the
input of every rule (model/resolve.py) and of the components' own refusals
(model/components/*.py `problems`), declared here so both type it without importing each
other."""

from __future__ import annotations

from typing import Any

from envbuilder.model import entries as E
from envbuilder.model import resolved as R
from envbuilder.model.components import flash_attn as FA
from envbuilder.model.matrix import Entry
from envbuilder.model.memory_plan import MemoryPlan


class Selection:
    """What a profile and its overrides name (versions, the matrix's records, the torch build,
    the vLLM release, dtype and attention as the profile asks): the input of every rule.
    Filled in order by _Resolver.select (and its cluster and HF-rollout plans); a record of
    the matrix is its YAML's, validated, and typed as entries.py says. `_v`: a version, `_rec`:
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
    components: dict[str, str]  # flash-attn, apex -> version
    python: str
    picked: tuple[str, E.TorchBuild] | None  # (variant, build) of the torch release, None: no build
    variant: str
    build: E.TorchBuild
    vllm_v: str | None
    vr: E.VllmEntry | None  # the vLLM release's record
    sglang_v: str | None
    sr: E.SglangEntry | None  # the SGLang release's record
    extra_cudas: list[str]
    usable_cudas: list[str]
    driver: R.Driver
    feats: dict[str, bool]
    dtype: str
    fa: str | None
    fa_rec: E.FlashAttnRelease | None
    fa_choice: FA.Choice | None  # where the builder takes flash-attn from first
    attention: str
    fused: str | None  # verl's fused log-prob backend the card runs (verl.yaml speed), None: none
    dynamic_bsz: bool  # token-budget micro-batches (verl.yaml speed)
    apex_v: str | None
    apex_rec: E.ApexRelease | None
    pins: dict[str, str]
    memory: MemoryPlan
    # the cluster plan
    nodes: int
    world: int
    interconnect: E.InterconnectEntry | None
    ic_name: str | None
    cluster_env: dict[str, str]
    imex_env: dict[str, str] | None
    # the HF-rollout plan
    train: dict[str, Any]
    notes: list[str]
    refused: list[R.RefusedOverride]
    lora_key: str | None
    actor_offload_ok: bool
    pinned: list[str]  # the world choices the user made (--rollout-tp, --offload, --sp)
    engine: str  # verl's training engine: fsdp or megatron (--engine)
    megatron: E.MegatronEntry | None  # the release's Megatron record (verl.yaml `megatron`), None on FSDP
    megatron_layout: dict[str, int] | None  # --megatron's layout, taken as given; None: planned
