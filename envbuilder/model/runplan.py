"""The run plan: every Hydra override the rendered run script passes to verl's trainer, as data.

Built in Python from a resolved environment (the release's keys, the dtypes and attention, the
critic or none, where the KL goes, LoRA, the world, the memory plan's batch sizes), checked here
against the batch arithmetic verl's workers assert (envbuilder/model/batches.py), and carried in
envbuild.json and `envbuild show --json` as `run`. The run script's template only prints it;
verify, the GPU tier and the tests read it instead of parsing bash.

An argument is `key=value` with the key as Hydra takes it (`+`/`++` prefixed where the release's
config lacks the key), `value` a plain value, or, with `shell`, text that names the run script's
own variables (`$MODEL`, `$DATA_DIR/train.parquet`, `$N_GPUS`, `$NNODES`), which the script
expands in double quotes; `notes` are the comment lines printed above it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# (the run's records are the resolved environment's, declared there: resolved.py reads no plan)
from envbuilder.model.batches import lookup
from envbuilder.model.resolved import Constraints, ResolvedEnv, RunArg

TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# the learning rates, KL coefficient and tensor parallelism of verl's own GSM8K PPO example
# (examples/ppo_trainer/run_qwen2-7b_seq_balance.sh and the quickstart: actor 1e-6, critic 1e-5,
# kl_ctrl.kl_coef 0.001); the rollout's tensor parallelism is the memory plan's
ACTOR_LR = "1e-6"
CRITIC_LR = "1e-5"
KL_COEF = "0.001"


def saved_from_json(text: str, origin: str = "envbuild.json") -> tuple[ResolvedEnv, Constraints | None]:
    """What a saved envbuild.json holds (ResolvedEnv.read_json): the environment, its run
    derived and the file's held to it (env_from_dict), and the lock's pins the file records
    beside it (None: rendered with none), for the context that replays it (context.replayed)."""
    env, pins, run = ResolvedEnv.read_json(text, origin)
    return _with_run(env, run, origin), pins


def env_from_json(text: str, origin: str = "envbuild.json") -> ResolvedEnv:
    """The environment a file holds (saved_from_json, without the pins it records)."""
    return saved_from_json(text, origin)[0]


def env_from_dict(data: object, origin: str = "envbuild.json") -> ResolvedEnv:
    """The environment of plain data from outside (ResolvedEnv.read_dict: every value checked
    against its matrix kind, the pins it records left out), with its run plan derived from the
    rest; a file whose `run` is not what its own settings give was edited (UserError, exit 2)."""
    env, _, run = ResolvedEnv.read_dict(data, origin)
    return _with_run(env, run, origin)


def _with_run(env: ResolvedEnv, stored: object, origin: str) -> ResolvedEnv:
    from envbuilder.errors import UserError

    run = build(env)
    if stored is not None and stored != [a.to_dict() for a in run]:
        raise UserError(
            f"{origin}: its `run` (the run script's overrides) is not what its own settings "
            "give: the file was edited. Pass the envbuild.json that `envbuild render` wrote, "
            "unedited, or re-resolve it from its profile."
        )
    return env._replace(run=run)


def _b(flag: bool) -> str:
    return "True" if flag else "False"


# complexity: one flat recipe, each condition one override in the order the script passes them;
# split, the order of the run script would be spread over functions that each print a few lines
def build(env: ResolvedEnv) -> tuple[RunArg, ...]:
    """The run's overrides, in the order the script passes them."""
    d, t, pr, al = env, env.train, env.precision, env.algorithm
    mb = env.memory.batch
    out: list[RunArg] = []

    def add(key: str, value: object, *notes: str, shell: bool = False) -> None:
        out.append(RunArg(key=key, value=str(value), shell=shell, notes=tuple(notes)))

    add("algorithm.adv_estimator", al.name)
    if al.kl == "reward":
        add("algorithm.use_kl_in_reward", "True")
    elif al.kl == "loss":
        add("algorithm.use_kl_in_reward", "False")
        add("actor_rollout_ref.actor.use_kl_loss", "True")
        add("actor_rollout_ref.actor.kl_loss_coef", al.kl_loss_coef)
        add("actor_rollout_ref.actor.kl_loss_type", al.kl_loss_type)
    add("algorithm.kl_ctrl.kl_coef", KL_COEF)
    add("data.train_files", "$DATA_DIR/train.parquet", shell=True)
    add("data.val_files", "$DATA_DIR/test.parquet", shell=True)
    mem = d.memory
    sp = mem.sequence_parallel  # (Ulysses: GPUs one sequence is split over)
    # GPUs one sequence is split over for the token budgets: Ulysses SP on FSDP, CP on the
    # Megatron engine, which verl 0.9.1 passes to its micro-batcher as sp_size
    # (workers/engine/megatron/transformer_impl.py:836; workers/engine/utils.py:111 multiplies)
    split = sp * (d.train.megatron.cp if d.train.megatron else 1)
    head = (
        f"batch sizes per GPU from the memory plan (envbuild show {d.asked} --memory): peak "
        f"{mem.peak.gib} GiB"
    )
    if d.verl.rollout_mode == "async":
        add(
            "data.train_batch_size",
            t.train_batch_size,
            head,
            f"({mem.peak.phase}) of {mem.usable_gib} usable; validation goes to the rollout server as one",
            f"batch (verl {d.verl.version} deprecates data.val_batch_size), which runs at most max_num_seqs at a time",
        )
    else:
        add(
            "data.train_batch_size",
            t.train_batch_size,
            head,
            f"({mem.peak.phase}) of {mem.usable_gib} usable; validation in batches, never the whole set at once",
        )
        add("data.val_batch_size", mb.val_batch_size)
    add("data.max_prompt_length", t.max_prompt_length)
    add("data.max_response_length", t.max_response_length)
    add("actor_rollout_ref.model.path", "$MODEL", shell=True)
    add("actor_rollout_ref.model.use_remove_padding", _b(d.features.remove_padding))
    add("actor_rollout_ref.model.enable_gradient_checkpointing", _b(t.gradient_checkpointing))
    add("actor_rollout_ref.actor.optim.lr", ACTOR_LR)
    add("actor_rollout_ref.actor.ppo_mini_batch_size", t.ppo_mini_batch_size)
    add("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", mb.actor_ppo_micro_batch_size_per_gpu)
    add("actor_rollout_ref.actor.fsdp_config.param_offload", _b(t.actor_param_offload))
    add("actor_rollout_ref.actor.fsdp_config.optimizer_offload", _b(t.optimizer_offload))
    add("++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype", pr.actor)
    add("++actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype", "fp32")
    add("++actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype", "fp32")
    if t.actor_model_dtype:
        add(
            "++actor_rollout_ref.actor.fsdp_config.model_dtype",
            t.actor_model_dtype,
            f"LoRA: the frozen base loads in {t.actor_model_dtype} (the adapters stay fp32)",
        )
    add("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", mb.log_prob_micro_batch_size_per_gpu)
    add("actor_rollout_ref.ref.fsdp_config.param_offload", _b(t.param_offload))
    add("++actor_rollout_ref.ref.fsdp_config.model_dtype", pr.ref)
    add("++actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype", pr.ref)
    add("actor_rollout_ref.rollout.name", d.rollout)
    if al.n > 1:
        group = ", its advantage normalised within each prompt's group" if al.group else ""
        add("actor_rollout_ref.rollout.n", al.n, f"{al.name}: {al.n} responses per prompt{group}")
    if d.verl.rollout_mode == "async":
        add("actor_rollout_ref.rollout.mode", "async")
    add("actor_rollout_ref.rollout.dtype", TORCH_DTYPE[pr.rollout])
    add("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", mb.log_prob_micro_batch_size_per_gpu)
    if mb.rollout_micro_batch_size:
        add("+actor_rollout_ref.rollout.micro_batch_size", mb.rollout_micro_batch_size)
    if mb.max_num_seqs:
        add("actor_rollout_ref.rollout.max_num_seqs", mb.max_num_seqs)
    f = d.features
    if f.fused_kernels:
        add(
            "actor_rollout_ref.model.use_fused_kernels",
            "True",
            f"log-probs and entropy by verl's fused {f.fused_kernels} kernels: no vocabulary-wide logits (SPEED above)",
        )
        add("actor_rollout_ref.model.fused_kernel_options.impl_backend", f.fused_kernels)
    if f.dynamic_bsz:
        seq = t.max_prompt_length + t.max_response_length
        # (a GPU of an SP or CP group holds 1/split of each sequence; verl multiplies the
        # budget by split)
        lp = -(-mb.log_prob_micro_batch_size_per_gpu * seq // split)
        add(
            "actor_rollout_ref.actor.use_dynamic_bsz",
            "True",
            f"token budgets per GPU: the plan's micro-batches x {seq} tokens (prompt + response), so a "
            "budget always holds one whole sequence",
        )
        add(
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
            -(-mb.actor_ppo_micro_batch_size_per_gpu * seq // split),
        )
        for part in ("ref", "rollout"):
            add(f"actor_rollout_ref.{part}.log_prob_use_dynamic_bsz", "True")
            add(f"actor_rollout_ref.{part}.log_prob_max_token_len_per_gpu", lp)
        if al.critic and d.verl.engine_batches:
            # (critic.use_dynamic_bsz follows the actor's; the critic's engine keeps its own
            # micro-batches, set below)
            add("critic.use_dynamic_bsz", "False")
    ch, tp = mem.choices, mem.rollout_tp
    add(
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        tp,
        *((f"rollout TP {tp}: {ch.rollout_tp.why}",) if tp > 1 and ch.rollout_tp else ()),
    )
    add(
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        t.gpu_memory_utilization,
        *(
            (f"vLLM's share {mem.vllm_share_gib} GiB, {ch.gpu_memory_utilization.why}",)
            if d.rollout == "vllm"
            else ()
        ),
    )
    if sp > 1:
        add(
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
            sp,
            f"Ulysses SP {sp}: {ch['sequence_parallel']['why']} (the reference follows the actor's)",
        )
    if t.lora_rank:
        add("++actor_rollout_ref.model.lora_rank", t.lora_rank)
        add("++actor_rollout_ref.model.lora_alpha", t.lora_rank)
        add("++actor_rollout_ref.model.target_modules", "all-linear")
    if d.verl.lora_orig_params_key:
        add("++" + d.verl.lora_orig_params_key, "True")
    if d.verl.attention_override:
        add(d.verl.attention_override, d.attention)
        if al.critic:  # the critic's model section has the same key
            add(d.verl.attention_override.replace("actor_rollout_ref.model", "critic.model"), d.attention)
    if not d.features.torch_compile:
        add("actor_rollout_ref.actor.use_torch_compile", "False")
    # a key the plan sets with `++` anyway (the mixed-precision param dtype verl 0.8+'s FSDP
    # engine takes its autocast from) is not set twice; its section's `dtype` (read by the
    # Megatron engine only) is set to the same dtype, so the composed config holds no other
    plain = {a.key.lstrip("+") for a in out} | {f"{d.verl.critic_fsdp}.mixed_precision.param_dtype"}
    for part, key in d.verl.autocast_keys.items():
        if al.critic or part != "critic":
            if key in plain:
                key = key.rsplit(".mixed_precision.", 1)[0] + ".dtype"
            add(key, TORCH_DTYPE[getattr(pr, part)])
    for setting in al.extra:
        key, _, value = setting.partition("=")
        add(key, value)
    if al.critic:
        fsdp = d.verl.critic_fsdp
        critic_micro = mb.critic_ppo_micro_batch_size_per_gpu
        add("critic.optim.lr", CRITIC_LR)
        add("critic.model.path", "$MODEL", shell=True)
        add("critic.model.use_remove_padding", _b(d.features.remove_padding))
        add("critic.model.enable_gradient_checkpointing", _b(t.gradient_checkpointing))
        add("critic.ppo_micro_batch_size_per_gpu", critic_micro)
        if d.verl.engine_batches:
            add(
                f"++{fsdp}.use_dynamic_bsz",
                "False",
                "the critic's engine takes its own micro-batches (left alone it packs 32768-token dynamic ones)",
            )
            add(f"++{fsdp}.micro_batch_size_per_gpu", critic_micro)
            add(f"++{fsdp}.infer_micro_batch_size_per_gpu", critic_micro)
        if sp > 1:
            add("critic.ulysses_sequence_parallel_size", sp)
            add(f"++{fsdp}.ulysses_sequence_parallel_size", sp)
        add(f"{fsdp}.param_offload", _b(t.param_offload))
        add(f"{fsdp}.optimizer_offload", _b(t.optimizer_offload))
        add(f"++{fsdp}.mixed_precision.param_dtype", pr.critic)
        critic_note: tuple[str, ...] = ()
    else:
        critic_note = (f"no critic: {al.name} needs none (verl trains one for gae only)",)
    add("trainer.logger", "[console]", *critic_note)
    add("trainer.val_before_train", "False")
    add("trainer.n_gpus_per_node", "$N_GPUS", shell=True)
    if d.cluster.nodes > 1:
        add("trainer.nnodes", "$NNODES", shell=True)
    else:
        add("trainer.nnodes", 1)
    add("trainer.save_freq", -1)
    add("trainer.test_freq", mb.test_freq)
    add("trainer.total_epochs", 1)
    return tuple(_megatron(env, out)) if env.megatron else tuple(out)


# the FSDP sections' keys and where the Megatron engine keeps the same setting (its mixed
# precision and model dtype have no counterpart: megatron.dtype is its one compute dtype)
_FSDP_SECTIONS = (
    ("actor_rollout_ref.actor.fsdp_config.", "actor_rollout_ref.actor.megatron."),
    ("actor_rollout_ref.ref.fsdp_config.", "actor_rollout_ref.ref.megatron."),
    ("critic.fsdp.", "critic.megatron."),
)
_LAYOUT_KEYS = (
    ("tensor_model_parallel_size", "tp"),
    ("pipeline_model_parallel_size", "pp"),
    ("expert_model_parallel_size", "ep"),
    ("expert_tensor_parallel_size", "etp"),
    ("context_parallel_size", "cp"),
)


def _megatron(env: ResolvedEnv, out: list[RunArg]) -> list[RunArg]:
    """The run on verl's Megatron engine: the release's keys that select it first
    (model_engine=megatron), each FSDP section's setting moved to the Megatron section, and the
    layout of the memory plan for the actor (the reference follows it) and the critic."""
    mg, lay = env.megatron, env.train.megatron
    assert mg is not None and lay is not None  # (the resolver sets both for --engine megatron)
    critic = env.algorithm.critic
    # the config-group choice (a key without a dot: model_engine) first, then the settings in
    # their sorted order (as envbuild.json holds them: a file's record reads back the same)
    keys = sorted(
        ((k, v) for k, v in mg.keys.items() if critic or not k.startswith("critic.")),
        key=lambda kv: ("." in kv[0], kv[0]),
    )
    chosen = env.memory.choices.megatron
    why = chosen.why if chosen else ""
    head = [
        RunArg(
            key=keys[0][0],
            value=keys[0][1],
            notes=(f"verl's Megatron engine: layout {lay.words()}" + (f", {why}" if why else ""),),
        )
    ]
    moved: list[RunArg] = []
    for a in out:
        bare = a.key.lstrip("+")
        for fsdp, megatron in _FSDP_SECTIONS:
            if bare.startswith(fsdp):
                rest = bare[len(fsdp) :]
                if rest.startswith("mixed_precision.") or rest == "model_dtype":
                    break  # (no counterpart)
                moved.append(a._replace(key=a.key[: len(a.key) - len(bare)] + megatron + rest))
                break
        else:
            moved.append(a)
    sections = ["actor_rollout_ref.actor.megatron"] + (["critic.megatron"] if critic else [])
    layout = [
        RunArg(key=f"{section}.{key}", value=str(getattr(lay, field)))
        for section in sections
        for key, field in _LAYOUT_KEYS
    ]
    extra = [RunArg(key=k, value=str(v)) for k, v in keys[1:]]
    tp = env.train.rollout_tp or 1
    if env.memory.arch.experts and tp > 1:
        extra.append(
            RunArg(
                key="actor_rollout_ref.rollout.expert_parallel_size",
                value=str(tp),
                notes=(f"vLLM spreads the experts over the rollout's {tp} GPUs (verl: EP = TP x DP)",),
            )
        )
    return head + moved + layout + extra


def overrides(args: tuple[RunArg, ...], env: Mapping[str, str]) -> list[str]:
    """The overrides as the run script passes them, its variables taken from `env`
    (MODEL, DATA_DIR, N_GPUS and, on several nodes, NNODES)."""
    return [a.text(env) for a in args]


def _value(text: str) -> int | bool | str:
    """A plain override value as Hydra reads it, for the arithmetic (ints, booleans, text)."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text in ("True", "true", "False", "false"):
        return text.lower() == "true"
    return text


def _section(node: dict[str, object], key: str) -> dict[str, object]:
    """The mapping at `key` of a config being built, made where it is missing."""
    sub = node.setdefault(key, {})
    if not isinstance(sub, dict):
        raise ValueError(f"{key}: set as a value and as a section")
    return sub


def as_config(args: tuple[RunArg, ...], env: Mapping[str, str]) -> dict[str, object]:
    """The overrides as a nested mapping (what they set of the composed config), for
    envbuilder/model/batches.py; the release's defaults (rollout.n 1, one node) stay implied."""
    out: dict[str, object] = {}
    for a in args:
        key, _, value = a.text(env).partition("=")
        node = out
        *parents, last = key.lstrip("+").split(".")
        for p in parents:
            node = _section(node, p)
        node[last] = _value(value)
    # what verl's config interpolates (critic.yaml: ppo_mini_batch_size follows the actor's)
    critic = out.get("critic")
    actor = lookup(out, "actor_rollout_ref.actor", {})
    if isinstance(critic, dict) and "ppo_mini_batch_size" not in critic and isinstance(actor, dict):
        if "ppo_mini_batch_size" in actor:
            critic["ppo_mini_batch_size"] = actor["ppo_mini_batch_size"]
    return out


def world(env: ResolvedEnv) -> dict[str, str]:
    """The script's variables as the plan's own defaults expand them (its GPUs and nodes)."""
    return {
        "MODEL": env.train.model,
        "DATA_DIR": "/data",
        "N_GPUS": str(env.train.n_gpus),
        "NNODES": str(env.cluster.nodes),
    }
