#!/usr/bin/env python3
"""verl's own workers run a PPO step on a GPU with the rendered configuration (the GPU tier).

Imports and a composed config prove neither a generation nor an update (p40 and 4090 passed
both and died before their first step). This runs the code that would die: verl's
ActorRolloutRefWorker and CriticWorker, built in one process as verl's trainer builds them
(world size 1), from the run script's own Hydra overrides composed with the release's config,
on the release's wheel with the rendered apply_patches.py applied, on a randomly initialised
model of the profile's shape, under the card's memory cap:

  init_model (critic, reference if the trainer makes one, actor+rollout last, as verl does)
  → generate_sequences on one validation batch of the planned size (greedy, validate=True)
  → two training steps: generate_sequences (train batch) → compute_log_prob →
    compute_ref_log_prob (where the config makes a reference) → compute_values →
    GAE (verl's core_algos) → update_critic → update_actor

Peaks per phase (torch.cuda.max_memory_allocated / reserved) and the dtypes each part computes
in (forward hooks: parameters, inputs, outputs and the autocast state per module and phase)
are recorded. Controls show the failures the plan avoids, on the same code: p40 with the
actor's parameters offloaded (the HF rollout generates from CPU weights) and 4090 without
use_orig_params (LoRA in one flat parameter).

Two steps, on two machines:
  python bench/gpu_step.py cases -o .gpu/cases.json            (here: needs envbuilder)
  python bench/gpu_step.py device --cases .gpu/cases.json --wheels .whl --out DIR
                                                              (on the GPU machine)
  python bench/gpu_step.py device --ppo ...   verl's own `python -m verl.trainer.main_ppo` with
                                              the same overrides, through Ray, for the first
                                              validation and two steps (no memory cap)
`device` unpacks each case's wheels (verl's release and the profile's pins of what verl
imports; the machine's own torch stays) into a folder of its own and runs each case in a
process of its own. The JSON it writes is what tests/fixtures/gpu/step/ holds, and
tests/test_gpu_step.py replays them against today's render.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import zipfile
from pathlib import Path

GIB = 1024**3
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from envbuilder.images import SIDECAR  # noqa: E402  (the standard library only)
from envbuilder.model.gpu_tier import CARRIED, SCRIPT_ENV  # noqa: E402  (needs only the standard library here)

# a wheel's content left out to fit a call (64 MiB): ray's Java jar and its dashboard's web
# client, which a Python process that never starts Java workers or the dashboard does not load
TRIMMED = ("ray/jars/", "ray/dashboard/client/build/")
# what only `--ppo` (verl's trainer: its dataset and dataloader) imports besides
PPO_EXTRA = ("datasets", "dill", "multiprocess", "torchdata")
PROFILES = ("p40", "4090")
SUBSTITUTES = {
    "tensordict": {
        "0.5.0": {
            "version": "0.6.2",
            "why": "tensordict 0.5.0 imports ForkingPickler from "
            "torch.multiprocessing.reductions, which the GPU machine's torch 2.11 no longer has; 0.6.2 is "
            "the newest release verl 0.4.1 accepts (tensordict<=0.6.2) and the p40 profile's pin",
        }
    }
}


# -- cases (here) -------------------------------------------------------------------------------


def case_of(
    profile: str, render_files, resolve, m, algo: str | None = None, model: str | None = None
) -> dict:
    """The GPU run of one profile as envbuild renders it today (envbuilder.model.gpu_tier.case),
    with `envbuild render PROFILE --algo ALGO --model MODEL` where they are given."""
    from envbuilder.model import gpu_tier
    from envbuilder.model.resolve import Overrides
    from envbuilder.render.context import BuildContext

    if model is not None:
        from envbuilder.model.architectures import with_model

        m, model = with_model(m, model)
    env = resolve(m, profile, Overrides(algo=algo, model=model))
    case = gpu_tier.case(env, render_files(BuildContext.of(env)), m.models)
    # where the profile's pin cannot import on the GPU machine's torch, the nearest release that
    # can, said in the record (the profile's torch itself cannot be carried)
    case["substitutes"] = {
        name: dict(SUBSTITUTES[name][version], pinned=version)
        for name, version in case["pins"].items()
        if version in SUBSTITUTES.get(name, {})
    }
    return case


def write_cases(out: Path, profiles: list[str]) -> None:
    from envbuilder.model import matrix
    from envbuilder.render.files import render_files
    from envbuilder.model.resolve import resolve

    m = matrix.load()
    cases = []
    for spec in profiles:  # PROFILE[:ALGO[:MODEL]]
        profile, algo, model = (spec.split(":", 2) + [None, None])[:3]
        case = case_of(profile, render_files, resolve, m, algo or None, model or None)
        case["variant"] = spec if (algo or model) else None
        cases.append(case)
    controls = []
    for case in cases:
        if case["profile"] == "p40" and not case.get(
            "variant"
        ):  # the plan's fix undone: the actor offloaded on the HF rollout
            controls.append(
                dict(
                    case,
                    name="p40-control-actor-offload",
                    control=True,
                    expect="Expects tensor to be on the compute device",
                    overrides=case["overrides"] + ["actor_rollout_ref.actor.fsdp_config.param_offload=True"],
                )
            )
        if case["lora_rank"] and not case.get("variant"):  # LoRA in one flat parameter, as verl
            # 0.4.1 wraps it for the HF rollout: neither the wrap patch nor use_orig_params
            key = next(o for o in case["overrides"] if "use_orig_params" in o)
            controls.append(
                dict(
                    case,
                    name=f"{case['profile']}-control-flat-lora",
                    control=True,
                    expect="Must flatten tensors with uniform",
                    overrides=[o for o in case["overrides"] if o != key],
                    apply_patches=_without_patch(case["apply_patches"], WRAP_PATCH),
                )
            )
        if case.get("variant") and WRAP_PATCH in [p["name"] for p in case["patches"]]:
            # the bf16 base without the wrap patch: base and fp32 adapters in one flat parameter
            controls.append(
                dict(
                    case,
                    name=f"{case['variant'].replace(':', '-').replace('/', '_')}-control-no-wrap",
                    control=True,
                    expect="uniform dtype",
                    apply_patches=_without_patch(case["apply_patches"], WRAP_PATCH),
                )
            )
    for case in cases:
        name = case.pop("variant") or case["profile"]
        case.update(name=name.replace(":", "-").replace("/", "_"), control=False, expect=None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cases": cases + controls}, indent=1) + "\n")
    print(f"wrote {len(cases)} cases and {len(controls)} controls to {out}")


WRAP_PATCH = "verl-hf-rollout-lora-wrap"


def _without_patch(sidecar: str, name: str) -> str:
    """apply_patches.py's rendered data (the case's sidecar) less one recorded patch; as it is
    where the render has no such patch."""
    data = json.loads(sidecar)
    part = data["apply_patches"]
    part["patches"] = [p for p in part["patches"] if p["name"] != name]
    return json.dumps(data, indent=1)


# -- device: unpack, patch, run each case in its own process --------------------------------------


def _wheel_name(path: Path) -> str:
    return path.name.split("-")[0].lower().replace("_", "-")


def unpack(case: dict, wheels: Path, site: Path) -> dict:
    """The case's wheels into `site` (a wheel is a zip of its import tree); {name: file}."""
    want = {k.split("[")[0].lower(): v for k, v in case["pins"].items()}
    want.update({k: v["version"] for k, v in case.get("substitutes", {}).items()})
    used = {}
    for whl in sorted(wheels.glob("*.whl")):
        name = _wheel_name(whl)
        version = whl.name.split("-")[1]
        if name == "verl":
            if version != case["verl"]:
                continue
        elif name in want and want[name] != version:
            continue
        elif name not in CARRIED + PPO_EXTRA:
            continue
        if name in used:
            raise SystemExit(f"two wheels of {name} fit case {case['name']}: {used[name]}, {whl.name}")
        with zipfile.ZipFile(whl) as z:
            for info in z.infolist():
                if not info.filename.startswith(TRIMMED):
                    path = z.extract(info, site)
                    mode = info.external_attr >> 16  # zipfile drops the execute bits (ray's binaries)
                    if mode & 0o111:
                        os.chmod(path, mode & 0o777)
        used[name] = whl.name
    missing = [n for n in want if n not in used and n in CARRIED]
    if missing or "verl" not in used:
        raise SystemExit(f"case {case['name']}: no wheel for {missing or ['verl']} in {wheels}")
    return used


def device(cases_path: Path, wheels: Path, out: Path, only: list[str], ppo: bool = False) -> int:
    cases = json.loads(cases_path.read_text())["cases"]
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for case in cases:
        if only and case["name"] not in only:
            continue
        root = Path("/tmp/envbuild-gpu") / case["name"]
        shutil.rmtree(root, ignore_errors=True)
        site = root / "site"
        site.mkdir(parents=True)
        t0 = time.time()
        used = unpack(case, wheels, site)
        # envbuild's own apply_patches.py, and the case's data beside it, where the script reads it
        shutil.copyfile(HERE.parent / "envbuilder" / "images" / "apply_patches.py", root / "apply_patches.py")
        (root / SIDECAR).write_text(case["apply_patches"])
        env = dict(os.environ, PYTHONPATH=str(site), PYTHONUNBUFFERED="1")
        patched = subprocess.run(
            [sys.executable, str(root / "apply_patches.py"), "--site", str(site)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        print(
            f"[{case['name']}] unpacked {len(used)} wheels in {time.time() - t0:.0f}s; "
            f"apply_patches rc={patched.returncode}: {patched.stdout.strip()[-400:]}"
            f"{patched.stderr.strip()[-1500:]}",
            flush=True,
        )
        env.update(case["exports"])
        (root / "case.json").write_text(json.dumps(case))
        if ppo:
            results.append(dict(main_ppo(case, root, env), wheels=used))
            (out / "gpu-ppo.json").write_text(json.dumps({"runs": results}, indent=1) + "\n")
            continue
        r = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "case",
                str(root / "case.json"),
                "--out",
                str(root / "result.json"),
            ],
            env=env,
            timeout=1500,
        )
        try:
            result = json.loads((root / "result.json").read_text())
        except (OSError, ValueError) as e:
            result = {"name": case["name"], "error": f"no result (rc={r.returncode}): {e}"}
        result.update(
            wheels=used,
            apply_patches={
                "rc": patched.returncode,
                "stdout": patched.stdout[-2000:],
                "stderr": patched.stderr[-2000:],
            },
        )
        results.append(result)
        (out / "gpu-step.json").write_text(json.dumps({"runs": results}, indent=1) + "\n")
    return 0


# -- verl's own trainer, with Ray ---------------------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def _gsm8k_like(root: Path, case: dict, cfg_rows: dict) -> dict:
    """train/test parquet files in the layout prepare_gsm8k.py writes (verl's gsm8k example):
    data_source openai/gsm8k, a chat prompt, the rule reward's ground truth."""
    import pandas as pd

    out = {}
    for split, n in cfg_rows.items():
        rows = [
            {
                "data_source": "openai/gsm8k",
                "prompt": [
                    {
                        "role": "user",
                        "content": " ".join(f"w{(i * 7 + j) % 1000}" for j in range(40))
                        + " Let's think step by step and output the final answer after ####.",
                    }
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(i)},
                "extra_info": {"split": split, "index": i},
            }
            for i in range(n)
        ]
        path = root / "data" / f"{split}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_parquet(path)
        out[split] = str(path)
    return out


def main_ppo(case: dict, root: Path, env: dict) -> dict:
    """`python -m verl.trainer.main_ppo` with the rendered overrides, on Ray, for the first
    validation and two training steps; its console output is the record."""
    sys.path.insert(0, env["PYTHONPATH"])
    import torch

    result = {
        "name": case["name"],
        "profile": case["profile"],
        "fingerprint": case["fingerprint"],
        "mode": "main_ppo",
    }
    model = Path(SCRIPT_ENV["MODEL"])
    sys.argv = ["x"]
    _model_dir(case, torch)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = CHAT_TEMPLATE
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.save_pretrained(model)
    val = next(int(o.split("=")[1]) for o in case["overrides"] if o.startswith("data.val_batch_size="))
    train = next(int(o.split("=")[1]) for o in case["overrides"] if o.startswith("data.train_batch_size="))
    files = _gsm8k_like(root, case, {"train": 2 * train, "test": val + 7})
    extra = [
        "trainer.val_before_train=True",
        "trainer.total_training_steps=2",
        f"data.train_files={files['train']}",
        f"data.val_files={files['test']}",
        "ray_init.num_cpus=8",
    ]
    overrides = [o for o in case["overrides"] if not o.startswith(("data.train_files=", "data.val_files="))]
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides, *extra]
    t0 = time.time()
    proc = subprocess.run(
        cmd, env=dict(env, RAY_DEDUP_LOGS="0"), cwd=root, capture_output=True, text=True, timeout=480
    )
    log = proc.stdout + proc.stderr
    (root / "main_ppo.log").write_text(log)
    steps = sorted({int(m) for m in __import__("re").findall(r"step:(\d+) ", log)})
    result.update(
        rc=proc.returncode,
        seconds=round(time.time() - t0, 1),
        extra_overrides=extra,
        steps=steps,
        validation="val-core/" in log or "val/" in log,
        metrics=[line[:4000] for line in log.splitlines() if "step:" in line][-3:],
        tail=log[-6000:],
    )
    print(f"[{case['name']}] main_ppo rc={proc.returncode} steps={steps} in {result['seconds']}s", flush=True)
    return result


# -- one case, in its own process ---------------------------------------------------------------


class Dtypes:
    """Forward hooks on a few modules of each model: per phase, what dtype the parameters, the
    inputs and the outputs had, and the autocast state, as seen inside the forward."""

    def __init__(self, torch):
        self.torch, self.phase, self.seen = torch, "init", {}

    def _dtype(self, x):
        t = self.torch
        if isinstance(x, t.Tensor):
            return str(x.dtype).replace("torch.", "")
        if isinstance(x, (tuple, list)) and x:
            return self._dtype(x[0])
        if hasattr(x, "logits"):
            return self._dtype(x.logits)
        if hasattr(x, "last_hidden_state"):
            return self._dtype(x.last_hidden_state)
        return None

    def watch(self, role: str, model) -> list[str]:
        picked = []
        for name, mod in model.named_modules():
            short = name.replace("_fsdp_wrapped_module.", "").replace("base_model.model.", "")
            if (
                short.endswith(
                    (
                        "embed_tokens",
                        "layers.0.self_attn",
                        "layers.0.self_attn.q_proj",
                        "layers.0.self_attn.q_proj.base_layer",
                        "layers.0.self_attn.q_proj.lora_A.default",
                        "layers.0.mlp",
                        "model.norm",
                        "lm_head",
                        "score",
                    )
                )
                and short not in picked
            ):
                picked.append(short)
                mod.register_forward_hook(self._hook(role, short))
        return picked

    def _hook(self, role, short):
        torch = self.torch

        def hook(mod, args, output):
            params = sorted({str(p.dtype).replace("torch.", "") for p in mod.parameters(recurse=False)})
            rec = {
                "params": params,
                "input": self._dtype(args),
                "output": self._dtype(output),
                "autocast": (
                    torch.get_autocast_dtype("cuda").__str__().replace("torch.", "")
                    if torch.is_autocast_enabled("cuda")
                    else None
                ),
            }
            key = f"{self.phase}|{role}|{short}"
            seen = self.seen.setdefault(key, [])
            if rec not in seen:
                seen.append(rec)

        return hook


def run_case(case_path: Path, out_path: Path) -> int:
    case = json.loads(case_path.read_text())
    os.environ.update(
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(29500 + os.getpid() % 1000),
    )
    result = {
        "name": case["name"],
        "profile": case["profile"],
        "control": case["control"],
        "fingerprint": case["fingerprint"],
        "overrides": case["overrides"],
        "expect": case.get("expect"),
        "phases": [],
        "error": None,
    }

    def save():
        out_path.write_text(json.dumps(result, indent=1) + "\n")

    try:
        _run(case, result, save)
    except BaseException as e:  # the result says where and how it failed
        result["error"] = {
            "phase": result.get("phase"),
            "type": type(e).__name__,
            "message": str(e)[:2000],
            "traceback": traceback.format_exc()[-6000:],
        }
        print(
            f"[{case['name']}] FAILED in {result.get('phase')}: {type(e).__name__}: {str(e)[:500]}",
            flush=True,
        )
    save()
    return 0


def _model_dir(case: dict, torch) -> str:
    """A randomly initialised model of the profile's shape, saved as a hub checkpoint would be
    (config, safetensors weights, a tokenizer and a generation config): no download."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = SCRIPT_ENV["MODEL"]
    a = case["arch"]
    eos, pad = 151645, 151643
    cfg = transformers.Qwen2Config(
        vocab_size=a["vocab_size"],
        hidden_size=a["hidden_size"],
        intermediate_size=a["intermediate_size"],
        num_hidden_layers=a["layers"],
        num_attention_heads=a["attention_heads"],
        num_key_value_heads=a["kv_heads"],
        max_position_embeddings=a["max_position_embeddings"],
        tie_word_embeddings=a["tied_embeddings"],
        torch_dtype="bfloat16",
        eos_token_id=eos,
        bos_token_id=pad,
        use_sliding_window=False,
    )
    marker = Path(path) / "envbuild-arch.json"
    if marker.exists() and json.loads(marker.read_text()) == a:
        return path
    shutil.rmtree(path, ignore_errors=True)
    torch.manual_seed(0)
    with torch.device(os.environ.get("ENVBUILD_GPU_STEP_DEVICE", "cuda")):  # (cpu: a harness smoke test)
        # bf16 on disk, as the hub ships Qwen2 (verl loads it in the dtype its config asks for)
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    vocab = {f"w{i}": i for i in range(1000)}
    vocab.update({"<|endoftext|>": pad, "<|im_start|>": 151644, "<|im_end|>": eos, "<unk>": 1000})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<unk>"
    )
    fast.save_pretrained(path)
    transformers.GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad).save_pretrained(path)
    marker.write_text(json.dumps(a))
    return path


def _compose(case: dict):
    from omegaconf import OmegaConf

    import verl
    from envbuilder.machine.compose import compose_run_config

    cfg = compose_run_config(Path(verl.__file__).parent.parent, case["overrides"])
    OmegaConf.resolve(cfg)
    return cfg


def _prompts(n: int, length: int, torch, meta: dict):
    from verl import DataProto

    g = torch.Generator().manual_seed(n)
    ids = torch.randint(0, 1000, (n, length), generator=g)
    mask = torch.ones_like(ids)
    pos = torch.arange(length).unsqueeze(0).expand(n, -1).contiguous()
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos}, meta_info=dict(meta)
    )


def _run(case: dict, result: dict, save) -> None:
    import numpy as np
    import torch

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    total = props.total_memory
    torch.ones(1, device=dev)
    import importlib.metadata as md

    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    for name in (
        "transformers",
        "verl",
        "peft",
        "tensordict",
        "ray",
        "hydra-core",
        "accelerate",
        "tokenizers",
        "numpy",
    ):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    result["meta"] = {
        "device": props.name,
        "total_bytes": total,
        "versions": versions,
        "cap_bytes": case["cap_bytes"],
        "card_gib": case["card_gib"],
        "exports": {k: os.environ.get(k) for k in case["exports"]},
    }
    result["phase"] = "model"
    _model_dir(case, torch)  # (at SCRIPT_ENV's MODEL, the path the overrides name)
    result["phase"] = "config"
    cfg = _compose(case)
    from omegaconf import OmegaConf

    result["config"] = {
        k: OmegaConf.select(cfg, k)
        for k in (
            "actor_rollout_ref.actor.fsdp_config.param_offload",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
            "actor_rollout_ref.ref.fsdp_config.param_offload",
            "critic.model.fsdp_config.param_offload",
            "actor_rollout_ref.actor.fsdp_config.use_orig_params",
            "actor_rollout_ref.rollout.name",
            "actor_rollout_ref.rollout.micro_batch_size",
            "actor_rollout_ref.model.lora_rank",
            "data.val_batch_size",
            "data.train_batch_size",
            "algorithm.adv_estimator",
            "algorithm.use_kl_in_reward",
            "actor_rollout_ref.actor.use_kl_loss",
            "actor_rollout_ref.model.enable_gradient_checkpointing",
        )
    }
    torch.cuda.set_per_process_memory_fraction(min(case["cap_bytes"], total) / total)
    from verl.trainer.ppo import core_algos
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    dt = Dtypes(torch)
    lora = cfg.actor_rollout_ref.model.get("lora_rank", 0) > 0
    use_ref = bool(cfg.algorithm.use_kl_in_reward or cfg.actor_rollout_ref.actor.use_kl_loss)
    use_critic = cfg.algorithm.adv_estimator == "gae"
    result["roles"] = {
        "critic": use_critic,
        "reference": ("in the actor (LoRA off)" if lora else "worker")
        if use_ref
        else "none: algorithm.use_kl_in_reward and actor.use_kl_loss are False "
        "(verl's main_ppo makes no reference policy)",
    }

    def phase(name: str, fn, **info):
        result["phase"] = name
        dt.phase = name
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        out = fn()
        torch.cuda.synchronize()
        rec = dict(
            info,
            phase=name,
            seconds=round(time.time() - t0, 2),
            peak_allocated=int(torch.cuda.max_memory_allocated()),
            peak_reserved=int(torch.cuda.max_memory_reserved()),
            allocated_after=int(torch.cuda.memory_allocated()),
        )
        result["phases"].append(rec)
        print(
            f"[{case['name']}] {name:22} {rec['seconds']:7.1f}s peak {rec['peak_allocated'] / GIB:6.2f} "
            f"alloc / {rec['peak_reserved'] / GIB:6.2f} reserved GiB  {info or ''}",
            flush=True,
        )
        save()
        return out

    if case.get("control"):  # a control says which parameters its failing FSDP unit held
        _diagnose_fsdp(result)
    # verl's trainer: critic, then the reference, then the actor with its rollout (last)
    critic = CriticWorker(cfg.critic) if use_critic else None
    ref = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="ref") if (use_ref and not lora) else None
    actor = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor_rollout")
    if critic:
        phase("init_model critic", critic.init_model)
        result["watched_critic"] = dt.watch("critic", critic.critic_module)
    if ref:
        phase("init_model ref", ref.init_model)
        dt.watch("ref", ref.ref_module_fsdp)
    phase("init_model actor", actor.init_model)
    result["watched_actor"] = dt.watch("actor", actor.actor_module_fsdp)
    result["attn_implementation"] = getattr(actor.actor_model_config, "_attn_implementation", None)

    P, R = cfg.data.max_prompt_length, cfg.data.max_response_length
    gen_meta = {"eos_token_id": 151645, "pad_token_id": 151643, "recompute_log_prob": False}
    val_n = cfg.data.val_batch_size
    val = _prompts(
        val_n,
        P,
        torch,
        dict(
            gen_meta,
            do_sample=bool(
                OmegaConf.select(cfg, "actor_rollout_ref.rollout.val_kwargs.do_sample", default=False)
            ),
            validate=True,
        ),
    )
    out = phase("validation generate", lambda: actor.generate_sequences(val), batch=val_n)  # noqa: F821  (called before the del below)
    result["validation_response_shape"] = list(out.batch["responses"].shape)
    del out, val

    n_train = cfg.data.train_batch_size
    # ENVBUILD_GPU_STEP_STEPS=1: one step (a 7B's HF generate takes minutes per chunk)
    for step in range(1, 1 + int(os.environ.get("ENVBUILD_GPU_STEP_STEPS", "2"))):
        batch = _prompts(n_train, P, torch, dict(gen_meta, do_sample=True))
        batch.non_tensor_batch["uid"] = np.array([f"u{i}" for i in range(n_train)], dtype=object)
        gen_batch = batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
        gen_batch.meta_info = dict(gen_meta, do_sample=True)
        gen_out = phase(f"step{step} generate", lambda: actor.generate_sequences(gen_batch), batch=n_train)
        gen_out.meta_info.pop("timing", None)
        # rollout.n responses per prompt (the HF rollout returns them together): the prompts
        # are repeated alongside, as verl's trainer does
        n = int(cfg.actor_rollout_ref.rollout.get("n", 1))
        if n > 1:
            batch = batch.repeat(repeat_times=n, interleave=True)
        batch = batch.union(gen_out)
        batch.batch["response_mask"] = batch.batch["attention_mask"][:, -R:]
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        old = phase(f"step{step} compute_log_prob", lambda: actor.compute_log_prob(batch))
        old.batch.pop("entropys")
        batch = batch.union(old)
        if use_ref:
            refp = phase(
                f"step{step} compute_ref_log_prob",
                lambda: (actor if lora else ref).compute_ref_log_prob(batch),
            )
            batch = batch.union(refp)
        if critic:
            values = phase(f"step{step} compute_values", lambda: critic.compute_values(batch))
            batch = batch.union(values)
        # a rule-based reward stands in: one score at each response's last token
        mask = batch.batch["response_mask"]  # (where the workers left the batch: verl moves it)
        scores = torch.zeros_like(mask, dtype=torch.float32)
        last = mask.sum(-1).clamp(min=1) - 1
        rows = mask.shape[0]
        scores[torch.arange(rows, device=mask.device), last] = torch.randint(
            0, 2, (rows,), device=mask.device
        ).float()
        batch.batch["token_level_scores"] = scores
        batch.batch["token_level_rewards"] = scores
        estimator = cfg.algorithm.adv_estimator
        if estimator == "gae":
            adv, ret = core_algos.compute_gae_advantage_return(
                token_level_rewards=scores,
                values=batch.batch["values"],
                response_mask=batch.batch["response_mask"],
                gamma=cfg.algorithm.gamma,
                lam=cfg.algorithm.lam,
            )
        elif estimator == "grpo":  # each prompt's n responses are one group (uid)
            adv, ret = core_algos.compute_grpo_outcome_advantage(
                token_level_rewards=scores,
                response_mask=batch.batch["response_mask"],
                index=batch.non_tensor_batch["uid"],
            )
        else:
            raise SystemExit(f"the harness computes gae and grpo advantages, not {estimator}")
        batch.batch["advantages"], batch.batch["returns"] = adv, ret
        if critic:
            c = phase(f"step{step} update_critic", lambda: critic.update_critic(batch))
            result.setdefault("critic_metrics", []).append(_metrics(c))
        batch.meta_info["multi_turn"] = False
        a = phase(f"step{step} update_actor", lambda: actor.update_actor(batch))
        result.setdefault("actor_metrics", []).append(_metrics(a))
    result["phase"] = None
    result["dtypes"] = dt.seen
    result["ok"] = True


def _diagnose_fsdp(result: dict) -> None:
    """Where FSDP refuses to flatten a unit (mixed requires_grad or dtype), record the
    parameters that unit held: those no nested unit took (names without _fsdp_wrapped_module
    below the unit itself)."""
    import verl.workers.fsdp_workers as fw

    real = fw.FSDP

    class DiagnosedFSDP(real):
        def __init__(self, module, *args, **kwargs):
            try:
                super().__init__(module, *args, **kwargs)
            except ValueError as e:
                left = [
                    (name, p.requires_grad, str(p.dtype).replace("torch.", ""))
                    for name, p in module.named_parameters()
                    if "_fsdp_wrapped_module" not in name
                ]
                result["unwrapped_params"] = {
                    "error": str(e)[:300],
                    "count": len(left),
                    "trainable": [n for n, grad, _ in left if grad][:40],
                    "frozen": [n for n, grad, _ in left if not grad][:40],
                    "dtypes": sorted({d for *_, d in left}),
                    "wrapped_units": sum(
                        1 for n, _ in module.named_modules() if n.endswith("_fsdp_wrapped_module")
                    ),
                }
                raise

    fw.FSDP = DiagnosedFSDP


def _metrics(out) -> dict:
    m = out.meta_info.get("metrics", {})
    return {
        k: (v if isinstance(v, (int, float)) else (v[-1] if isinstance(v, list) and v else str(v)))
        for k, v in m.items()
        if isinstance(v, (int, float, list))
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cases")
    c.add_argument("-o", "--out", type=Path, required=True)
    c.add_argument("--profiles", nargs="*", default=list(PROFILES))
    d = sub.add_parser("device")
    d.add_argument("--cases", type=Path, required=True)
    d.add_argument("--wheels", type=Path, required=True)
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--only", nargs="*", default=[])
    d.add_argument(
        "--ppo",
        action="store_true",
        help="instead of the in-process steps: `python -m verl.trainer.main_ppo` itself, "
        "with Ray, for validation and two steps (no memory cap: Ray's workers are "
        "separate processes)",
    )
    r = sub.add_parser("case")
    r.add_argument("case", type=Path)
    r.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "cases":
        write_cases(a.out, a.profiles)
        return 0
    if a.cmd == "device":
        return device(a.cases, a.wheels, a.out, a.only, ppo=a.ppo)
    return run_case(a.case, a.out)


if __name__ == "__main__":
    sys.exit(main())
