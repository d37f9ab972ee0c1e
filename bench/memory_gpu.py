#!/usr/bin/env python3
"""The memory estimate (envbuilder/model/memory.py) against a real GPU, one profile at a time.

Two steps, on two machines:
  python bench/memory_gpu.py cases -o out/memory_cases.json     (here: needs envbuilder)
  python bench/memory_gpu.py run --cases out/memory_cases.json --out DIR   (on the GPU: needs
                                                                 only torch and transformers)
The JSON that `run` writes is what tests/fixtures/gpu/memory/h200-run.json holds, and
tests/test_memory_gpu.py replays it against the estimate of the current code.

`run` caps the process at each profile's memory (torch.cuda.set_per_process_memory_fraction),
builds a randomly initialised Qwen2 of the profile's architecture (no download), and measures
torch.cuda.max_memory_allocated / max_memory_reserved of what verl does on that GPU:
  generation    model.generate, greedy, max_new_tokens = the response length, at half, the
                planned and twice the planned generation batch (twice only where memory, not the
                validation set, bounds the plan). HF rollout: the capped card; vLLM: the
                engine's share (gpu_memory_utilization × the card), HF generate standing in for
                vLLM's engine (a whole-batch prefill: more than vLLM's chunked prefill needs).
  log_prob      a forward without grad at the planned log-prob micro-batch, logits divided by
                the temperature, log-probs and entropy as verl computes them.
  actor, critic forward + backward at the planned micro-batch, two micro-batches a step, two
                steps (Adam's state exists in the second), then Adam's step (AdamW, foreach);
                gradient checkpointing as the profile sets it. bf16 profiles run FSDP's mixed
                precision by hand: a bf16 compute copy, fp32 master weights and gradients (a
                post-accumulate hook moves each bf16 grad into the fp32 one, as FSDP does).
The state other roles leave on the GPU meanwhile (critic, reference, optimizer not offloaded) is
allocated as plain tensors of the estimate's size ("ballast"): bytes, not kernels.
Attention: eager where the profile is eager (the P40), sdpa elsewhere, standing in for
flash-attention (not installed on the device machine): neither keeps the s² scores.
For n_gpus > 1 (a 7B model sharded over 8 GPUs) one rank is emulated: its sharded state as
ballast and the whole bf16 model standing in for FSDP's gathered units (the difference is
`extra_bytes`, added to the cap where the card allows).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

GIB = 1024**3
DEVICE = "cuda"  # (a CPU smoke test of the harness sets "cpu")


# -- cases (here, with envbuilder) --------------------------------------------------------------


def write_cases(out: Path, probes: list[str] | None = None) -> None:
    """`probes`: PROFILE:KEY:B1,B2 adds runs of KEY at those batch sizes (label "probe")."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from envbuilder.model import matrix
    from envbuilder.model import memory
    from envbuilder.model.resolve import resolve

    m = matrix.load()
    consts_of = {}
    cases = []
    for name in m.profiles:
        env = resolve(m, name).to_dict()
        mem = env["memory"]
        arch_rec = m.models[env["train"]["model"]]
        total = m.memory["total_mib"].get(env["gpu"]["key"])
        consts = dict(m.memory, total_gib=total["mib"] / 1024 if total else float(env["gpu"]["vram_gb"]))
        consts_of[name] = consts
        s = memory.setup(env, arch_rec, consts, mem["validation_rows"])
        plan_b = {
            "generation": mem["batch"]["val_batch_size"] // s.n,
            "log_prob": mem["batch"]["log_prob_micro_batch_size_per_gpu"],
            "actor": mem["batch"]["actor_ppo_micro_batch_size_per_gpu"],
            "critic": mem["batch"]["critic_ppo_micro_batch_size_per_gpu"],
        }
        runs = []
        g = plan_b["generation"]
        small = arch_rec["parameters"] < 2e9  # (the half-batch slope only where it is cheap)
        gen = [(g // 2, "half")] if small else []
        gen += [(g, "planned"), (2 * g, "twice")]
        if s.rollout == "hf" and g < s.val_per_gpu:
            gen.append((s.val_per_gpu, "whole validation set"))  # what verl 0.4.1 does unbounded
        for b, label in sorted(gen):
            if b < 1 or (label == "twice" and mem["bound_by"]["generation"] != "memory"):
                continue
            runs.append(_run_case(memory, s, "generation", b, label))
        for probe in probes or ():
            p_name, p_key, p_sizes = probe.split(":")
            if p_name == name:
                runs += [_run_case(memory, s, p_key, int(b), "probe") for b in p_sizes.split(",")]
        for key in ("log_prob", "actor", "critic"):
            runs.append(_run_case(memory, s, key, plan_b[key], "planned"))
            bigger = [b for b in memory.candidates(s, key) if b > plan_b[key]]
            if bigger and mem["bound_by"][key] == "memory":
                runs.append(
                    _run_case(
                        memory,
                        s,
                        key,
                        bigger[0]
                        if key != "log_prob"
                        else bigger[min(len(bigger) - 1, max(plan_b[key] // 4, 0))],
                        "next",
                    )
                )
        cases.append(
            {
                "profile": name,
                "gpu": env["gpu"]["name"],
                "model": env["train"]["model"],
                "arch": {
                    k: arch_rec[k]
                    for k in (
                        "layers",
                        "hidden_size",
                        "attention_heads",
                        "kv_heads",
                        "head_dim",
                        "intermediate_size",
                        "vocab_size",
                        "tied_embeddings",
                        "max_position_embeddings",
                    )
                },
                "dtype": env["dtype"],
                "compute_bytes": s.c,
                "generation_bytes": s.g,
                "inference_bytes": s.inf,
                "rollout": s.rollout,
                "attention": env["attention"],
                "test_attention": "eager" if s.eager else "sdpa",
                "n_gpus": s.n,
                "prompt": s.prompt,
                "response": s.response,
                "lora_rank": s.lora,
                "gradient_checkpointing": s.ckpt,
                "param_offload": s.param_offload,
                "optimizer_offload": s.optimizer_offload,
                "usable_gib": mem["usable_gib"],
                "vllm_share_gib": mem["vllm_share_gib"],
                # what the rendered run script exports (PYTORCH_CUDA_ALLOC_CONF), so the run has it
                "alloc_conf": (env.get("cuda_alloc_conf") or {}).get("value"),
                "plan": mem["batch"],
                "bound_by": mem["bound_by"],
                "runs": runs,
            }
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cases": cases}, indent=1) + "\n")
    print(f"wrote {len(cases)} profiles to {out}")


def _run_case(memory, s, key: str, b: int, label: str) -> dict:
    """What the GPU run measures at batch b, with the estimate it is compared with."""
    est = memory.estimate(s, key, b)
    terms = est["terms"]
    realized_model = _model_bytes(s, key)
    state = [t for t in terms if t["kind"] == "state"]
    resident = sum(t["bytes"] for t in terms if t["kind"] == "resident")
    if s.n == 1 and key in ("actor", "critic"):
        ballast = resident  # the role's own state is the real thing: model, grads, Adam
    else:
        # the harness builds the model in its compute dtype; every other state byte is ballast
        model_terms = sum(
            t["bytes"]
            for t in state
            if t["term"].endswith(("bf16 copy", "FSDP gathered units"))
            or (t["term"] in ("actor weights", "vLLM weights") and realized_model == t["bytes"])
        )
        ballast = resident + sum(t["bytes"] for t in state) - model_terms
    extra = 0
    if s.n > 1 and key != "generation":
        units = next(t["bytes"] for t in state if t["term"].endswith("FSDP gathered units"))
        extra = realized_model - units
    step = (
        memory.estimate(s, f"{key}_step", 0)["bytes"] if (key in ("actor", "critic") and s.n == 1) else None
    )
    return {
        "key": key,
        "batch": b,
        "label": label,
        "phase": est["phase"],
        "step_estimate_bytes": step,
        "estimate_bytes": est["bytes"],
        "budget_gib": est["budget_gib"],
        "work_bytes": sum(t["bytes"] for t in terms if t["kind"] == "work"),
        "model_bytes": realized_model,
        "ballast_bytes": int(ballast),
        "extra_bytes": int(extra),
        "cap_bytes": int(est["budget_gib"] * GIB + extra),
    }


def _model_bytes(s, key: str) -> int:
    a = s.arch
    if key == "generation":
        return (a.params() + (a.lora_params(s.lora) if s.lora and s.rollout == "hf" else 0)) * s.g
    params = a.critic_params() if key == "critic" else a.params()
    lora = a.lora_params(s.lora) if (s.lora and key != "critic") else 0
    return (params + lora) * s.c


# -- run (on the GPU, with torch and transformers only) -----------------------------------------


def run(
    cases_path: Path,
    out_dir: Path,
    only: list[str],
    budget_s: float,
    labels: list[str] | None = None,
    name: str = "memory_gpu.json",
    keys: list[str] | None = None,
) -> int:
    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    total = props.total_memory
    torch.ones(1, device=dev)
    free, _ = torch.cuda.mem_get_info()
    context = total - free - torch.cuda.memory_reserved()
    meta = {
        "device": props.name,
        "total_bytes": total,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "context_bytes_after_init": int(context),
        "note": "an H200 capped to each profile's memory emulates its memory, not its bandwidth, "
        "kernels or fp32-on-Pascal speed",
    }
    print(json.dumps(meta), flush=True)
    cases = json.loads(cases_path.read_text())["cases"]
    results = {"meta": meta, "profiles": []}
    start = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    for case in cases:
        if only and case["profile"] not in only:
            continue
        rec = {k: case[k] for k in case if k != "runs"}
        rec["runs"] = []
        for r in case["runs"]:
            if (labels and r["label"] not in labels) or (keys and r["key"] not in keys):
                continue
            if time.time() - start > budget_s:
                rec["runs"].append(dict(r, skipped="time budget"))
                continue
            rec["runs"].append(measure(case, r, total))
            row = rec["runs"][-1]
            print(
                f"{case['profile']:5} {r['key']:10} {r['label']:7} b={r['batch']:<5} "
                f"est={r['estimate_bytes'] / GIB:7.2f} meas={_g(row.get('peak_allocated')):>7} "
                f"res={_g(row.get('peak_reserved')):>7} cap={r['cap_bytes'] / GIB:7.2f} "
                f"{'OOM' if row.get('oom') else 'ok'} {row.get('seconds', 0):.1f}s",
                flush=True,
            )
        results["profiles"].append(rec)
        (out_dir / name).write_text(json.dumps(results, indent=1) + "\n")
    print(f"total {time.time() - start:.0f}s")
    return 0


def _g(x):
    return "-" if x is None else f"{x / GIB:.2f}"


def measure(case: dict, r: dict, total: int) -> dict:
    import torch

    out = dict(r)
    cap = min(r["cap_bytes"], total)
    out["cap_applied_bytes"] = int(cap)
    out["cap_raised_by_extra"] = r["extra_bytes"] > 0
    out["cap_clamped_to_card"] = r["cap_bytes"] > total
    gc.collect()
    torch.cuda.empty_cache()
    out["alloc_conf_applied"] = _allocator(case.get("alloc_conf"))
    torch.cuda.set_per_process_memory_fraction(cap / total)
    torch.cuda.reset_peak_memory_stats()
    held = []
    t0 = time.time()
    try:
        if r["ballast_bytes"] > 0:
            held.append(torch.empty(r["ballast_bytes"], dtype=torch.uint8, device=DEVICE))
        fn = {"generation": _generation, "log_prob": _log_prob, "actor": _update, "critic": _update}[r["key"]]
        extra = fn(case, r, held)
        out.update(extra or {})
        out["oom"] = False
    except torch.OutOfMemoryError as e:
        out["oom"] = True
        out["error"] = str(e).splitlines()[0][:300]
    out["peak_allocated"] = int(torch.cuda.max_memory_allocated())
    out["peak_reserved"] = int(torch.cuda.max_memory_reserved())
    out["seconds"] = round(time.time() - t0, 1)
    held.clear()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0)
    return out


def _allocator(conf: str | None) -> str:
    """The caching allocator's setting for this run, as the rendered run script exports it
    (expandable segments on small cards with the HF rollout, off otherwise). Set at run time
    (the process serves every profile); it applies to the segments allocated after it, and
    measure() empties the cache first."""
    import torch

    value = conf or "expandable_segments:False"
    torch.cuda.memory._set_allocator_settings(value)
    return value


def _config(case: dict, attn: str):
    from transformers import Qwen2Config

    a = case["arch"]
    assert a["hidden_size"] // a["attention_heads"] == a["head_dim"]
    cfg = Qwen2Config(
        vocab_size=a["vocab_size"],
        hidden_size=a["hidden_size"],
        intermediate_size=a["intermediate_size"],
        num_hidden_layers=a["layers"],
        num_attention_heads=a["attention_heads"],
        num_key_value_heads=a["kv_heads"],
        max_position_embeddings=a["max_position_embeddings"],
        tie_word_embeddings=a["tied_embeddings"],
        use_cache=True,
        num_labels=1,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation=attn,
    )
    cfg._attn_implementation = attn
    return cfg


def _build(case: dict, kind: str, dtype):
    import torch
    from transformers import Qwen2ForCausalLM, Qwen2ForTokenClassification

    cls = Qwen2ForTokenClassification if kind == "critic" else Qwen2ForCausalLM
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(DEVICE):
            model = cls(_config(case, case["test_attention"]))
    finally:
        torch.set_default_dtype(old)
    return model


def _add_lora(model, rank: int, dtype):
    """peft's LoRA (all-linear) written out: each q/k/v/o/gate/up/down Linear frozen, with a
    trained A (rank × in) and B (out × rank) beside it."""
    import torch
    from torch import nn

    class Lora(nn.Module):
        def __init__(self, base: nn.Linear):
            super().__init__()
            self.base = base
            self.A = nn.Parameter(torch.randn(rank, base.in_features, dtype=dtype, device=DEVICE) * 0.01)
            self.B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=dtype, device=DEVICE))
            self.scale = 1.0

        def forward(self, x):
            return self.base(x) + (x @ self.A.t()) @ self.B.t() * self.scale

    for p in model.parameters():
        p.requires_grad_(False)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in targets:
                if hasattr(parent, name):
                    setattr(parent, name, Lora(getattr(parent, name)))
    return model


def _inputs(case: dict, b: int, length: int):
    import torch

    """Left-padded like verl's prompts (row i has i % (length // 4) pads), so that attention
    takes the masked path it takes in a real batch."""
    ids = torch.randint(1, case["arch"]["vocab_size"], (b, length), device=DEVICE)
    pads = torch.arange(b, device=DEVICE) % max(length // 4, 1)
    mask = (torch.arange(length, device=DEVICE).unsqueeze(0) >= pads.unsqueeze(1)).long()
    ids = ids * mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def _dtype(nbytes: int, case: dict):
    import torch

    if nbytes == 4:
        return torch.float32
    return torch.bfloat16 if case["dtype"] == "bf16" else torch.float16


def _generation(case: dict, r: dict, held: list) -> dict:
    import torch

    model = _build(case, "actor", _dtype(case["generation_bytes"], case))
    if case["lora_rank"] and case["rollout"] == "hf":
        _add_lora(model, case["lora_rank"], _dtype(case["generation_bytes"], case))
    model.eval()
    held.append(model)
    ids, mask, _ = _inputs(case, r["batch"], case["prompt"])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            num_beams=1,
            max_new_tokens=case["response"],
            pad_token_id=0,
            eos_token_id=None,
            use_cache=True,
            return_dict_in_generate=True,
            output_scores=False,
        )
    seq = out.sequences
    assert seq.shape == (r["batch"], case["prompt"] + case["response"]), tuple(seq.shape)
    return {"generated_tokens": int(seq.shape[1] - case["prompt"])}


def _logprobs(logits, labels):
    """verl's logprobs_from_logits without flash-attn's kernel (logprobs_from_logits_v2), written
    out: fp32 gathers and takes logsumexp row by row; bf16/fp16 takes log_softmax row by row."""
    import torch
    import torch.nn.functional as F

    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    rows = [
        F.log_softmax(rl, dim=-1).gather(-1, ll.unsqueeze(-1)).squeeze(-1) for rl, ll in zip(logits, labels)
    ]
    return torch.stack(rows)


def _entropy(logits):
    import torch

    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def _autocast(case: dict):
    import torch

    return torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=case["compute_bytes"] == 2)


def _log_prob(case: dict, r: dict, held: list) -> dict:
    import torch

    model = _build(case, "actor", _dtype(case["compute_bytes"], case))
    model.eval()
    held.append(model)
    b, resp = r["batch"], case["response"]
    ids, mask, pos = _inputs(case, b, case["prompt"] + resp)
    with torch.no_grad(), _autocast(case):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        logits.div_(1.0)
        logits = logits[:, -resp - 1 : -1, :]
        logp = _logprobs(logits, ids[:, -resp:])
        ent = _entropy(logits)
    return {"checksum_finite": bool(torch.isfinite(logp).all() and torch.isfinite(ent).all())}


def _update(case: dict, r: dict, held: list) -> dict:
    import torch

    role = r["key"]
    cdtype = _dtype(case["compute_bytes"], case)
    model = _build(case, role, cdtype)
    if case["lora_rank"] and role == "actor":
        _add_lora(model, case["lora_rank"], cdtype)
    if case["gradient_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    held.append(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    sharded = case["n_gpus"] > 1
    masters = None
    if sharded:
        # one rank of n: the sharded state is ballast; each unsharded grad is freed once made,
        # as FSDP's reduce-scatter does
        for p in trainable:
            p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
        opt = None
    elif cdtype == torch.float32:
        opt = torch.optim.AdamW(trainable, lr=1e-6, weight_decay=0.01)
    else:
        masters = [p.detach().float() for p in trainable]
        for m in masters:
            m.requires_grad_(True)
        held.append(masters)

        def hook(p, m):
            m.grad = p.grad.float() if m.grad is None else m.grad.add_(p.grad)
            p.grad = None

        for p, m in zip(trainable, masters):
            p.register_post_accumulate_grad_hook(lambda p, m=m: hook(p, m))
        opt = torch.optim.AdamW(masters, lr=1e-6, weight_decay=0.01)
        if case["lora_rank"] and role == "actor":  # FSDP keeps the frozen base in fp32 too
            frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
            held.append(torch.empty(frozen * 4, dtype=torch.uint8, device=DEVICE))
    b, resp = r["batch"], case["response"]

    def micro():
        ids, mask, pos = _inputs(case, b, case["prompt"] + resp)
        with _autocast(case):
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
            if role == "actor":
                logits = out.logits
                logits.div_(1.0)
                logits = logits[:, -resp - 1 : -1, :]
                logp = _logprobs(logits, ids[:, -resp:])
                loss = -(logp * torch.randn_like(logp)).mean()
            else:
                values = out.logits[:, -resp - 1 : -1].squeeze(-1)
                loss = 0.5 * ((values.float() - torch.randn_like(values.float())) ** 2).mean()
        loss.backward()

    def step():
        if opt is None:
            return
        opt.step()
        opt.zero_grad(set_to_none=True)
        if masters is not None:
            with torch.no_grad():
                for p, m in zip(trainable, masters):
                    p.copy_(m)

    if opt is None:
        torch.cuda.reset_peak_memory_stats()
        micro()
        return {"steps": 0}
    micro()
    micro()
    step()  # Adam's state exists from here on
    torch.cuda.reset_peak_memory_stats()
    micro()
    micro()
    update_alloc = torch.cuda.max_memory_allocated()
    update_res = torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    step()
    return {
        "update_peak_allocated": int(update_alloc),
        "update_peak_reserved": int(update_res),
        "step_peak_allocated": int(torch.cuda.max_memory_allocated()),
        "step_peak_reserved": int(torch.cuda.max_memory_reserved()),
        "steps": 2,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cases", help="write the cases (needs envbuilder)")
    c.add_argument("-o", "--out", type=Path, default=Path("out/memory_cases.json"))
    c.add_argument(
        "--probe",
        nargs="*",
        default=[],
        metavar="PROFILE:KEY:B1,B2",
        help="extra runs of KEY (generation, log_prob, actor, critic) at these sizes",
    )
    r = sub.add_parser("run", help="measure on the GPU (needs torch and transformers)")
    r.add_argument("--cases", type=Path, default=Path("out/memory_cases.json"))
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/memory")))
    r.add_argument("--only", nargs="*", default=[])
    r.add_argument("--budget-s", type=float, default=480)
    r.add_argument(
        "--labels",
        nargs="*",
        default=[],
        help="only these runs of each profile (e.g. planned: the current plan's sizes)",
    )
    r.add_argument("--name", default="memory_gpu.json", help="the result file's name in --out")
    r.add_argument("--keys", nargs="*", default=[], help="only these phases (generation, ...)")
    args = ap.parse_args()
    if args.cmd == "cases":
        write_cases(args.out, args.probe)
        return 0
    return run(args.cases, args.out, args.only, args.budget_s, args.labels, args.name, args.keys)


if __name__ == "__main__":
    sys.exit(main())
