"""The matrix's records as the type checker sees them: one TypedDict per record of
matrix_schema.py (its key `name?` is `name: NotRequired[...]` here), so a read of a field the
schema does not define, or of an optional one without `.get`, is a type error and not a KeyError
at run time. At run time they are the plain dicts the YAML (or the JSON cache) holds, checked by
matrix_schema.SECTIONS when the matrix loads: these types add no code and no copy.

A string kind of the schema (a version, a name, a URL) is `str`; `S.Scalar()` (a run key's
value) is `Scalar`; an `S.Range()` is the range's text."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict, Union

if TYPE_CHECKING:
    from typing_extensions import NotRequired

Scalar = Union[str, int, float, bool]  # (a run key's value: S.Scalar)
Pins = dict[str, str]  # package -> the version it is pinned to


class TrainingPath(TypedDict):
    modules: list[str]
    source: str


class GpuEntry(TypedDict):
    name: str
    match: list[str]
    arch: str
    compute_capability: str
    vram_gb: float
    max_smem_per_block_kb: int
    bf16: bool
    fp16_fast: bool
    machine: NotRequired[str]
    p2p: NotRequired[bool]
    p2p_driver: NotRequired[str]
    p2p_source: NotRequired[str]
    mnnvl: NotRequired[bool]
    form_factor: NotRequired[str]
    interconnect: NotRequired[str]
    source: str


class InterconnectEntry(TypedDict):
    description: str
    scope: str
    env: dict[str, str]
    interface: bool
    note: NotRequired[str]
    source: str


class CudaImages(TypedDict):
    devel: str
    runtime: str


class CudaEntry(TypedDict):
    version: str
    min_driver: str
    compat_driver: str
    nvcc_archs: list[str]
    ubuntu: str
    glibc: NotRequired[str]
    python: str
    images: CudaImages
    conda_nvcc: str
    source: str


class TorchBuild(TypedDict):
    cuda: str
    archs: list[str]


class TorchEntry(TypedDict):
    python: list[str]
    torchvision: str
    torchaudio: str
    pypi_default: str
    pypi_aarch64: NotRequired[str]
    builds: dict[str, TorchBuild]
    source: str


class VllmEntry(TypedDict):
    torch: str
    wheel_cuda: str
    python: list[str]
    min_compute_capability: NotRequired[str]
    modules: NotRequired[list[str]]
    pins: NotRequired[Pins]
    aarch64: NotRequired[bool]
    source: str


class SglangKernel(TypedDict):
    package: str
    version: str
    archs: list[str]


class SglangEntry(TypedDict):
    torch: str
    python: str
    extras: NotRequired[list[str]]
    kernel: SglangKernel
    min_compute_capability: str
    flashinfer: str
    pins: NotRequired[Pins]
    glibc: NotRequired[str]
    wheel_cuda: NotRequired[str]
    modules: NotRequired[list[str]]
    source: str


class Needs(TypedDict):
    needs: dict[str, str]  # dependency -> the range a release's METADATA requires
    source: str


class FeatureEntry(TypedDict):
    min_compute_capability: str
    note: NotRequired[str]
    source: str


class FlashAttnRelease(TypedDict):
    torch: str
    wheel_cuda: NotRequired[dict[str, str]]
    wheel_torch: NotRequired[str]
    wheel_python: NotRequired[list[str]]
    source: str


class SdistBuild(TypedDict):
    estimate: str
    core_minutes_per_arch: NotRequired[int]
    archs: NotRequired[list[str]]
    source: str


class WheelWorld(TypedDict):
    torch: str
    cuda: str
    python: list[str]
    versions: list[str]


class WheelIndex(TypedDict):
    url: str
    worlds: list[WheelWorld]
    archs: dict[str, list[str]]
    source: str


class ReleaseWheels(TypedDict):
    url: str
    filename: str
    source: str


class FlashAttnSection(TypedDict):
    min_compute_capability: str
    source: str
    versions: dict[str, FlashAttnRelease]
    sdist_build: NotRequired[SdistBuild]
    pypi_sdist_only: NotRequired[list[str]]
    pypi_sdist_only_source: NotRequired[str]
    wheel_indexes: NotRequired[dict[str, WheelIndex]]
    release_wheels: ReleaseWheels
    runtime_pins: NotRequired[Pins]
    training_path: TrainingPath


class ApexRelease(TypedDict):
    ref: str
    install: str
    source: str


class ApexSection(TypedDict):
    versions: dict[str, ApexRelease]
    source_url: str
    nvcc_must_match_torch_cuda: bool
    training_path: TrainingPath
    source: str


class VllmMax(TypedDict):
    version: str
    why: str
    source: str


class VerlSglang(TypedDict):
    version: str
    pins: NotRequired[Pins]
    refused: NotRequired[str]
    source: str


class VerlTrainingPath(TypedDict):
    modules: list[str]
    rollouts: dict[str, list[str]]
    source: str


class HfOffload(TypedDict):
    works: bool
    why: str
    source: str


class KeyWhy(TypedDict):
    """A run key and why it is set (verl.yaml hf_rollout.lora, trainer_v1)."""

    key: str
    why: str
    source: str


class HfRollout(TypedDict, total=False):
    offload: HfOffload
    lora: KeyWhy


class Batches(TypedDict):
    engine: bool
    why: str
    source: str


class FusedKernel(TypedDict):
    backend: str
    min_compute_capability: str


class Speed(TypedDict):
    fused_kernels: list[FusedKernel]
    fused_why: str
    dynamic_bsz: bool
    dynamic_why: str
    source: str


class MegatronEntry(TypedDict):
    packages: Pins
    transformer_engine: str
    transformer_engine_why: str
    cuda_major: str
    min_compute_capability: str
    machines: list[str]
    python: str
    keys: dict[str, Scalar]
    modules: list[str]
    why: str
    source: str


class CompileCache(TypedDict):
    env: str
    value: str
    min_torch: str
    why: str
    source: str


class NcclEnv(TypedDict):
    min_compute_capability: str
    opt_in: str
    env: dict[str, str]
    when: str
    why: str
    source: str


class VerlEntry(TypedDict):
    torch: str
    torch_why: NotRequired[str]
    torch_source: str
    python: NotRequired[str]
    python_why: NotRequired[str]
    python_source: NotRequired[str]
    rollouts: list[str]
    rollout_mode: NotRequired[str]
    rollouts_why: NotRequired[str]
    vllm: str
    vllm_max: NotRequired[VllmMax]
    sglang: NotRequired[VerlSglang]
    attention_override: str | None
    patches: list[str]
    precision: dict[str, list[str]]  # actor, critic, ref, rollout -> the dtypes it runs in
    precision_source: str
    autocast_keys: NotRequired[dict[str, str]]
    reviewed: NotRequired[list[str]]
    pins: Pins
    training_path: VerlTrainingPath
    hf_rollout: NotRequired[HfRollout]
    config_reads: NotRequired[list[str]]
    critic_fsdp: NotRequired[str]
    batches: NotRequired[Batches]
    trainer_v1: NotRequired[KeyWhy]
    speed: NotRequired[Speed]
    megatron: NotRequired[MegatronEntry]
    compile_cache: NotRequired[CompileCache]
    nccl_env: NotRequired[NcclEnv]
    source: str


# a patch's replacement: `with` a template (matrix_schema.fill_placeholders)
Replace = TypedDict("Replace", {"find": str, "with": str})


class PatchEntry(TypedDict):
    why: str
    when: str
    files: list[str]
    replace: list[Replace]
    source: str


class AlgorithmEntry(TypedDict):
    description: str
    since: str
    critic: bool
    group: bool
    n: int
    kl: str
    kl_loss_type: NotRequired[str]
    kl_loss_coef: NotRequired[float]
    extra: NotRequired[list[str]]
    extra_generation: NotRequired[bool]
    v1: NotRequired[bool]
    refused: NotRequired[str]
    source: str


class ReviewedEntry(TypedDict):
    check: str
    file: str
    line: str
    why: str
    holds: dict[str, Scalar]
    source: str


class MinWhy(TypedDict):
    min: str
    why: str
    source: str


class AllocConfSection(TypedDict):
    max_vram_gb: float
    value: str
    why: str
    not_with_rollouts: dict[str, str]
    with_rollouts: NotRequired[dict[str, MinWhy]]
    source: str


class TrainBlock(TypedDict):
    model: str
    model_vram_gb: float
    n_gpus: int
    train_batch_size: int
    ppo_mini_batch_size: int
    micro_batch_size_per_gpu: NotRequired[int]
    max_prompt_length: int
    max_response_length: int
    param_offload: bool
    optimizer_offload: bool
    gradient_checkpointing: bool
    gpu_memory_utilization: float
    lora_rank: int
    host_memory_gib: NotRequired[int]


class StackEntry(TypedDict):
    cuda: str
    torch: str
    rollout: str
    vllm: NotRequired[str]
    python: NotRequired[str]
    components: NotRequired[dict[str, str]]
    pins: NotRequired[Pins]
    why: str
    source: str


class ProfileEntry(TypedDict):
    description: str
    gpu: str
    cuda: str
    torch: str
    verl: str
    rollout: str
    vllm: NotRequired[str]
    python: NotRequired[str]
    dtype: str
    attention: str
    components: dict[str, str]  # apex, flash-attn -> version
    optional_components: NotRequired[dict[str, str]]
    pins: NotRequired[Pins]
    train: TrainBlock
    algorithm: NotRequired[str]
    source: str


class Mla(TypedDict):
    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    v_head_dim: int


class ModelEntry(TypedDict):
    family: str
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: NotRequired[bool]
    experts: NotRequired[int]
    experts_per_token: NotRequired[int]
    moe_intermediate_size: NotRequired[int]
    shared_experts: NotRequired[int]
    dense_layers: NotRequired[int]
    router_bias: NotRequired[bool]
    mla: NotRequired[Mla]
    max_position_embeddings: int
    parameters: int
    source: str


class TotalMib(TypedDict):
    mib: int
    ecc_off_mib: NotRequired[int]
    source: str


class MemorySection(TypedDict):
    total_mib: dict[str, TotalMib]
    cuda_context_gib: float
    nccl_gib: float
    allocator_overhead: float
    hf_generate_overhead: float
    margin: float
    validation_share: float
    max_micro_tokens: NotRequired[int]
    rollout_seqs_per_gpu: int
    host_memory_gib_per_gpu: int
    source: str


class MirrorEntry(TypedDict):
    description: str
    registries: NotRequired[dict[str, list[str]]]
    pypi: NotRequired[list[str]]
    pytorch: NotRequired[list[str]]
    conda: NotRequired[dict[str, list[str]]]
    huggingface: NotRequired[list[str]]
    apt: NotRequired[list[str]]
    github: NotRequired[list[str]]
    wheel_indexes: NotRequired[dict[str, list[str]]]
    source: NotRequired[str]


class DatasetFiles(TypedDict):
    train: str
    test: str


class DatasetRows(TypedDict):
    train: int
    test: int


class DatasetEntry(TypedDict):
    repo: str
    revision: str
    files: DatasetFiles
    data_source: str
    ability: str
    instruction: str
    answer_pattern: str
    rows: DatasetRows
    source: str


class UvFile(TypedDict):
    url: str
    sha256: str
    size: int


class UvPin(TypedDict):
    version: str
    url: str
    sha256: str
    size: int
    aarch64: NotRequired[UvFile]
    source: str


class DefaultsSection(TypedDict):
    pypi_index: str
    huggingface: str
    conda_channels: list[str]
    registry_local: str
    uv: NotRequired[UvPin]


class CudaCompat(TypedDict):
    libcuda: str
    source: str


# a PyPI name of another project (dependencies.yaml pypi_names): what it is, what to pin
PypiName = TypedDict("PypiName", {"is": str, "fix": str, "source": str})
