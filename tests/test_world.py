"""A plan for the world (issue 45): the rollout's tensor parallelism, FSDP sharding over every
GPU of every node, offload with the host's memory counted, Ulysses sequence parallelism and
vLLM's share of the card as planned quantities, each also a flag the user can set and the fix
search can offer."""

from __future__ import annotations

import pytest

from conftest import resolved, violations
from envbuilder.errors import UserError
from envbuilder.model import runplan
from envbuilder.model.batches import violations as batch_violations

Q7, Q14, Q32, Q72 = (f"Qwen/Qwen2.5-{s}-Instruct" for s in ("7B", "14B", "32B", "72B"))


def args(env) -> dict[str, str]:
    return {a.key.lstrip("+"): a.value for a in env.run}


def arithmetic(env) -> list[str]:
    cfg = runplan.as_config(env.run, runplan.world(env))
    return batch_violations(cfg, env.verl.engine_batches)


def test_a_half_b_gae_on_an_a10_plans_vllm_a_share_it_needs_not_a_fixed_fraction():
    # today: vLLM's fixed 0.4 × 22.5 GiB beside the resident state refused even batch 1
    env = resolved("3090", gpu_memory=23028)
    util = float(args(env)["actor_rollout_ref.rollout.gpu_memory_utilization"])
    mem = env.memory
    assert not mem["problems"]
    assert util * mem["gpu_total_gib"] == pytest.approx(mem["vllm_share_gib"], abs=0.05)
    outside = next(p for p in mem["phases"] if p["key"] == "generate_outside")
    assert outside["fits"] and "planned" in mem["choices"]["gpu_memory_utilization"]["why"]


def test_a_32b_grpo_is_refused_on_one_h100_node_with_a_second_node_that_resolves():
    # actor weights, gradients, Adam and its step temporary: 20 B a parameter / 8 GPUs = 76 GiB,
    # loaded back for the actor's own update whatever is offloaded (verl's own 32B PPO example
    # runs 4 nodes of 8)
    v = violations("h100", model=Q32, algo="grpo")["memory"]
    assert "actor_step" in v.why and "--nodes 2" in v.fix and "--gpus-per-node 16" not in v.fix


def test_a_32b_grpo_on_two_h100_nodes_splits_the_rollout():
    env = resolved("h100", model=Q32, algo="grpo", nodes=2)
    a, ch = args(env), env.memory["choices"]
    tp = int(a["actor_rollout_ref.rollout.tensor_model_parallel_size"])
    assert tp > 1 and 8 % tp == 0 and 40 % tp == 0 and (8 % tp == 0 or tp % 8 == 0)
    assert ch["rollout_tp"]["value"] == tp and "weight shard" in ch["rollout_tp"]["why"]
    assert a["actor_rollout_ref.rollout.max_num_seqs"] == str(env.memory["batch"]["max_num_seqs"])
    assert not arithmetic(env)


def test_the_smallest_tp_is_chosen_where_one_gpu_holds_the_rollout():
    env = resolved("h100", algo="grpo")
    assert args(env)["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "1"


def test_rollout_tp_is_a_flag_checked_against_the_node_and_the_heads():
    env = resolved("h100", model=Q32, algo="grpo", nodes=2, rollout_tp=8)
    assert args(env)["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "8"
    with pytest.raises(UserError) as e:  # 28 heads of the 7B do not split 8 ways
        resolved("h100", algo="grpo", rollout_tp=8)
    assert "28 attention heads" in str(e.value) and "--rollout-tp" in str(e.value)
    with pytest.raises(UserError) as e:
        resolved("h100", algo="grpo", rollout_tp=3)
    assert "8 GPUs" in str(e.value)


def test_offload_is_a_flag_that_sets_each_role_and_counts_the_hosts_memory():
    env = resolved("h100", algo="grpo", offload=("params", "optimizer"))
    a = args(env)
    assert a["actor_rollout_ref.actor.fsdp_config.param_offload"] == "True"
    assert a["actor_rollout_ref.actor.fsdp_config.optimizer_offload"] == "True"
    assert a["actor_rollout_ref.ref.fsdp_config.param_offload"] == "True"
    host = env.memory["host"]
    assert 0 < host["gib"] <= host["budget_gib"]
    with pytest.raises(UserError):
        resolved("h100", offload=("gradients",))


def test_a_host_too_small_for_what_is_offloaded_is_refused():
    v = violations("h100", model=Q32, algo="grpo", nodes=2, offload=("params", "optimizer"), host_memory=64)[
        "memory"
    ]
    assert "host" in v.why and "--host-memory" in v.fix


def test_ulysses_sp_is_a_flag_that_shards_each_sequence_and_keeps_the_arithmetic():
    fa = ("flash-attn",)
    one = resolved("h100", algo="grpo", with_=fa)
    env = resolved("h100", algo="grpo", sp=2, with_=fa)
    a = args(env)
    assert a["actor_rollout_ref.actor.ulysses_sequence_parallel_size"] == "2"
    assert env.memory["sequence_parallel"] == 2
    # half the tokens a GPU holds at the same micro-batch: the update takes at least as many
    assert (
        env.memory["batch"]["actor_ppo_micro_batch_size_per_gpu"]
        >= one.memory["batch"]["actor_ppo_micro_batch_size_per_gpu"]
    )
    assert not arithmetic(env)
    gae = resolved("h100", sp=4, with_=fa)
    assert args(gae)["critic.ulysses_sequence_parallel_size"] == "4"
    assert not arithmetic(gae)
    with pytest.raises(UserError) as e:  # 28 heads do not split 8 ways
        resolved("h100", algo="grpo", sp=8, with_=fa)
    assert "28 attention heads" in str(e.value)
    with pytest.raises(UserError) as e:  # Ulysses runs on unpadded micro-batches only
        resolved("h100", algo="grpo", sp=2)
    assert "--with flash-attn" in str(e.value)


def test_a_14b_gae_that_needs_more_gpus_is_offered_a_second_node_not_sixteen_per_node():
    v = violations("h100", model=Q14, gpus_per_node=2)["memory"]
    assert "--gpus-per-node 16" not in v.fix
    env = resolved("h100", model=Q14)  # eight H100s: the plan offloads what is idle
    assert not env.memory["problems"]


def test_the_fix_search_offers_the_world_flags():
    from envbuilder.model.flags import BY_FIELD

    for field in ("rollout_tp", "offload", "sp", "host_memory"):
        assert BY_FIELD[field].fix, field


def test_a_model_too_big_for_the_node_is_offered_more_nodes_before_a_smaller_model():
    # the model the user asked for, on a larger world, comes first; a smaller model is the fallback
    v = violations("h100", model=Q32, algo="grpo")["memory"]
    assert v.fix.startswith("use --nodes 2"), v.fix
    assert v.fix.index("--nodes 2") < v.fix.index("--model Qwen/Qwen2.5-14B-Instruct")


def test_a_moe_plan_counts_every_expert_in_the_state_and_shards_the_rollout():
    # Qwen3-30B-A3B on the FSDP engine, as verl trains it: Adam state for all 128 experts (30.5B
    # parameters, like a 32B: refused on one node of H100s), a second node fits
    moe = "Qwen/Qwen3-30B-A3B"
    v = violations("h100", model=moe, algo="grpo")["memory"]
    assert "actor_step" in v.why and v.fix.startswith("use --nodes 2")
    env = resolved("h100", model=moe, algo="grpo", nodes=2)
    terms = {t["term"]: t for p in env.memory["phases"] if p["key"] == "actor_step" for t in p["terms"]}
    assert terms["actor Adam state"]["bytes"] == pytest.approx(8 * 30_532_122_624 / 16)
    assert env.memory["arch"]["experts"] == 128
    assert int(args(env)["actor_rollout_ref.rollout.tensor_model_parallel_size"]) > 1
    assert not arithmetic(env)


def test_a_7b_grpo_fits_one_card_only_as_lora_and_the_refusal_offers_it():
    # full fine-tuning: 20 B a parameter at Adam's step (152 GiB) on any one card; LoRA rank 32:
    # the frozen base without gradients or Adam state, and no reference of its own
    v = violations("h100", model=Q7, algo="grpo", gpus_per_node=1)["memory"]
    assert "use --lora-rank 32 (LoRA adapters" in v.fix, v.fix
    assert v.fix.index("--gpus-per-node") < v.fix.index("--lora-rank") < v.fix.index("--model")
    env = resolved("h100", model=Q7, algo="grpo", gpus_per_node=1, lora_rank=32)
    assert not env.memory["problems"] and env.train.lora_rank == 32
    a = args(env)
    assert (a["actor_rollout_ref.model.lora_rank"], a["actor_rollout_ref.model.target_modules"]) == (
        "32",
        "all-linear",
    )
    terms = {t["term"]: t for p in env.memory["phases"] for t in p["terms"]}
    assert "reference weights (resident)" not in terms  # (verl: ref_in_actor for LoRA)
    assert terms["actor gradients"]["gib"] < 1 and "LoRA" in terms["actor gradients"]["formula"]
    assert "vLLM LoRA slot" in terms
    assert not arithmetic(env)


def test_lora_rank_is_a_flag_within_vllms_ranks_and_the_fsdp_engine():
    from envbuilder.model.flags import BY_FIELD, LORA_RANK_MAX

    assert BY_FIELD["lora_rank"].fix and BY_FIELD["lora_rank"].bounds == (0, LORA_RANK_MAX) == (0, 512)
    with pytest.raises(UserError) as e:
        resolved("h100", model=Q7, algo="grpo", lora_rank=32, engine="megatron")
    assert "FSDP engine only" in str(e.value) and "--lora-rank" in str(e.value)
    # 0 trains every weight, where the profile's default is LoRA (the 4090's seed run)
    assert resolved("4090").train.lora_rank == 32
    full = resolved("4090", lora_rank=0)
    assert full.train.lora_rank == 0 and "actor_rollout_ref.model.lora_rank" not in args(full)


def test_the_lora_fix_is_offered_for_dense_models_only():
    # a mixture's experts as vLLM LoRA: no record says they serve, so the fix is not offered
    v = violations("h100", model="Qwen/Qwen3-30B-A3B", algo="grpo", gpus_per_node=2)["memory"]
    assert "--lora-rank" not in v.fix, v.fix
    # a 72B on one node of 8 H100s: verl's own LoRA example's world (rollout TP 8)
    env = resolved("h100", model=Q72, algo="grpo", lora_rank=32)
    assert args(env)["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "8"
    assert not env.memory["problems"] and not arithmetic(env)


def test_prompt_and_response_lengths_are_flags_the_plan_and_run_script_follow():
    Q05 = "Qwen/Qwen2.5-0.5B-Instruct"
    one = resolved("h100", model=Q05, algo="grpo", gpus_per_node=1)
    env = resolved(
        "h100", model=Q05, algo="grpo", gpus_per_node=1, max_response_length=4096, max_prompt_length=512
    )
    a = args(env)
    assert (a["data.max_prompt_length"], a["data.max_response_length"]) == ("512", "4096")
    assert (env.train.max_prompt_length, env.train.max_response_length) == (512, 4096)
    # longer sequences: fewer of them at once, and each token budget still holds one whole sequence
    assert env.memory["batch"]["max_num_seqs"] < one.memory["batch"]["max_num_seqs"]
    assert int(a["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]) >= 512 + 4096
    assert not arithmetic(env)


def test_a_run_longer_than_the_models_context_is_offered_the_response_that_fits():
    v = violations("h100", model="Qwen/Qwen2.5-0.5B-Instruct", gpus_per_node=1, max_response_length=40000)
    fix = v["model-context"].fix
    assert "(1024 + 40000)" in v["model-context"].what
    assert fix.startswith("use --max-response-length 31744 "), fix  # 32768 less the 1024-token prompts
    env = resolved("h100", model="Qwen/Qwen2.5-0.5B-Instruct", gpus_per_node=1, max_response_length=31744)
    assert env.train.max_prompt_length + env.train.max_response_length == 32768


def test_a_memory_refusal_offers_shorter_sequences_as_flags():
    v = violations(
        "4090",
        model="Qwen/Qwen2.5-1.5B-Instruct",
        algo="grpo",
        max_prompt_length=4096,
        max_response_length=16384,
    )["memory"]
    assert v.fix.startswith("use --max-prompt-length 2048 --max-response-length 8192 (shorter sequences)"), (
        v.fix
    )
    assert "--matrix-dir" not in v.fix
    resolved(
        "4090",
        model="Qwen/Qwen2.5-1.5B-Instruct",
        algo="grpo",
        max_prompt_length=2048,
        max_response_length=8192,
    )
