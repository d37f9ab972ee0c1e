"""The resolved environment, typed: what the resolver decided, what every template, the lock,
the wheelhouse, build and doctor read, and what envbuild.json holds.

Frozen records (record.py): fields by name, nested records, tuples for lists, read-only mappings
for the maps (pins, images). Nothing changes an environment in place: a mirror
(mirrors.apply_to_env, through context.prepare) gives a new one, which the
render.context.BuildContext holds beside the resolver's own and the lock's pins.

Each field is declared once, here: its Python type, and (`Annotated`) the kind of its value as
the matrix field it came from checks it (a name, a version, a URL, one line of text: schema.py
`S`, matrix_schema.py `K`). `field_spec()` derives from them the spec `from_dict` checks a file
against: a field that may be None is null in the file, a field in a record's `absent()` may be
left out of it.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from envbuilder.errors import UserError
from envbuilder.model.memory_plan import MemoryPlan
from envbuilder.record import Record

if TYPE_CHECKING:  # (the kinds in the annotations: read by field_spec, which imports them)
    from envbuilder.model import matrix_schema as K
    from envbuilder.model import schema as S

SCHEMA_VERSION = 1
# what --gpu-memory takes, MiB: from a 1 GiB card to 2 TiB
GPU_MEMORY_MIB = (1024, 1 << 21)
FROM_FIX = (
    "Pass the envbuild.json that `envbuild render` wrote, unedited, or re-resolve the "
    "profile (envbuild render PROFILE)."
)


# the run script's variables a `shell` value may name, and what each stands for
SHELL_VARS = ("MODEL", "DATA_DIR", "N_GPUS", "NNODES")
_SHELL_VALUE = re.compile(r"\$(" + "|".join(SHELL_VARS) + r")(/[A-Za-z0-9._-]+)?")


class RunArg(Record):
    """One override of the run: `key=value`; `shell`: the value names the script's variables."""

    key: Annotated[
        str, S.Pattern(r"\+{0,2}[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", "trainer.nnodes")
    ]
    value: Annotated[str, S.Text(200)]
    shell: bool = False
    notes: Annotated[tuple[str, ...], S.ListOf(S.Text(400))] = ()

    def text(self, env: Mapping[str, str] | None = None) -> str:
        """`key=value`, with the script's variables taken from `env` where `shell`."""
        if not self.shell:
            return f"{self.key}={self.value}"
        if env is None:
            raise ValueError(f"{self.key}: its value names the run script's variables; pass them")
        return f"{self.key}={_SHELL_VALUE.sub(lambda m: env[m.group(1)] + (m.group(2) or ''), self.value)}"


class Overrides(Record):
    """What the user asked to change about a profile (CLI flags); every one may be left out."""

    cuda: Annotated[str | None, S.CUDA] = None
    torch: Annotated[str | None, S.VERSION] = None
    python: Annotated[str | None, S.CUDA] = None
    verl: Annotated[str | None, S.VERSION] = None
    rollout: Annotated[str | None, S.OneOf(K.ROLLOUTS)] = None
    vllm: Annotated[str | None, S.VERSION] = None
    with_: Annotated[tuple[str, ...], S.ListOf(S.NAME)] = ()
    without: Annotated[tuple[str, ...], S.ListOf(S.NAME)] = ()
    driver: Annotated[str | None, S.DRIVER] = None
    allow_unsupported: bool = False
    ecc: Annotated[str | None, S.OneOf(("on", "off"))] = None
    # the card's memory as nvidia-smi reports it (MiB): plans for a card whose SKU the matrix
    # lacks, or with the size `detect` read, in place of memory.yaml's record
    gpu_memory: int | None = None
    model: Annotated[str | None, S.MODEL_REF] = None
    # the shape --model's config.json gave (architectures.with_model), for a model the table
    # lacks; derived from `model`, so never a flag of its own (nor in the file)
    model_arch: Mapping[str, Any] | None = None
    algo: Annotated[str | None, S.NAME] = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    interconnect: Annotated[str | None, S.NAME] = None
    # the world's parallelism and offload (the memory plan chooses each the user leaves out):
    # GPUs a vLLM engine spans, what is offloaded to the host while idle, GPUs one sequence is
    # split over (Ulysses), and the host memory (GiB a node) offload may fill
    rollout_tp: int | None = None
    offload: Annotated[tuple[str, ...], S.ListOf(S.NAME)] = ()
    sp: int | None = None
    host_memory: int | None = None
    # LoRA adapters of this rank in place of training every weight (0: every weight)
    lora_rank: int | None = None
    # the longest prompt and response a run takes (tokens; verl's data.max_*_length)
    max_prompt_length: int | None = None
    max_response_length: int | None = None
    # the PEP 503 index flash-attn's wheel comes from first (model/components/flash_attn.py)
    flash_attn_index: Annotated[str | None, S.URL] = None
    # verl's training engine: fsdp (the default) or megatron (verl.yaml `megatron`), and a
    # Megatron layout the user gave (--megatron tp=4,pp=2,ep=8: the plan takes it as given)
    engine: Annotated[str | None, S.OneOf(("fsdp", "megatron"))] = None
    megatron: Annotated[tuple[str, ...], S.ListOf(S.Pattern(r"[A-Za-z0-9_.=-]{1,32}", "tp=4"))] = ()

    _keys = {"with_": "with"}
    _derived: ClassVar[tuple[str, ...]] = ("model_arch",)

    @classmethod
    def omitted(cls) -> tuple[str, ...]:
        return cls._fields  # (to_dict below leaves out every flag not given)

    def to_dict(self) -> dict[str, Any]:
        """The flags given, by their names (`with`), sorted; what was left at its default is
        left out."""
        d = {
            self._keys.get(k, k): v
            for k, v in self._asdict().items()
            if v not in (None, (), False) and k not in self._derived
        }
        return {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(d.items())}


class Gpu(Record):
    """key: the matrix's name of the GPU; sm: the compute capability without the dot."""

    key: Annotated[str, S.NAME]
    name: Annotated[str, S.GPU_NAME]
    arch: Annotated[str, S.NAME]
    compute_capability: Annotated[str, S.CC]
    sm: Annotated[str, S.Pattern(r"\d+", "61", max_len=8)]
    vram_gb: Annotated[float, S.Num(0, 1 << 20, above=True)]
    bf16: bool
    max_smem_per_block_kb: Annotated[int, S.Int(1, 1 << 20)]
    # the host's CPU architecture (GH200/GB200: aarch64): the platform its wheels are for
    machine: Annotated[str, S.OneOf(("x86_64", "aarch64"))] = "x86_64"


class Cuda(Record):
    """version: major.minor (the image's); images: role (devel, runtime) -> image reference."""

    version: Annotated[str, S.CUDA]
    full_version: Annotated[str, S.VERSION]
    ubuntu: Annotated[str, K.UBUNTU]
    glibc: Annotated[str | None, S.GLIBC]
    images: Annotated[Mapping[str, str], K.IMAGES]
    conda_nvcc: Annotated[str, S.CONDA_SPEC]
    compat_libcuda: Annotated[str, S.ABSPATH]


class Driver(Record):
    """The driver the image needs (for_cuda: its CUDA, or the vLLM wheel's if newer); with
    --driver, that driver and how it runs the image (mode: native, minor-version-compatibility,
    too-old)."""

    min_driver: Annotated[str, S.DRIVER]
    compat_driver: Annotated[str, S.DRIVER]
    for_cuda: Annotated[str, S.CUDA]
    mode: Annotated[str | None, S.OneOf(K.DRIVER_MODES)] = None
    driver: Annotated[str | None, S.DRIVER] = None

    _omit_none = ("mode", "driver")


class Torch(Record):
    """variant: the build (cu118, cu124, ...); index_url: the PyTorch index of a +cuXXX build,
    None for PyPI's; packages: the torch, torchvision, torchaudio requirements."""

    version: Annotated[str, S.VERSION]
    variant: Annotated[str, S.NAME]
    cuda: Annotated[str, S.CUDA]
    archs: Annotated[tuple[str, ...], S.ListOf(S.CC)]
    index_url: Annotated[str | None, S.URL]
    packages: Annotated[tuple[str, ...], S.ListOf(S.REQUIREMENT, min_len=1)]


class CompileCache(Record):
    """vLLM's torch.compile cache kept on: the variable the run script exports unless set
    (verl turns the cache off for its Ray workers otherwise), its value, and why it is safe."""

    env: Annotated[str, K.ENV_NAME]
    value: Annotated[str, K.ENV_VALUE]
    why: Annotated[str, K.WHY]


class Vllm(Record):
    """compile_cache: None where the release or torch leaves vLLM's compile cache off."""

    _omit_none = ("compile_cache",)

    version: Annotated[str, S.VERSION]
    torch: Annotated[str, S.VERSION]
    wheel_cuda: Annotated[str, S.CUDA]
    compile_cache: CompileCache | None = None


class Sglang(Record):
    """The SGLang release of the sglang rollout: its torch pin, the requirement its install
    layer asks for (with verl's extras) and the kernel wheel it pins."""

    version: Annotated[str, S.VERSION]
    torch: Annotated[str, S.VERSION]
    requirement: Annotated[str, S.REQUIREMENT]
    kernel: Annotated[str, S.REQUIREMENT]


class RefusedOverride(Record):
    """A run override (KEY=VALUE on the run script's command line) preflight refuses: why, fix."""

    key: Annotated[str, S.HYDRA_KEY]
    value: Annotated[str, S.Text(200)]
    why: Annotated[str, K.WHY]
    fix: Annotated[str, K.WHY]


class Verl(Record):
    """autocast_keys: part -> the Hydra key of its autocast dtype; pins: package -> version;
    config_reads: keys the release reads that its config file lacks (only `+`/`++` sets them);
    lora_orig_params_key: the key the run script sets True for LoRA on the HF rollout (None
    where not needed); refused_overrides: what preflight refuses on the run's command line."""

    version: Annotated[str, S.VERSION]
    attention_override: Annotated[str | None, S.HYDRA_OVERRIDE]
    autocast_keys: Annotated[Mapping[str, str], K.AUTOCAST_KEYS]
    pins: Annotated[Mapping[str, str], K.PINS]
    config_reads: Annotated[tuple[str, ...], S.ListOf(S.HYDRA_KEY)] = ()
    lora_orig_params_key: Annotated[str | None, S.HYDRA_KEY] = None
    refused_overrides: tuple[RefusedOverride, ...] = ()
    rollout_mode: Annotated[str, S.OneOf(("sync", "async"))] = "sync"
    critic_fsdp: Annotated[str, S.HYDRA_KEY] = "critic.model.fsdp_config"
    # the engine workers (0.8+): each GPU's data must be a whole number of every micro-batch, and
    # the critic's engine takes its micro-batches from critic_fsdp (verl.yaml batches)
    engine_batches: bool = False


class Precision(Record):
    """The dtype each part of a PPO run computes in (bf16, fp16, fp32)."""

    actor: Annotated[str, K.DTYPES]
    critic: Annotated[str, K.DTYPES]
    ref: Annotated[str, K.DTYPES]
    rollout: Annotated[str, K.DTYPES]


class Features(Record):
    """fused_kernels: verl's fused log-prob/entropy backend (triton, torch) or None;
    dynamic_bsz: token-budget micro-batches for the actor and every log-prob pass; speed: why
    each speed setting is what it is, one sentence each, as the run script prints them."""

    bf16: bool
    flash_attention: bool
    remove_padding: bool
    torch_compile: bool
    fused_kernels: Annotated[str | None, S.Pattern(r"triton|torch", "triton")] = None
    dynamic_bsz: bool = False
    speed: Annotated[tuple[str, ...], S.ListOf(K.WHY)] = ()


class FlashAttn(Record):
    """release: the download folder of its prebuilt wheels; wheel: their file name template;
    cuda_tags: CUDA major -> the wheel's tag (flash_attn_wheel.py names the file). how: where
    the builder takes it from first (index, release, source: model/components/flash_attn.py);
    index: the wheel index of `how: index`; arch: FLASH_ATTN_CUDA_ARCHS of a source build (the
    card's flash-attn arch); core_minutes: what a source build of that one arch costs."""

    version: Annotated[str, S.VERSION]
    modules: Annotated[tuple[str, ...], K.MODULES]
    release: Annotated[str, S.URL]
    wheel: Annotated[str, K.WHEEL_TEMPLATE]
    cuda_tags: Annotated[Mapping[str, str], K.CUDA_TAGS]
    how: Annotated[str, K.FLASH_ATTN_HOW] = "release"
    index: Annotated[str | None, S.URL] = None
    index_name: Annotated[str | None, S.NAME] = None
    index_path: Annotated[str | None, K.INDEX_PATH] = None
    arch: Annotated[str | None, K.FLASH_ATTN_ARCH] = None
    core_minutes: int = 0


class Apex(Record):
    """install: how its CUDA extensions are asked for (env or config_settings)."""

    version: Annotated[str, S.VERSION]
    ref: Annotated[str, S.GIT_REF]
    install: Annotated[str, K.APEX_INSTALL]
    url: Annotated[str, S.URL]
    arch_list: Annotated[str, S.CC]
    modules: Annotated[tuple[str, ...], K.MODULES]


class MegatronLayout(Record):
    """Megatron's parallel sizes (envbuilder/model/megatron.py): tensor, pipeline, expert,
    expert-tensor and context parallel."""

    tp: Annotated[int, S.Int(1, 1024)] = 1
    pp: Annotated[int, S.Int(1, 1024)] = 1
    ep: Annotated[int, S.Int(1, 1024)] = 1
    etp: Annotated[int, S.Int(1, 1024)] = 1
    cp: Annotated[int, S.Int(1, 1024)] = 1

    @property
    def model_parallel(self) -> int:
        """GPUs one data-parallel rank of the dense part spans (verl's validate_config:
        n_gpus % (tp × pp × cp) == 0)."""
        return self.tp * self.pp * self.cp

    def dp(self, world: int) -> int:
        """The dense part's data-parallel ranks."""
        return max(world // self.model_parallel, 1)

    def edp(self, world: int) -> int:
        """The experts' data-parallel ranks."""
        return max(world // (self.ep * self.etp * self.pp), 1)

    def words(self) -> str:
        """The sizes as a person reads them (TP 2, PP 1, EP 8): TP and PP always, the others
        where above one."""
        more = (("EP", self.ep), ("ETP", self.etp), ("CP", self.cp))
        return ", ".join([f"TP {self.tp}", f"PP {self.pp}"] + [f"{n} {v}" for n, v in more if v > 1])


class Megatron(Record):
    """verl's Megatron engine (verl.yaml `megatron`): what it installs (megatron-core, the
    bridge that loads Hugging Face weights into it, TransformerEngine's core wheel and its
    PyTorch extension, compiled for the card's arch where no wheel exists), the run keys that
    select and set it up (the config group first: model_engine=megatron), and the modules its
    training path imports."""

    packages: Annotated[Mapping[str, str], K.PINS]
    transformer_engine: Annotated[str, S.VERSION]
    te_arch: Annotated[str, S.Pattern(r"\d{2,3}[af]?", "90")]
    keys: Annotated[Mapping[str, str], S.MapOf(S.Scalar(), key=S.HYDRA_KEY)]
    modules: Annotated[tuple[str, ...], K.MODULES]


class Patch(Record):
    """A patch of verl's source: replace is a tuple of {"find", "with"} (source text)."""

    name: Annotated[str, S.NAME]
    why: Annotated[str, K.WHY]
    files: Annotated[tuple[str, ...], K.PATCH_FILES]
    replace: Annotated[tuple[Mapping[str, str], ...], S.ListOf(K.REPLACE)]


class Reviewed(Record):
    """A reviewed exception of the precision audit: `line` in `file` is fine because `why`,
    as long as the run script's values `holds`."""

    name: Annotated[str, S.NAME]
    check: Annotated[str, K.AUDIT_CHECK]
    file: Annotated[str, S.RELPATH]
    line: Annotated[str, S.Text(1000)]
    why: Annotated[str, K.WHY]
    holds: Annotated[Mapping[str, str | int | float | bool], K.HOLDS]


class Audit(Record):
    checks: Annotated[tuple[str, ...], S.ListOf(K.AUDIT_CHECK)]
    reviewed: tuple[Reviewed, ...]


class AllocConf(Record):
    """PYTORCH_CUDA_ALLOC_CONF for a small GPU: value (None where the rollout refuses it), why."""

    value: Annotated[str | None, S.ALLOC_CONF]
    why: Annotated[str, K.WHY]


class Indexes(Record):
    """pypi: the package index; torch: the PyTorch index of a +cuXXX build (None: PyPI's)."""

    pypi: Annotated[str, S.URL]
    torch: Annotated[str | None, S.URL]


class Uv(Record):
    """The uv wheel the runtime stage's pip steps install with, pinned by sha256."""

    version: Annotated[str, S.VERSION]
    url: Annotated[str, S.URL]
    sha256: Annotated[str, S.SHA256]
    size: Annotated[int, S.Int(1, 1 << 40)]

    @property
    def filename(self) -> str:
        """The wheel's file name (the last part of its URL), as indexes and wheelhouses list it."""
        return self.url.rsplit("/", 1)[-1]


class Train(Record):
    """The PPO run's settings (the profile's `train`); micro_batch_size_per_gpu: an upper bound
    on every planned micro-batch, None for none."""

    model: Annotated[str, S.MODEL_REF]
    model_vram_gb: Annotated[float, S.Num(0, 1 << 20, above=True)]
    n_gpus: Annotated[int, S.Int(1, 1 << 16)]
    train_batch_size: Annotated[int, K.COUNT]
    ppo_mini_batch_size: Annotated[int, K.COUNT]
    max_prompt_length: Annotated[int, K.COUNT]
    max_response_length: Annotated[int, K.COUNT]
    param_offload: bool
    optimizer_offload: bool
    gradient_checkpointing: bool
    gpu_memory_utilization: Annotated[float, S.Num(0, 1, above=True)]
    lora_rank: Annotated[int, S.Int(0, 1 << 16)]
    actor_param_offload: bool
    micro_batch_size_per_gpu: Annotated[int | None, K.COUNT] = None
    actor_model_dtype: Annotated[str | None, S.OneOf(("bf16",))] = None
    # the memory plan's parallelism (envbuilder/model/memory.py), where above one: GPUs a vLLM
    # engine spans, GPUs one sequence is split over (Ulysses); the host memory offload may fill
    rollout_tp: Annotated[int | None, S.Int(1, 64)] = None
    sequence_parallel: Annotated[int | None, S.Int(1, 64)] = None
    host_memory_gib: Annotated[int | None, S.Int(1, 1 << 20)] = None
    # the Megatron engine's layout (the memory plan's choice, or --megatron's)
    megatron: MegatronLayout | None = None

    _omit_none = (
        "megatron",
        "micro_batch_size_per_gpu",
        "actor_model_dtype",
        "rollout_tp",
        "sequence_parallel",
        "host_memory_gib",
    )


class Algorithm(Record):
    """verl's advantage estimator and what the run takes of it (algorithms.yaml): a critic
    (gae only), `n` responses per prompt (above 1 where it normalises over the group), where
    the KL to the reference goes (`loss`, `reward` or `none`), extra run keys, and one more
    greedy rollout per prompt (ReMax)."""

    name: Annotated[str, S.NAME]
    critic: bool
    group: bool
    n: Annotated[int, S.Int(1, 64)]
    kl: Annotated[str, K.KL]
    kl_loss_type: Annotated[str | None, K.KL_LOSS_TYPE]
    kl_loss_coef: float | None
    extra: Annotated[tuple[str, ...], S.ListOf(K.RUN_SETTING)]
    extra_generation: bool


class Cluster(Record):
    """Where the run's GPUs are: `nodes` machines of `gpus_per_node` each, how they talk
    (interconnects.yaml: None for one GPU), the NCCL/Gloo variables the run script exports
    unless set, and whether it names the bootstrap interface (NCCL_SOCKET_IFNAME,
    GLOO_SOCKET_IFNAME) from the default route. without_imex: the NCCL variables the
    launchers export unless set on a node without IMEX channels (verl.yaml `nccl_env`: verl
    0.9.1's GB200 settings); None where the release gives these GPUs none."""

    _omit_none = ("without_imex",)

    nodes: Annotated[int, S.Int(1, 1024)]
    gpus_per_node: Annotated[int, S.Int(1, 64)]
    interconnect: Annotated[str | None, S.NAME]
    env: Annotated[Mapping[str, str], S.MapOf(K.ENV_VALUE, key=K.ENV_NAME)]
    interface: bool
    without_imex: Annotated[Mapping[str, str] | None, S.MapOf(K.ENV_VALUE, key=K.ENV_NAME)] = None


class Dataset(Record):
    """files: split -> file in the repo; rows: split -> row count."""

    name: Annotated[str, S.NAME]
    repo: Annotated[str, S.MODEL_ID]
    revision: Annotated[str, S.GIT_REF]
    files: Annotated[Mapping[str, str], K.DATASET_FILES]
    data_source: Annotated[str, S.Text(200)]
    ability: Annotated[str, S.Text(200)]
    instruction: Annotated[str, S.Text(1000)]
    answer_pattern: Annotated[str, S.Regex()]
    rows: Annotated[Mapping[str, int], {"train": K.COUNT, "test": K.COUNT}]
    source: Annotated[str, K.SOURCE]


class Constraints(Record):
    """The pins of the lock that fits the environment's install plan (context.prepare):
    from_: which lock; torch_swapped: solved with PyPI's torch ('2.6.0+cu118 -> 2.6.0 ...');
    layers: install layer -> name==version pins."""

    from_: Annotated[str, S.Text(300)]
    torch_swapped: Annotated[str | None, S.Text(300)]
    plan_sha256: Annotated[str, S.SHA256]
    layers: Annotated[Mapping[str, tuple[str, ...]], S.MapOf(S.ListOf(S.REQUIREMENT), key=S.NAME)]

    _keys = {"from_": "from"}


class Mirror(Record):
    """The mirror set the endpoints were rewritten to (mirrors.apply_to_env)."""

    name: Annotated[str, S.NAME]
    apt: Annotated[str | None, S.URL]
    conda_nvidia: Annotated[str | None, S.URL]


class ResolvedEnv(Record):
    """Everything the templates need. JSON round-trips to the same bytes.

    memory: the memory plan (envbuilder/model/memory.py: peak, usable_gib, batch sizes, the budget
    term by term; its records in memory_plan.py); warnings: what --allow-unsupported let through;
    mirror: None unless a mirror set was applied (then left out of the file). No lock's pins:
    they live in the BuildContext beside the environment; envbuild.json records them next to
    it under `constraints` (saved_dict), and `render --from` reads them back into a context
    (runplan.saved_from_json, context.replayed), never into an environment."""

    schema_version: int
    envbuild_version: Annotated[str, S.VERSION]
    profile: Annotated[str, S.NAME]
    description: Annotated[str, K.DESCRIPTION]
    overrides: Overrides
    gpu: Gpu
    cuda: Cuda
    driver: Driver
    python: Annotated[str, S.CUDA]
    torch: Torch
    rollout: Annotated[str, S.OneOf(K.ROLLOUTS)]
    vllm: Vllm | None
    verl: Verl
    dtype: Annotated[str, K.DTYPES]
    precision: Precision
    attention: Annotated[str, K.ATTENTION]
    features: Features
    flash_attn: FlashAttn | None
    apex: Apex | None
    patches: tuple[Patch, ...]
    audit: Audit
    cuda_alloc_conf: AllocConf | None
    indexes: Indexes
    uv: Uv
    huggingface: Annotated[str, S.URL]
    conda_channels: Annotated[tuple[str, ...], S.ListOf(S.CHANNEL)]
    train: Train
    algorithm: Algorithm
    cluster: Cluster
    dataset: Dataset | None
    training_path: Annotated[tuple[str, ...], K.MODULES]
    memory: MemoryPlan  # (its records declare the kinds envbuild.json's `memory` is checked against)
    warnings: Annotated[tuple[str, ...], S.ListOf(K.NOTE)]
    notes: Annotated[tuple[str, ...], S.ListOf(K.NOTE)] = ()
    sglang: Sglang | None = None
    mirror: Mirror | None = None
    # the run script's overrides as data (envbuilder/model/runplan.py), derived from the rest:
    # a file's copy is checked against the derivation, never trusted (from_dict)
    run: tuple[RunArg, ...] = ()
    # the matrix's card asked for by name where it has no profile of its own and takes this
    # profile's stack (gpu is that card's); None: the profile's own card
    card: Annotated[str | None, S.NAME] = None
    # verl's Megatron engine where --engine megatron asked for it; None: FSDP
    megatron: Megatron | None = None

    _omit_none = ("mirror", "sglang", "card", "megatron")
    _absent = ("mirror", "sglang", "run", "card", "megatron")

    @property
    def name(self) -> str:
        """The profile: its stack, its lock and its wheelhouse."""
        return self.profile

    @property
    def asked(self) -> str:
        """What the user asked for and types again: the card's key where a card took the
        profile's stack, else the profile; the rendered folder's name."""
        return self.card or self.profile

    @property
    def described(self) -> str:
        """The profile's description, or for a card on another profile's stack `NVIDIA L40S on
        profile 4090's stack (<the profile's description>)`: the image's description label."""
        if self.card:
            return f"{self.gpu.name} on profile {self.profile}'s stack ({self.description})"
        return self.description

    @property
    def title(self) -> str:
        """What a file's header and `show` name it: `profile 4090: <its description>`, or
        `l40s: NVIDIA L40S on profile 4090's stack (...)` for a card on another's stack."""
        return (
            f"{self.card}: {self.described}" if self.card else f"profile {self.profile}: {self.description}"
        )

    @property
    def needs_builder(self) -> bool:
        """A builder stage compiles or fetches extensions (apex, flash-attn, TransformerEngine's
        PyTorch extension) against the torch."""
        return bool(self.apex or self.flash_attn or self.megatron)

    @property
    def base_images(self) -> tuple[str, ...]:
        """The images the Dockerfile's FROM lines take: the runtime one, and the devel one
        where a builder stage compiles (a mirror need carry no other)."""
        roles = ("devel", "runtime") if self.needs_builder else ("runtime",)
        return tuple(self.cuda.images[role] for role in roles)

    def saved_dict(self, constraints: Constraints | None = None) -> dict[str, object]:
        """envbuild.json's plain data: the environment's (to_dict), and beside it, under
        `constraints`, the pins of the context it was rendered in (BuildContext.constraints;
        null where no lock fits). The file records them; the environment never carries them."""
        d: dict[str, object] = self.to_dict()
        d["constraints"] = constraints.to_dict() if constraints is not None else None
        return d

    def to_json(self, d: dict[str, Any] | None = None, compact: str | None = None) -> str:
        """envbuild.json's text: indented, sorted; of `d` (saved_dict: this environment with
        the context's pins), the environment rendered with no lock's pins when not given (what
        `show --json` prints). json's indenting encoder is pure Python (a
        third of `render --all`), so the text is kept in the cache folder by the sha256 of the
        compact form (C-encoded) and used only when it reads back as this environment: its own
        compact form is this one's, byte for byte. (`d`: this environment's saved_dict(), and
        `compact`: its sorted compact JSON, where the caller has them.)"""
        from envbuilder.paths import sealed_text

        d = self.saved_dict() if d is None else d
        if compact is None:
            compact = json.dumps(d, sort_keys=True, separators=(",", ":"))
        key = hashlib.sha256(compact.encode()).hexdigest()  # (the indented form is json's own)
        return sealed_text("env", key, lambda: json.dumps(d, indent=2, sort_keys=True) + "\n")

    @classmethod
    def read_json(
        cls, text: str, origin: str = "envbuild.json"
    ) -> tuple["ResolvedEnv", Constraints | None, Any]:
        """The environment a file holds (JSON), read by the one bounded reader (readers.py: no
        NaN, no number of hundreds of digits, no key twice, nested at most a few levels) and
        checked as read_dict checks it."""
        from envbuilder.model.readers import parse_json

        return cls.read_dict(parse_json(text, origin, fix=FROM_FIX), origin)

    @classmethod
    def read_dict(
        cls, data: Any, origin: str = "envbuild.json"
    ) -> tuple["ResolvedEnv", Constraints | None, Any]:
        """The environment of plain data from outside (a file, an image's /etc/envbuild.json),
        without its run; the lock's pins the file records beside it (`constraints`, None:
        none), which a context takes (context.replayed), never the environment; and the run
        the data holds (None: none): the run plan is derived from
        the rest, and model/runplan.env_from_dict derives it and holds the file's to it.
        Every value is checked against the kind of the matrix field it came from
        (field_spec: names, versions, URLs, model ids, pins, one-line text) and the shape
        against the fields here, all problems named at once: an edited or foreign file
        reaches no template with a value the matrix would refuse (UserError, exit 2)."""
        from envbuilder.model import schema as S
        from envbuilder.model.readers import check_tree

        check_tree(data, origin, FROM_FIX)  # (depth, lengths, finite numbers: data from outside)
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise UserError(
                f"{origin} is not an envbuild resolved environment of schema version "
                f"{SCHEMA_VERSION}. Pass the envbuild.json that `envbuild render` wrote "
                "(or re-resolve it from its profile)."
            )
        try:
            S.check(data, field_spec(), f"{origin}: ", partial=True)
        except S.SchemaError as e:
            raise UserError(
                f"{e}. It is not a value envbuild writes there; pass the envbuild.json "
                "that `envbuild render` wrote, unedited, or re-resolve the profile "
                "(envbuild render PROFILE)."
            ) from None
        problems = shape_problems(data)
        if problems:
            profile = data["profile"] if isinstance(data.get("profile"), str) else "PROFILE"
            raise UserError(
                f"{origin} is not an envbuild resolved environment as this envbuild "
                f"writes it: {'; '.join(problems[:5])}"
                + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
                + ". Pass the envbuild.json that `envbuild render` wrote, unedited, or "
                f"re-resolve it: envbuild render {profile} with the same overrides "
                "(they are under `overrides` in the file)."
            )
        pins = data.get("constraints")
        env = cls.from_plain({k: v for k, v in data.items() if k not in ("run", "constraints")})
        return env, Constraints.from_plain(pins) if isinstance(pins, dict) else None, data.get("run")


def shape_problems(data: dict[str, Any]) -> list[str]:
    """Where plain data (read from a file) differs in shape from the resolved environment's
    field spec (field_spec): every required key that is missing, every value of
    another kind (a number in a list of names too), all at once."""
    from envbuilder.model import schema as S

    kinds = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "true/false",
        int: "a number",
        float: "a number",
    }

    def want(spec: object) -> set[str]:
        if isinstance(spec, tuple):
            return want(spec[0])
        if isinstance(spec, (dict, S.MapOf, S.Tree)):
            return {"an object"}
        if isinstance(spec, S.ListOf):
            return {"a list"}
        if spec in (int, float) or isinstance(spec, (S.Int, S.Num)):
            return {"a number"}
        if spec is bool:
            return {"true/false"}
        if isinstance(spec, S.Scalar):
            return {"a string", "a number", "true/false"}
        if isinstance(spec, S.OneOf):
            return {kinds.get(type(c), "a string") for c in spec.choices}
        return {"a string"}  # (the text kinds)

    def value(v: object, spec: object, where: str) -> list[str]:
        if v is None:
            return []
        got = kinds.get(type(v), type(v).__name__)
        wanted = want(spec)
        if got not in wanted:
            return [f"{where} is {got}, not {' or '.join(sorted(wanted))}"]
        # (past that check an object is a dict and a list a list: `got` is of the exact type)
        inner: object = spec[0] if isinstance(spec, tuple) else spec
        if isinstance(inner, dict) and isinstance(v, dict):
            return walk(v, inner, f"{where}.")
        if isinstance(inner, S.ListOf) and isinstance(v, list):
            return [p for i, item in enumerate(v) for p in value(item, inner.item, f"{where}[{i}]")]
        if isinstance(inner, S.MapOf) and isinstance(v, dict):
            return [p for k, item in v.items() for p in value(item, inner.value, f"{where}.{k}")]
        return []

    def walk(data: dict[str, object], spec: dict[str, object], where: str) -> list[str]:
        out = []
        for key, sub in spec.items():
            if key == "*":
                continue
            name = key.rstrip("?")
            if name not in data:
                if not key.endswith("?"):
                    out.append(f"{where}{name} is missing")
                continue
            out += value(data[name], sub, f"{where}{name}")
        return out

    return walk(data, field_spec(), "")


_SPEC: dict[str, Any] = {}


def field_spec() -> dict[str, Any]:
    """The spec of envbuild.json (schema.py's form: key -> kind, `key?` for a key a file may
    leave out, `(kind, None)` for a value that may be null, a dict for an object), derived once
    from the records' annotations (record_spec): the environment's, and the lock's pins the
    file records beside it (`constraints`: ResolvedEnv.saved_dict; a file may lack the key)."""
    if not _SPEC:
        _SPEC.update(record_spec(ResolvedEnv))
        _SPEC["constraints?"] = (record_spec(Constraints), None)
    return _SPEC


def record_spec(cls: type[Record]) -> dict[str, Any]:
    """The spec of a record's plain data: a record is an object of its fields, a tuple of
    records a list of objects, `Annotated[T, kind]` that kind, a bare bool, int or float
    itself; `X | None` may be null unless the record leaves the key out instead."""
    import typing

    from envbuilder.model import matrix_schema as K
    from envbuilder.model import schema as S

    names = dict(vars(sys.modules[cls.__module__]), K=K, S=S)

    def kind(tp: Any, where: str, nullable: bool = True) -> Any:
        args = typing.get_args(tp)
        if typing.get_origin(tp) is typing.Annotated:
            base, spec = args[0], tp.__metadata__[0]
            may_be_none = type(None) in typing.get_args(base)
            return (spec, None) if may_be_none and nullable else spec
        if type(None) in args:  # X | None
            (inner,) = (a for a in args if a is not type(None))
            spec = kind(inner, where)
            return (spec, None) if nullable else spec
        if isinstance(tp, type) and issubclass(tp, Record):
            return record_spec(tp)
        if typing.get_origin(tp) is tuple and isinstance(args[0], type) and issubclass(args[0], Record):
            return S.ListOf(record_spec(args[0]))
        if tp in (bool, int, float):
            return tp
        raise TypeError(f"{where}: {tp} says nothing of its values: give it a kind, Annotated[T, kind]")

    # (each field's annotation, a string, evaluated where its record was declared)
    texts = {f: t for c in reversed(cls.__mro__) for f, t in vars(c).get("__annotations__", {}).items()}
    out: dict[str, Any] = {}
    for f in cls._fields:
        if f in getattr(cls, "_derived", ()):
            continue
        key = cls._keys.get(f, f) + ("?" if f in cls.absent() else "")
        tp = eval(texts[f], names)  # (annotations of envbuild's own records, nothing from outside)
        out[key] = kind(tp, f"{cls.__name__}.{f}", nullable=f not in cls.omitted())
    return out
