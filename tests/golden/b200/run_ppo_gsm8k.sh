#!/usr/bin/env bash
# verl PPO on GSM8K for profile b200: NVIDIA B200 (CC 10.0, 180 GB)
# Rendered by envbuild 0.1.0: bf16, sdpa attention, vllm rollout, verl 0.9.1.
# SPEED: remove padding off: sdpa attention has no varlen path for packed sequences in verl 0.9.1 (flash-attn has: `--with flash-attn` turns it on), so micro-batches are padded
# SPEED: log-probs and entropy by verl's fused torch kernels (use_fused_kernels): otherwise the engine materialises the whole (tokens, vocabulary) logits, and where flash-attn's cross-entropy kernel is missing (PyPI has no flash-attn wheel) verl's logprobs_from_logits falls back to logprobs_from_logits_v2, a Python loop over every token's vocabulary row (one log_softmax, gather and their backward per token); use_fused_kernels computes log-probs and entropy from the hidden states in vocabulary chunks (FusedLinearForPPO in plain torch, verl/utils/experimental/torch_functional.py), so neither the loop nor the logits remain
# SPEED: micro-batches by token budget (use_dynamic_bsz), each the plan's micro-batch x (prompt + response) tokens: use_dynamic_bsz packs each micro-batch up to a token budget instead of a count of padded sequences; verl raises when one sequence exceeds the budget (utils/seqlen_balancing.py), so every budget holds at least a whole prompt plus response
# Precision, part by part: rollout bf16 · reference log-probs bf16 · actor (log-probs, PPO update) bf16 · critic bf16.
# Usage: DATA_DIR=~/data/gsm8k MODEL=Qwen/Qwen2.5-7B-Instruct ./run_ppo_gsm8k.sh [extra hydra overrides]
#        GSM8K_FROM=/path/to/gsm8k (local train/test .parquet or .jsonl) instead of the hub;
#        ENVBUILD_HOME=DIR where preflight.py and prepare_gsm8k.py are, outside the image.
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
N_GPUS=${N_GPUS:-8}
# MODEL and DATA_DIR reach Hydra as override values, where `,` makes a sweep, quotes, brackets,
# `=` and `#` do not parse and `${...}` is an interpolation: refuse those before any work
for var in MODEL DATA_DIR; do
  val=${!var}
  bad=${val//[A-Za-z0-9._\/+@:-]/}
  if [ -n "$bad" ]; then
    why="the character '${bad:0:1}' cannot reach verl's Hydra overrides"
  elif [ -z "$val" ]; then
    why="it is empty"
  else
    continue
  fi
  echo "$var='$val': $why; use a path of letters, digits and . _ / + @ : - (a symlink to it works)" >&2
  exit 2
done
case "$N_GPUS" in ''|*[!0-9]*) echo "N_GPUS='$N_GPUS': a number of GPUs, digits only" >&2; exit 2 ;; esac
export HF_ENDPOINT=${HF_ENDPOINT:-https://huggingface.co}
# vLLM's compile cache stays on (VLLM_DISABLE_COMPILE_CACHE=0; under $VLLM_CACHE_ROOT, default ~/.cache/vllm, which a volume keeps between containers): verl turns vLLM's torch.compile cache off for its Ray workers (VLLM_DISABLE_COMPILE_CACHE=1, for vllm#31199: engines writing one cache at once corrupted it) unless the launching shell sets the variable; torch 2.10 and later write Inductor's cache artifacts atomically (pytorch#162432), so this run keeps the cache on and a launch after the first loads vLLM's compiled graphs instead of compiling them again. Export VLLM_DISABLE_COMPILE_CACHE=1 to turn it off.
export VLLM_DISABLE_COMPILE_CACHE=${VLLM_DISABLE_COMPILE_CACHE:-0}
# PYTORCH_CUDA_ALLOC_CONF expandable_segments:True: vLLM's sampler allocates [running requests x vocabulary] fp32 tensors that grow with the concurrency after each sleep (verl sleeps the engine around every weight sync) has emptied torch's cache; expandable segments let those blocks grow in place instead of leaving the cache fragmented, and vLLM (from 0.21) turns them off only inside its sleep-mode pool. An exported value wins (empty: off).
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}
# GSM8K in verl's layout: made here when missing, from the hub through HF_ENDPOINT (a mirror
# works) or, with GSM8K_FROM=PATH, from local parquet/jsonl files (e.g. carried across an air gap).
if [ ! -f "$DATA_DIR/train.parquet" ] || [ ! -f "$DATA_DIR/test.parquet" ]; then
  echo "GSM8K not found in $DATA_DIR: preparing it from ${GSM8K_FROM:-$HF_ENDPOINT}" >&2
  python3 "${ENVBUILD_HOME:-/opt/envbuild}/prepare_gsm8k.py" --out "$DATA_DIR" ${GSM8K_FROM:+--from "$GSM8K_FROM"}
fi

# preflight also checks the extra overrides: a +/++ key verl's config does not have, or one this
# release cannot run (envbuild.json verl.refused_overrides), stops here with the reason (exit 2)
python3 "${ENVBUILD_HOME:-/opt/envbuild}/preflight.py" --quiet --overrides "$@"

args=(
  algorithm.adv_estimator=gae
  algorithm.kl_ctrl.kl_coef=0.001
  data.train_files="$DATA_DIR/train.parquet"
  data.val_files="$DATA_DIR/test.parquet"
  # batch sizes per GPU from the memory plan (envbuild show b200 --memory): peak 129.727 GiB
  # (generate (vLLM)) of 178.06 usable; validation goes to the rollout server as one
  # batch (verl 0.9.1 deprecates data.val_batch_size), which runs at most max_num_seqs at a time
  data.train_batch_size=1024
  data.max_prompt_length=1024
  data.max_response_length=2048
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.model.use_remove_padding=False
  actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=256
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
  actor_rollout_ref.actor.fsdp_config.param_offload=False
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
  actor_rollout_ref.ref.fsdp_config.param_offload=False
  ++actor_rollout_ref.ref.fsdp_config.model_dtype=bf16
  ++actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.mode=async
  actor_rollout_ref.rollout.dtype=bfloat16
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
  actor_rollout_ref.rollout.max_num_seqs=165
  # log-probs and entropy by verl's fused torch kernels: no vocabulary-wide logits (SPEED above)
  actor_rollout_ref.model.use_fused_kernels=True
  actor_rollout_ref.model.fused_kernel_options.impl_backend=torch
  # token budgets per GPU: the plan's micro-batches x 3072 tokens (prompt + response), so a budget always holds one whole sequence
  actor_rollout_ref.actor.use_dynamic_bsz=True
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=49152
  actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
  actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=49152
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
  actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=49152
  critic.use_dynamic_bsz=False
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  # vLLM's share 107.44 GiB, planned: what the resident roles leave on the card while vLLM generates, at most the profile's 0.6
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa
  +critic.model.override_config.attn_implementation=sdpa
  actor_rollout_ref.actor.fsdp_config.dtype=bfloat16
  critic.fsdp.dtype=bfloat16
  actor_rollout_ref.ref.fsdp_config.dtype=bfloat16
  critic.optim.lr=1e-5
  critic.model.path="$MODEL"
  critic.model.use_remove_padding=False
  critic.model.enable_gradient_checkpointing=True
  critic.ppo_micro_batch_size_per_gpu=32
  # the critic's engine takes its own micro-batches (left alone it packs 32768-token dynamic ones)
  ++critic.fsdp.use_dynamic_bsz=False
  ++critic.fsdp.micro_batch_size_per_gpu=32
  ++critic.fsdp.infer_micro_batch_size_per_gpu=32
  critic.fsdp.param_offload=False
  critic.fsdp.optimizer_offload=False
  ++critic.fsdp.mixed_precision.param_dtype=bf16
  'trainer.logger=[console]'
  trainer.val_before_train=False
  trainer.n_gpus_per_node="$N_GPUS"
  trainer.nnodes=1
  trainer.save_freq=-1
  trainer.test_freq=6
  trainer.total_epochs=1
)
exec python3 -m verl.trainer.main_ppo "${args[@]}" "$@"
