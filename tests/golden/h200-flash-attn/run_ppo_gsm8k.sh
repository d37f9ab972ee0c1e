#!/usr/bin/env bash
# verl PPO on GSM8K for profile h200: NVIDIA H200 (CC 9.0, 141 GB)
# Rendered by envbuild 0.1.0: bf16, flash_attention_2 attention, vllm rollout, verl 0.6.1.
# SPEED: remove padding on: flash-attn's varlen attention runs packed sequences without their padding
# SPEED: no fused log-prob kernels or token budgets: the plan knows none for verl 0.6.1 (verl.yaml speed); micro-batches are counts of padded sequences
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
  # batch sizes per GPU from the memory plan (envbuild show h200 --memory): peak 112.989 GiB
  # (log_prob) of 139.4 usable; validation in batches, never the whole set at once
  data.train_batch_size=1024
  data.val_batch_size=1320
  data.max_prompt_length=1024
  data.max_response_length=2048
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.model.use_remove_padding=True
  actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=256
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
  actor_rollout_ref.actor.fsdp_config.param_offload=False
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=18
  actor_rollout_ref.ref.fsdp_config.param_offload=False
  ++actor_rollout_ref.ref.fsdp_config.model_dtype=bf16
  ++actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.dtype=bfloat16
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=18
  actor_rollout_ref.rollout.max_num_seqs=165
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  # vLLM's share 84.24 GiB, planned: what the resident roles leave on the card while vLLM generates, at most the profile's 0.6
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  +actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2
  +critic.model.override_config.attn_implementation=flash_attention_2
  actor_rollout_ref.actor.fsdp_config.dtype=bfloat16
  critic.model.fsdp_config.dtype=bfloat16
  actor_rollout_ref.ref.fsdp_config.dtype=bfloat16
  critic.optim.lr=1e-5
  critic.model.path="$MODEL"
  critic.model.use_remove_padding=True
  critic.model.enable_gradient_checkpointing=True
  critic.ppo_micro_batch_size_per_gpu=32
  critic.model.fsdp_config.param_offload=False
  critic.model.fsdp_config.optimizer_offload=False
  ++critic.model.fsdp_config.mixed_precision.param_dtype=bf16
  'trainer.logger=[console]'
  trainer.val_before_train=False
  trainer.n_gpus_per_node="$N_GPUS"
  trainer.nnodes=1
  trainer.save_freq=-1
  trainer.test_freq=6
  trainer.total_epochs=1
)
exec python3 -m verl.trainer.main_ppo "${args[@]}" "$@"
