"""The resolved environment of a selection every rule accepted: the assembly of the
resolver's records (`ResolvedEnv`, model/resolved.py) from the selection's stage records
(model/selection.py), and the run plan checked against verl's batch arithmetic
(`with_run_plan`). Pure: reads only the Matrix and the selection."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envbuilder import __version__
from envbuilder.errors import UserError
from envbuilder.model import entries as E
from envbuilder.model import resolved as R
from envbuilder.model.components import registry as COMPONENTS
from envbuilder.model.components import sglang as SGLANG
from envbuilder.model.components import vllm as VLLM
from envbuilder.model.matrix import Matrix
from envbuilder.model.matrix_schema import AUDIT_CHECKS
from envbuilder.model.resolved import SCHEMA_VERSION, ResolvedEnv
from envbuilder.model.selection import Ask, Selection
from envbuilder.model.stages import legacy_trainer
from envbuilder.model.versions import in_range
from envbuilder.record import frozen

# the torch dtype of each of envbuild's dtype names
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


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


def speed_notes(verl: E.VerlEntry, s: Selection, remove_padding: bool) -> tuple[str, ...]:
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


def patches_and_audit(
    m: Matrix, s: Selection, precision: dict[str, str]
) -> tuple[tuple[R.Patch, ...], R.Audit]:
    """verl's recorded patches this run needs (each one's `when` holds), their placeholders
    filled with the run's attention and precision, and the precision audit's checks with the
    reviewed lines that hold."""
    from envbuilder.model.matrix_schema import fill_placeholders  # (the matrix checked every template)

    t, verl, attention, dtype = m.typed, s.verl, s.attention, s.dtype
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


def alloc_conf(m: Matrix, s: Selection) -> R.AllocConf | None:
    """PYTORCH_CUDA_ALLOC_CONF (cuda_alloc_conf.yaml): expandable segments where the
    rollout's release allows them under sleep mode, else on small cards unless the rollout
    refuses them."""
    ac = m.typed.cuda_alloc_conf
    taken = ac.get("with_rollouts", {}).get(s.rollout) if ac else None
    rollout_v = s.vllm_v if s.rollout == "vllm" else None
    if ac and taken and rollout_v and in_range(rollout_v, ">=" + taken["min"]):
        return R.AllocConf(value=ac["value"], why=taken["why"])
    if ac and s.card["vram_gb"] <= ac["max_vram_gb"]:
        refused = ac["not_with_rollouts"].get(s.rollout)
        return R.AllocConf(value=None if refused else ac["value"], why=refused or ac["why"])
    return None


def assemble(a: Ask, s: Selection, found_notes: Sequence[str], warnings: Sequence[str]) -> ResolvedEnv:
    """The resolved environment of a selection every rule accepted (rules.judge): its notes the
    selection's, then the rules' (`found_notes`), and the warnings the rules found where
    --allow-unsupported renders anyway."""
    p, ov, m, t = a.p, a.ov, a.m, a.m.typed
    cc, verl, dtype, attention = s.cc, s.verl, s.dtype, s.attention
    remove_padding = s.kernels.remove_padding
    apex = COMPONENTS.APEX_.record(m, s)
    # what each part of the run computes in: the profile's dtype where this verl can run the
    # part in it, fp32 otherwise (verl.yaml precision: no fp16 training without a loss scaler)
    precision = {
        part: dtype if dtype in allowed else "fp32" for part, allowed in sorted(verl["precision"].items())
    }
    patches, audit = patches_and_audit(m, s, precision)
    alloc = alloc_conf(m, s)
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
        profile=a.name,
        card=a.named.gpu,
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
            engine_batches=s.engine_batches,
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
        notes=(*s.notes, *found_notes),
        dataset=R.Dataset.from_plain(dict(dataset, name="gsm8k")) if dataset else None,
        training_path=tuple(training_path(m, s.verl_v, s.rollout, tuple(s.components), s.vllm_v))
        + (tuple(s.megatron["modules"]) if s.megatron else ()),
        memory=frozen(s.memory),
        megatron=megatron_record(s),
        warnings=tuple(warnings),
    )


def megatron_record(s: Selection) -> R.Megatron | None:
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
