"""The batch arithmetic verl's workers assert at run time, checked on a composed run config.

verl's Hydra config accepts batch sizes its workers then refuse mid-run: the h200 render composed
cleanly and died at its first `compute_log_prob` on an H200 (a log-prob micro-batch of 22 against
256 samples per GPU). These are the checks, each with where the release asserts it; `violations`
takes the composed config as plain data (`OmegaConf.to_container(cfg, resolve=True)`), so the
pypi tier (verl's real config, composed with Hydra), `envbuild verify` and the resolver's plan all
judge a run the same way. `engine`: the release's engine workers (verl 0.8+, matrices/verl.yaml
`batches`), which split each GPU's data with `tu.chunk_tensordict` and assert it divides; the
legacy workers (0.4-0.7) split with a remainder, so there only the update's split is asserted.

  world        W = trainer.n_gpus_per_node × trainer.nnodes; with Ulysses SP of sp GPUs the
               batches divide over D = W / sp data-parallel ranks (each rule below that divides
               by W per GPU divides by D), and a token budget holds budget × sp tokens; on the
               Megatron engine D = W / (TP × PP × CP) (validate_config's megatron_dp)
  rollout      B = data.train_batch_size prompts × n = rollout.n responses; B·n % W == 0
               (validate_config, `real_train_batch_size must be divisible by minimal possible
               batch size`); each GPU holds D = B·n / W
  mini-batch   mini ≤ B (ActorConfig/CriticConfig.validate); mini·n % W == 0 (engine_workers
               train_mini_batch); B % mini == 0, or the last mini-batch is short and its
               micro-batches do not divide it; each GPU's mini-batch M = mini·n / W
  micro        M % ppo_micro_batch_size_per_gpu == 0 (actor and critic updates);
               engine: D % log_prob_micro_batch_size_per_gpu == 0 (rollout and ref), and the
               critic's values at its engine's infer micro-batch; the critic's engine must not
               be left on its dynamic default, or the plan's critic micro-batch is not what runs
  budgets      with actor.use_dynamic_bsz (verl.yaml `speed`), the actor's update and every
               log-prob pass take token budgets instead: each budget ≥ max_prompt_length +
               max_response_length (utils/seqlen_balancing.py raises on a longer sequence), and
               rollout.log_prob_use_dynamic_bsz equals the actor's flag (engine_workers.py)
"""

from __future__ import annotations

from collections.abc import Mapping

MISSING = object()
Config = Mapping[str, object]  # (a composed run config as plain data)


def lookup(cfg: Config, dotted: str, default: object = MISSING) -> object:
    """The value at a dotted key of a composed config as plain data, `default` where the
    config lacks it (verify reads its composed config through this too)."""
    node: object = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _int(cfg: Config, dotted: str) -> int | None:
    value = lookup(cfg, dotted, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def uses_critic(cfg: Config) -> bool:
    """verl's need_critic: critic.enable where it is set, else the GAE estimator only."""
    enable = lookup(cfg, "critic.enable", None)
    if isinstance(enable, bool):
        return enable
    return bool(lookup(cfg, "algorithm.adv_estimator", "gae") == "gae")


def uses_reference(cfg: Config) -> bool:
    """verl's need_reference_policy: a KL to the reference, in the reward or in the loss."""
    return (
        lookup(cfg, "algorithm.use_kl_in_reward", False) is True
        or lookup(cfg, "actor_rollout_ref.actor.use_kl_loss", False) is True
    )


# complexity: one branch per assertion verl's workers make, in the order they make them, each
# readable beside the verl source line it mirrors
def violations(cfg: Config, engine: bool, critic_engine: str = "critic.fsdp") -> list[str]:
    """What verl's workers would refuse in this composed config, one sentence each (empty: none).
    `critic_engine`: where the release keeps the critic's engine settings."""
    out: list[str] = []
    dynamic = lookup(cfg, "actor_rollout_ref.actor.use_dynamic_bsz", False) is True
    if dynamic:
        out += _budget_violations(cfg)
    world = (_int(cfg, "trainer.n_gpus_per_node") or 1) * (_int(cfg, "trainer.nnodes") or 1)
    n = _int(cfg, "actor_rollout_ref.rollout.n") or 1
    batch = _int(cfg, "data.train_batch_size")
    if batch is None:
        return ["data.train_batch_size is not a positive whole number"]
    if batch * n % world:
        out.append(
            f"data.train_batch_size × rollout.n = {batch} × {n} = {batch * n} does not divide over "
            f"{world} GPUs (verl's validate_config asserts it)"
        )
        return out
    per_gpu = batch * n // world
    # Ulysses: an SP group of sp GPUs is one data-parallel rank; verl divides the batches by
    # world / sp (the worker's normalisation of ppo_mini_batch_size and the engine's split)
    # Megatron: a data-parallel rank spans TP × PP × CP GPUs (validate_config's megatron_dp)
    sps = {
        "actor": _megatron_split(cfg, "actor_rollout_ref.actor.megatron")
        or _int(cfg, "actor_rollout_ref.actor.ulysses_sequence_parallel_size")
        or 1,
        "critic": _megatron_split(cfg, "critic.megatron")
        or _int(cfg, "critic.ulysses_sequence_parallel_size")
        or 1,
    }
    if isinstance(lookup(cfg, "critic.megatron", None), Mapping):
        critic_engine = "critic.megatron"  # (the Megatron engine keeps the critic's settings there)
    for role, sp in sps.items():
        if world % sp:
            out.append(
                f"the {role}'s data-parallel group of {sp} GPUs (Ulysses SP, or Megatron's TP × PP × CP) "
                f"does not divide the {world} GPUs"
            )
            return out
    # (token budgets: the actor's update and its log-probs divide nothing by a count)
    roles = [] if dynamic else [("actor", "actor_rollout_ref.actor")]
    if uses_critic(cfg):
        roles.append(("critic", "critic"))
    for role, root in roles:
        mini = _int(cfg, f"{root}.ppo_mini_batch_size")
        if mini is None:
            out.append(f"{root}.ppo_mini_batch_size is not set")
            continue
        if mini > batch:
            out.append(f"{root}.ppo_mini_batch_size {mini} is larger than data.train_batch_size {batch}")
            continue
        if mini * n % world:
            out.append(
                f"the {role}'s mini-batch of {mini} × {n} responses does not divide over {world} GPUs "
                "(engine_workers.train_mini_batch asserts it)"
            )
            continue
        if batch % mini:
            out.append(
                f"data.train_batch_size {batch} is not a whole number of {root}.ppo_mini_batch_size "
                f"{mini}: the last mini-batch is short and its micro-batches do not divide it"
            )
            continue
        dp = world // sps[role]
        mini_gpu = mini * n // dp
        micro_key = f"{root}.ppo_micro_batch_size_per_gpu"
        if role == "critic" and engine:
            if lookup(cfg, f"{critic_engine}.use_dynamic_bsz", True) is not False:
                out.append(
                    f"the critic's engine ({critic_engine}) is left on dynamic batches "
                    "(EngineConfig.use_dynamic_bsz defaults to True): critic.ppo_micro_batch_size_per_gpu "
                    "is not what runs"
                )
                continue
            micro_key = f"{critic_engine}.micro_batch_size_per_gpu"
        micro = _int(cfg, micro_key)
        if micro is None:
            out.append(f"{micro_key} is not set")
        elif mini_gpu % micro:
            out.append(
                f"{micro_key}={micro} does not divide the {role}'s mini-batch of {mini_gpu} per GPU "
                f"({root}.ppo_mini_batch_size {mini} × {n} responses / {dp} data-parallel ranks)"
            )
    if not engine:
        return out
    infer = [] if dynamic else ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"]
    if uses_reference(cfg) and not dynamic:
        infer.append("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu")
    if uses_critic(cfg):
        infer.append(f"{critic_engine}.infer_micro_batch_size_per_gpu")
    for key in infer:
        micro = _int(cfg, key)
        dp = world // sps["critic" if key.startswith("critic") else "actor"]
        per_gpu = batch * n // dp
        if micro is None:
            if key.endswith("infer_micro_batch_size_per_gpu"):
                continue  # (reported above with the critic's dynamic default)
            out.append(f"{key} is not set")
        elif per_gpu % micro:
            out.append(
                f"{key}={micro} does not divide the {per_gpu} samples each GPU holds "
                f"(train_batch_size {batch} × rollout.n {n} / {dp} data-parallel ranks): verl's engine asserts "
                "'data size must be divisible by force_group_size * micro_batch_size_per_gpu'"
            )
    return out


def _megatron_split(cfg: Config, section: str) -> int | None:
    """GPUs one data-parallel rank of the Megatron engine spans (TP × PP × CP), None where the
    section sets no Megatron layout."""
    sizes = [_int(cfg, f"{section}.{k}_model_parallel_size") for k in ("tensor", "pipeline")] + [
        _int(cfg, f"{section}.context_parallel_size")
    ]
    if all(v is None for v in sizes):
        return None
    return (sizes[0] or 1) * (sizes[1] or 1) * (sizes[2] or 1)


# the token budgets of use_dynamic_bsz and where the release reads each (engine_workers.py
# 616-636: the rollout's log-prob flag must equal the actor's)
BUDGETS = (
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
)


def _budget_violations(cfg: Config) -> list[str]:
    """With use_dynamic_bsz: each token budget holds one whole sequence (verl's
    utils/seqlen_balancing.py raises when a sequence is longer than the budget), and the
    rollout's log-prob flag follows the actor's (engine_workers.py asserts it)."""
    out = []
    seq = (_int(cfg, "data.max_prompt_length") or 0) + (_int(cfg, "data.max_response_length") or 0)
    if lookup(cfg, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", False) is not True:
        out.append(
            "actor_rollout_ref.actor.use_dynamic_bsz is True but rollout.log_prob_use_dynamic_bsz is not "
            "(verl's engine worker asserts they are equal)"
        )
    # (verl's engine multiplies each budget by the SP size: a group's budget; on the Megatron
    # engine that size is its CP, transformer_impl.py:836 sp_size=context_parallel_size)
    sp = (_int(cfg, "actor_rollout_ref.actor.ulysses_sequence_parallel_size") or 1) * (
        _int(cfg, "actor_rollout_ref.actor.megatron.context_parallel_size") or 1
    )
    for key in BUDGETS:
        budget = _int(cfg, key)
        if budget is None:
            out.append(f"{key} is not set (use_dynamic_bsz needs a token budget)")
        elif budget * sp < seq:
            out.append(
                f"{key}={budget} tokens is less than one sequence (max_prompt_length + "
                f"max_response_length = {seq}): verl's seqlen_balancing raises"
            )
    return out
