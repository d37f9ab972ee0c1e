"""A resolved environment in words, for people: `envbuild list`'s table, `envbuild show`'s
summary and `show --memory`'s budget term by term. Pure functions of the matrix and the
resolved environment (no click, no I/O):

    print(show_text(m, "p40", Overrides()))
    print("\n".join(memory_lines(resolve(m, "p40"))))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import json

from envbuilder.model.components import registry as COMPONENTS

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import Overrides, ResolvedEnv


def list_rows(m: Matrix) -> list[dict[str, object]]:
    """Each profile's line of `envbuild list` (its --json form)."""
    rows = []
    for name, p in m.profiles.items():
        gpu = m.gpus[p["gpu"]]
        rows.append(
            {
                "profile": name,
                "gpu": gpu["name"],
                "cc": gpu["compute_capability"],
                "vram_gb": gpu["vram_gb"],
                "cuda": p["cuda"],
                "torch": p["torch"],
                "verl": p["verl"],
                "rollout": p["rollout"],
                "description": p["description"],
            }
        )
    return rows


def list_table(rows: list[dict[str, object]]) -> str:
    """`envbuild list`: the rows as aligned columns under a header."""
    header = ("PROFILE", "GPU", "CC", "CUDA", "TORCH", "VERL", "ROLLOUT")
    table = [header] + [
        (r["profile"], r["gpu"], r["cc"], r["cuda"], r["torch"], r["verl"], r["rollout"]) for r in rows
    ]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def show_text(
    m: Matrix,
    profile: str,
    overrides: Overrides | None = None,
    *,
    memory: bool = False,
    as_json: bool = False,
) -> str:
    """What `envbuild show PROFILE` prints (with a final newline): the summary, the resolved
    environment as JSON, or (`memory`) the memory plan as text or JSON. Every URL's
    user:password@ (an overlay's index, say) is shown as ***@."""
    from envbuilder.text import redact

    return redact(_show_text(m, profile, overrides, memory=memory, as_json=as_json))


def _show_text(
    m: Matrix,
    profile: str,
    overrides: Overrides | None = None,
    *,
    memory: bool = False,
    as_json: bool = False,
) -> str:
    from envbuilder.model.resolve import held_back, resolve

    env = resolve(m, profile, overrides)
    if memory and as_json:
        from envbuilder.record import plain

        return json.dumps({"profile": env.name, "memory": plain(env.memory)}, indent=2, sort_keys=True) + "\n"
    if memory:
        return "\n".join(memory_lines(env)) + "\n"
    if as_json:
        return env.to_json()
    lines = [
        *([f"card       {env.title}"] if env.card else []),  # (the card asked for, on the profile's stack)
        f"profile    {env.profile}: {env.description}",
        f"gpu        {env.gpu.name} (CC {env.gpu.compute_capability}, {env.gpu.vram_gb} GB)",
        *board_lines(m, env),
        f"cuda       {env.cuda.version} ({env.cuda.images['runtime']}), driver >= {env.driver.min_driver}",
        f"python     {env.python}",
        f"torch      {' '.join(env.torch.packages)}"
        + (f" from {env.torch.index_url}" if env.torch.index_url else " from PyPI"),
        f"rollout    {env.rollout}" + (f" (vllm {env.vllm.version})" if env.vllm else ""),
        f"verl       {env.verl.version}",
        f"algorithm  {env.algorithm.name}"
        + ("" if env.algorithm.critic else " (no critic)")
        + (f", {env.algorithm.n} responses per prompt" if env.algorithm.n > 1 else "")
        + f"; --algo also takes {', '.join(available_algorithms(m, env))}",
        f"cluster    {env.cluster.nodes} node(s) x {env.cluster.gpus_per_node} GPU(s)"
        + (f", {env.cluster.interconnect}" if env.cluster.interconnect else "")
        + (f" ({', '.join(f'{k}={v}' for k, v in env.cluster.env.items())})" if env.cluster.env else ""),
        f"precision  {env.dtype}, attention {env.attention}, remove_padding "
        f"{env.features.remove_padding}, torch.compile {env.features.torch_compile}",
        f"extensions {', '.join(c.section for c in COMPONENTS.built(env)) or 'none'}",
        f"patches    {', '.join(p.name for p in env.patches) or 'none'}",
    ]
    if env.megatron and env.train.megatron:
        mg, lay = env.megatron, env.train.megatron
        lines.insert(
            -2,
            f"engine     megatron, {lay.words()} ("
            + ", ".join(f"{k} {v}" for k, v in mg.packages.items() if k in ("megatron-core", "mbridge"))
            + f", TransformerEngine {mg.transformer_engine}: its PyTorch extension compiled for sm_{mg.te_arch})",
        )
    mem = env.memory
    lines.append(
        f"memory     peak {mem.peak.gib:.1f} GiB of {mem.usable_gib:.1f} usable "
        f"({mem.peak.phase}); `--memory` for the budget"
    )
    lines += [f"plan       {n}" for n in env.notes]
    lines += [f"held back  {h}" for h in held_back(m, profile, overrides)]
    lines += [f"WARNING    {w}" for w in env.warnings]
    return "\n".join(lines) + "\n"


BOARDS = {"sxm": "an SXM module", "pcie": "a PCIe card", "superchip": "a superchip"}


def board_lines(m: Matrix, env: ResolvedEnv) -> list[str]:
    """The card's identity beside its name and CC (gpus.yaml's form_factor and interconnect,
    the latter in interconnects.yaml's words), where its record has them."""
    gpu = m.gpus.get(env.gpu.key) or {}
    ic = (m.sections.get("interconnects") or {}).get(gpu.get("interconnect") or "")
    form: str = gpu.get("form_factor") or ""
    said = [BOARDS.get(form, form)] if form else []
    said += [str(ic["description"])] if ic else []
    return [f"board      {'; '.join(said)}"] if said else []


def available_algorithms(m: Matrix, env: ResolvedEnv) -> list[str]:
    """The estimators env's verl release has that the recipe can run, besides env's own."""
    from envbuilder.model.versions import version_key

    return [
        name
        for name, rec in (m.sections.get("algorithms") or {}).items()
        if name != env.algorithm.name
        and not rec.get("refused")
        and version_key(env.verl.version) >= version_key(rec["since"])
    ]


# The run script's names for the planned sizes (templates/run_ppo_gsm8k.sh.j2 writes them).
BATCH_KEYS = (
    ("val_batch_size", "data.val_batch_size"),
    ("rollout_micro_batch_size", "+actor_rollout_ref.rollout.micro_batch_size"),
    ("max_num_seqs", "actor_rollout_ref.rollout.max_num_seqs"),
    (
        "log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.{rollout,ref}.log_prob_micro_batch_size_per_gpu",
    ),
    ("actor_ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("critic_ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu"),
    ("test_freq", "trainer.test_freq"),
)


PHASE_BATCH = {"generation": "generation", "log_prob": "log_prob", "actor": "actor", "critic": "critic"}


def memory_lines(env: ResolvedEnv) -> list[str]:
    """`show --memory`: the budget line by line (term, formula, GiB) and the chosen sizes."""
    from envbuilder.model.memory import allocator_overhead  # (the one rule of the allocator's headroom)

    mem, a, card = env.memory, env.memory.arch, env.memory.card
    out = [
        f"memory per GPU: {env.gpu.name}, {mem.gpu_total_gib:.1f} GiB"
        + (f" ({card.mib} MiB: {card.why})" if card else "")
        + " - "
        f"{mem.cuda_context_gib:g} CUDA context"
        + (f" - {mem.nccl_gib:g} NCCL" if mem.nccl_gib else "")
        + f" = {mem.usable_gib:.1f} GiB usable; a planned batch adds "
        f"{mem.allocator_overhead:.0%} for the allocator"
        + (f" ({mem.hf_generate_overhead:.0%} in HF generate)" if env.rollout == "hf" else "")
        + f" and leaves {mem.margin:.0%} free",
        f"model {mem.model}: {a.layers} layers, hidden {a.hidden_size}, "
        f"{a.attention_heads} heads ({a.kv_heads} KV) x {a.head_dim}, MLP "
        + (
            f"{a.experts} experts of {a.moe_intermediate_size} ({a.experts_per_token} a token)"
            if a.experts
            else f"{a.intermediate_size}"
        )
        + f", vocab {a.vocab_size}, "
        f"{'tied' if a.tied_embeddings else 'untied'} embeddings, {a.parameters:,} params"
        + (f" (+{a.lora_parameters:,} LoRA)" if a.lora_parameters else ""),
        (
            f"{env.cluster.nodes} nodes x {env.train.n_gpus} GPUs = "
            f"{env.cluster.nodes * env.train.n_gpus} GPUs"
            if env.cluster.nodes > 1
            else f"{env.train.n_gpus} GPU(s)"
        )
        + f", {env.dtype}, {env.attention} attention, "
        f"{env.rollout} rollout, sequences {mem.sequence.prompt} + "
        f"{mem.sequence.response}, rollout batch {mem.rollout_batch_per_gpu} and "
        f"mini-batch {mem.mini_batch_per_gpu} per GPU, {mem.validation_rows} validation "
        "prompts",
    ]
    width = max(len(t.term) for p in mem.phases for t in p.terms)
    for p in mem.phases:
        key = p.key
        head = f"{p.phase}" + (f" at batch {p.batch}" if key in PHASE_BATCH else "")
        bound = mem.bound_by.get(key)
        # the comparison that decides "fits": the tensors plus the allocator's headroom
        oh = allocator_overhead(env.rollout, key, mem.hf_generate_overhead, mem.allocator_overhead)
        exempt = (p.exempt_bytes or 0) / 2**30
        need = (p.total_gib - exempt) * (1 + oh) + exempt
        # one figure, one spelling: a phase whose budget is the usable memory says it as the
        # header does (budget_gib keeps 3 decimals, usable_gib 2: 78.648 and 78.65 read 78.6 and 78.7)
        budget = mem.usable_gib if abs(p.budget_gib - mem.usable_gib) < 0.01 else p.budget_gib
        out += [
            "",
            f"{head}: {p.total_gib:.2f} GiB + {oh:.0%} allocator headroom = {need:.2f} GiB of "
            f"{budget:.1f}"
            + (f" (batch bounded by {bound})" if bound else "")
            + ("" if p.fits else "  DOES NOT FIT"),
        ]
        out += [f"  {t.term:<{width}}  {t.gib:7.2f}  {t.formula}" for t in p.terms]
    out += [
        "",
        f"peak: {mem.peak.phase}, {mem.peak.gib:.2f} GiB of {mem.usable_gib:.1f} usable",
        "",
        "batch sizes (run_ppo_gsm8k.sh):",
    ]
    kw = max(len(k) for _, k in BATCH_KEYS)
    sizes = mem.batch.sizes()
    out += [f"  {key:<{kw}}  {sizes[name]}" for name, key in BATCH_KEYS if sizes[name] is not None]
    return out
