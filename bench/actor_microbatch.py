#!/usr/bin/env python3
"""Where an actor micro-batch's time goes, on a GPU: verl's own log-prob code against the floor.

  PYTHONPATH=SITE python3 bench/actor_microbatch.py --out OUT.json [--batch 20] [--prompt 220]
         [--response 1024] [--repeat 3] [--arch JSON]

One micro-batch of the render's shape (`--batch` sequences of `--prompt` + `--response` tokens,
left-padded prompts) through a randomly initialised Qwen2 of the profile's model shape (bf16
compute copy, as FSDP's mixed precision runs it; sdpa with the padding mask; gradient
checkpointing), forward + backward and forward only, with the log-prob/entropy head computed by:

  verl-rowloop   verl 0.9.1's `logprobs_from_logits` as it runs without flash-attn (its
                 `logprobs_from_logits_v2`: a Python loop over every token's row) and
                 `entropy_from_logits` under torch.compile, as the padded engine path calls them
  verl-fused-triton / verl-fused-torch
                 verl's fused linear-log-prob-entropy kernels (`use_fused_kernels`, the
                 `impl_backend` the render names): no vocabulary logits are materialised
  floor          plain torch: the full-vocabulary log-softmax in fp32, gather and entropy

Each is timed with CUDA events after a warm-up, its peak memory read from torch. Prints the
milliseconds, tokens/s, model TFLOP/s and the ratios to the floor; writes them to --out.
Standard library at the top level; torch, transformers and verl are imported in `main`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


def model_flops(params: int, tokens: int, backward: bool, checkpointing: bool) -> float:
    """Dense model math: 2 × params per token forward, 4 more for backward, 2 more to recompute
    the forward under gradient checkpointing (attention's quadratic term left out)."""
    per_token = 2 + (4 + (2 if checkpointing else 0) if backward else 0)
    return float(per_token * params * tokens)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--prompt", type=int, default=220)
    p.add_argument("--response", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--arch", default="", help="a Qwen2 config as JSON (default: Qwen2.5-0.5B's shape)")
    p.add_argument("--variants", default="floor,verl-fused-triton,verl-fused-torch,verl-rowloop")
    a = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    dev = "cuda"
    cfg = Qwen2Config(**(json.loads(a.arch) if a.arch else QWEN25_05B), attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg).to(dev, torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    params = sum(p.numel() for p in model.parameters())
    B, S = a.batch, a.prompt + a.response
    ids = torch.randint(0, cfg.vocab_size, (B, S), device=dev)
    mask = torch.ones(B, S, dtype=torch.long, device=dev)
    for i in range(B):  # left padding of up to a fifth of the prompt, as verl's data has
        mask[i, : (i * a.prompt) // (5 * B)] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    tokens = int(mask.sum())

    def hidden() -> torch.Tensor:
        return model.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state

    labels = torch.roll(ids, -1, 1)

    def head_floor(h: torch.Tensor, entropy: bool):
        logits = model.lm_head(h).float()
        lp = F.log_softmax(logits, -1)
        out = lp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        ent = -(lp.exp() * lp).sum(-1) if entropy else None
        return out, ent

    def head_rowloop(h: torch.Tensor, entropy: bool):
        from verl.utils import torch_functional as vf

        logits = model.lm_head(h)  # bf16, as under FSDP's mixed precision
        ent = compiled_entropy(logits) if entropy else None
        flat = logits[mask.bool()]  # the engine's narrow + cat to (nnz, vocab)
        return vf.logprobs_from_logits(flat, labels[mask.bool()]), ent

    def head_fused(backend: str):
        def run(h: torch.Tensor, entropy: bool):
            if backend == "triton":
                from verl.utils.kernel.linear_cross_entropy import linear_cross_entropy

                return linear_cross_entropy(h, model.lm_head.weight, labels, 1.0, "none")
            from verl.utils.experimental.torch_functional import FusedLinearForPPO

            return FusedLinearForPPO(impl_backend="torch")(h, model.lm_head.weight, labels, 1.0)

        return run

    heads = {
        "floor": head_floor,
        "verl-rowloop": head_rowloop,
        "verl-fused-triton": head_fused("triton"),
        "verl-fused-torch": head_fused("torch"),
    }
    compiled_entropy = None
    if "verl-rowloop" in a.variants:
        from verl.utils import torch_functional as vf

        compiled_entropy = torch.compile(vf.entropy_from_logits, dynamic=True)

    def one(head, backward: bool) -> None:
        if backward:
            model.train()
            h = hidden()
            lp, ent = head(h, False)
            # a masked token mean, as verl's policy loss takes it (its gradient is a whole tensor)
            weight = mask.float() if lp.shape == mask.shape else torch.ones_like(lp, dtype=torch.float32)
            (-(lp.float() * weight).sum() / tokens).backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                model.eval()
                head(hidden(), True)

    results: dict[str, dict[str, float]] = {}
    for name in [v for v in a.variants.split(",") if v]:
        row: dict[str, float] = {}
        for mode, backward in (("fwd_bwd", True), ("fwd_logprob", False)):
            try:
                one(heads[name], backward)  # warm-up (compiles)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                wall = time.perf_counter()
                start.record()
                for _ in range(a.repeat):
                    one(heads[name], backward)
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end) / a.repeat
                row[f"{mode}_ms"] = round(ms, 1)
                row[f"{mode}_wall_ms"] = round((time.perf_counter() - wall) * 1000 / a.repeat, 1)
                row[f"{mode}_peak_gib"] = round(torch.cuda.max_memory_allocated() / 1024**3, 2)
                row[f"{mode}_tflops"] = round(model_flops(params, tokens, backward, True) / ms / 1e9, 1)
            except Exception as e:  # a variant that fails is reported, the others still run
                row[f"{mode}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            torch.cuda.empty_cache()
        results[name] = row
        print(name, json.dumps(row), flush=True)
    floor = results.get("floor", {})
    for name, row in results.items():
        for mode in ("fwd_bwd", "fwd_logprob"):
            if f"{mode}_ms" in row and f"{mode}_ms" in floor:
                row[f"{mode}_x_floor"] = round(row[f"{mode}_ms"] / floor[f"{mode}_ms"], 2)
    out = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": {"batch": B, "prompt": a.prompt, "response": a.response, "tokens": tokens, "params": params},
        "results": results,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
