"""Profile + overrides -> ResolvedEnv, or the list of rules the combination breaks.

Pure: reads only the Matrix. Every rule reads its threshold from the data; no GPU name or
version is spelled out here. A Violation says what, why and a concrete fix; `hard` ones stay
errors under --allow-unsupported (the combination cannot work at all), the others become
warnings that are written into the rendered files.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, TypeVar
from collections.abc import Mapping

from envbuilder import __version__
from envbuilder.model import resolved as R
from envbuilder.model.components import flash_attn as FA
from envbuilder.errors import UserError
from envbuilder.model import entries as E
from envbuilder.model.matrix import Entry, Matrix, at_least
from envbuilder.model.versions import in_range, version_key
from envbuilder.record import Record, frozen, plain
from envbuilder.model.resolved import SCHEMA_VERSION, Overrides, ResolvedEnv  # noqa: F401  (re-exported)
from envbuilder.model.memory_plan import Card, MemoryPlan
from envbuilder.model.components import Refusal
from envbuilder.model.components import registry as COMPONENTS
from envbuilder.model.components import cuda as CUDA
from envbuilder.model.components.cuda import stacks_for_driver
from envbuilder.model.components import sglang as SGLANG
from envbuilder.model.components import torch as TORCH
from envbuilder.model.components import verl as VERL
from envbuilder.model.components.verl import INSTALLABLE_ROLLOUTS  # noqa: F401  (the rollouts a profile may name)
from envbuilder.model.components import vllm as VLLM
from envbuilder.model.versions import ranges_overlap
from envbuilder.model.names import profile_named, suggest, unknown_name_hint
from envbuilder.model.selection import Selection
from envbuilder.model import flags as F

# the torch dtype of each of envbuild's dtype names
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# the precision audit's checks (envbuilder/images/audit_precision.py implements them) and the
# condition under which each applies (one of the conditions a patch's `when` names)
from envbuilder.model.matrix_schema import AUDIT_CHECKS  # noqa: E402,F401  (re-exported)

T = TypeVar("T")

# each matrix's memory plans by their inputs (_Resolver.memory_plan)
_PLANS: "weakref.WeakKeyDictionary[Matrix, dict[str, MemoryPlan]]" = weakref.WeakKeyDictionary()


class Violation(Record):
    """A broken rule: what, why and a concrete fix; `hard` ones survive --allow-unsupported."""

    rule: str
    what: str
    why: str
    fix: str
    hard: bool = False

    def text(self) -> str:
        return f"{self.what}: {self.why}. Fix: {self.fix}."


class ResolveError(UserError):
    def __init__(self, profile: str, violations: list[Violation]):
        self.profile = profile
        self.violations = violations
        lines = [f"Profile {profile!r} cannot be resolved as asked:"]
        lines += [f"  - [{v.rule}] {v.text()}" for v in violations]
        if not any(v.hard for v in violations):
            lines.append("  (--allow-unsupported renders anyway and writes these warnings into the files.)")
        super().__init__("\n".join(lines))


def rounded_batch(train: E.TrainBlock, world: int) -> int:
    """The train batch a profile's `train` block takes on `world` GPUs: the mini-batch rounded up
    to a multiple of the world, the batch to a multiple of that (cluster_plan)."""
    mini = min(train["ppo_mini_batch_size"], train["train_batch_size"])
    mini = -(-mini // world) * world
    return int(-(-train["train_batch_size"] // mini) * mini)


def with_run_plan(env: ResolvedEnv) -> ResolvedEnv:
    """The environment with its run plan (envbuilder/model/runplan.py), checked against the batch
    arithmetic the release's workers assert: a plan verl would refuse mid-run is a bug here, not
    a user's first failed step."""
    from envbuilder.model import runplan
    from envbuilder.model.batches import violations

    run = runplan.build(env)
    cfg = runplan.as_config(run, runplan.world(env))
    problems = violations(cfg, env.verl.engine_batches, env.verl.critic_fsdp)
    if problems:
        raise AssertionError(f"the run plan of {env.profile} breaks verl's batch arithmetic: {problems}")
    return env._replace(run=run)


def legacy_trainer(verl: E.VerlEntry, algo: E.AlgorithmEntry) -> tuple[str, ...]:
    """`trainer.use_v1=False` where the release's default trainer (v1) never computes what the
    estimator needs (algorithms.yaml `v1: false`, verl.yaml `trainer_v1`), else nothing."""
    v1 = verl.get("trainer_v1")
    if v1 and algo.get("v1", True) is False:
        return (f"{v1['key']}=False",)
    return ()


def training_path(
    m: Matrix, verl_v: str, rollout: str, components: tuple[str, ...] = (), vllm_v: str | None = None
) -> list[str]:
    """The modules a PPO run (verl.trainer.main_ppo, FSDP) imports, in the order preflight and the
    smoke test import them: the compiled parts first (each names the package that is broken:
    vllm's ops for the vllm rollout, then `components` in the registry's order), then verl's trainer,
    workers, dataset and reward, then the rollout's own modules. Every name comes from the matrix."""
    t = m.typed
    parts: list[list[str]] = []
    if rollout == "vllm":  # a release whose compiled ops moved records its own (vllm.yaml)
        vr = t.vllm.get(vllm_v) if vllm_v else None
        parts.append((vr.get("modules") if vr else None) or t.vllm_training_path["modules"])
    if rollout == "sglang" and t.sglang_training_path:  # its compiled ops first, as vLLM's
        sr = t.sglang.get(SGLANG.of(m, verl_v) or "")
        parts.append((sr.get("modules") if sr else None) or t.sglang_training_path["modules"])
    parts += COMPONENTS.training_modules(m, components)
    path = t.verl[verl_v]["training_path"]
    parts += [path["modules"], path["rollouts"].get(rollout, [])]
    return list(dict.fromkeys(name for part in parts for name in part))


def _stored_plan(inputs: list[object], compute: Callable[[], MemoryPlan]) -> MemoryPlan:
    """compute(), the memory plan of `inputs` (plain data), kept as a sealed cache entry
    (paths.sealed_text) by the sha256 of the inputs and of memory.py's code. The plan's search
    over batch sizes is most of a profile's resolution, and every `envbuild render` resolves
    in a fresh process. Plain JSON both ways: the plan's records to_dict() and from_plain()."""
    import hashlib
    import json
    import os

    from envbuilder.paths import sealed_text, source

    try:  # (the plan's code by its paths: a plan read back needs none of it)
        h = hashlib.sha256()
        for name in ("memory.py", "memory_plan.py", "arch.py", "megatron.py"):
            h.update(source(os.path.join(os.path.dirname(__file__), name)))
        h.update(json.dumps(inputs, sort_keys=True).encode())
    except (OSError, TypeError, ValueError):  # (no source to key on, or not plain data)
        return MemoryPlan.from_plain(json.loads(json.dumps(plain(compute()))))
    data = json.loads(sealed_text("plan", h.hexdigest(), lambda: json.dumps(plain(compute()))))
    if not isinstance(data, dict):
        raise ValueError("a memory plan of the cache is no JSON object")
    return MemoryPlan.from_plain(data)


def speed_notes(verl: E.VerlEntry, s: "Selection", remove_padding: bool) -> tuple[str, ...]:
    """Why each speed setting of the run is what it is, one sentence each (the run script's
    SPEED lines): remove padding, the fused log-prob kernels, token-budget micro-batches."""
    speed = verl.get("speed")
    v = s.verl_v
    out = []
    if remove_padding:
        out.append(
            "remove padding on: flash-attn's varlen attention runs packed sequences without their padding"
        )
    elif not s.feats.get("remove_padding", True):
        out.append(
            f"remove padding off: verl unpads through flash-attn's varlen kernels, which need CC 8.0 "
            f"(this card is CC {s.cc}); {s.attention} attention runs each micro-batch padded"
        )
    else:
        out.append(
            f"remove padding off: {s.attention} attention has no varlen path for packed sequences in verl {v} "
            "(flash-attn has: `--with flash-attn` turns it on), so micro-batches are padded"
        )
    if s.fused and speed:
        out.append(
            f"log-probs and entropy by verl's fused {s.fused} kernels (use_fused_kernels): {speed['fused_why']}"
        )
    elif speed:
        out.append(f"no fused log-prob kernels: none of verl {v}'s backends runs on CC {s.cc}")
    else:
        out.append(
            f"no fused log-prob kernels or token budgets: the plan knows none for verl {v} (verl.yaml speed); "
            "micro-batches are counts of padded sequences"
        )
    if s.dynamic_bsz and speed:
        out.append(
            "micro-batches by token budget (use_dynamic_bsz), each the plan's micro-batch x (prompt + response) "
            f"tokens: {speed['dynamic_why']}"
        )
    return tuple(out)


class _Resolver:
    def __init__(self, m: Matrix, profile_name: str, ov: Overrides):
        self.m, self.ov = m, ov
        self.v: list[Violation] = []
        named = profile_named(m, profile_name)
        if named is None:
            raise UserError(
                f"Unknown profile {profile_name!r}; {unknown_name_hint(m, profile_name)}"
                f"Known profiles: {', '.join(m.profiles)}, or a GPU's name (H100, RTX 4090, "
                "A100-SXM4-40GB). `envbuild list` shows them; add your own with --matrix-dir."
            )
        self.named = named  # (a card without a profile: the profile's stack, on that card)
        profile_name = named.profile
        self.name = profile_name
        self.p = m.profiles[profile_name]
        self.algo_rec: dict[str, Any] | None = None  # the selection's estimator (select() sets it)
        # whether the release's workers assert that each GPU's data divides every micro-batch
        self.engine_batches = False
        # verl's training engine and the Megatron layout the user gave (select_engine sets them)
        self.engine = "fsdp"
        self.megatron_layout: dict[str, int] | None = None
        # verl's fused log-prob backend for the card (select() sets it; verl.yaml speed)
        self.fused: str | None = None
        # the model table, with --model's shape where the table lacks it (its config.json)
        self.models = m.models
        if ov.model and ov.model not in m.models:
            if not ov.model_arch:
                raise UserError(
                    f"--model {ov.model!r} is not in the model table "
                    f"({', '.join(m.models)}) and its shape was not read. Pass a hub "
                    "repo id or a folder holding its config.json."
                )
            self.models = {**m.models, ov.model: dict(ov.model_arch)}

    def refuse(self, x: Refusal | None) -> None:
        """A building block's refusal (model/components/), as the block made it."""
        if x is not None:
            self.add(x.code, x.what, x.why, x.fix, hard=x.hard)

    def add(self, rule: str, what: str, why: str, fix: str, hard: bool = False) -> None:
        self.v.append(Violation(rule, what, why, fix, hard))

    def release(self, kind: str, version: str, releases: dict[str, T]) -> T:
        """A component's release record (apex, flash-attn), or a clear error naming the known ones."""
        if version not in releases:
            raise UserError(
                f"{kind} {version!r} is not in the matrix; known: {', '.join(releases)}. "
                "Add it in a --matrix-dir overlay if you need it."
            )
        return releases[version]

    def pick(self, kind: str, table: dict[str, T], value: str, by_name: bool = False) -> T:
        """The record of `value` in `table` (a section of the matrix), or a clear error naming
        the known ones (by name as the matrix lists them, else by version)."""
        if value not in table:
            known = list(table) if by_name else sorted(table, key=version_key)
            raise UserError(
                f"{kind} {value!r} is not in the matrix; {suggest(value, known)}known: "
                f"{', '.join(known)}. Add it in a --matrix-dir overlay if you need it."
            )
        return table[value]

    # -- the rules ---------------------------------------------------------------------------

    def pypi_name_rule(self, pins: dict[str, str]) -> None:
        """A pin of a name that PyPI gives to another project (dependencies.yaml pypi_names)."""
        names = self.m.typed.pypi_names or {}
        for pkg in sorted(pins):
            rec = names.get(pkg.split("[", 1)[0].lower())
            if rec:
                self.add(
                    "pypi-name",
                    f"{pkg}=={pins[pkg]} from PyPI is not the {pkg} a training environment means",
                    rec["is"],
                    rec["fix"],
                    hard=True,
                )

    def shared_dependency_rule(self, packages: dict[str, str]) -> None:
        """Two installed packages whose requirements on one dependency cannot both hold (pip
        installs them in different layers without noticing), or a pin outside a requirement."""
        needs: dict[str, list[tuple[str, str]]] = {}
        for pkg, ver in sorted(packages.items()):
            rec = self.m.typed.requires.get(pkg, {}).get(ver)
            for dep, spec in sorted((rec["needs"] if rec else {}).items()):
                needs.setdefault(dep, []).append((f"{pkg}=={ver}", spec))
        for dep, wants in sorted(needs.items()):
            pinned = packages.get(dep)
            if pinned is not None:
                for who, spec in wants:
                    if not in_range(pinned, spec):
                        self.add(
                            "shared-dependency",
                            f"{dep}=={pinned} is pinned but {who} needs {dep}{spec}",
                            "pip would install one and break the other "
                            "(`pip check` fails; uv refuses to resolve it)",
                            f"pin {dep} inside {spec}, or choose another {who.split('==')[0]}",
                            hard=True,
                        )
                continue
            for i, (who_a, spec_a) in enumerate(wants):
                for who_b, spec_b in wants[i + 1 :]:
                    if not ranges_overlap(spec_a, spec_b):
                        self.add(
                            "shared-dependency",
                            f"{who_a} and {who_b} cannot be installed together",
                            f"{who_a} needs {dep}{spec_a}, {who_b} needs "
                            f"{dep}{spec_b}; installed in separate layers every step exits 0 "
                            "and the result is broken",
                            f"pin {who_b.split('==')[0]} (or "
                            f"{who_a.split('==')[0]}) to a release whose {dep} requirement "
                            "meets the other's, in the profile's `pins`",
                            hard=True,
                        )

    def memory_plan(
        self,
        gpu_key: str,
        gpu: dict[str, Any],
        dtype: str,
        attention: str,
        rollout: str,
        train: dict[str, Any],
        lora_flat: bool = False,
        algo: Entry | None = None,
    ) -> MemoryPlan:
        mem = self.m.memory
        total: Entry | None = mem["total_mib"].get(gpu_key)
        card = card_size(total, gpu, self.ov.ecc, self.ov.gpu_memory)
        consts = dict(mem, total_gib=card.mib / 1024)
        algo = algo or self.algo_rec or {"critic": True, "n": 1}
        # the same inputs give the same plan: computed once per matrix (a grid or a fix walk
        # resolves one profile under many overrides; the plan is most of a resolution's time)
        import json

        arch = self.models[train["model"]]
        key = (
            json.dumps(
                [gpu_key, gpu, dtype, attention, rollout, train, lora_flat, algo, arch, card.to_dict()],
                sort_keys=True,
                default=str,
            )
            + str(getattr(self, "nodes", 1))
            + str(self.engine_batches)
            + str(self.fused)
            + str(
                (
                    getattr(self, "pinned", ()),
                    getattr(self, "unpadded", False),
                    getattr(self, "actor_offload_ok", True),
                    getattr(self, "engine", "fsdp"),
                    getattr(self, "megatron_layout", None),
                )
            )
        )
        known = _PLANS.setdefault(self.m, {})
        if key in known:
            return known[key]
        env: dict[str, object] = {
            "dtype": dtype,
            "attention": attention,
            "rollout": rollout,
            "train": train,
            "lora_flat_grads": lora_flat,
            "critic": algo["critic"],
            "rollout_n": algo["n"],
            "extra_generation": algo.get("extra_generation", False),
            "nodes": getattr(self, "nodes", 1),
            "engine_batches": self.engine_batches,
            "fused_kernels": self.fused,
            "pinned": sorted(getattr(self, "pinned", ())),
            "remove_padding": getattr(self, "unpadded", False),
            "actor_offload_ok": getattr(self, "actor_offload_ok", True),
            "engine": getattr(self, "engine", "fsdp"),
        }
        if getattr(self, "megatron_layout", None):
            env["train"] = dict(train, megatron_pinned=self.megatron_layout)
        rows: int = self.m.datasets["gsm8k"]["rows"]["test"]

        def compute() -> MemoryPlan:
            from envbuilder.model.memory import plan

            return plan(env, arch, consts, rows)

        out = _stored_plan([key, consts, rows], compute)._replace(card=card)
        known[key] = out  # (a record: nothing changes it)
        return out

    def memory_rule(self, s: "Selection") -> None:
        """When no batch fits the GPU (the selection's memory plan, envbuilder/model/memory.py): why,
        and which change to the profile would fit."""
        gpu = s.gpu
        train = s.train
        mem: MemoryPlan = s.memory
        if not mem.problems:
            return

        def fits(algo: Entry | None = None, **changes: Any) -> bool:
            changed = dict(train, **changes)
            if "param_offload" in changes:  # the actor's only where its rollout allows it
                changed["actor_param_offload"] = changes["param_offload"] and s.actor_offload_ok
            return not self.lora_memory(s, changed, algo)[0].problems

        fixes = []
        # without a critic (GRPO: no critic weights, gradients or Adam state) a run fits where
        # the critic's state does not: the seed 4090 report's 7B LoRA run is that case
        grpo = self.m.algorithms.get("grpo")
        critic_free = (
            s.algo_rec["critic"]
            and grpo is not None
            and version_key(s.verl_v) >= version_key(grpo["since"])
            and fits(algo=grpo)
        )
        size = self.models[train["model"]]["parameters"]
        moe = bool(self.models[train["model"]].get("experts"))
        # (the largest that fits, of the same kind where one does: a dense model for a dense one,
        # a mixture for a mixture)
        smaller = [
            (r["parameters"], name)
            for _, _, name, r in sorted(
                (bool(r.get("experts")) == moe, r["parameters"], name, r)
                for name, r in self.m.models.items()
                if r["parameters"] < size and fits(model=name)
            )
        ]
        prompt, response = train["max_prompt_length"], train["max_response_length"]
        while prompt + response > 128:
            prompt, response = max(prompt // 2, 32), max(response // 2, 32)
            if fits(max_prompt_length=prompt, max_response_length=response):
                fixes.append(
                    f"shorter sequences: train.max_prompt_length {prompt} and max_response_length {response}"
                )
                break
        # more GPUs shard the state: more of them in the node, up to what a node holds
        # (gpus.yaml max_per_node, else 8), then more nodes (--gpus-per-node, --nodes: flags)
        per_node, nodes = train["n_gpus"], getattr(self, "nodes", 1)
        most = max(int(gpu.get("max_per_node", 8)), per_node)

        def divides(world: int) -> bool:
            return not (train["train_batch_size"] % world or train["ppo_mini_batch_size"] % world)

        def fits_on(n_nodes: int) -> bool:
            self.nodes = n_nodes  # (the world memory_plan reads)
            try:
                return fits()
            finally:
                self.nodes = nodes

        more = next(
            (
                f"--gpus-per-node {n} (the state sharded over {n} GPUs fits)"
                for n in (2, 4, 8, 16)
                if per_node < n <= most and divides(n * nodes) and fits(n_gpus=n)
            ),
            None,
        ) or next(
            (
                f"--nodes {k} (the state sharded over {k} × {per_node} GPUs fits)"
                for k in (2, 4, 8, 16)
                if k > nodes and divides(k * per_node) and fits_on(k)
            ),
            None,
        )
        if not mem.host.fits:
            need = math.ceil(mem.host.gib / (1 - mem.margin))
            fixes.insert(0, f"pass --host-memory {need} where each node has {need} GiB for offload")
        fix = memory_fix(fixes, smaller, more, critic_free)
        if self.megatron_layout:  # (the user's layout: the plan's own may fit)
            given, self.megatron_layout = self.megatron_layout, None
            try:
                own = self.lora_memory(s, train)[0]
            finally:
                self.megatron_layout = given
            if not own.problems and own.megatron:
                lay = _layout_words(dict(own.megatron))
                fix = f"drop --megatron (the plan's own layout, {lay}, fits); or {fix}"
        self.add(
            "memory",
            f"{train['model']} does not fit the {gpu['name']} ({mem.gpu_total_gib:.0f} GiB) even at batch 1",
            self.memory_why(mem),
            fix,
        )

    def memory_why(self, mem: MemoryPlan) -> str:
        """Why a plan does not fit: its worst phase against the budget, with the choices tried
        and the three largest terms, and the command that prints the whole budget."""
        worst = max(mem.problems, key=lambda p: p.gib - p.budget_gib)
        phase = next((p for p in mem.phases if p.phase == worst.phase), None)
        top = sorted((phase or mem.host).terms, key=lambda t: -t.gib)[:3]
        where = "per GPU at batch 1" if phase else "a node's host"
        choices = mem.choices
        tried = [
            f"{k} {dict(v) if isinstance(v := choice.value, Mapping) else v}"  # (a layout as the JSON's dict)
            for k in sorted(choices._fields)
            if k != "gpu_memory_utilization" and (choice := getattr(choices, k)) is not None
        ]
        return (
            f"its {worst.phase} phase needs {worst.gib:.1f} GiB {where} "
            f"against {worst.budget_gib:.1f} GiB usable, with {', '.join(tried)} ("
            + ", ".join(f"{t.term} {t.gib:.1f}" for t in top)
            + "; `envbuild show "
            f"{self.named.gpu or self.name} --memory --allow-unsupported` prints the whole budget)"
        )

    # -- the whole: select, then every rule over the selection, then assemble ---------------

    def select(self) -> "Selection":
        """What the profile and the overrides name, read from the matrix, with nothing judged:
        an unknown version is bad input (UserError); every judgement is a rule's. In stages:
        the versions and their records, the rollout's release, the kernels and precision, the
        pins, then the HF-rollout, cluster and memory plans."""
        s = Selection()
        p = self.p = self.stacked(self.p)
        self.select_versions(s, p)
        self.select_rollout(s, p)
        self.select_kernels(s, p)
        self.select_pins(s, p)
        self.select_engine(s)
        self.hf_rollout_plan(s)
        if legacy_trainer(s.verl, s.algo_rec):
            s.notes.append(
                f"trainer.use_v1=False: {s.algo} on verl {s.verl_v} needs the legacy trainer, "
                f"since {s.verl['trainer_v1']['why']}"
            )
        self.cluster_plan(s)
        s.memory, bf16_base = self.lora_memory(s, s.train)
        self.apply_choices(s)
        if bf16_base:
            s.train["actor_model_dtype"] = "bf16"
            s.notes.append(
                "++actor_rollout_ref.actor.fsdp_config.model_dtype=bf16 and the patch "
                "verl-hf-rollout-lora-wrap: with an fp32 base in one flat parameter the model does "
                "not fit, so the frozen base loads in bf16 and each LoRA adapter (fp32) is an FSDP "
                "unit of its own; the reference is the same weights with the adapters off"
            )
        return s

    def select_versions(self, s: "Selection", p: Entry) -> None:
        """The card, the CUDA, torch, verl and algorithm asked for, with their records, the
        components, the Python and the torch build."""
        ov, m, t = self.ov, self.m, self.m.typed
        s.gpu_key = self.named.gpu or str(p["gpu"])  # (the card asked for: its identity and memory)
        s.gpu, s.card = m.gpus[s.gpu_key], t.gpus[s.gpu_key]
        s.cc = s.card["compute_capability"]
        s.cuda_v, s.torch_v = ov.cuda or str(p["cuda"]), ov.torch or str(p["torch"])
        s.verl_v, s.rollout = ov.verl or str(p["verl"]), ov.rollout or str(p["rollout"])
        s.cuda = self.pick("CUDA", t.cuda, s.cuda_v)
        s.torch = self.pick("torch", t.torch, s.torch_v)
        s.verl = self.pick("verl", t.verl, s.verl_v)
        s.algo = ov.algo or str(p.get("algorithm", "gae"))
        s.algo_rec = self.pick("algorithm (--algo)", t.algorithms, s.algo, by_name=True)
        self.algo_rec = m.algorithms[s.algo]  # (the same record, as the memory plan takes it)
        batches = s.verl.get("batches")
        self.engine_batches = bool(batches and batches["engine"])
        s.components = self.select_components(s.torch_v)
        s.python = ov.python or str(p.get("python") or s.cuda["python"])
        s.picked = TORCH.build_for(s.torch, s.cuda_v)
        s.variant, s.build = s.picked or (f"cu{s.cuda_v.replace('.', '')}", {"cuda": s.cuda_v, "archs": []})

    def select_rollout(self, s: "Selection", p: Entry) -> None:
        """The vLLM or SGLang release, the CUDAs their wheels bring, the CUDAs a --cuda
        suggestion may name, and the driver they all need."""
        ov, m, t = self.ov, self.m, self.m.typed
        s.vllm_v = s.vr = None
        s.extra_cudas = []
        if s.rollout == "vllm":
            given: str | None = ov.vllm or p.get("vllm")
            s.vllm_v = given or VLLM.choose(m, s.torch_v, s.verl)
            if s.vllm_v:
                s.vr = self.pick("vllm", t.vllm, s.vllm_v)
                if s.vr["wheel_cuda"] in m.cuda:
                    s.extra_cudas.append(s.vr["wheel_cuda"])
        s.sglang_v = SGLANG.of(m, s.verl_v) if s.rollout == "sglang" else None
        s.sr = t.sglang.get(s.sglang_v) if s.sglang_v else None
        wheel_cuda = s.sr.get("wheel_cuda") if s.sr else None
        if wheel_cuda and wheel_cuda in m.cuda:
            s.extra_cudas.append(wheel_cuda)
        # CUDAs a --cuda suggestion may name: the torch release has a build for them, and the
        # vLLM wheel (if any) shares their major
        s.usable_cudas = [
            c
            for c in m.cuda
            if any(b["cuda"] == c for b in s.torch["builds"].values())
            and all(c.split(".")[0] == x.split(".")[0] for x in s.extra_cudas)
        ]
        s.driver = CUDA.driver_info(m, s.cuda_v, s.cuda, s.extra_cudas, ov.driver)

    def select_kernels(self, s: "Selection", p: Entry) -> None:
        """The card's features, dtype, flash-attn and where it comes from, the attention,
        verl's fused-kernel backend and token budgets (verl.yaml `speed`), apex."""
        t = self.m.typed
        fa_section = t.flash_attn
        s.feats = {k: at_least(s.cc, f["min_compute_capability"]) for k, f in t.features.items()}
        s.dtype = str(p["dtype"])
        if s.dtype == "auto":
            s.dtype = "bf16" if s.card["bf16"] else ("fp16" if s.card["fp16_fast"] else "fp32")
        s.fa = s.components.get("flash-attn")
        s.fa_rec = (
            self.release("flash-attn", s.fa, COMPONENTS.required(fa_section)["versions"]) if s.fa else None
        )
        s.fa_choice = (
            FA.choose(
                COMPONENTS.required(fa_section),
                s.fa,
                cc=s.cc,
                torch_v=s.torch_v,
                torch_cuda=s.build["cuda"],
                python=s.python,
                machine=s.card.get("machine") or "x86_64",
                index=self.ov.flash_attn_index,
            )
            if s.fa
            else None
        )
        fa_usable = s.fa is not None and at_least(
            s.cc, COMPONENTS.required(fa_section)["min_compute_capability"]
        )
        s.attention = str(p["attention"])
        if s.attention == "auto":
            s.attention = "flash_attention_2" if fa_usable else "sdpa"
        # verl's speed settings (verl.yaml `speed`): the first fused-kernel backend the card runs
        speed = s.verl.get("speed")
        s.fused = next(
            (
                f["backend"]
                for f in (speed["fused_kernels"] if speed else ())
                if at_least(s.cc, f["min_compute_capability"])
            ),
            None,
        )
        s.dynamic_bsz = bool(speed and speed["dynamic_bsz"])
        self.fused = s.fused
        s.apex_v = s.components.get("apex")
        s.apex_rec = (
            self.release("apex", s.apex_v, COMPONENTS.required(t.apex)["versions"]) if s.apex_v else None
        )

    def select_pins(self, s: "Selection", p: Entry) -> None:
        """verl's pins, then the vLLM release's own pairings, then what flash-attn imports, then
        the profile's: later ones win."""
        t = self.m.typed
        s.pins = dict(s.verl["pins"])
        if s.vllm_v:
            s.pins.update(t.vllm[s.vllm_v].get("pins") or {})
        if s.sr:  # SGLang pins what it shares exactly (transformers), then what verl's extra adds
            s.pins.update(s.sr.get("pins") or {})
            s.pins.update(s.verl["sglang"].get("pins") or {})
        if s.fa:  # its wheel installs with --no-deps: what it imports at run time is pinned here
            s.pins.update(COMPONENTS.required(t.flash_attn).get("runtime_pins") or {})
        profile_pins: dict[str, str] = p.get("pins", {})
        s.pins.update(profile_pins)

    def select_engine(self, s: "Selection") -> None:
        """--engine megatron: the release's Megatron record, refused where it cannot run (no
        record for this verl, the card below TransformerEngine's floor, a machine without its
        wheels, a Python megatron-core has no wheel for); --megatron's layout, checked."""
        ov = self.ov
        s.engine, s.megatron, s.megatron_layout = ov.engine or "fsdp", None, None
        if ov.megatron and s.engine != "megatron":
            raise UserError(
                f"--megatron {','.join(ov.megatron)}: a Megatron layout needs --engine megatron. "
                "Add --engine megatron, or drop --megatron."
            )
        self.engine = s.engine
        self.megatron_layout = None
        if s.engine != "megatron":
            return
        rec = s.verl.get("megatron")
        have = sorted(v for v, r in self.m.typed.verl.items() if r.get("megatron"))
        if not rec:
            raise UserError(
                f"--engine megatron: envbuild has no Megatron stack for verl {s.verl_v} (megatron-core, "
                "TransformerEngine and the bridge are pinned per release). Use --verl "
                + " or --verl ".join(have)
                + ", or drop --engine megatron (the FSDP engine)."
            )
        machine = s.card.get("machine") or "x86_64"
        if not at_least(s.cc, rec["min_compute_capability"]):
            raise UserError(
                f"--engine megatron on the {s.card['name']} (compute capability {s.cc}): TransformerEngine "
                f"{rec['transformer_engine']}, which verl's Megatron engine runs on, supports compute "
                f"capability {rec['min_compute_capability']} (Ampere) and later. Drop --engine megatron: "
                "the FSDP engine trains on this card."
            )
        if machine not in rec["machines"]:
            raise UserError(
                f"--engine megatron on {machine}: TransformerEngine {rec['transformer_engine']}'s core "
                f"wheel (transformer-engine-cu13) is published for {', '.join(rec['machines'])} only. "
                "Drop --engine megatron (the FSDP engine), or train on an x86_64 host."
            )
        if s.build["cuda"].split(".")[0] != rec["cuda_major"]:
            raise UserError(
                f"--engine megatron with torch {s.torch_v} for CUDA {s.build['cuda']}: TransformerEngine "
                f"{rec['transformer_engine']}'s core wheel is built for CUDA {rec['cuda_major']}. Use --cuda "
                f"{rec['cuda_major']}.0, or drop --engine megatron."
            )
        if not in_range(s.python, rec["python"]):
            raise UserError(
                f"--engine megatron with Python {s.python}: megatron-core "
                f"{rec['packages']['megatron-core']} needs Python {rec['python']}. Add --python 3.12."
            )
        if s.rollout != "vllm":
            raise UserError(
                f"--engine megatron with the {s.rollout} rollout: envbuild plans the Megatron engine "
                "with vLLM's rollout only. Add --rollout vllm."
            )
        s.megatron = rec

    def megatron_flag(self, s: "Selection", words: tuple[str, ...]) -> dict[str, int]:
        """--megatron tp=N,pp=N,ep=N,cp=N: checked against the model and the world as
        megatron-core checks it (model/megatron.py fits_model)."""
        from envbuilder.model.megatron import Layout, fits_model
        from envbuilder.model.arch import Arch

        given: dict[str, int] = {}
        for w in words:
            key, _, value = w.partition("=")
            if key not in ("tp", "pp", "ep", "cp") or not value.isdigit() or int(value) < 1 or key in given:
                raise UserError(
                    f"--megatron {','.join(words)}: a layout is tp=N,pp=N,ep=N,cp=N (each at most once, "
                    "each a whole number from 1). Use e.g. --megatron tp=2,pp=1,ep=8."
                )
            given[key] = int(value)
        lay = Layout(**given)
        t = s.train
        per_node, world = t["n_gpus"], t["n_gpus"] * s.nodes
        why = fits_model(Arch(t["model"], self.models[t["model"]]), lay, per_node, world)
        if why:
            raise UserError(
                f"--megatron {','.join(words)}: {why} ({t['model']} on {world} GPUs). Drop --megatron "
                "and the plan chooses a layout that fits, or give one that divides them."
            )
        return lay.to_dict()

    def apply_choices(self, s: "Selection") -> None:
        """What the memory plan chose (offload, vLLM's share, the rollout's TP, Ulysses SP) into
        the train block the run plan prints; a choice the plan changed is noted with its why."""
        t, ch = s.train, s.memory.choices
        for key, offload in (
            ("param_offload", ch.param_offload),
            ("optimizer_offload", ch.optimizer_offload),
        ):
            if offload is not None and offload.value != t[key]:
                t[key] = offload.value
                s.notes.append(f"{key}: {offload.why}")
        t["actor_param_offload"] = t["param_offload"] and s.actor_offload_ok
        if s.rollout == "vllm":
            t["gpu_memory_utilization"] = ch.gpu_memory_utilization.value
        if s.engine == "megatron" and ch.megatron is not None:
            t["megatron"] = dict(ch.megatron.value, etp=1)
            if not s.megatron_layout:
                s.notes.append(f"Megatron layout {_layout_words(t['megatron'])}: {ch.megatron.why}")
        for key, split in (("rollout_tp", ch.rollout_tp), ("sequence_parallel", ch.sequence_parallel)):
            if split is not None and split.value > 1:
                t[key] = split.value
                if key not in s.pinned:
                    s.notes.append(f"{key} {split.value}: {split.why}")
            else:
                t.pop(key, None)

    def lora_memory(
        self, s: "Selection", train: dict[str, Any], algo: Entry | None = None
    ) -> tuple[MemoryPlan, bool]:
        """The memory plan of `train`, and whether LoRA's frozen base loads in bf16 for it.

        verl 0.4.x-0.5.x put the HF rollout's actor in one flat parameter (use_orig_params): an
        fp32 base, and a gradient the size of the whole model. Where that does not fit one GPU,
        the patch verl-hf-rollout-lora-wrap keeps verl's LoRA wrap policy, so each adapter is an
        FSDP unit of its own: no gradient spans the base, and the base loads in bf16
        (fsdp_config.model_dtype; the adapters stay fp32, peft's default). The GPU tier ran both
        (tests/fixtures/gpu/step). The flat configuration stays where it fits: it is the one the
        GPU tier ran a whole PPO step with."""
        flat = {k: v for k, v in train.items() if k != "actor_model_dtype"}
        plan = self.memory_plan(
            s.gpu_key, s.gpu, s.dtype, s.attention, s.rollout, flat, lora_flat=bool(s.lora_key), algo=algo
        )
        if plan.problems and s.lora_key and s.world == 1 and s.dtype == "bf16":
            slim = dict(flat, actor_model_dtype="bf16")
            return (
                self.memory_plan(s.gpu_key, s.gpu, s.dtype, s.attention, s.rollout, slim, algo=algo),
                True,
            )
        return plan, False

    def stacked(self, p: dict[str, Any]) -> dict[str, Any]:
        """The profile as `--verl X` asks: where X is not the profile's own verl and stacks.yaml
        has X's whole pinned set (CUDA, torch, rollout, vLLM, Python, components, pins), those
        replace the profile's, so `--verl 0.6.1` on a verl 0.9 profile is the 0.6.1 stack and not
        verl 0.6.1 beside torch 2.11. The other overrides still apply on top."""
        want = self.ov.verl
        stack = (self.m.sections.get("stacks") or {}).get(want) if want else None
        if stack is None or want == p["verl"]:
            return p
        q = dict(
            p,
            verl=want,
            cuda=stack["cuda"],
            torch=stack["torch"],
            rollout=stack["rollout"],
            pins=dict(stack.get("pins") or {}),
        )
        for key in ("vllm", "python"):
            q.pop(key, None)
            if key in stack:
                q[key] = stack[key]
        comps, theirs = dict(p["components"]), stack.get("components") or {}
        if "flash-attn" not in theirs:
            comps.pop("flash-attn", None)  # another torch: the profile's flash-attn may not fit
        floor = (self.m.flash_attn or {}).get("min_compute_capability", "0.0")
        cc = self.m.gpus[p["gpu"]]["compute_capability"]
        comps.update(
            {
                name: version
                for name, version in theirs.items()
                if not (name == "flash-attn" and not at_least(cc, floor))
            }
        )
        q["components"] = comps
        q["optional_components"] = {
            k: v for k, v in (p.get("optional_components") or {}).items() if k != "flash-attn"
        }
        return q

    def world_flags(self, s: "Selection") -> None:
        """--rollout-tp, --offload, --sp and --host-memory: the choices the memory plan would
        make, made by the user (the plan takes them as given: Selection.pinned), each checked
        against the world and the model's heads as vLLM and verl require."""
        ov, t = self.ov, s.train
        s.pinned = []
        arch = self.models[t["model"]]
        heads, kv, per_node = arch["attention_heads"], arch["kv_heads"], t["n_gpus"]

        def splits(flag: str, n: int, what: str) -> None:
            if per_node % n or heads % n or not (kv % n == 0 or n % kv == 0):
                from envbuilder.model.arch import Arch
                from envbuilder.model.memory import split_ways

                ways = split_ways(per_node, Arch(t["model"], arch), per_node)
                raise UserError(
                    f"{flag} {n}: {what} over {n} GPUs needs a number that divides the {per_node} GPUs "
                    f"of a node and {t['model']}'s {heads} attention heads ({kv} KV heads: a divisor "
                    f"or a multiple of them). Use {flag} " + " or ".join(map(str, ways)) + "."
                )

        if ov.rollout_tp is not None:
            if s.rollout != "vllm":
                raise UserError(
                    f"--rollout-tp {ov.rollout_tp}: the {s.rollout} rollout generates on each GPU alone; "
                    "tensor parallelism is vLLM's. Drop --rollout-tp, or use --rollout vllm."
                )
            splits("--rollout-tp", ov.rollout_tp, "splitting each vLLM engine")
            t["rollout_tp"] = ov.rollout_tp
            s.pinned.append("rollout_tp")
        if ov.offload:
            words = set(ov.offload)
            if not words <= set(F.OFFLOAD) or ("none" in words and len(words) > 1):
                raise UserError(
                    f"--offload {','.join(ov.offload)}: offload takes params, optimizer or both "
                    "(params,optimizer), or none alone. Use one of those."
                )
            t["param_offload"], t["optimizer_offload"] = "params" in words, "optimizer" in words
            s.pinned.append("offload")
        if ov.sp is not None and s.megatron and ov.sp > 1:
            raise UserError(
                f"--sp {ov.sp}: Ulysses sequence parallelism is the FSDP engine's; the Megatron engine "
                f"splits a sequence with context parallelism. Use --megatron cp={ov.sp}, or drop --sp."
            )
        if ov.sp is not None:
            splits("--sp", ov.sp, "splitting each sequence (Ulysses)")
            if ov.sp > 1 and not self.remove_padding(s):
                raise UserError(
                    f"--sp {ov.sp}: verl's Ulysses sequence parallelism needs use_remove_padding, which "
                    f"runs on flash-attn's varlen kernels; this render uses {s.attention} attention. "
                    "Add --with flash-attn (CC 8.0 and up), or drop --sp."
                )
            t["sequence_parallel"] = ov.sp
            s.pinned.append("sequence_parallel")
        if ov.host_memory is not None:
            t["host_memory_gib"] = ov.host_memory
        if ov.megatron and s.megatron:
            s.megatron_layout = self.megatron_flag(s, ov.megatron)
            self.megatron_layout = s.megatron_layout
            s.pinned.append("megatron")
        # (what the memory plan reads beside the train block: memory_plan's inputs)
        self.pinned, self.unpadded = tuple(s.pinned), self.remove_padding(s)
        self.actor_offload_ok = s.actor_offload_ok

    def remove_padding(self, s: "Selection") -> bool:
        """Whether the run unpads its micro-batches (flash-attn's varlen kernels, CC 8.0)."""
        return s.attention == "flash_attention_2" and bool(s.feats.get("remove_padding", True))

    def cluster_plan(self, s: "Selection") -> None:
        """--nodes and --gpus-per-node: the world the run shards over (the memory plan divides
        every role's state by it; verl splits the batches evenly over it, so they are rounded
        up to a multiple), and --interconnect: what NCCL and Gloo are told (interconnects.yaml),
        with NCCL_P2P_DISABLE=1 for several GPUs per node of a card without peer-to-peer."""
        ov, t = self.ov, s.train
        nodes = ov.nodes or 1
        per_node = ov.gpus_per_node or t["n_gpus"]
        if nodes < 1 or per_node < 1 or nodes > 1024 or per_node > 64:
            raise UserError(
                f"--nodes {nodes} --gpus-per-node {per_node}: a run takes 1 to 1024 "
                "nodes of 1 to 64 GPUs each."
            )
        t["n_gpus"] = per_node
        world = nodes * per_node
        self.round_batches(s, nodes, per_node)
        s.nodes, s.world = nodes, world
        self.nodes = nodes
        self.world_flags(s)
        self.network_plan(s, nodes, per_node)

    def round_batches(self, s: "Selection", nodes: int, per_node: int) -> None:
        """The mini-batch a multiple of the world (verl splits it evenly over the GPUs), then the
        train batch a multiple of the mini-batch (else the last mini-batch is short and its
        micro-batches do not divide it: envbuilder/model/batches.py); a world whose step takes
        more prompts than the data set has is refused."""
        t, world = s.train, nodes * per_node
        t["ppo_mini_batch_size"] = min(t["ppo_mini_batch_size"], t["train_batch_size"])
        for key, unit, why in (
            ("ppo_mini_batch_size", world, f"of the {world} GPUs (verl splits it evenly over them)"),
            ("train_batch_size", 0, "of the mini-batch (each step is a whole number of mini-batches)"),
        ):
            unit = unit or t["ppo_mini_batch_size"]
            if t[key] % unit:
                was, t[key] = t[key], -(-t[key] // unit) * unit
                label = (
                    "actor_rollout_ref.actor.ppo_mini_batch_size"
                    if key == "ppo_mini_batch_size"
                    else "data.train_batch_size"
                )
                s.notes.append(f"{label} {t[key]}: the profile's {was} rounded up to a multiple {why}")
        gsm8k = self.m.typed.datasets.get("gsm8k")
        rows = gsm8k["rows"]["train"] if gsm8k else None
        if rows and t["train_batch_size"] > rows:
            p_train = self.p["train"]
            fits = next(
                (w for w in range(world - 1, 0, -1) if rounded_batch(p_train, w) <= rows),
                0,
            )
            raise UserError(
                f"--nodes {nodes} --gpus-per-node {per_node}: on {world} GPUs a step takes "
                f"data.train_batch_size {t['train_batch_size']} prompts (each GPU needs a share of "
                f"every mini-batch), more than GSM8K's {rows} training rows. verl's dataloader "
                "drops the last partial batch, so not one step would run. "
                + (f"Use at most {fits} GPUs in all" if fits else "Use fewer GPUs")
                + " (--nodes × --gpus-per-node), or train on a larger data set."
            )

    def network_plan(self, s: "Selection", nodes: int, per_node: int) -> None:
        """--interconnect: what NCCL and Gloo are told (interconnects.yaml), with
        NCCL_P2P_DISABLE=1 for several GPUs per node of a card without peer-to-peer (or a
        driver on which its P2P transport hangs), and verl's own NCCL settings for a
        multi-node NVLink GPU."""
        ov = self.ov
        name = ov.interconnect or ("tcp" if nodes > 1 else None)
        table = self.m.typed.interconnects
        s.interconnect = (
            self.pick("interconnect (--interconnect)", table, name, by_name=True) if name else None
        )
        s.ic_name = name
        if nodes > 1 and not ov.interconnect:
            s.notes.append(
                f"the {nodes} nodes talk over plain TCP (NCCL_IB_DISABLE=1): pass "
                "--interconnect ib or roce where they have an RDMA network"
            )
        env = dict(s.interconnect["env"] if s.interconnect else {})
        p2p_driver, drv = s.card.get("p2p_driver"), self.ov.driver
        if per_node > 1 and s.card.get("p2p") is False:
            env["NCCL_P2P_DISABLE"] = "1"
            s.notes.append(
                f"NCCL_P2P_DISABLE=1: {per_node} {s.card['name']}s in a node have no "
                "peer-to-peer (NCCL's P2P transport hangs on them)"
            )
        elif per_node > 1 and p2p_driver and (drv is None or version_key(drv) < version_key(p2p_driver)):
            env["NCCL_P2P_DISABLE"] = "1"
            s.notes.append(
                f"NCCL_P2P_DISABLE=1: {per_node} {s.card['name']}s in a node, and NCCL's P2P "
                f"transport hangs on them with drivers older than {p2p_driver} "
                + (f"(--driver {drv})" if drv else f"(pass --driver; from {p2p_driver} it stays on)")
            )
        s.cluster_env = dict(sorted(env.items()))
        # verl's own NCCL settings for a multi-node NVLink GPU, which the launchers set where
        # `when` holds (an HGX B200 has no IMEX channels and keeps NVLS)
        nccl = s.verl.get("nccl_env")
        s.imex_env = None
        if nccl and s.card.get("mnnvl") and at_least(s.cc, nccl["min_compute_capability"]):
            s.imex_env = dict(sorted(nccl["env"].items()))
        if table and s.interconnect and s.interconnect.get("note"):
            s.notes.append(f"{name}: {s.interconnect['note']}")

    def hf_rollout_plan(self, s: "Selection") -> None:
        """What the release's HF rollout cannot do, planned around (verl.yaml hf_rollout): the
        actor's parameters stay on the GPU where generate cannot load them back, LoRA gets
        use_orig_params=True where one flat parameter holds base and adapters; and the run
        overrides that would undo either, for preflight to refuse."""
        s.train = dict(self.p["train"])
        if self.ov.model and self.ov.model != s.train["model"]:
            from envbuilder.model.architectures import scaled_vram_gb

            was = self.models[s.train["model"]]["parameters"]
            s.train["model"] = self.ov.model
            s.train["model_vram_gb"] = scaled_vram_gb(
                s.train["model_vram_gb"], was, self.models[self.ov.model]["parameters"]
            )
        s.notes, s.refused, s.lora_key = [], [], None
        if self.named.gpu:
            s.notes.append(self.named.why)
        if self.ov.model and self.ov.model.startswith("/"):
            s.notes.append(
                f"the model is the folder {self.ov.model}, which the image does not "
                f"hold: mount it at the same path (docker run -v "
                f"{self.ov.model}:{self.ov.model}:ro ...)"
            )
        hf = s.verl.get("hf_rollout") if s.rollout == "hf" else None
        off, lora = (hf.get("offload"), hf.get("lora")) if hf else (None, None)
        s.actor_offload_ok = not (off and not off["works"])
        s.train["actor_param_offload"] = s.train["param_offload"] and s.actor_offload_ok
        where = f"verl {s.verl_v}'s HF rollout"
        if off and not off["works"]:  # (not s.actor_offload_ok)
            key = "actor_rollout_ref.actor.fsdp_config.param_offload"
            if s.train["param_offload"]:
                s.notes.append(
                    f"{key}=False although the profile offloads parameters (the critic's "
                    f"and the reference's still are): {off['why']}. The memory plan "
                    "keeps the actor's weights on the GPU in every phase"
                )
            s.refused.append(
                R.RefusedOverride(
                    key=key,
                    value="true",
                    why=f"{where} cannot generate from an offloaded actor: {off['why']}",
                    fix="leave it False (the memory plan keeps the actor's weights on "
                    f"the GPU: envbuild show {self.named.gpu or self.name} --memory), offload the optimizer instead, or use "
                    f"the vLLM rollout on a GPU of CC >= {self.m.min_compute_capability}",
                )
            )
        if lora and s.train["lora_rank"]:
            s.lora_key = lora["key"]
            s.notes.append(f"{lora['key']}=True for LoRA on the HF rollout: {lora['why']}")
            s.refused.append(
                R.RefusedOverride(
                    key=lora["key"],
                    value="false",
                    why=f"{where} cannot wrap LoRA then: {lora['why']}",
                    fix=f"leave {lora['key']}=True as the run script sets it",
                )
            )

    def select_components(self, torch_v: str) -> dict[str, str]:
        """The profile's compiled components with --with / --without applied (registry.select)."""
        optional: dict[str, str] = self.p.get("optional_components", {})
        return COMPONENTS.select(
            self.m, dict(self.p["components"]), optional, self.ov.with_, self.ov.without, torch_v
        )

    def run(self) -> ResolvedEnv:
        s = self.select()
        for rule in RULES:
            rule(self, s)
        hard = [v for v in self.v if v.hard]
        if hard or (self.v and not self.ov.allow_unsupported):
            raise ResolveError(self.name, self.v)
        return with_run_plan(self.assemble(s))

    def patches_and_audit(
        self, s: "Selection", precision: dict[str, str]
    ) -> tuple[tuple[R.Patch, ...], R.Audit]:
        """verl's recorded patches this run needs (each one's `when` holds), their placeholders
        filled with the run's attention and precision, and the precision audit's checks with the
        reviewed lines that hold."""
        from envbuilder.model.matrix_schema import fill_placeholders  # (the matrix checked every template)

        t, verl, attention, dtype = self.m.typed, s.verl, s.attention, s.dtype
        values = {"attention": attention}
        for part, pd in precision.items():
            values[f"{part}_dtype"] = TORCH_DTYPE[pd]
            values[f"{part}_autocast"] = str(pd != "fp32")
        # the conditions a patch's `when` and an audit check name
        conditions = {
            "always": True,
            "no_flash_attention": attention != "flash_attention_2",
            "no_bf16": dtype != "bf16",
            "lora_hf_rollout": bool(s.train["lora_rank"]) and s.rollout == "hf",
            "lora_bf16_base": s.train.get("actor_model_dtype") == "bf16",
            "hf_rollout": s.rollout == "hf",
        }
        patches = []
        for pname in verl["patches"]:
            pr = t.patches[pname]
            if conditions[pr["when"]]:
                patches.append(
                    R.Patch(
                        name=pname,
                        why=pr["why"],
                        files=tuple(pr["files"]),
                        replace=frozen(
                            [
                                {"find": r["find"], "with": fill_placeholders(r["with"], values)}
                                for r in pr["replace"]
                            ]
                        ),
                    )
                )
        checks = tuple(c for c, when in AUDIT_CHECKS.items() if conditions[when])
        reviewed = []
        for rname in verl.get("reviewed") or []:
            rec = t.reviewed[rname]
            if rec["check"] in checks:
                holds = {
                    k: fill_placeholders(v, values) if isinstance(v, str) else v
                    for k, v in sorted(rec["holds"].items())
                }
                reviewed.append(
                    R.Reviewed(
                        name=rname,
                        check=rec["check"],
                        file=rec["file"],
                        line=rec["line"],
                        why=rec["why"],
                        holds=frozen(holds),
                    )
                )
        return tuple(patches), R.Audit(checks=checks, reviewed=tuple(reviewed))

    def alloc_conf(self, s: "Selection") -> R.AllocConf | None:
        """PYTORCH_CUDA_ALLOC_CONF (cuda_alloc_conf.yaml): expandable segments where the
        rollout's release allows them under sleep mode, else on small cards unless the rollout
        refuses them."""
        ac = self.m.typed.cuda_alloc_conf
        taken = ac.get("with_rollouts", {}).get(s.rollout) if ac else None
        rollout_v = s.vllm_v if s.rollout == "vllm" else None
        if ac and taken and rollout_v and in_range(rollout_v, ">=" + taken["min"]):
            return R.AllocConf(value=ac["value"], why=taken["why"])
        if ac and s.card["vram_gb"] <= ac["max_vram_gb"]:
            refused = ac["not_with_rollouts"].get(s.rollout)
            return R.AllocConf(value=None if refused else ac["value"], why=refused or ac["why"])
        return None

    def assemble(self, s: "Selection") -> ResolvedEnv:
        """The resolved environment of a selection every rule accepted."""
        p, ov, m, t = self.p, self.ov, self.m, self.m.typed
        cc, verl, dtype, attention = s.cc, s.verl, s.dtype, s.attention
        remove_padding = self.remove_padding(s)
        apex = COMPONENTS.APEX_.record(m, s)
        # what each part of the run computes in: the profile's dtype where this verl can run the
        # part in it, fp32 otherwise (verl.yaml precision: no fp16 training without a loss scaler)
        precision = {
            part: dtype if dtype in allowed else "fp32" for part, allowed in sorted(verl["precision"].items())
        }
        patches, audit = self.patches_and_audit(s, precision)
        alloc = self.alloc_conf(s)
        torch_index = None
        local = ""
        if s.variant != s.torch["pypi_default"]:
            torch_index = m.index_url.format(variant=s.variant)
            local = f"+{s.variant}"
        defaults = t.defaults
        gpu, cuda, torch_v, vllm_v = s.card, s.cuda, s.torch_v, s.vllm_v
        dataset = t.datasets.get("gsm8k")
        return ResolvedEnv(
            schema_version=SCHEMA_VERSION,
            envbuild_version=__version__,
            profile=self.name,
            card=self.named.gpu,
            description=p["description"],
            overrides=ov,
            gpu=R.Gpu(
                key=s.gpu_key,
                name=gpu["name"],
                arch=gpu["arch"],
                compute_capability=cc,
                sm=cc.replace(".", ""),
                vram_gb=gpu["vram_gb"],
                bf16=gpu["bf16"],
                max_smem_per_block_kb=gpu["max_smem_per_block_kb"],
                machine=gpu.get("machine", "x86_64"),
            ),
            cuda=R.Cuda(
                version=s.cuda_v,
                full_version=cuda["version"],
                ubuntu=cuda["ubuntu"],
                glibc=cuda.get("glibc"),
                images=frozen(cuda["images"]),
                conda_nvcc=cuda["conda_nvcc"],
                compat_libcuda=t.cuda_compat["libcuda"],
            ),
            driver=s.driver,
            python=s.python,
            torch=R.Torch(
                version=torch_v,
                variant=s.variant,
                cuda=s.build["cuda"],
                archs=tuple(s.build["archs"]),
                index_url=torch_index,
                packages=(
                    f"torch=={torch_v}{local}",
                    f"torchvision=={s.torch['torchvision']}{local}",
                    f"torchaudio=={s.torch['torchaudio']}{local}",
                ),
            ),
            rollout=s.rollout,
            vllm=R.Vllm(
                version=vllm_v,
                torch=t.vllm[vllm_v]["torch"],
                wheel_cuda=t.vllm[vllm_v]["wheel_cuda"],
                compile_cache=VLLM.compile_cache(verl, s.torch_v),
            )
            if vllm_v
            else None,
            sglang=SGLANG.record(s.sglang_v, s.sr) if s.sr and s.sglang_v else None,
            verl=R.Verl(
                version=s.verl_v,
                attention_override=verl["attention_override"],
                autocast_keys=frozen(dict(sorted((verl.get("autocast_keys") or {}).items()))),
                pins=frozen(dict(sorted(s.pins.items()))),
                config_reads=tuple(verl.get("config_reads") or ()),
                lora_orig_params_key=s.lora_key,
                refused_overrides=tuple(s.refused),
                rollout_mode=verl.get("rollout_mode", "sync"),
                critic_fsdp=verl.get("critic_fsdp", "critic.model.fsdp_config"),
                engine_batches=self.engine_batches,
            ),
            dtype=dtype,
            precision=R.Precision(**precision),
            attention=attention,
            features=R.Features(
                bf16=dtype == "bf16",
                flash_attention=attention == "flash_attention_2",
                remove_padding=remove_padding,
                torch_compile=s.feats.get("torch_compile", True),
                fused_kernels=s.fused,
                dynamic_bsz=s.dynamic_bsz,
                speed=speed_notes(verl, s, remove_padding),
            ),
            flash_attn=COMPONENTS.FLASH_ATTN.record(m, s),
            apex=apex,
            patches=patches,
            audit=audit,
            cuda_alloc_conf=alloc,
            indexes=R.Indexes(
                pypi=defaults["pypi_index"] if defaults else "https://pypi.org/simple", torch=torch_index
            ),
            uv=_uv_pin(defaults.get("uv") if defaults else None, gpu.get("machine", "x86_64")),
            huggingface=defaults["huggingface"] if defaults else "https://huggingface.co",
            conda_channels=tuple(defaults["conda_channels"] if defaults else ["conda-forge", "nvidia"]),
            train=R.Train.from_plain(s.train),
            algorithm=R.Algorithm(
                name=s.algo,
                critic=s.algo_rec["critic"],
                group=s.algo_rec["group"],
                n=s.algo_rec["n"],
                kl=s.algo_rec["kl"],
                kl_loss_type=s.algo_rec.get("kl_loss_type"),
                kl_loss_coef=s.algo_rec.get("kl_loss_coef"),
                extra=tuple(s.algo_rec.get("extra") or ()) + legacy_trainer(s.verl, s.algo_rec),
                extra_generation=s.algo_rec.get("extra_generation", False),
            ),
            cluster=R.Cluster(
                nodes=s.nodes,
                gpus_per_node=s.train["n_gpus"],
                interconnect=s.ic_name,
                env=frozen(s.cluster_env),
                interface=bool(s.interconnect and s.interconnect["interface"]),
                without_imex=frozen(s.imex_env),
            ),
            notes=tuple(s.notes),
            dataset=R.Dataset.from_plain(dict(dataset, name="gsm8k")) if dataset else None,
            training_path=tuple(training_path(m, s.verl_v, s.rollout, tuple(s.components), s.vllm_v))
            + (tuple(s.megatron["modules"]) if s.megatron else ()),
            memory=frozen(s.memory),
            megatron=megatron_record(s),
            warnings=tuple(v.text() for v in self.v),
        )


def megatron_record(s: "Selection") -> R.Megatron | None:
    """The Megatron engine's record of a selection (None on FSDP): what it installs, the arch
    TransformerEngine's extension is compiled for, and the run keys that select it."""
    rec = s.megatron
    if not rec:
        return None
    return R.Megatron(
        packages=frozen(dict(sorted(rec["packages"].items()))),  # (as envbuild.json reads back)
        transformer_engine=rec["transformer_engine"],
        te_arch=s.cc.replace(".", ""),
        keys=frozen({k: str(v) for k, v in rec["keys"].items()}),
        modules=tuple(rec["modules"]),
    )


def _layout_words(lay: dict[str, int]) -> str:
    from envbuilder.model.megatron import Layout

    return Layout(**lay).words()


def memory_fix(fixes: list[str], smaller: list[tuple[int, str]], more: str | None, critic_free: bool) -> str:
    """A memory refusal's fix, cheapest first: GRPO where the critic is what does not fit, the
    model on a larger world, a smaller model of the table, then more host memory for offload or
    an overlay's changes (shorter sequences, ...)."""
    fix = (
        ("in a --matrix-dir overlay of the profile, " + "; or ".join(fixes))
        if fixes
        else "a GPU with more memory"
    )
    if fixes and fixes[0].startswith("pass --host-memory"):
        fix = fixes[0] + (f"; or {'; or '.join(fixes[1:])}" if fixes[1:] else "")
    if smaller:  # (a model of the table: --model takes it, and the fix walk checks it)
        fix = f"use --model {smaller[-1][1]} (a smaller model from the table); or {fix}"
    if more:  # (the model the user asked for, on a larger world, first)
        fix = f"use {more}; or {fix}"
    if critic_free:
        fix = f"use --algo grpo (no critic to train: it fits); or {fix}"
    return fix


def card_size(total: Entry | None, gpu: Entry, ecc: str | None, given: int | None = None) -> Card:
    """The memory the plan counts on (--gpu-memory, else memory.yaml total_mib, else the nominal
    vram_gb) and what the board's ECC does to it: `ecc` is the --ecc override (None: the board's
    default), `given` the --gpu-memory override (MiB, as nvidia-smi reports the card)."""
    if given is not None:
        low, high = R.GPU_MEMORY_MIB
        if not low <= given <= high:
            raise UserError(
                f"--gpu-memory {given}: a card's memory is {low} to {high} MiB, as nvidia-smi's "
                "memory.total prints it (an A100 40GB: 40960)."
            )
        recorded = total["mib"] if total else int(gpu["vram_gb"] * 1024)
        return Card(
            mib=given,
            ecc="as measured",
            why=f"--gpu-memory {given} (the {gpu['name']} is recorded at {recorded} MiB)"
            + (f"; --ecc {ecc} changes nothing: the size given is the card's as it runs" if ecc else ""),
        )
    if total is None:
        return Card(
            mib=int(gpu["vram_gb"] * 1024),
            ecc="as shipped",
            why="no nvidia-smi size recorded: the nominal size"
            + (f"; --ecc {ecc} changes nothing here" if ecc else ""),
        )
    if "ecc_off_mib" not in total:
        why = (
            "the board's default"
            if ecc is None
            else f"--ecc {ecc}: no other size is recorded for this board (its ECC takes no memory, "
            "or the size with ECC off is unknown)"
        )
        return Card(mib=total["mib"], ecc="as shipped", why=why)
    if ecc == "off":
        return Card(
            mib=total["ecc_off_mib"],
            ecc="off",
            why=f"--ecc off (with ECC on, its default, the board shows {total['mib']} MiB)",
        )
    return Card(
        mib=total["mib"],
        ecc="on",
        why=f"ECC on, the board's default (--ecc off plans with {total['ecc_off_mib']} MiB)",
    )


# -- the rules: each takes the selection and adds what it finds wrong ----------------------------


def _rule_torch_cuda(r: _Resolver, s: Selection) -> None:
    if s.picked is None:
        r.refuse(TORCH.cuda_refusal(r.m, s.torch_v, s.torch, s.cuda_v))


def _rule_python(r: _Resolver, s: Selection) -> None:
    torch, cuda, python, m = s.torch, s.cuda, s.python, r.m
    r.refuse(TORCH.python_refusal(s.torch_v, torch, python, cuda["python"]))
    r.refuse(CUDA.python_refusal(m, s.cuda_v, cuda, python, torch, s.cc))


def _rule_arch(r: _Resolver, s: Selection) -> None:
    if s.picked:
        r.refuse(TORCH.arch_refusal(r.m, s.card, s.torch_v, s.variant, s.build))


def _rule_machine(r: _Resolver, s: Selection) -> None:
    """An aarch64 host (GH200, GB200) runs a stack only where PyPI serves aarch64 CUDA wheels of
    its torch (torch.yaml pypi_aarch64: a CPU build up to 2.10.0, cu130 from 2.11.0) and of its
    vLLM (vllm.yaml aarch64: from 0.10.2); the extensions are planned for x86_64 only."""
    machine, t = s.card.get("machine", "x86_64"), r.m.typed
    if machine == "x86_64":
        return
    why = []
    built = s.torch.get("pypi_aarch64")
    if built == "cpu":
        why.append(f"PyPI's {machine} torch {s.torch_v} is a CPU build (no CUDA)")
    elif not built:
        why.append(f"no {machine} CUDA build of torch {s.torch_v} on PyPI is recorded")
    elif s.picked and s.variant != built:
        why.append(f"PyPI's {machine} torch {s.torch_v} is its {built} build, not {s.variant}")
    if s.rollout == "vllm" and s.vllm_v and not t.vllm[s.vllm_v].get("aarch64"):
        why.append(f"vLLM {s.vllm_v} publishes no {machine} wheel on PyPI")
    if s.rollout == "sglang":
        why.append(f"SGLang's {machine} wheels are not checked here")
    # (flash-attn from a wheel index that builds for this machine, verl's wheelhouse: no gap)
    comps = sorted(
        c for c in s.components if not (c == "flash-attn" and s.fa_choice and s.fa_choice.how == FA.INDEX)
    )
    if comps:
        why.append(
            f"{' and '.join(comps)} {'is' if len(comps) == 1 else 'are'} planned for x86_64 only (wheel names, builds)"
        )
    if not why:
        s.notes.append(
            f"{machine}: PyPI serves this stack's {machine} CUDA wheels (torch {s.torch_v} {built}"
            + (f", vLLM {s.vllm_v}" if s.vllm_v else "")
            + f"), and `envbuild check {r.name} --resolve` co-resolves the pins for {machine}; "
            "the image installs uv's aarch64 wheel, and `envbuild lock` solves for "
            f"{machine} (lockfiles/{r.name} where shipped)"
        )
        return
    fits = [
        v
        for v, st in sorted(t.stacks.items(), key=lambda kv: version_key(kv[0]))
        if st["torch"] in t.torch and t.torch[st["torch"]].get("pypi_aarch64", "").startswith("cu")
    ]
    r.add(
        "machine",
        f"the {s.card['name']} is an {machine} system, which verl {s.verl_v}'s stack "
        f"(torch {s.torch_v}" + (f", vLLM {s.vllm_v}" if s.vllm_v else "") + ") cannot serve from PyPI",
        "; ".join(why),
        f"use --verl {fits[-1]}"
        if fits
        else "use NVIDIA's aarch64 NGC PyTorch image (nvcr.io/nvidia/pytorch)",
        hard=True,
    )


def _rule_verl(r: _Resolver, s: Selection) -> None:
    """verl's refusals: the verl block's (model/components/verl.py)."""
    for x in VERL.problems(r.m, s):
        r.refuse(x)


def _rule_vllm(r: _Resolver, s: Selection) -> None:
    """The vLLM rollout's refusals: the vLLM block's (model/components/vllm.py)."""
    for x in VLLM.problems(r.m, s, r.ov.vllm):
        r.refuse(x)


def _rule_sglang(r: _Resolver, s: Selection) -> None:
    """The SGLang rollout's refusals: the SGLang block's (model/components/sglang.py)."""
    for x in SGLANG.problems(r.m, s):
        r.refuse(x)


def _rule_driver(r: _Resolver, s: Selection) -> None:
    r.refuse(CUDA.driver_refusal(r.m, s.driver, r.ov.driver, s.usable_cudas))


def _rule_bf16(r: _Resolver, s: Selection) -> None:
    if r.p["dtype"] == "bf16" and not s.card["bf16"]:
        r.add(
            "bf16",
            f"bf16 on the {s.card['name']} (CC {s.cc})",
            f"native bfloat16 needs CC >= {r.m.typed.features['bf16']['min_compute_capability']}",
            "set dtype to fp16 or fp32 in the profile",
        )


def _rule_extensions(r: _Resolver, s: Selection) -> None:
    for x in COMPONENTS.problems(r.m, s):
        r.refuse(x)
    s.notes.extend(COMPONENTS.notes(r.m, s))


def _rule_shared_dependencies(r: _Resolver, s: Selection) -> None:
    named = {"torch": s.torch_v, **({"vllm": s.vllm_v} if s.vllm_v else {})}
    named.update({"sglang": s.sglang_v} if s.sglang_v else {})
    r.pypi_name_rule(s.pins)
    r.shared_dependency_rule({**named, **s.pins})


def _rule_algorithm(r: _Resolver, s: Selection) -> None:
    a = s.algo_rec
    if version_key(s.verl_v) < version_key(a["since"]):
        newer = [v for v in r.m.verl if version_key(v) >= version_key(a["since"])]
        r.add(
            "algorithm-release",
            f"verl {s.verl_v} has no {s.algo} estimator",
            f"{s.algo} came with verl {a['since']} (its AdvantageEstimator)",
            (f"use --verl {newer[-1]}" if newer else "use another --algo") + " or --algo grpo",
            hard=True,
        )
    if a.get("refused"):
        r.add(
            "algorithm-reward",
            f"{s.algo} cannot train on this recipe",
            a["refused"],
            "use --algo grpo",
            hard=True,
        )


def _rule_cluster(r: _Resolver, s: Selection) -> None:
    ic = s.interconnect
    if s.nodes > 1 and ic and ic["scope"] != "cluster":
        r.add(
            "interconnect",
            f"--interconnect {s.ic_name} joins the GPUs of one node, but the run spans {s.nodes} nodes",
            "the nodes talk over a network: InfiniBand, RoCE or TCP",
            "use --interconnect tcp or --interconnect ib or --interconnect roce",
            hard=True,
        )


def _rule_model(r: _Resolver, s: Selection) -> None:
    t = s.train
    longest = r.models[t["model"]]["max_position_embeddings"]
    need = t["max_prompt_length"] + t["max_response_length"]
    if need > longest:
        r.add(
            "model-context",
            f"{t['model']} reads at most {longest} tokens, but the profile's "
            f"prompts and responses take {need}",
            "max_position_embeddings in its config.json bounds prompt + response",
            "pick a model with a longer context, or shorten train.max_prompt_length and "
            "max_response_length in a --matrix-dir overlay",
            hard=True,
        )


def _rule_memory(r: _Resolver, s: Selection) -> None:
    if any(v.rule == "model-context" for v in r.v):
        return  # (a plan of sequences the model cannot read says nothing more)
    r.memory_rule(s)


# In the order their findings are reported.
RULES = (
    _rule_machine,
    _rule_torch_cuda,
    _rule_python,
    _rule_arch,
    _rule_verl,
    _rule_vllm,
    _rule_sglang,
    _rule_driver,
    _rule_bf16,
    _rule_extensions,
    _rule_shared_dependencies,
    _rule_algorithm,
    _rule_cluster,
    _rule_model,
    _rule_memory,
)


# the flags that choose a stack: given any, the user chose it and the driver rule only refuses
STACK_FLAGS = ("cuda", "torch", "python", "verl", "rollout", "vllm")
PTX_LIMIT = "no PTX JIT: only kernels built for the card run, none compiled from PTX at load"


def stack_for_driver(m: Matrix, profile: str, ov: Overrides, refused: ResolveError) -> ResolvedEnv | None:
    """Pick the newest stack the machine runs, not the newest there is: where the profile's own
    stack is refused for --driver alone and no stack flag was given, the newest stack whose CUDA
    the driver runs (natively or under minor-version compatibility) and whose kernels cover the
    card, if one resolves; its notes say what it is and what a driver upgrade would add."""
    if ov.driver is None or any(getattr(ov, f) is not None for f in STACK_FLAGS):
        return None
    if "driver" not in {v.rule for v in refused.violations}:
        return None
    for v, how in stacks_for_driver(m, ov.driver):
        try:
            env = _Resolver(m, profile, ov._replace(verl=v)).run()
        except ResolveError:
            continue
        mode = env.driver.mode
        note = (
            f"driver {ov.driver} runs CUDA {env.driver.for_cuda} "
            + ("natively" if mode == "native" else f"under minor-version compatibility ({PTX_LIMIT})")
            + f": verl {v}'s stack (torch {env.torch.version}+{env.torch.variant}"
            + (f", vLLM {env.vllm.version}" if env.vllm else "")
            + "), the newest this driver runs"
        )
        try:
            newest = _Resolver(m, profile, ov._replace(driver=None)).run()
            note += (
                f"; with driver >= {newest.driver.min_driver}: verl {newest.verl.version}"
                + (f", vLLM {newest.vllm.version}" if newest.vllm else "")
                + f" (CUDA {newest.driver.for_cuda})"
            )
        except ResolveError:
            pass
        return env._replace(notes=(note, *env.notes))
    return None


def picked_for_driver(env: ResolvedEnv, asked: Overrides | None) -> str | None:
    """The note of a stack stack_for_driver picked (env took a --verl the user did not give)."""
    if env.overrides.driver and env.overrides.verl and not (asked and asked.verl) and env.notes:
        return env.notes[0]
    return None


def resolve(
    m: Matrix,
    profile: str,
    overrides: Overrides | None = None,
    check_fixes: bool = True,
    pick_stack: bool = True,
) -> ResolvedEnv:
    """The environment of `profile` under `overrides`; a refusal's fixes are all checked to work
    (fixes.checked), so none leads to a new refusal. `check_fixes=False` skips that walk (the
    verdict is the same; only the fixes' text is as each rule wrote it): for callers that ask
    many combinations and show no fixes (the grid). With --driver and no stack flag, a profile
    whose stack the driver cannot run takes the newest stack it can (stack_for_driver), unless
    `pick_stack` is False (the grid: each column is one stack, as it is)."""
    ov = overrides or Overrides()
    try:
        return _Resolver(m, profile, ov).run()
    except ResolveError as e:
        picked = stack_for_driver(m, profile, ov, e) if pick_stack else None
        if picked is not None:
            return picked
        if not check_fixes:
            raise
        from envbuilder.model import fixes

        def broken(o: Overrides) -> object:
            try:
                return _Resolver(m, profile, o).run()
            except ResolveError as again:
                return {v.rule for v in again.violations}

        raise ResolveError(profile, fixes.checked(m, profile, ov, e.violations, broken)) from None


def held_back(m: Matrix, profile: str, overrides: Overrides | None = None) -> list[str]:
    """Why the profile does not run the newest stack (stacks.yaml): what the resolver says of
    `--verl NEWEST` on it, the hard refusals first. Empty when it already runs that verl."""
    stacks = m.typed.stacks
    ov = overrides or Overrides()
    if not stacks or profile not in m.profiles:
        return []
    newest = max(stacks, key=version_key)
    current = ov.verl or m.profiles[profile]["verl"]
    if version_key(current) >= version_key(newest):
        return []
    st = stacks[newest]
    what = (
        f"verl {newest} (torch {st['torch']}, CUDA {st['cuda']}"
        + (f", vLLM {st['vllm']}" if st.get("vllm") else "")
        + ")"
    )
    try:
        resolve(m, profile, Overrides(verl=newest, driver=ov.driver, ecc=ov.ecc))
    except ResolveError as e:
        found = sorted(e.violations, key=lambda v: not v.hard)
        return [f"{what} is not for this GPU: {v.what} ({v.why})" for v in found[:1]]
    if ov.verl:
        return [
            f"{what} also resolves here: envbuild render {profile} (the profile's default) or --verl {newest}"
        ]
    return [
        f"{what} also resolves here: envbuild render {profile} --verl {newest}; the "
        f"profile stays on verl {current}, the stack its GPU tier and field reports cover"
    ]


def uv_pin(defaults: Mapping[str, Any], machine: str = "x86_64") -> R.Uv:
    """The uv wheel the runtime stage's pip steps install with (defaults.uv: version, url,
    sha256, size; its `aarch64` file for an aarch64 host)."""
    return _uv_pin(defaults.get("uv"), machine)


def _uv_pin(uv: E.UvPin | None, machine: str) -> R.Uv:
    if not uv:
        raise UserError(
            "The matrix's `defaults:` section has no `uv:` pin (version, url, sha256, "
            "size of uv's manylinux x86_64 wheel), which the Dockerfile installs its "
            "pip steps with. An overlay that replaces `defaults:` must carry it; copy "
            "it from envbuild's matrices/defaults.yaml."
        )
    # (x86_64's file is the pin's own; aarch64, the one other machine, has a file of its own)
    wheel: E.UvFile | None = (
        uv if machine == "x86_64" else uv.get("aarch64") if machine == "aarch64" else None
    )
    if not wheel:
        raise UserError(
            f"The matrix's `defaults.uv` pins no {machine} wheel of uv {uv['version']} "
            f"(`{machine}:` with url, sha256 and size), which an {machine} image installs its "
            "pip steps with. Add it (matrices/defaults.yaml carries one)."
        )
    return R.Uv(version=uv["version"], url=wheel["url"], sha256=wheel["sha256"], size=wheel["size"])
