#!/usr/bin/env python3
"""verl's own validate_config on every default render of the engine releases (the real-stack tier).

verl's config checks import verl, and verl imports torch, so CI (no torch) checks the batch
arithmetic with envbuilder/model/batches.py on configs composed with the real wheels' Hydra
config, and this runs the release's own checks where torch is: the GPU machine, or any machine
with the profile's stack installed.

  python bench/verl_validate.py cases -o .gpu/validate-cases.json      (here: needs envbuilder)
  python bench/verl_validate.py cases -o FILE --megatron SHAPES        (the Megatron engine's)
  python bench/verl_validate.py device --cases FILE --out FILE --model DIR  (where verl imports)

`cases` renders each default profile on verl >= 0.8 (and the 0.8/0.9 stacks on the h100) with
GAE and GRPO, on one node and on two of eight GPUs, and writes each run script's overrides as
bash expands them. `device` composes each with the installed verl's own Hydra config, as
`python -m verl.trainer.main_ppo` does, and calls main_ppo's validate_config(config,
need_reference_policy(config), need_critic(config)). --model names a local model folder (one
`bench/gpu_ppo.py run` made will do): verl 0.9's HFModelConfig reads the model's config while the
config is built, so the cases' placeholder path (MODEL) is replaced by it; --model-dir DIR gives a
case that names its model's shape (bench/world_table.py cases) the folder DIR/SHAPE instead. On the H200 with
verl 0.9.1 (2026-12-05) all 48 of its cases passed, and again on an H100 (2026-12-07); with the
speed settings of issue 42 all 48 passed on this machine's CPU in the venv `envbuild verify h100
--keep` made (torch 2.11.0); the record is
tests/fixtures/gpu/validate/verl-0.9.1.json, and tests/test_verl_validate_record.py holds each
case's overrides to today's render by their fingerprint.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fingerprint(verl: str, overrides: list[str]) -> str:
    return hashlib.sha256(json.dumps([verl, overrides]).encode()).hexdigest()


def grid() -> list[dict]:
    """The runs the grid test checks (tests/test_batches.py _runs), with their overrides."""
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE.parent / "tests"))
    from conftest import resolved, shipped

    from envbuilder.model import runplan
    from envbuilder.model.versions import version_key

    runs = [
        (n, None)
        for n, p in sorted(shipped().profiles.items())
        if version_key(p["verl"]) >= version_key("0.8.0")
    ]
    runs += [("h100", v) for v in shipped().stacks if version_key(v) >= version_key("0.8.0")]
    out = []
    for profile, verl in runs:
        for algo in ("gae", "grpo"):
            for topo in ({}, {"nodes": 2, "gpus_per_node": 8}):
                env = resolved(profile, verl=verl, algo=algo, **topo)
                world = {
                    "MODEL": PLACEHOLDER_MODEL,
                    "DATA_DIR": "/data/gsm8k",
                    "N_GPUS": str(env.train.n_gpus),
                    "NNODES": str(env.cluster.nodes),
                }
                ov = runplan.overrides(env.run, world)
                out.append(
                    {
                        "case": f"{profile}{'@' + verl if verl else ''}/{algo}/{env.cluster.nodes}x{env.train.n_gpus}",
                        "verl": env.verl.version,
                        "overrides": ov,
                        "fingerprint": fingerprint(env.verl.version, ov),
                    }
                )
    return out


PLACEHOLDER_MODEL = "/models/m"  # what `cases` writes for the run script's MODEL

# verl's Megatron engine (issue 48): the model each plan is for, on the worlds of issue 48 (8 GPUs,
# 2 x 8) and with the host memory a DGX H100 has (its plan is verl's 8-GPU example layout)
MEGATRON = (
    ("h100", "Qwen/Qwen3-30B-A3B", ("grpo",), {}),
    ("h100", "Qwen/Qwen3-30B-A3B", ("grpo",), {"host_memory": 1024}),
    ("h100", "Qwen/Qwen3-30B-A3B", ("grpo", "gae"), {"nodes": 2, "gpus_per_node": 8}),
    ("h200", "Qwen/Qwen3-30B-A3B", ("grpo",), {}),
    ("h100", "Qwen/Qwen2.5-7B-Instruct", ("grpo", "gae"), {}),
    # a DeepSeek-V3-style mixture (MLA, shared experts, a dense first layer), on both engines
    ("h100", "moonshotai/Moonlight-16B-A3B", ("grpo", "gae"), {}),
    ("h100", "moonshotai/Moonlight-16B-A3B", ("grpo",), {"engine": "fsdp"}),
    # a 7B GRPO on one H100 (issue 45): full fine-tuning fits no single card, LoRA adapters do
    # (the memory refusal's --lora-rank fix), served to vLLM as its LoRA
    ("h100", "Qwen/Qwen2.5-7B-Instruct", ("grpo",), {"engine": "fsdp", "gpus_per_node": 1, "lora_rank": 32}),
    # verl's 72B LoRA example's world (examples/tuning/70b: rank 32 on 8 H100, rollout TP 8)
    ("h100", "Qwen/Qwen2.5-72B-Instruct", ("grpo",), {"engine": "fsdp", "lora_rank": 32}),
    # 32K-token responses on 4 x RTX 3090 (tests/fixtures/long-context, a --matrix-dir overlay):
    # one sequence fits no layout at CP 1, so the plan chooses context parallelism (TP 2, CP 2;
    # GAE's critic too)
    ("3090-long", "Qwen/Qwen2.5-3B-Instruct", ("grpo", "gae"), {"matrix_dir": "tests/fixtures/long-context"}),
)


def shape_name(model: str) -> str:
    return model.replace("/", "_")


def megatron_grid() -> list[dict]:
    """The Megatron engine's renders (MEGATRON), each case with its model's shape folder."""
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE.parent / "tests"))
    from conftest import resolved

    from envbuilder.model import runplan
    from envbuilder.model.matrix import load

    out = []
    for profile, model, algos, given in MEGATRON:
        over = {k: v for k, v in given.items() if k != "matrix_dir"}
        # (a profile of an overlay: the shipped matrix with that --matrix-dir on top)
        matrix = load((HERE.parent / str(given["matrix_dir"]),)) if "matrix_dir" in given else None
        for algo in algos:
            env = resolved(profile, matrix, algo=algo, model=model, **dict({"engine": "megatron"}, **over))
            lay = env.train.megatron
            world = dict(runplan.world(env), MODEL=PLACEHOLDER_MODEL, DATA_DIR="/data/gsm8k")
            ov = runplan.overrides(env.run, world)
            extra = "".join(
                f"+{k}{v}" for k, v in sorted(over.items()) if k not in ("nodes", "gpus_per_node")
            )
            out.append(
                {
                    "case": f"{profile}/{shape_name(model)}/{algo}/{env.cluster.nodes}x{env.train.n_gpus}{extra}",
                    "verl": env.verl.version,
                    "shape": shape_name(model),
                    "layout": lay.to_dict() if lay else None,
                    "overrides": ov,
                    "fingerprint": fingerprint(env.verl.version, ov),
                }
            )
    return out


def megatron_shapes(dest: Path) -> None:
    """A model folder of each MEGATRON model's shape under dest/<shape_name>."""
    sys.path.insert(0, str(HERE.parent))
    from envbuilder.machine.verify import write_model_shape
    from envbuilder.model.matrix import load

    m = load()
    for model in sorted({row[1] for row in MEGATRON}):
        write_model_shape(m.models[model], dest / shape_name(model))


def device(cases: Path, out: Path, model: Path | None = None, model_dir: Path | None = None) -> int:
    import importlib.metadata as md
    import os

    from hydra import compose, initialize_config_dir

    import verl.trainer.main_ppo as main_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    have = md.version("verl")
    results = []
    for case in json.loads(cases.read_text()):
        if case["verl"] != have:
            continue
        t = time.time()
        entry = {k: case[k] for k in ("case", "verl", "fingerprint", "layout") if k in case}
        # a case of a model's own shape (bench/world_table.py) takes its folder under model_dir
        folder = model_dir / case["shape"] if model_dir is not None and "shape" in case else model
        overrides = [
            o.replace(PLACEHOLDER_MODEL, str(folder)) if folder is not None else o for o in case["overrides"]
        ]
        try:
            with initialize_config_dir(config_dir=config_dir, version_base=None):
                cfg = compose(config_name="ppo_trainer", overrides=overrides)
            validate_config(
                config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
            )
            entry["validated"] = True
            entry["strategy"] = str(cfg.actor_rollout_ref.actor.strategy)
        except BaseException as e:  # noqa: BLE001  (the record says what verl raised)
            entry["validated"] = False
            entry["error"] = f"{type(e).__name__}: {e}"[:2000]
        entry["seconds"] = round(time.time() - t, 2)
        results.append(entry)
    doc = {
        "verl": have,
        "torch": md.version("torch"),
        "python": sys.version.split()[0],
        "runs": results,
    }
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    bad = [r for r in results if not r["validated"]]
    print(f"{len(results)} validated with verl {have}: {len(bad)} refused")
    for r in bad:
        print(f"  {r['case']}: {r['error'][:300]}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cases")
    c.add_argument("-o", "--out", type=Path, required=True)
    c.add_argument(
        "--megatron",
        type=Path,
        metavar="SHAPES",
        help="the Megatron engine's cases instead (MEGATRON), their model shapes written under SHAPES",
    )
    d = sub.add_parser("device")
    d.add_argument("--cases", type=Path, required=True)
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--model", type=Path, help="a local model folder for the run script's MODEL")
    d.add_argument("--model-dir", type=Path, help="for cases with a shape: the folder of each shape's model")
    a = ap.parse_args(argv)
    if a.cmd == "cases":
        runs = grid() if a.megatron is None else megatron_grid()
        if a.megatron is not None:
            megatron_shapes(a.megatron)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(runs, indent=1) + "\n")
        print(f"{len(runs)} cases -> {a.out}")
        return 0
    return device(a.cases, a.out, a.model, a.model_dir)


if __name__ == "__main__":
    sys.exit(main())
