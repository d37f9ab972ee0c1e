"""The GPU tier's records: which rendered configuration ran verl's workers through a PPO step on
a GPU (bench/gpu_step.py writes them; tests/fixtures/gpu/step/ holds them and travels in the
wheel as _data/gpu_step). A record counts for a profile only while today's render has the same
fingerprint: the run script's overrides, its exports, the patches, the card's cap, the model's
shape, the pins of what verl imports, the precision and the attention."""

from __future__ import annotations

from collections.abc import Mapping

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from envbuilder.images import SIDECAR
from envbuilder.model import runplan
from envbuilder.model.resolved import ResolvedEnv

GIB = 1024**3
# the shell variables of the rendered run script, as the GPU tier expands them
SCRIPT_ENV = {"MODEL": "/tmp/envbuild-gpu/model", "DATA_DIR": "/tmp/envbuild-gpu/data", "N_GPUS": "1"}
# what verl imports on the worker path beyond what a GPU machine's torch image has: the pins of
# these are part of a run's identity
CARRIED = (
    "transformers",
    "tokenizers",
    "huggingface-hub",
    "peft",
    "accelerate",
    "tensordict",
    "ray",
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "codetiming",
    "setuptools",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "orjson",
)
_KEYS = (
    "profile",
    "verl",
    "overrides",
    "exports",
    "patches",
    "cap_bytes",
    "arch",
    "pins",
    "precision",
    "attention",
)


Record = dict[str, object]  # (a run record, or a case: JSON data)


def fingerprint(case: Mapping[str, object]) -> str:
    blob = json.dumps({k: case[k] for k in _KEYS}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def case(env: ResolvedEnv, files: dict[str, str], models: Mapping[str, Mapping[str, object]]) -> Record:
    """The GPU run of a resolved, rendered profile (`files`: render.files.render_files of its context)."""
    exports = {}
    if env.cuda_alloc_conf and env.cuda_alloc_conf.value:
        exports["PYTORCH_CUDA_ALLOC_CONF"] = env.cuda_alloc_conf.value
    if not env.features.torch_compile:
        exports["TORCHDYNAMO_DISABLE"] = "1"
    mem = env.memory
    out: Record = {
        "profile": env.profile,
        "gpu": env.gpu.name,
        "verl": env.verl.version,
        # the run plan's overrides, expanded as the script expands them (no bash: the plan is data)
        "overrides": runplan.overrides(env.run, dict(SCRIPT_ENV, NNODES=str(env.cluster.nodes))),
        "exports": exports,
        "patches": [
            {"name": p.name, "files": list(p.files), "replace": [dict(r) for r in p.replace]}
            for p in env.patches
        ],
        # the sidecar apply_patches.py (envbuilder/images/) reads: its part of the rendered one
        "apply_patches": json.dumps({"apply_patches": json.loads(files[SIDECAR])["apply_patches"]}, indent=1),
        # the card: what the plan calls usable (its memory less the CUDA context), the cap of
        # torch's caching allocator (the context lives outside it)
        "cap_bytes": int(mem.usable_gib * GIB),
        "card_gib": mem.gpu_total_gib,
        "arch": {
            k: v for k, v in models[env.train.model].items() if k not in ("source", "parameters", "family")
        },
        "model": env.train.model,
        "pins": {k: v for k, v in env.verl.pins.items() if k.split("[")[0] in CARRIED},
        "precision": env.precision.to_dict(),
        "attention": env.attention,
        "dtype": env.dtype,
        "lora_rank": env.train.lora_rank,
        "plan": {
            "batch": mem.batch.sizes(),
            "peak": mem.peak.to_dict(),
            "phases": {p.key: p.total_gib for p in mem.phases},
        },
    }
    out["fingerprint"] = fingerprint(out)
    return out


def records_dir() -> Path | None:
    pkg = Path(__file__).resolve().parent.parent  # (envbuilder/, as paths.data_dir finds data)
    for candidate in (pkg / "_data" / "gpu_step", pkg.parent / "tests" / "fixtures" / "gpu" / "step"):
        if candidate.is_dir():
            return candidate
    return None


@lru_cache(maxsize=None)
def _runs() -> tuple[Record, ...]:
    where = records_dir()
    out = []
    for path in sorted(where.glob("*.json")) if where else ():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for run in doc.get("runs", []) if isinstance(doc, dict) else []:
            if isinstance(run, dict) and not run.get("control"):
                out.append(dict(run, file=path.name))
    return tuple(out)


def records() -> tuple[Record, ...]:
    """Every recorded in-process worker run (the profiles' own, not the controls)."""
    return tuple(r for r in _runs() if r.get("mode") != "main_ppo")


def trainer_records() -> tuple[Record, ...]:
    """Every recorded `python -m verl.trainer.main_ppo` run through Ray (bench/gpu_step.py --ppo)."""
    return tuple(r for r in _runs() if r.get("mode") == "main_ppo")


def _map(r: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = r.get(key)
    return value if isinstance(value, Mapping) else {}


def _list(r: Mapping[str, object], key: str) -> list[object]:
    value = r.get(key)
    return value if isinstance(value, list) else []


def status(env: ResolvedEnv, files: dict[str, str], models: Mapping[str, Mapping[str, object]]) -> str:
    """What the GPU tier says of this render: `ran (...)`, `stale` (a run of another
    configuration), or `not run`."""
    mine = [r for r in records() if r.get("profile") == env.profile]
    if not mine:
        return "not run"
    fp = case(env, files, models)["fingerprint"]
    for r in mine:
        if r.get("fingerprint") == fp:
            if not r.get("ok"):
                return f"FAILED in {_map(r, 'error').get('phase')}"
            phases = [p for p in _list(r, "phases") if isinstance(p, Mapping)]
            steps = len([p for p in phases if str(p["phase"]).endswith("update_actor")])
            ray = [
                p
                for p in trainer_records()
                if p.get("profile") == env.profile and p.get("fingerprint") == fp and p.get("rc") == 0
            ]
            return f"ran: {steps} steps ({_map(r, 'meta').get('device', 'GPU')})" + (
                f", main_ppo+Ray {max(n for n in _list(ray[0], 'steps') if isinstance(n, int))} steps"
                if ray
                else ""
            )
    return "stale (another configuration ran)"
