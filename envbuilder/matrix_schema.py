"""The schema of every matrix section (checked only when the files changed: see matrix.load)."""

from __future__ import annotations

from typing import Any

from . import schema as S
from .resolve import AUDIT_CHECKS

SOURCE = str
# what a training run imports, in order: dotted Python module names (they land in preflight.py
# and the smoke test as data, and the real-package tests look each one up in the real wheel)
MODULES = S.ListOf(S.MODULE)
TRAINING_PATH = {"modules": MODULES, "source": SOURCE}
GPU = {"name": str, "match": S.ListOf(S.Regex()), "arch": str, "compute_capability": S.CC,
       "vram_gb": float, "max_smem_per_block_kb": int, "bf16": bool, "fp16_fast": bool,
       "source": SOURCE}
CUDA = {"version": S.VERSION, "min_driver": S.DRIVER, "compat_driver": S.DRIVER,
        "nvcc_archs": S.ListOf(S.CC), "ubuntu": str, "glibc?": S.GLIBC, "python": S.CUDA,
        "images": {"devel": str, "runtime": str}, "conda_nvcc": str, "source": SOURCE}
TORCH = {"python": S.ListOf(S.CUDA), "torchvision": S.VERSION, "torchaudio": S.VERSION,
         "pypi_default": str, "builds": S.MapOf({"cuda": S.CUDA, "archs": S.ListOf(S.CC)}),
         "source": SOURCE}
VLLM = {"torch": S.VERSION, "wheel_cuda": S.CUDA, "python": S.ListOf(S.CUDA),
        "pins?": S.MapOf(S.VERSION), "source": SOURCE}
# requires: PACKAGE -> VERSION -> what that release's METADATA needs of a shared dependency
REQUIRES = S.MapOf(S.MapOf({"needs": S.MapOf(S.Range()), "source": SOURCE}, key=S.VERSION))
FEATURE = {"min_compute_capability": S.CC, "note?": str, "source": SOURCE}
# release_wheels.filename: a template of {version} {cuda_tag} {torch} {cxx11_abi} {python}
# {machine} (envbuilder/flash_attn_wheel.py formats it); wheel_cuda: CUDA major -> wheel tag
# (a release without it, or a major it does not list, has no prebuilt wheel: the builder compiles)
WHEEL_TEMPLATE = S.Pattern(r"[A-Za-z0-9_.+-]*(\{(version|cuda_tag|torch|cxx11_abi|python|machine)\}"
                           r"[A-Za-z0-9_.+-]*)+\.whl", "flash_attn-{version}+cu{cuda_tag}...-linux_{machine}.whl")
FLASH_ATTN = {"min_compute_capability": S.CC, "source": SOURCE,
              "versions": S.MapOf({"torch": S.Range(),
                                   "wheel_cuda?": S.MapOf(S.Pattern(r"\d{2,3}", "12"),
                                                          key=S.Pattern(r"\d+", "12")),
                                   "source": SOURCE}, key=S.VERSION),
              "release_wheels": {"url": S.Pattern(r"https?://[^\s{}]+(\{version\}[^\s{}]*)?",
                                                  "https://github.com/OWNER/REPO/releases/download/v{version}"),
                                 "filename": WHEEL_TEMPLATE, "source": SOURCE},
              "runtime_pins?": S.MapOf(S.VERSION), "training_path": TRAINING_PATH}
APEX = {"versions": S.MapOf({"ref": str, "install": S.OneOf(("env", "config_settings")),
                             "source": SOURCE}),
        "source_url": str, "nvcc_must_match_torch_cuda": bool, "training_path": TRAINING_PATH,
        "source": SOURCE}
# the parts of a PPO run that compute in a dtype of their own (verl's roles), and the dtypes
DTYPES = S.OneOf(("bf16", "fp16", "fp32"))
PARTS = ("actor", "critic", "ref", "rollout")
PRECISION = {part: S.ListOf(DTYPES) for part in PARTS}
# the names a patch's `with` and a reviewed exception's `holds` may format in
FORMAT_FIELDS = ("attention", *(f"{part}_{kind}" for part in PARTS for kind in ("dtype", "autocast")))
VERL = {"torch": S.Range(), "torch_why?": str, "torch_source": SOURCE,
        "rollouts": S.ListOf(S.OneOf(("hf", "vllm", "sglang"))), "vllm": S.Range(),
        "attention_override": (str, None), "patches": S.ListOf(str),
        "precision": PRECISION, "precision_source": SOURCE,
        "autocast_keys?": {f"{part}?": S.HYDRA_KEY for part in PARTS},
        "reviewed?": S.ListOf(str),
        "pins": S.MapOf(S.VERSION),
        "training_path": {"modules": MODULES, "rollouts": S.MapOf(MODULES), "source": SOURCE},
        "source": SOURCE}
PATCH = {"why": str, "when": S.OneOf(("no_flash_attention", "no_bf16", "always")),
         "files": S.ListOf(str),
         "replace": S.ListOf({"find": str, "with": str}), "source": SOURCE}
REVIEWED = {"check": S.OneOf(tuple(AUDIT_CHECKS)), "file": S.RELPATH, "line": str, "why": str,
            "holds": S.MapOf(S.Scalar(), key=S.HYDRA_KEY), "source": SOURCE}
ALLOC_CONF = {"max_vram_gb": float, "value": S.ALLOC_CONF, "why": str,
              "not_with_rollouts": S.MapOf(str, key=S.Pattern(r"hf|vllm|sglang", "vllm")),
              "source": SOURCE}
# micro_batch_size_per_gpu: optional; an upper bound on every planned micro-batch (the plan picks
# the largest that fits the GPU: envbuilder/memory.py)
TRAIN = {"model": str, "model_vram_gb": float, "n_gpus": int, "train_batch_size": int,
         "ppo_mini_batch_size": int, "micro_batch_size_per_gpu?": int, "max_prompt_length": int,
         "max_response_length": int, "param_offload": bool, "optimizer_offload": bool,
         "gradient_checkpointing": bool, "gpu_memory_utilization": float, "lora_rank": int}
PROFILE = {"description": str, "gpu": str, "cuda": S.CUDA, "torch": S.VERSION, "verl": S.VERSION,
           "rollout": S.OneOf(("hf", "vllm", "sglang")), "vllm?": S.VERSION,
           "python?": S.CUDA, "dtype": S.OneOf(("auto", "bf16", "fp16", "fp32")),
           "attention": S.OneOf(("auto", "flash_attention_2", "sdpa", "eager")),
           "components": S.MapOf(S.VERSION), "optional_components?": S.MapOf(S.VERSION),
           "pins?": S.MapOf(S.VERSION), "train": TRAIN, "source": SOURCE}
# a decoder's architecture (its config.json) for the memory estimate; `parameters` is checked
# against the count the architecture gives (matrix._cross_check)
MODEL = {"family": S.OneOf(("qwen2",)), "layers": int, "hidden_size": int, "attention_heads": int,
         "kv_heads": int, "head_dim": int, "intermediate_size": int, "vocab_size": int,
         "tied_embeddings": bool, "qkv_bias": bool, "max_position_embeddings": int,
         "parameters": int, "source": SOURCE}
MEMORY = {"total_mib": S.MapOf({"mib": int, "source": SOURCE}), "cuda_context_gib": float,
          "nccl_gib": float, "allocator_overhead": float, "hf_generate_overhead": float,
          "margin": float,
          "validation_share": float, "source": SOURCE}
ENDPOINTS = S.ListOf(str)
MIRROR = {"description": str, "registries?": S.MapOf(ENDPOINTS), "pypi?": ENDPOINTS,
          "pytorch?": ENDPOINTS, "conda?": S.MapOf(ENDPOINTS), "huggingface?": ENDPOINTS,
          "apt?": ENDPOINTS, "github?": ENDPOINTS, "source?": SOURCE}
DATASET = {"repo": str, "revision": str, "files": {"train": str, "test": str},
           "data_source": str, "ability": str, "instruction": str, "answer_pattern": str,
           "rows": {"train": int, "test": int}, "source": SOURCE}
DEFAULTS = {"pypi_index": str, "huggingface": str, "conda_channels": S.ListOf(str),
            "registry_local": str}

# section -> (schema of the section, whether records merge by key)
SECTIONS: dict[str, tuple[Any, bool]] = {
    "gpus": (S.MapOf(GPU), True),
    "cuda": (S.MapOf(CUDA, key=S.CUDA), True),
    "torch": (S.MapOf(TORCH, key=S.VERSION), True),
    "index_url": (str, False),
    "arch_lists": (S.MapOf(S.ListOf(S.CC)), True),
    "vllm": (S.MapOf(VLLM, key=S.VERSION), True),
    "min_compute_capability": (S.CC, False),
    "min_compute_capability_source": (SOURCE, False),
    "vllm_training_path": (TRAINING_PATH, False),
    "cuda_compat": ({"libcuda": S.ABSPATH, "source": SOURCE}, False),
    "features": (S.MapOf(FEATURE), True),
    "flash_attn": (FLASH_ATTN, False),
    "apex": (APEX, False),
    "verl": (S.MapOf(VERL, key=S.VERSION), True),
    "requires": (REQUIRES, True),
    "patches": (S.MapOf(PATCH), True),
    "reviewed": (S.MapOf(REVIEWED), True),
    "cuda_alloc_conf": (ALLOC_CONF, False),
    "profiles": (S.MapOf(PROFILE), True),
    "mirrors": (S.MapOf(MIRROR), True),
    "datasets": (S.MapOf(DATASET), True),
    "models": (S.MapOf(MODEL), True),
    "memory": (MEMORY, False),
    "defaults": (DEFAULTS, False),
    "sources": (S.MapOf(str), False),
}


