#!/usr/bin/env python3
"""The world table of docs/world.md: each model of the table on each common setup, GAE and GRPO,
as today's matrix plans it (issue 45). A cell is a plan (the rollout's tensor parallelism, what is
offloaded, Ulysses SP, vLLM's share and the micro-batches) or a refusal with the fixes the fix
search checked (each resolves; tests/test_world_table.py resolves them again).

  python bench/world_table.py > docs/world.md          (tests/test_world_table.py regenerates it)
  python bench/world_table.py cases -o FILE --shapes DIR   (here: needs envbuilder)
  python bench/verl_validate.py device --cases FILE --out FILE --model-dir DIR   (where verl imports)

`cases` writes every planned cell's run overrides as the run script passes them, and a model
folder of each model's shape (config.json from matrices/models.yaml, machine/verify.py
write_model_shape) under DIR, for verl's own validate_config; the record is
tests/fixtures/gpu/validate/world-verl-0.9.1.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

MODELS = (
    *(f"Qwen/Qwen2.5-{s}-Instruct" for s in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B")),
    "Qwen/Qwen3-30B-A3B",  # a mixture of experts (128 experts, 8 a token)
)
MOE = {"Qwen/Qwen3-30B-A3B": "30B-A3B"}
ALGOS = ("gae", "grpo")
# (label, profile, overrides): a 24 GB and a 48 GB card alone (the 3090 profile's verl 0.9.1
# stack; the 48 GB card at the size an L40S reports, memory.yaml), 8 GPUs of each datacenter
# card, and two nodes of 8 H100s
SETUPS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("24 GB × 1", "3090", {}),
    ("48 GB × 1", "3090", {"gpu_memory": 46068}),
    ("A100-80 × 8", "a100", {}),
    ("H100 × 8", "h100", {}),
    ("H200 × 8", "h200", {}),
    ("B200 × 8", "b200", {}),
    ("2 × 8 H100", "h100", {"nodes": 2}),
)
# what verl's own example scripts run for these sizes (volcengine/verl examples/ at b178a3cd,
# 2026-01-29): (size, algo, the example, what it runs, the same model and world here: profile,
# overrides). The H800 of the 14B example is an H100 with less interconnect, 80 GB as well.
VERL_EXAMPLES_AT = "b178a3cd"
ANCHORS: tuple[tuple[str, str, str, str, str, dict[str, Any]], ...] = (
    (
        "7B",
        "gae",
        "examples/ppo_trainer/run_qwen2-7b_seq_balance.sh",
        "1 × 8 GPUs, rollout TP 2, no offload, vLLM 0.5",
        "h100",
        {},
    ),
    (
        "14B",
        "grpo",
        "examples/tuning/14b/qwen2_14b_grpo_4_h800_fsdp_vllm.sh",
        "1 × 4 H800, rollout TP 4, param and optimizer offload, vLLM 0.5",
        "h100",
        {"gpus_per_node": 4},
    ),
    (
        "32B",
        "gae",
        "examples/ppo_trainer/run_qwen2.5-32b.sh",
        "4 × 8 GPUs, rollout TP 4, no offload, vLLM 0.5",
        "h100",
        {"nodes": 4},
    ),
    (
        "72B",
        "grpo",
        "examples/tuning/70b/qwen2-72b_grpo-lora_8_h100_fsdp_vllm.sh",
        "LoRA rank 32, 1 × 8 H100, rollout TP 8, param and optimizer offload, Ulysses SP 2, vLLM 0.4",
        "h100",
        {"lora_rank": 32},
    ),
    (
        "30B-A3B",
        "grpo",
        "examples/gmpo_trainer/test_dapo_qwen3_30b_math.sh",
        "8 × 8 GPUs, rollout TP 4, param and optimizer offload, Ulysses SP 4 (8K responses), vLLM 0.8",
        "h100",
        {"nodes": 8},
    ),
)


def _setup_path() -> None:
    for p in (str(HERE), str(HERE.parent), str(HERE.parent / "tests")):
        if p not in sys.path:
            sys.path.insert(0, p)


def model_of(size: str) -> str:
    return next((m for m, s in MOE.items() if s == size), f"Qwen/Qwen2.5-{size}-Instruct")


def size_of(model: str) -> str:
    return MOE.get(model) or model.split("-")[1]


_CELLS: dict[
    tuple[Any, ...], dict[str, Any]
] = {}  # (each resolution once: the table, the anchors and cases share them)


def cell(profile: str, model: str, algo: str, over: dict[str, Any]) -> dict[str, Any]:
    """One cell: {"env": the resolved environment} or {"refused": rule, "what", "fix": the
    checked fix}."""
    key = (profile, model, algo, tuple(sorted(over.items())))
    if key not in _CELLS:
        _CELLS[key] = _cell(profile, model, algo, over)
    return _CELLS[key]


def _cell(profile: str, model: str, algo: str, over: dict[str, Any]) -> dict[str, Any]:
    _setup_path()
    from envbuilder.errors import UserError
    from envbuilder.model.matrix import load
    from envbuilder.model.resolve import Overrides, ResolveError, resolve

    try:
        return {"env": resolve(load(), profile, Overrides(model=model, algo=algo, **over))}
    except ResolveError as e:
        v = e.violations[0]
        return {"refused": v.rule, "what": v.what, "fix": v.fix}
    except UserError as e:
        return {"refused": "input", "what": str(e), "fix": ""}


def short(c: dict[str, Any]) -> str:
    """A cell as the table prints it: a plan's layout, or a refusal's alternatives (each the
    flags it sets, a model by its size)."""
    if "env" not in c:
        from envbuilder.model.fixes import FIX_FLAG, alternatives

        alts = []
        for alt in alternatives(c["fix"]):
            flags = " ".join(f"--{f} {v}" for f, v in FIX_FLAG.findall(alt))
            if flags:
                alts.append(flags.replace("Qwen/Qwen2.5-", "").replace("-Instruct", ""))
        return "✗ " + " · ".join(alts) if alts else "✗ " + c["refused"]
    env = c["env"]
    mem, t = env.memory, env.train
    b = mem["batch"]
    parts = [f"TP {mem['rollout_tp']}"]
    off = [w for w, on in (("params", t.param_offload), ("optimizer", t.optimizer_offload)) if on]
    if off:
        parts.append("offload " + "+".join(off))
    if mem["sequence_parallel"] > 1:
        parts.append(f"SP {mem['sequence_parallel']}")
    parts.append(f"vLLM {t.gpu_memory_utilization:g}")
    parts.append(f"mb {b['actor_ppo_micro_batch_size_per_gpu']}/{b['log_prob_micro_batch_size_per_gpu']}")
    return "✓ " + ", ".join(parts)


def _flags(over: dict[str, Any]) -> str:
    return "".join(f" --{k.replace('_', '-')} {v}" for k, v in over.items())


def table() -> str:
    """docs/world.md's text."""
    out = [
        "# The world table: models × setups, as today's matrix plans them",
        "",
        "Generated by `python bench/world_table.py > docs/world.md`; `tests/test_world_table.py`",
        "regenerates it and fails when this file differs. Each cell is `envbuild check PROFILE",
        "--model M --algo A` on that setup: a plan (✓: the rollout's tensor parallelism, what is",
        "offloaded while idle, Ulysses SP, vLLM's planned share of the card, the actor's update and",
        "the log-prob micro-batches per GPU), or a refusal (✗) with the fixes it offers, each the",
        "flags it sets (`·` between alternatives); the fix search resolved each before offering it,",
        "and the test resolves each again. Qwen2.5 Instruct models and the Qwen3-30B-A3B mixture of",
        "experts (matrices/models.yaml, from their Hugging Face config.json), GSM8K at the profile's",
        "sequence lengths and batch sizes. Every plan's run overrides passed verl 0.9.1's own",
        "`validate_config`, composed with its Hydra config and a model folder of that model's shape",
        "(tests/fixtures/gpu/validate/world-verl-0.9.1.json, held to today's overrides by their",
        "fingerprint).",
        "",
        "Setups: "
        + "; ".join(f"{label} = `{profile}`{_flags(over)}" for label, profile, over in SETUPS)
        + ".",
        "",
    ]
    for algo in ALGOS:
        out += [f"## {algo.upper()}", "", "| model | " + " | ".join(s[0] for s in SETUPS) + " |"]
        out.append("|---" * (len(SETUPS) + 1) + "|")
        for model in MODELS:
            cells = [short(cell(profile, model, algo, over)) for _, profile, over in SETUPS]
            label = f"{size_of(model)} MoE" if model in MOE else size_of(model)
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
    out += [
        "## Read against verl's own examples",
        "",
        f"verl's example scripts (volcengine/verl `examples/` at {VERL_EXAMPLES_AT}) for these sizes,",
        "and the plan for the same model (`--model SIZE` stands for the table's model of that size),",
        "algorithm and world here:",
        "",
        "| size | verl's example | what it runs | `envbuild check` | this plan |",
        "|---|---|---|---|---|",
    ]
    for size, algo, path, what, profile, over in ANCHORS:
        plan = short(cell(profile, model_of(size), algo, over))
        cmd = f"`{profile} --model {size} --algo {algo}{_flags(over)}`"
        out.append(f"| {size} | `{path}` | {what} | {cmd} | {plan} |")
    out += [
        "",
        "The plan takes the smallest rollout TP that holds the weight shard, the KV cache of 16",
        "sequences a GPU and the sampler (verl's examples often take a wider one: a choice for",
        "throughput, not memory), and offloads only what does not fit resident. The actor's own",
        "update loads its weights, gradients and Adam state back whatever is offloaded (20 B a",
        "parameter during Adam's step, sharded over the world), which is why a 32B needs two nodes",
        "of 80 GB cards here (verl's 32B example runs four, with the same TP 4 and no offload), a",
        "14B GRPO is refused on four 80 GB cards where verl's example runs it at the edge of an",
        "H800, and a full-parameter 72B needs four nodes (verl's 72B example on one node trains",
        "LoRA adapters: `--lora-rank 32` plans that on one node, rollout TP 8 as verl's, and a",
        "refusal offers it wherever the frozen base fits). A mixture of experts (Qwen3-30B-A3B)",
        "is planned on the FSDP engine as verl trains it: weights, gradients and Adam state count",
        "all 128 experts of every layer (30.5B parameters, like a 32B), activations the 8 a token",
        "runs; verl's example trains it with SP 4 for 8K-token responses, where GSM8K's 1K need",
        "none; `--engine megatron` plans it on verl's Megatron engine instead (docs/megatron.md).",
        "DeepSeek-V2/V3-style mixtures (MLA attention, shared experts, leading dense layers; e.g.",
        "moonshotai/Moonlight-16B-A3B) are planned on both engines too.",
        "",
    ]
    return "\n".join(out)


def cases() -> list[dict[str, Any]]:
    """Every planned cell's run overrides (verl_validate's case format; "shape": the model's
    folder under the cases' shape directory)."""
    _setup_path()
    from verl_validate import PLACEHOLDER_MODEL, fingerprint

    from envbuilder.model import runplan

    out = []
    for label, profile, over in SETUPS:
        for model in MODELS:
            for algo in ALGOS:
                c = cell(profile, model, algo, over)
                if "env" not in c:
                    continue
                env = c["env"]
                world = dict(runplan.world(env), MODEL=PLACEHOLDER_MODEL, DATA_DIR="/data/gsm8k")
                ov = runplan.overrides(env.run, world)
                out.append(
                    {
                        "case": f"{label}/{size_of(model)}/{algo}",
                        "verl": env.verl.version,
                        "shape": size_of(model),
                        "overrides": ov,
                        "fingerprint": fingerprint(env.verl.version, ov),
                    }
                )
    return out


def shapes(dest: Path) -> None:
    """A model folder of each model's shape under dest/SIZE (config.json and a tokenizer)."""
    _setup_path()
    from envbuilder.machine.verify import write_model_shape
    from envbuilder.model.matrix import load

    m = load()
    for model in MODELS:
        write_model_shape(m.models[model], dest / size_of(model))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("cases")
    c.add_argument("-o", "--out", type=Path, required=True)
    c.add_argument("--shapes", type=Path, required=True, help="where each model's shape folder goes")
    a = ap.parse_args(argv)
    if a.cmd is None:
        sys.stdout.write(table())
        return 0
    runs = cases()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(runs, indent=1) + "\n")
    shapes(a.shapes)
    print(f"{len(runs)} cases -> {a.out}; model shapes -> {a.shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
