"""Load the compatibility matrix (matrices/*.yaml plus user overlays) and validate it.

Every file may hold any of the sections below; an overlay directory's files are read after the
shipped ones and replace records key by key, so users add or override profiles without forking.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import schema as S
from .errors import UserError
from .paths import data_dir

SOURCE = str
GPU = {"name": str, "match": S.ListOf(str), "arch": str, "compute_capability": S.CC,
       "vram_gb": float, "max_smem_per_block_kb": int, "bf16": bool, "fp16_fast": bool,
       "source": SOURCE}
CUDA = {"version": S.VERSION, "min_driver": S.DRIVER, "compat_driver": S.DRIVER,
        "nvcc_archs": S.ListOf(S.CC), "ubuntu": str, "python": S.CUDA,
        "images": {"devel": str, "runtime": str}, "conda_nvcc": str, "source": SOURCE}
TORCH = {"python": S.ListOf(S.CUDA), "torchvision": S.VERSION, "torchaudio": S.VERSION,
         "pypi_default": str, "builds": S.MapOf({"cuda": S.CUDA, "archs": S.ListOf(S.CC)}),
         "source": SOURCE}
VLLM = {"torch": S.VERSION, "wheel_cuda": S.CUDA, "python": S.ListOf(S.CUDA), "source": SOURCE}
FEATURE = {"min_compute_capability": S.CC, "note?": str, "source": SOURCE}
FLASH_ATTN = {"min_compute_capability": S.CC, "source": SOURCE,
              "versions": S.MapOf({"torch": str, "source": SOURCE}, key=S.VERSION)}
APEX = {"versions": S.MapOf({"ref": str, "install": S.OneOf(("env", "config_settings")),
                             "source": SOURCE}),
        "source_url": str, "nvcc_must_match_torch_cuda": bool, "source": SOURCE}
VERL = {"rollouts": S.ListOf(S.OneOf(("hf", "vllm", "sglang"))), "vllm": str,
        "attention_override": (str, None), "patches": S.ListOf(str),
        "pins": S.MapOf(S.VERSION), "source": SOURCE}
PATCH = {"why": str, "when": S.OneOf(("no_flash_attention", "no_bf16", "always")),
         "files": S.ListOf(str),
         "replace": S.ListOf({"find": str, "with": str}), "source": SOURCE}
TRAIN = {"model": str, "model_vram_gb": float, "n_gpus": int, "train_batch_size": int,
         "ppo_mini_batch_size": int, "micro_batch_size_per_gpu": int, "max_prompt_length": int,
         "max_response_length": int, "param_offload": bool, "optimizer_offload": bool,
         "gradient_checkpointing": bool, "gpu_memory_utilization": float, "lora_rank": int}
PROFILE = {"description": str, "gpu": str, "cuda": S.CUDA, "torch": S.VERSION, "verl": S.VERSION,
           "rollout": S.OneOf(("hf", "vllm", "sglang")), "vllm?": S.VERSION,
           "python?": S.CUDA, "dtype": S.OneOf(("auto", "bf16", "fp16", "fp32")),
           "attention": S.OneOf(("auto", "flash_attention_2", "sdpa", "eager")),
           "components": S.MapOf(S.VERSION), "optional_components?": S.MapOf(S.VERSION),
           "pins?": S.MapOf(S.VERSION), "train": TRAIN, "source": SOURCE}
ENDPOINTS = S.ListOf(str)
MIRROR = {"description": str, "registries?": S.MapOf(ENDPOINTS), "pypi?": ENDPOINTS,
          "pytorch?": ENDPOINTS, "conda?": S.MapOf(ENDPOINTS), "huggingface?": ENDPOINTS,
          "apt?": ENDPOINTS, "github?": ENDPOINTS, "source?": SOURCE}
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
    "features": (S.MapOf(FEATURE), True),
    "flash_attn": (FLASH_ATTN, False),
    "apex": (APEX, False),
    "verl": (S.MapOf(VERL, key=S.VERSION), True),
    "patches": (S.MapOf(PATCH), True),
    "profiles": (S.MapOf(PROFILE), True),
    "mirrors": (S.MapOf(MIRROR), True),
    "defaults": (DEFAULTS, False),
    "sources": (S.MapOf(str), False),
}


@dataclass
class Matrix:
    """The merged, validated matrix. Sections are plain dicts of validated records."""

    sections: dict[str, Any]
    origin: dict[tuple[str, str], str] = field(default_factory=dict)  # (section, key) -> file

    def __getattr__(self, name: str) -> Any:
        try:
            return self.sections[name]
        except KeyError:
            raise AttributeError(name) from None

    def where(self, section: str, key: str) -> str:
        return self.origin.get((section, key), f"matrices ({section})")


def _read(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"Cannot read matrix file {path}: {e.strerror}.") from None
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        doc = yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise UserError(f"{path}{at}: malformed YAML ({problem}). Fix the file's syntax "
                        "(indentation, quotes, colons) and run again.") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UserError(f"{path}: a matrix file must be a mapping of sections "
                        f"({', '.join(SECTIONS)}), not {type(doc).__name__}.")
    return doc


def _check_sources(doc: dict, name: str) -> None:
    known = doc.get("sources", {})

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("source", "min_compute_capability_source") and isinstance(v, str):
                    for token in (t.strip() for t in v.split(",")):
                        if token not in known and "://" not in token:
                            raise S.SchemaError(f"{where}.{k}", f"source {token!r} is neither a URL "
                                                f"nor a key of this file's `sources:`")
                else:
                    walk(v, f"{where}.{k}")

    for section, body in doc.items():
        if section != "sources":
            walk(body, f"{name}: {section}")


def _validate_file(path: Path, doc: dict) -> None:
    name = _display(path)
    for section, body in doc.items():
        if section not in SECTIONS:
            import difflib

            close = difflib.get_close_matches(str(section), list(SECTIONS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UserError(f"{name}: unknown section {section!r}.{hint} "
                            f"Known sections: {', '.join(SECTIONS)}.")
        try:
            S.check(body, SECTIONS[section][0], f"{name}: {section}")
        except S.SchemaError as e:
            raise UserError(f"{e}. Fix this key in the matrix file and run again.") from None
    try:
        _check_sources(doc, name)
    except S.SchemaError as e:
        raise UserError(f"{e}. Every fact names where it comes from.") from None


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def matrix_files(overlays: tuple[Path, ...] = ()) -> list[Path]:
    files = sorted(data_dir("matrices").glob("*.yaml"))
    for d in overlays:
        d = Path(d)
        if not d.is_dir():
            raise UserError(f"Matrix overlay {d} is not a directory. Pass --matrix-dir a folder "
                            "of *.yaml files (same sections as the shipped matrices).")
        files += sorted(d.glob("*.yaml"))
    return files


def load(overlays: tuple[Path, ...] = ()) -> Matrix:
    sections: dict[str, Any] = {}
    origin: dict[tuple[str, str], str] = {}
    for path in matrix_files(overlays):
        doc = _read(path)
        _validate_file(path, doc)
        for section, body in doc.items():
            if section == "sources":
                continue
            merge_by_key = SECTIONS[section][1]
            if merge_by_key:
                sections.setdefault(section, {}).update(body)
                for key in body:
                    origin[(section, key)] = _display(path)
            else:
                sections[section] = body
    for section in SECTIONS:
        sections.setdefault(section, {} if SECTIONS[section][1] else None)
    m = Matrix(sections, origin)
    _cross_check(m)
    return m


def _cross_check(m: Matrix) -> None:
    """References between files and facts that must agree."""
    bf16_floor = (m.features.get("bf16") or {}).get("min_compute_capability")
    for key, gpu in m.gpus.items():
        if bf16_floor and gpu["bf16"] != (cc_tuple(gpu["compute_capability"]) >= cc_tuple(bf16_floor)):
            raise UserError(f"{m.where('gpus', key)}: gpus.{key}.bf16 is {gpu['bf16']} but CC "
                            f"{gpu['compute_capability']} vs the bf16 floor {bf16_floor} says "
                            "otherwise. Correct one of the two facts.")
    for key, ver in m.verl.items():
        for p in ver["patches"]:
            if p not in m.patches:
                raise UserError(f"{m.where('verl', key)}: verl.{key}.patches names {p!r}, which "
                                "patches.yaml does not define.")
    refs = (("gpu", "gpus"), ("cuda", "cuda"), ("torch", "torch"), ("verl", "verl"),
            ("vllm", "vllm"))
    for key, prof in m.profiles.items():
        for field_, section in refs:
            value = prof.get(field_)
            if value is not None and value not in m.sections[section]:
                import difflib

                close = difflib.get_close_matches(str(value), list(m.sections[section]), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise UserError(f"{m.where('profiles', key)}: profiles.{key}.{field_} is "
                                f"{value!r}, which {section} does not define.{hint}")


def cc_tuple(cc: str) -> tuple[int, int]:
    major, _, minor = cc.partition(".")
    return int(major), int(minor or 0)


def version_key(v: str):
    from packaging.version import Version

    return Version(v)


def in_range(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(version, prereleases=True)


def overlays_from_env() -> tuple[Path, ...]:
    env = os.environ.get("ENVBUILD_MATRIX_DIR")
    return tuple(Path(p) for p in env.split(os.pathsep) if p) if env else ()
