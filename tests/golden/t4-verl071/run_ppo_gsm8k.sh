#!/usr/bin/env bash
# verl PPO on GSM8K for profile t4: Tesla T4 (CC 7.5, 16 GB)
# Rendered by envbuild 0.1.0: fp16, sdpa attention, vllm rollout, verl 0.7.1.
# SPEED: remove padding off: verl unpads through flash-attn's varlen kernels, which need CC 8.0 (this card is CC 7.5); sdpa attention runs each micro-batch padded
# SPEED: no fused log-prob kernels or token budgets: the plan knows none for verl 0.7.1 (verl.yaml speed); micro-batches are counts of padded sequences
# Precision, part by part: rollout fp16 · reference log-probs fp16 · actor (log-probs, PPO update) fp32 · critic fp32 (training stays in fp32: verl's FSDP critic has no fp16 loss scaler).
# Usage: DATA_DIR=~/data/gsm8k MODEL=Qwen/Qwen2.5-0.5B-Instruct ./run_ppo_gsm8k.sh [extra hydra overrides]
#        GSM8K_FROM=/path/to/gsm8k (local train/test .parquet or .jsonl) instead of the hub;
#        ENVBUILD_HOME=DIR where preflight.py and prepare_gsm8k.py are, outside the image.
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
N_GPUS=${N_GPUS:-1}
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
# PYTORCH_CUDA_ALLOC_CONF stays as it is: vLLM's sleep mode, which verl's vLLM rollout turns on, refuses expandable_segments:True (its CuMemAllocator asserts it is off).
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
  # batch sizes per GPU from the memory plan (envbuild show t4 --memory): peak 11.614 GiB
  # (log_prob) of 14.5 usable; validation goes to the rollout server as one
  # batch (verl 0.7.1 deprecates data.val_batch_size), which runs at most max_num_seqs at a time
  data.train_batch_size=16
  data.max_prompt_length=256
  data.max_response_length=256
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.model.use_remove_padding=False
  actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=8
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
  actor_rollout_ref.actor.fsdp_config.param_offload=True
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32
  ++actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
  actor_rollout_ref.ref.fsdp_config.param_offload=True
  ++actor_rollout_ref.ref.fsdp_config.model_dtype=fp16
  ++actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp16
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.mode=async
  actor_rollout_ref.rollout.dtype=float16
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
  actor_rollout_ref.rollout.max_num_seqs=251
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  # vLLM's share 6.0 GiB, planned: what the resident roles leave on the card while vLLM generates, at most the profile's 0.4
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa
  +critic.model.override_config.attn_implementation=sdpa
  actor_rollout_ref.actor.fsdp_config.dtype=float32
  critic.model.fsdp_config.dtype=float32
  actor_rollout_ref.ref.fsdp_config.dtype=float16
  critic.optim.lr=1e-5
  critic.model.path="$MODEL"
  critic.model.use_remove_padding=False
  critic.model.enable_gradient_checkpointing=True
  critic.ppo_micro_batch_size_per_gpu=8
  critic.model.fsdp_config.param_offload=True
  critic.model.fsdp_config.optimizer_offload=True
  ++critic.model.fsdp_config.mixed_precision.param_dtype=fp32
  'trainer.logger=[console]'
  trainer.val_before_train=False
  trainer.n_gpus_per_node="$N_GPUS"
  trainer.nnodes=1
  trainer.save_freq=-1
  trainer.test_freq=330
  trainer.total_epochs=1
)
exec python3 -m verl.trainer.main_ppo "${args[@]}" "$@"
