"""The schema of every matrix section (checked only when the files changed: see matrix.load)."""

from __future__ import annotations

import re
from envbuilder.model import schema as S

# the precision audit's checks and the condition under which each runs (a patch's `when`)
AUDIT_CHECKS = {"autocast_bf16": "no_bf16", "flash_attention_2": "no_flash_attention"}

# What each string is (schema.py): names, versions, URLs, model ids, packages, one line of text.
# Every string of the matrix, an overlay or the config has a kind here, checked as it enters.
SOURCE = S.Text(2000)  # URLs or keys of the file's `sources:` (matrix._check_sources)
DESCRIPTION = S.Text(300)
WHY = S.Text(2000)  # a fact's reason, as the rendered files and messages quote it
PINS = S.MapOf(S.VERSION, key=S.PACKAGE)  # package -> the version it is pinned to
ROLLOUTS = ("hf", "vllm", "sglang")
# what a training run imports, in order: dotted Python module names (they land in preflight.py
# and the smoke test as data, and the real-package tests look each one up in the real wheel)
MODULES = S.ListOf(S.MODULE)
TRAINING_PATH = {"modules": MODULES, "source": SOURCE}
GPU = {
    "name": S.GPU_NAME,
    "match": S.ListOf(S.Regex()),
    "arch": S.NAME,
    "compute_capability": S.CC,
    "vram_gb": float,
    "max_smem_per_block_kb": int,
    "bf16": bool,
    "fp16_fast": bool,
    "machine?": S.OneOf(("x86_64", "aarch64")),
    "p2p?": bool,
    # peer-to-peer works from this driver on (older ones hang in NCCL's P2P transport)
    "p2p_driver?": S.DRIVER,
    "p2p_source?": SOURCE,
    # its nodes join a multi-node NVLink domain (GB200 NVL72: 18 trays, one NVLink fabric),
    # which NCCL reaches through the IMEX service
    "mnnvl?": bool,
    # its identity beside name and CC: how the board is built, and the interconnects.yaml key
    # (scope node) its GPUs of one node talk over as shipped
    "form_factor?": S.OneOf(("sxm", "pcie", "superchip")),
    "interconnect?": S.NAME,
    "source": SOURCE,
}
# an environment variable NCCL or Gloo reads, set to a plain value
ENV_NAME = S.Pattern(r"[A-Z][A-Z0-9_]{0,63}", "NCCL_IB_DISABLE")
ENV_VALUE = S.Pattern(r"[A-Za-z0-9_.,^:-]{0,64}", "1")
INTERCONNECT = {
    "description": DESCRIPTION,
    "scope": S.OneOf(("node", "cluster")),
    "env": S.MapOf(ENV_VALUE, key=ENV_NAME),
    "interface": bool,
    "note?": WHY,
    "source": SOURCE,
}
IMAGES = {"devel": S.IMAGE, "runtime": S.IMAGE}  # role -> image reference
UBUNTU = S.Pattern(r"\d+\.\d+", "22.04", max_len=16)
CUDA = {
    "version": S.VERSION,
    "min_driver": S.DRIVER,
    "compat_driver": S.DRIVER,
    "nvcc_archs": S.ListOf(S.CC),
    "ubuntu": UBUNTU,
    "glibc?": S.GLIBC,
    "python": S.CUDA,
    "images": IMAGES,
    "conda_nvcc": S.CONDA_SPEC,
    "source": SOURCE,
}
TORCH = {
    "python": S.ListOf(S.CUDA),
    "torchvision": S.VERSION,
    "torchaudio": S.VERSION,
    "pypi_default": S.NAME,
    # PyPI's Linux aarch64 wheel: cpu, or the CUDA variant it is built as
    "pypi_aarch64?": S.NAME,
    "builds": S.MapOf({"cuda": S.CUDA, "archs": S.ListOf(S.CC)}, key=S.NAME),
    "source": SOURCE,
}
VLLM = {
    "torch": S.VERSION,
    "wheel_cuda": S.CUDA,
    "python": S.ListOf(S.CUDA),
    "min_compute_capability?": S.CC,
    "modules?": MODULES,
    "pins?": PINS,
    # a Linux aarch64 wheel on PyPI
    "aarch64?": bool,
    "source": SOURCE,
}
# an SGLang release (sglang.yaml): its torch pin, Python, kernel wheel and the SASS arches of its
# compiled ops ("9.0a": that exact compute capability only), hardware floor, flashinfer pin
SGLANG_ARCH = S.Pattern(r"\d{1,2}\.\d{1,2}a?", "9.0a", max_len=8)
SGLANG = {
    "torch": S.VERSION,
    "python": S.Range(),
    "extras?": S.ListOf(S.NAME),
    "kernel": {"package": S.PACKAGE, "version": S.VERSION, "archs": S.ListOf(SGLANG_ARCH)},
    "min_compute_capability": S.CC,
    "flashinfer": S.VERSION,
    "pins?": PINS,
    "glibc?": S.GLIBC,
    "wheel_cuda?": S.CUDA,
    "modules?": MODULES,
    "source": SOURCE,
}
# requires: PACKAGE -> VERSION -> what that release's METADATA needs of a shared dependency
REQUIRES = S.MapOf(
    S.MapOf({"needs": S.MapOf(S.Range(), key=S.PACKAGE), "source": SOURCE}, key=S.VERSION), key=S.PACKAGE
)
FEATURE = {"min_compute_capability": S.CC, "note?": WHY, "source": SOURCE}
# release_wheels.filename: a template of {version} {cuda_tag} {torch} {cxx11_abi} {python}
# {machine} (envbuilder/images/flash_attn_wheel.py formats it); wheel_cuda: CUDA major -> wheel tag
# (a release without it, or a major it does not list, has no prebuilt wheel: the builder compiles)
WHEEL_TEMPLATE = S.Pattern(
    r"[A-Za-z0-9_.+-]*(\{(version|cuda_tag|torch|cxx11_abi|python|machine)\}"
    r"[A-Za-z0-9_.+-]*)+\.whl",
    "flash_attn-{version}+cu{cuda_tag}...-linux_{machine}.whl",
)
FLASH_ATTN_HOW = S.OneOf(("index", "release", "source"))  # (resolved.FlashAttn.how)
FLASH_ATTN_ARCH = S.Pattern(r"\d{2,3}", "90")  # a FLASH_ATTN_CUDA_ARCHS value
INDEX_PATH = S.Pattern(r"[A-Za-z0-9._~/-]+", "cu130/torch2.11/simple/")  # a world under an index root
CUDA_TAGS = S.MapOf(S.Pattern(r"\d{2,3}", "12"), key=S.Pattern(r"\d+", "12"))
FLASH_ATTN = {
    "min_compute_capability": S.CC,
    "source": SOURCE,
    "versions": S.MapOf(
        {
            "torch": S.Range(),
            "wheel_cuda?": CUDA_TAGS,
            "wheel_torch?": S.Range(),
            "wheel_python?": S.ListOf(S.CUDA),
            "source": SOURCE,
        },
        key=S.VERSION,
    ),
    "sdist_build?": {
        "estimate": WHY,
        "core_minutes_per_arch?": S.Int(1, 10_000),
        "archs?": S.ListOf(FLASH_ATTN_ARCH),
        "source": SOURCE,
    },
    "pypi_sdist_only?": S.ListOf(S.VERSION),
    "pypi_sdist_only_source?": SOURCE,
    "wheel_indexes?": S.MapOf(
        {
            "url": S.Url(("cuda", "torch"), "https://example.org/cu{cuda}/torch{torch}/simple/"),
            "worlds": S.ListOf(
                {
                    "torch": S.Pattern(r"\d+\.\d+", "2.11"),
                    "cuda": S.Pattern(r"\d{2,3}", "130"),
                    "python": S.ListOf(S.CUDA),
                    "versions": S.ListOf(S.VERSION),
                }
            ),
            "archs": S.MapOf(S.ListOf(S.CC), key=S.OneOf(("x86_64", "aarch64"))),
            "source": SOURCE,
        },
        key=S.NAME,
    ),
    "release_wheels": {
        "url": S.Url(("version",), "https://github.com/OWNER/REPO/releases/download/v{version}"),
        "filename": WHEEL_TEMPLATE,
        "source": SOURCE,
    },
    "runtime_pins?": PINS,
    "training_path": TRAINING_PATH,
}
APEX_INSTALL = S.OneOf(("env", "config_settings"))
APEX = {
    "versions": S.MapOf({"ref": S.GIT_REF, "install": APEX_INSTALL, "source": SOURCE}, key=S.VERSION),
    "source_url": S.Url(("ref",), "https://github.com/NVIDIA/apex/archive/refs/tags/{ref}.tar.gz"),
    "nvcc_must_match_torch_cuda": bool,
    "training_path": TRAINING_PATH,
    "source": SOURCE,
}
# the parts of a PPO run that compute in a dtype of their own (verl's roles), and the dtypes
DTYPES = S.OneOf(("bf16", "fp16", "fp32"))
PARTS = ("actor", "critic", "ref", "rollout")
PRECISION = {part: S.ListOf(DTYPES) for part in PARTS}
# the names a patch's `with` and a reviewed exception's `holds` may format in
FORMAT_FIELDS = ("attention", *(f"{part}_{kind}" for part in PARTS for kind in ("dtype", "autocast")))
# A patch's `with` and a `holds` value are data with `{name}` placeholders (a name above) and
# `{{` / `}}` for a literal brace; nothing else of str.format (no format spec: `{attention:>9999}`
# would write gigabytes; no conversion, attribute or index). PLACEHOLDER reads them left to right
# as str.format does, so a template it takes fills (fill_placeholders) to the same text.
PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|\{[^{}]{0,40}\}?|\}")


def placeholder_error(text: str) -> str | None:
    """What in `text` is not a `{name}` placeholder, a `{{` or a `}}`; None when nothing is."""
    for m in PLACEHOLDER.finditer(text):
        if m[0] in ("{{", "}}") or m[1] in FORMAT_FIELDS:
            continue
        what = (
            f"{{{m[1]}}} is not a value envbuild fills in"
            if m[1]
            else f"{m[0]!r} is not a placeholder (a format spec, conversion, attribute or index, or "
            "a lone brace)"
        )
        return (
            f"{what}. A `with` or `holds` value takes only "
            f"{', '.join('{' + f + '}' for f in FORMAT_FIELDS)}, and {{{{ or }}}} for a "
            "literal brace"
        )
    return None


def fill_placeholders(text: str, values: dict[str, str]) -> str:
    """`text` (placeholder_error found nothing in it) with each `{name}` as values[name] and each
    `{{` / `}}` as one brace: one pass, no formatting (anything else stays as it is)."""

    def one(m: re.Match[str]) -> str:
        if m[0] in ("{{", "}}"):
            return str(m[0][0])
        return values.get(m[1], m[0]) if m[1] else str(m[0])

    return PLACEHOLDER.sub(one, text)


class TemplateCode(S.Code):
    """Source text with `{name}` placeholders (a patch's `with`)."""

    def string(self, value: object, where: str) -> str:
        text = super().string(value, where)
        why = placeholder_error(text)
        if why:
            raise S.SchemaError(where, why)
        return text


class TemplateScalar(S.Scalar):
    """A config value; a string one with `{name}` placeholders (a reviewed exception's `holds`)."""

    def check(self, value: object, where: str) -> None:
        super().check(value, where)
        why = placeholder_error(value) if isinstance(value, str) else None
        if why:
            raise S.SchemaError(where, why)


AUTOCAST_KEYS = {f"{part}?": S.HYDRA_KEY for part in PARTS}
VERL = {
    "torch": S.Range(),
    "torch_why?": WHY,
    "torch_source": SOURCE,
    "python?": S.Range(),
    # where the release's true floor is not its wheel's Requires-Python (its pins' floors)
    "python_why?": WHY,
    "python_source?": SOURCE,
    "rollouts": S.ListOf(S.OneOf(ROLLOUTS)),
    "rollout_mode?": S.OneOf(("sync", "async")),
    "rollouts_why?": WHY,
    "vllm": S.Range(),
    # the newest vLLM that co-resolves with the release's own pins where its setup.py range is
    # open above (verl 0.9.x: vLLM 0.32+ needs a transformers its cap excludes)
    "vllm_max?": {"version": S.VERSION, "why": WHY, "source": SOURCE},
    # the SGLang release its `sglang` extra pins, what the extra adds, and why it cannot install
    "sglang?": {"version": S.VERSION, "pins?": PINS, "refused?": WHY, "source": SOURCE},
    "attention_override": (S.HYDRA_OVERRIDE, None),
    "patches": S.ListOf(S.NAME),
    "precision": PRECISION,
    "precision_source": SOURCE,
    "autocast_keys?": AUTOCAST_KEYS,
    "reviewed?": S.ListOf(S.NAME),
    "pins": PINS,
    "training_path": {
        "modules": MODULES,
        "rollouts": S.MapOf(MODULES, key=S.OneOf(ROLLOUTS)),
        "source": SOURCE,
    },
    # what the release's HF rollout cannot do (the offloaded actor, LoRA's flat parameter)
    "hf_rollout?": {
        "offload?": {"works": bool, "why": WHY, "source": SOURCE},
        "lora?": {"key": S.HYDRA_KEY, "why": WHY, "source": SOURCE},
    },
    "config_reads?": S.ListOf(S.HYDRA_KEY),
    # where the critic's FSDP settings live (critic.model.fsdp_config up to 0.7.x)
    "critic_fsdp?": S.HYDRA_KEY,
    # the batch arithmetic its workers assert (engine: every GPU's data is a whole number of
    # each micro-batch; the legacy workers split with a remainder)
    "batches?": {"engine": bool, "why": WHY, "source": SOURCE},
    # its default trainer, where an estimator needs the other one (algorithms.yaml `v1: false`)
    "trainer_v1?": {"key": S.HYDRA_KEY, "why": WHY, "source": SOURCE},
    # vLLM's torch.compile cache, which the release turns off for its Ray workers unless the
    # launching shell sets `env`: the run script keeps it on (`value`) from torch `min_torch` up
    # the speed settings of its training path (runplan.py, memory.py): fused log-prob/entropy
    # kernels (the first backend whose compute-capability floor the card meets) and token-budget
    # micro-batches
    "speed?": {
        "fused_kernels": S.ListOf(
            {"backend": S.Pattern(r"triton|torch", "triton"), "min_compute_capability": S.CC}
        ),
        "fused_why": WHY,
        "dynamic_bsz": bool,
        "dynamic_why": WHY,
        "source": SOURCE,
    },
    # its Megatron engine (--engine megatron; model/megatron.py): the packages its pip layer
    # installs, TransformerEngine's PyTorch extension (compiled), where it runs, the run keys that
    # select it, and the modules its training path imports
    "megatron?": {
        "packages": PINS,
        "transformer_engine": S.VERSION,
        "transformer_engine_why": WHY,
        "cuda_major": S.Pattern(r"\d{2}", "13"),
        "min_compute_capability": S.CC,
        "machines": S.ListOf(S.OneOf(("x86_64", "aarch64"))),
        "python": S.Range(),
        "keys": S.MapOf(S.Scalar(), key=S.HYDRA_KEY),
        "modules": MODULES,
        "why": WHY,
        "source": SOURCE,
    },
    "compile_cache?": {
        "env": ENV_NAME,
        "value": ENV_VALUE,
        "min_torch": S.VERSION,
        "why": WHY,
        "source": SOURCE,
    },
    # NCCL settings the release gives its Ray workers on GPUs from a compute capability up, when
    # its opt-in variable is 1 (0.9.1's _gb200_nccl_env); `when` says where a launcher sets them
    # (for a GPU of a multi-node NVLink domain, gpus.yaml `mnnvl`)
    "nccl_env?": {
        "min_compute_capability": S.CC,
        "opt_in": ENV_NAME,
        "env": S.MapOf(ENV_VALUE, key=ENV_NAME),
        "when": WHY,
        "why": WHY,
        "source": SOURCE,
    },
    "source": SOURCE,
}
# find / with: source text, written into apply_patches.py as Python literals
# (`with` as the matrix holds it, a template; filled, as a resolved environment holds it, code)
REPLACE = {"find": S.Code(10_000), "with": S.Code(10_000)}
# a run key set to a plain value (an estimator's extra settings)
RUN_SETTING = S.Pattern(
    S.HYDRA_KEY.regex + r"=[A-Za-z0-9_.]+", "actor_rollout_ref.actor.calculate_sum_pi_squared=True"
)
KL = S.OneOf(("loss", "reward", "none"))
KL_LOSS_TYPE = S.OneOf(("low_var_kl", "kl", "mse", "abs"))
# an advantage estimator of verl (algorithms.yaml): what it needs of the run
ALGORITHM = {
    "description": DESCRIPTION,
    "since": S.VERSION,
    "critic": bool,
    "group": bool,
    "n": int,
    "kl": KL,
    "kl_loss_type?": KL_LOSS_TYPE,
    "kl_loss_coef?": float,
    "extra?": S.ListOf(RUN_SETTING),
    "extra_generation?": bool,
    # false: verl's v1 trainer (0.9's default) never computes what it needs (verl.yaml trainer_v1)
    "v1?": bool,
    "refused?": WHY,
    "source": SOURCE,
}
PATCH_FILES = S.ListOf(S.RELPATH)
PATCH = {
    "why": WHY,
    "when": S.OneOf(
        ("no_flash_attention", "no_bf16", "lora_hf_rollout", "lora_bf16_base", "hf_rollout", "always")
    ),
    "files": PATCH_FILES,
    "replace": S.ListOf(dict(REPLACE, **{"with": TemplateCode(10_000)})),
    "source": SOURCE,
}
HOLDS = S.MapOf(S.Scalar(), key=S.HYDRA_KEY)
AUDIT_CHECK = S.OneOf(tuple(AUDIT_CHECKS))
REVIEWED = {
    "check": AUDIT_CHECK,
    "file": S.RELPATH,
    "line": S.Text(1000),
    "why": WHY,
    "holds": S.MapOf(TemplateScalar(), key=S.HYDRA_KEY),
    "source": SOURCE,
}
ALLOC_CONF = {
    "max_vram_gb": float,
    "value": S.ALLOC_CONF,
    "why": WHY,
    "not_with_rollouts": S.MapOf(WHY, key=S.Pattern(r"hf|vllm|sglang", "vllm")),
    # rollout releases from `min` that take it whatever the card (features.yaml says why)
    "with_rollouts?": S.MapOf(
        {"min": S.VERSION, "why": WHY, "source": SOURCE}, key=S.Pattern(r"hf|vllm|sglang", "vllm")
    ),
    "source": SOURCE,
}
# micro_batch_size_per_gpu: optional; an upper bound on every planned micro-batch (the plan picks
# the largest that fits the GPU: envbuilder/model/memory.py)
TRAIN = {
    "model": S.MODEL_REF,
    "model_vram_gb": float,
    "n_gpus": int,
    "train_batch_size": int,
    "ppo_mini_batch_size": int,
    "micro_batch_size_per_gpu?": int,
    "max_prompt_length": int,
    "max_response_length": int,
    "param_offload": bool,
    "optimizer_offload": bool,
    "gradient_checkpointing": bool,
    "gpu_memory_utilization": float,
    "lora_rank": int,
    # the host memory (GiB) a node offers offload: the memory plan counts what it keeps there
    "host_memory_gib?": int,
}
COMPONENT_VERSIONS = S.MapOf(S.VERSION, key=S.NAME)  # (matrix._cross_check: apex, flash-attn)
# a whole pinned set by verl release (stacks.yaml): what `--verl X` selects on a profile that
# runs another verl; components apply where the GPU meets their hardware floor
STACK = {
    "cuda": S.CUDA,
    "torch": S.VERSION,
    "rollout": S.OneOf(ROLLOUTS),
    "vllm?": S.VERSION,
    "python?": S.CUDA,
    "components?": COMPONENT_VERSIONS,
    "pins?": PINS,
    "why": WHY,
    "source": SOURCE,
}
PROFILE = {
    "description": DESCRIPTION,
    "gpu": S.NAME,
    "cuda": S.CUDA,
    "torch": S.VERSION,
    "verl": S.VERSION,
    "rollout": S.OneOf(ROLLOUTS),
    "vllm?": S.VERSION,
    "python?": S.CUDA,
    "dtype": S.OneOf(("auto", "bf16", "fp16", "fp32")),
    "attention": S.OneOf(("auto", "flash_attention_2", "sdpa", "eager")),
    "components": COMPONENT_VERSIONS,
    "optional_components?": COMPONENT_VERSIONS,
    "pins?": PINS,
    "train": TRAIN,
    "algorithm?": S.NAME,
    "source": SOURCE,
}
# a decoder's architecture (its config.json) for the memory estimate; `parameters` is checked
# against the count the architecture gives (matrix._cross_check)
MODEL = {
    "family": S.OneOf(("qwen2", "llama", "qwen3", "deepseek")),
    "layers": int,
    "hidden_size": int,
    "attention_heads": int,
    "kv_heads": int,
    "head_dim": int,
    "intermediate_size": int,
    "vocab_size": int,
    "tied_embeddings": bool,
    "qkv_bias": bool,
    "qk_norm?": bool,
    # a mixture of experts (Qwen3-MoE): every decoder layer's MLP is `experts` experts of
    # moe_intermediate_size, `experts_per_token` of them run for each token
    "experts?": int,
    "experts_per_token?": int,
    "moe_intermediate_size?": int,
    # DeepSeek-style: shared experts beside the routed ones, the first layers dense, MLA attention
    "shared_experts?": int,
    "dense_layers?": int,
    "router_bias?": bool,
    "mla?": {"q_lora_rank": int, "kv_lora_rank": int, "qk_rope_head_dim": int, "v_head_dim": int},
    "max_position_embeddings": int,
    "parameters": int,
    "source": SOURCE,
}
MEMORY = {
    "total_mib": S.MapOf({"mib": int, "ecc_off_mib?": int, "source": SOURCE}, key=S.NAME),
    "cuda_context_gib": float,
    "nccl_gib": float,
    "allocator_overhead": float,
    "hf_generate_overhead": float,
    "margin": float,
    "validation_share": float,
    "max_micro_tokens?": int,
    "rollout_seqs_per_gpu": int,
    "host_memory_gib_per_gpu": int,
    "source": SOURCE,
}
# endpoints, tried in order: registries (HOST[:PORT][/PREFIX]) by the registry they stand in
# for; index, Hugging Face, apt and GitHub prefixes as URLs (the PyTorch index's take {variant})
MIRROR = {
    "description": DESCRIPTION,
    "registries?": S.MapOf(S.ListOf(S.REGISTRY), key=S.REGISTRY_HOST),
    "pypi?": S.ListOf(S.URL),
    "pytorch?": S.ListOf(S.Url(("variant",))),
    "conda?": S.MapOf(S.ListOf(S.URL), key=S.NAME),
    "huggingface?": S.ListOf(S.URL),
    "apt?": S.ListOf(S.URL),
    "github?": S.ListOf(S.URL),
    # a known flash-attn wheel index (extensions.yaml wheel_indexes) by name -> prefixes that
    # serve its world trees (cu130/torch2.11/simple/)
    "wheel_indexes?": S.MapOf(S.ListOf(S.URL), key=S.NAME),
    "source?": SOURCE,
}
DATASET_FILES = {"train": S.REPO_FILE, "test": S.REPO_FILE}  # split -> file in the repo
DATASET = {
    "repo": S.MODEL_ID,
    "revision": S.GIT_REF,
    "files": DATASET_FILES,
    "data_source": S.Text(200),
    "ability": S.Text(200),
    "instruction": S.Text(1000),
    "answer_pattern": S.Regex(),
    "rows": {"train": int, "test": int},
    "source": SOURCE,
}
# uv: the installer of the runtime stage's pip steps, its linux x86_64 wheel (and aarch64 one) pinned by sha256
# (an overlay that replaces `defaults` must carry it: assemble.uv_pin says so)
UV = {
    "version": S.VERSION,
    "url": S.URL,
    "sha256": S.SHA256,
    "size": int,
    # the same release's manylinux aarch64 wheel, for the Grace profiles' images
    "aarch64?": {"url": S.URL, "sha256": S.SHA256, "size": int},
    "source": SOURCE,
}
DEFAULTS = {
    "pypi_index": S.URL,
    "huggingface": S.URL,
    "conda_channels": S.ListOf(S.CHANNEL),
    "registry_local": S.REGISTRY,
    "uv?": UV,
}

# section -> (schema of the section, whether records merge by key)
SECTIONS: dict[str, tuple[S.Spec, bool]] = {
    "gpus": (S.MapOf(GPU, key=S.NAME), True),
    "cuda": (S.MapOf(CUDA, key=S.CUDA), True),
    "torch": (S.MapOf(TORCH, key=S.VERSION), True),
    "index_url": (S.Url(("variant",), "https://download.pytorch.org/whl/{variant}"), False),
    "arch_lists": (S.MapOf(S.ListOf(S.CC), key=S.NAME), True),
    "vllm": (S.MapOf(VLLM, key=S.VERSION), True),
    "min_compute_capability": (S.CC, False),
    "min_compute_capability_source": (SOURCE, False),
    "vllm_training_path": (TRAINING_PATH, False),
    "sglang": (S.MapOf(SGLANG, key=S.VERSION), True),
    "sglang_training_path": (TRAINING_PATH, False),
    "cuda_compat": ({"libcuda": S.ABSPATH, "source": SOURCE}, False),
    "features": (S.MapOf(FEATURE, key=S.NAME), True),
    "flash_attn": (FLASH_ATTN, False),
    "apex": (APEX, False),
    "verl": (S.MapOf(VERL, key=S.VERSION), True),
    "algorithms": (S.MapOf(ALGORITHM, key=S.NAME), True),
    "interconnects": (S.MapOf(INTERCONNECT, key=S.NAME), True),
    "requires": (REQUIRES, True),
    # PyPI names that are another project than the one meant (PyPI's `apex`): a pin is refused
    "pypi_names": (S.MapOf({"is": WHY, "fix": WHY, "source": SOURCE}, key=S.PACKAGE), False),
    "patches": (S.MapOf(PATCH, key=S.NAME), True),
    "reviewed": (S.MapOf(REVIEWED, key=S.NAME), True),
    "cuda_alloc_conf": (ALLOC_CONF, False),
    "profiles": (S.MapOf(PROFILE, key=S.NAME), True),
    "stacks": (S.MapOf(STACK, key=S.VERSION), True),
    "mirrors": (S.MapOf(MIRROR, key=S.NAME), True),
    "datasets": (S.MapOf(DATASET, key=S.NAME), True),
    "models": (S.MapOf(MODEL, key=S.MODEL_ID), True),
    "memory": (MEMORY, False),
    "defaults": (DEFAULTS, False),
    "sources": (S.MapOf(SOURCE, key=S.NAME), False),
}


def matrix_json_schema() -> dict[str, object]:
    """The JSON Schema of one file of matrices/ (or an overlay): a mapping of sections, each
    as SECTIONS declares it (schema.json_schema; matrix.load's own check says more)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "envbuild matrix file",
        "type": "object",
        "properties": {name: S.json_schema(spec) for name, (spec, _) in SECTIONS.items()},
        "additionalProperties": False,
    }


# The kinds of the resolved environment's values that its records (envbuilder/model/resolved.py)
# name in their annotations, where the spec `render --from` checks a file against is derived
# from (resolved.field_spec). Every value a file carries is checked with the kind of the matrix
# field it came from, so an edited or foreign file reaches no template with a value the matrix
# itself would refuse. (The memory plan's records name their kinds in
# envbuilder/model/memory_plan.py.)
DRIVER_MODES = ("native", "minor-version-compatibility", "too-old")
# The numbers of a resolved environment, each in the range it means (a count is never 0 or
# negative, a share of memory is in (0, 1]): a file can hold any number, the matrix only these.
COUNT = S.Int(1, 10**9)
GIB = S.Num(0, 1 << 20)
ATTENTION = S.OneOf(("flash_attention_2", "sdpa", "eager"))
NOTE = S.Text(4000)  # a note or warning of the resolver, one paragraph
