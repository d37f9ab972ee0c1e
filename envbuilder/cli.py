"""The `envbuild` command line. Heavy imports (docker, requests, rattler) stay inside the
commands that need them, so `render` starts fast."""

from __future__ import annotations

import json
import sys
from functools import wraps
from pathlib import Path

import click

from .errors import EnvbuildError, UserError


def split_names(values: tuple[str, ...]) -> tuple[str, ...]:
    """--without apex,flash-attn and --without apex --without flash-attn both work."""
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def _driver_version(ctx, param, value):
    from .versions import is_driver_version

    if value is not None and not is_driver_version(value):
        raise click.BadParameter(f"{value!r} is not an NVIDIA driver version like 550.54.14 "
                                 "(nvidia-smi shows it as 'Driver Version').")
    return value


def override_options(f):
    opts = [
        click.option("--cuda", help="CUDA toolkit of the image, e.g. 12.4."),
        click.option("--torch", "torch_", metavar="VERSION", help="torch release, e.g. 2.6.0."),
        click.option("--python", help="Python version, e.g. 3.10."),
        click.option("--verl", help="verl release, e.g. 0.4.1."),
        click.option("--rollout", type=click.Choice(["hf", "vllm", "sglang"]), help="Rollout backend."),
        click.option("--vllm", help="vLLM release (vllm rollout)."),
        click.option("--with", "with_", multiple=True, metavar="NAMES",
                     help="Add optional components: apex, flash-attn (comma-separated)."),
        click.option("--without", multiple=True, metavar="NAMES",
                     help="Leave components out: apex, flash-attn (comma-separated)."),
        click.option("--driver", metavar="VERSION", callback=_driver_version,
                     help="Check against this NVIDIA driver version, e.g. 550.54.14."),
        click.option("--allow-unsupported", is_flag=True,
                     help="Render even when the hardware is below a floor; the warnings go into the files."),
        click.option("--model", metavar="HF_ID|FOLDER",
                     help="Train this model: a hub repo id (its config.json is read through "
                     "HF_ENDPOINT, then cached) or a folder holding its config.json. The memory "
                     "plan, batch sizes and run script follow its shape."),
        click.option("--algo", metavar="ESTIMATOR",
                     help="verl's advantage estimator: gae (PPO with a critic, the default), grpo, "
                     "rloo, reinforce_plus_plus, remax, ... (`envbuild show PROFILE` lists the "
                     "release's); the run script, critic and memory plan follow it."),
        click.option("--nodes", type=click.IntRange(1, 1024),
                     help="Train across this many nodes (a Ray cluster); default 1."),
        click.option("--gpus-per-node", type=click.IntRange(1, 64),
                     help="GPUs on each node (default: the profile's count). The memory plan "
                     "shards over nodes x GPUs."),
        click.option("--interconnect", metavar="nvlink|pcie|ib|roce|tcp",
                     help="How the GPUs talk: nvlink or pcie inside a node; ib, roce or tcp "
                     "between nodes (default tcp with --nodes above 1). Sets NCCL's variables."),
        click.option("--ecc", type=click.Choice(["on", "off"]),
                     help="Plan memory for the board with ECC on (GDDR datacenter boards' default, "
                          "which costs memory) or off (nvidia-smi -e 0 and a reboot)."),
    ]
    f = matrix_dir_option(f)
    for opt in reversed(opts):
        f = opt(f)

    @wraps(f)
    def wrapper(*args, cuda, torch_, python, verl, rollout, vllm, with_, without, driver,
                allow_unsupported, model, algo, nodes, gpus_per_node, interconnect, ecc, **kwargs):
        from .resolve import Overrides

        both = sorted(set(split_names(with_)) & set(split_names(without)))
        if both:
            raise UserError(f"--with and --without both name {', '.join(both)}: say once whether "
                            "the profile gets it.")
        model_key, arch = None, None
        if model is not None:
            from .architectures import with_model

            table = load_matrix(kwargs.get("matrix_dirs") or ())
            m, model_key = with_model(table, model)
            arch = None if model_key in table.models else m.models[model_key]
        kwargs["overrides"] = Overrides(cuda=cuda, torch=torch_, python=python, verl=verl,
                                        rollout=rollout, vllm=vllm, with_=split_names(with_),
                                        without=split_names(without), driver=driver,
                                        allow_unsupported=allow_unsupported, ecc=ecc,
                                        model=model_key, model_arch=arch, algo=algo,
                                        nodes=nodes, gpus_per_node=gpus_per_node,
                                        interconnect=interconnect)
        return f(*args, **kwargs)

    return wrapper


def matrix_dir_option(f):
    """--matrix-dir (and ENVBUILD_MATRIX_DIR), the same on every command that reads the
    matrix: the command gets `matrix_dirs`, a tuple of folders."""
    return click.option("--matrix-dir", "matrix_dirs", multiple=True,
                        type=click.Path(path_type=Path), envvar="ENVBUILD_MATRIX_DIR",
                        help="Extra matrix folder(s) whose *.yaml add or override profiles, "
                             "facts and mirror sets.")(f)


def implied_profile(m, command: str, probes=None) -> str:
    """The profile a command without PROFILE takes: the one `envbuild detect` picks for this
    machine's GPUs, said on stderr with why; with no GPU a profile fits, a refusal that lists
    the profiles (exit 2)."""
    from .detect import detect, recommend
    from .doctor import Probes

    probes = probes if probes is not None else Probes()
    machine = detect(m, probes.nvml, probes.run)
    rec = recommend(m, machine)
    if rec.profile and rec.gpu is not None:
        click.echo(f"{command}: no PROFILE given: this machine's {rec.gpu.name} (CC "
                   f"{rec.gpu.compute_capability}) fits profile {rec.profile} best (`envbuild "
                   f"detect` says why); name another to override", err=True)
        return rec.profile
    why = machine.problem if not machine.gpus else "; ".join(rec.notes) or "no profile fits its GPU"
    raise UserError(f"Name a profile: `envbuild {command} PROFILE`"
                    + (" (or --all, or --from envbuild.json)" if command == "render" else "")
                    + ". None was given, "
                    + ("there is no rendered folder here (no envbuild.json), "
                       if command.startswith("build") else "")
                    + f"and detect picks none for this machine ({why}). Profiles: "
                    f"{', '.join(m.profiles)} (`envbuild list` shows each one's GPU).")


def load_matrix(matrix_dirs):
    from . import matrix

    return matrix.load(tuple(matrix_dirs))


def resolve_all(m, names: list[str], overrides, nothing: str) -> list:
    """Every named profile resolved before anything is done: each failure is printed, then one
    error says how many failed and that `nothing` happened. One name alone raises its own."""
    from .resolve import resolve

    envs, failed = [], []
    for name in names:
        try:
            envs.append(resolve(m, name, overrides))
        except EnvbuildError as e:
            if len(names) == 1:
                raise
            failed.append(name)
            click.echo(f"envbuild: {name}: {e}", err=True)
    if failed:
        raise UserError(f"{len(failed)} of {len(names)} profiles did not resolve "
                        f"({', '.join(failed)}); {nothing}.")
    return envs


# The actions' commands live in modules of their own, imported only when one of their commands
# runs (or help lists them), so `render` pays nothing for build, lock, wheelhouse or detect:
# click's documented lazy subcommands, name -> "module:command" (no registration by import).
LAZY_COMMANDS = {"build": "envbuilder.cli_build:build", "bake": "envbuilder.cli_build:bake", "mirrors": "envbuilder.cli_build:mirrors",
                 "lock": "envbuilder.cli_lock:lock",
                 "wheelhouse": "envbuilder.cli_wheelhouse:wheelhouse",
                 "detect": "envbuilder.cli_detect:detect", "doctor": "envbuilder.cli_detect:doctor",
                 "verify": "envbuilder.cli_verify:verify",
                 "refresh": "envbuilder.cli_refresh:refresh",
                 "affected": "envbuilder.cli_refresh:affected",
                 "export-image": "envbuilder.cli_image:export_image",
                 "import-image": "envbuilder.cli_image:import_image",
                 "apptainer": "envbuilder.cli_apptainer:apptainer"}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            import importlib

            module, attr = LAZY_COMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"],
                               "auto_envvar_prefix": "ENVBUILD"})
@click.version_option(package_name="envbuild")
def cli():
    """Reproducible GPU environments for LLM RL training, right for the GPU you have."""


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@matrix_dir_option
def list_(as_json, matrix_dirs):
    """Profiles with GPU, compute capability, CUDA, torch and rollout, one line each."""
    m = load_matrix(matrix_dirs)
    rows = []
    for name, p in m.profiles.items():
        gpu = m.gpus[p["gpu"]]
        rows.append({"profile": name, "gpu": gpu["name"], "cc": gpu["compute_capability"],
                     "vram_gb": gpu["vram_gb"], "cuda": p["cuda"], "torch": p["torch"],
                     "verl": p["verl"], "rollout": p["rollout"], "description": p["description"]})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    header = ("PROFILE", "GPU", "CC", "CUDA", "TORCH", "VERL", "ROLLOUT")
    table = [header] + [(r["profile"], r["gpu"], r["cc"], r["cuda"], r["torch"], r["verl"], r["rollout"])
                        for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


@cli.command()
@click.argument("profile")
@click.option("--json", "as_json", is_flag=True, help="The resolved environment as JSON.")
@click.option("--memory", is_flag=True, help="The memory budget per GPU, term by term, and the "
              "batch sizes it gives (with --json: the plan as JSON).")
@override_options
def show(profile, as_json, memory, overrides, matrix_dirs):
    """The resolved environment of PROFILE."""
    from .resolve import held_back, resolve

    m = load_matrix(matrix_dirs)
    env = resolve(m, profile, overrides)
    if memory:
        if as_json:
            from .record import plain

            click.echo(json.dumps({"profile": env.name, "memory": plain(env.memory)}, indent=2,
                                  sort_keys=True))
        else:
            click.echo("\n".join(memory_lines(env)))
        return
    if as_json:
        click.echo(env.to_json(), nl=False)
        return
    lines = [
        f"profile    {env.profile}: {env.description}",
        f"gpu        {env.gpu.name} (CC {env.gpu.compute_capability}, {env.gpu.vram_gb} GB)",
        f"cuda       {env.cuda.version} ({env.cuda.images['runtime']}), driver >= "
        f"{env.driver.min_driver}",
        f"python     {env.python}",
        f"torch      {' '.join(env.torch.packages)}"
        + (f" from {env.torch.index_url}" if env.torch.index_url else " from PyPI"),
        f"rollout    {env.rollout}" + (f" (vllm {env.vllm.version})" if env.vllm else ""),
        f"verl       {env.verl.version}",
        f"algorithm  {env.algorithm.name}" + ("" if env.algorithm.critic else " (no critic)")
        + (f", {env.algorithm.n} responses per prompt" if env.algorithm.n > 1 else "")
        + f"; --algo also takes {', '.join(available_algorithms(m, env))}",
        f"cluster    {env.cluster.nodes} node(s) x {env.cluster.gpus_per_node} GPU(s)"
        + (f", {env.cluster.interconnect}" if env.cluster.interconnect else "")
        + (f" ({', '.join(f'{k}={v}' for k, v in env.cluster.env.items())})"
           if env.cluster.env else ""),
        f"precision  {env.dtype}, attention {env.attention}, remove_padding "
        f"{env.features.remove_padding}, torch.compile {env.features.torch_compile}",
        f"extensions {', '.join(x for x in ('apex', 'flash_attn') if getattr(env, x)) or 'none'}",
        f"patches    {', '.join(p.name for p in env.patches) or 'none'}",
    ]
    mem = env.memory
    lines.append(f"memory     peak {mem['peak']['gib']:.1f} GiB of {mem['usable_gib']:.1f} usable "
                 f"({mem['peak']['phase']}); `--memory` for the budget")
    lines += [f"plan       {n}" for n in env.notes]
    lines += [f"held back  {h}" for h in held_back(m, profile, overrides)]
    lines += [f"WARNING    {w}" for w in env.warnings]
    click.echo("\n".join(lines))


def available_algorithms(m, env) -> list[str]:
    """The estimators env's verl release has that the recipe can run, besides env's own."""
    from .versions import version_key

    return [name for name, rec in (m.sections.get("algorithms") or {}).items()
            if name != env.algorithm.name and not rec.get("refused")
            and version_key(env.verl.version) >= version_key(rec["since"])]


# The run script's names for the planned sizes (templates/run_ppo_gsm8k.sh.j2 writes them).
BATCH_KEYS = (("val_batch_size", "data.val_batch_size"),
              ("rollout_micro_batch_size", "+actor_rollout_ref.rollout.micro_batch_size"),
              ("max_num_seqs", "actor_rollout_ref.rollout.max_num_seqs"),
              ("log_prob_micro_batch_size_per_gpu",
               "actor_rollout_ref.{rollout,ref}.log_prob_micro_batch_size_per_gpu"),
              ("actor_ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
              ("critic_ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu"),
              ("test_freq", "trainer.test_freq"))
PHASE_BATCH = {"generation": "generation", "log_prob": "log_prob", "actor": "actor", "critic": "critic"}


def memory_lines(env) -> list[str]:
    """`show --memory`: the budget line by line (term, formula, GiB) and the chosen sizes."""
    mem, a = env.memory, env.memory["arch"]
    card = mem.get("card") or {}
    out = [f"memory per GPU: {env.gpu.name}, {mem['gpu_total_gib']:.1f} GiB"
           + (f" ({card['mib']} MiB: {card['why']})" if card else "") + " - "
           f"{mem['cuda_context_gib']:g} CUDA context"
           + (f" - {mem['nccl_gib']:g} NCCL" if mem["nccl_gib"] else "")
           + f" = {mem['usable_gib']:.1f} GiB usable; a planned batch adds "
           f"{mem['allocator_overhead']:.0%} for the allocator"
           + (f" ({mem['hf_generate_overhead']:.0%} in HF generate)" if env.rollout == "hf" else "")
           + f" and leaves {mem['margin']:.0%} free",
           f"model {mem['model']}: {a['layers']} layers, hidden {a['hidden_size']}, "
           f"{a['attention_heads']} heads ({a['kv_heads']} KV) x {a['head_dim']}, MLP "
           f"{a['intermediate_size']}, vocab {a['vocab_size']}, "
           f"{'tied' if a['tied_embeddings'] else 'untied'} embeddings, {a['parameters']:,} params"
           + (f" (+{a['lora_parameters']:,} LoRA)" if a["lora_parameters"] else ""),
           (f"{env.cluster.nodes} nodes x {env.train.n_gpus} GPUs = "
            f"{env.cluster.nodes * env.train.n_gpus} GPUs" if env.cluster.nodes > 1
            else f"{env.train.n_gpus} GPU(s)") + f", {env.dtype}, {env.attention} attention, "
           f"{env.rollout} rollout, sequences {mem['sequence']['prompt']} + "
           f"{mem['sequence']['response']}, rollout batch {mem['rollout_batch_per_gpu']} and "
           f"mini-batch {mem['mini_batch_per_gpu']} per GPU, {mem['validation_rows']} validation "
           "prompts"]
    width = max(len(t["term"]) for p in mem["phases"] for t in p["terms"])
    for p in mem["phases"]:
        key = p["key"]
        head = f"{p['phase']}" + (f" at batch {p['batch']}" if key in PHASE_BATCH else "")
        bound = mem["bound_by"].get(key)
        out += ["", f"{head}: {p['total_gib']:.2f} GiB of {p['budget_gib']:.1f}"
                + (f" (batch bounded by {bound})" if bound else "")
                + ("" if p["fits"] else "  DOES NOT FIT")]
        out += [f"  {t['term']:<{width}}  {t['gib']:7.2f}  {t['formula']}" for t in p["terms"]]
    out += ["", f"peak: {mem['peak']['phase']}, {mem['peak']['gib']:.2f} GiB of "
            f"{mem['usable_gib']:.1f} usable", "", "batch sizes (run_ppo_gsm8k.sh):"]
    kw = max(len(k) for _, k in BATCH_KEYS)
    out += [f"  {key:<{kw}}  {mem['batch'][name]}" for name, key in BATCH_KEYS
            if mem["batch"][name] is not None]
    return out


@cli.command()
@click.argument("profile")
@click.option("--resolve", "online", is_flag=True,
              help="Also resolve the whole pinned set as one solution with uv against the index, "
                   "for the profile's Python and platform (needs the network and the lock extra).")
@click.option("--index-url", metavar="URL", help="With --resolve: the PyPI index (default the "
              "profile's).")
@click.option("--torch-index-url", metavar="URL", help="With --resolve: the PyTorch index for "
              "+cuXXX builds (default the profile's; when it does not answer, PyPI's build of the "
              "same torch version is resolved instead, and said so).")
@override_options
def check(profile, online, index_url, torch_index_url, overrides, matrix_dirs):
    """Exit 0 when PROFILE (with overrides) is a working combination; else explain, exit 2."""
    from .resolve import resolve

    m = load_matrix(matrix_dirs)
    env = resolve(m, profile, overrides)
    click.echo(f"OK: {profile} resolves: {env.gpu.name} (CC {env.gpu.compute_capability}), "
               f"CUDA {env.cuda.version}, torch {env.torch.version}+{env.torch.variant}, "
               f"verl {env.verl.version} with the {env.rollout} rollout, {env.dtype}.")
    for w in env.warnings:
        click.echo(f"WARNING: {w}")
    if online:
        from .lock import target_glibc
        from .lock.pip import co_resolve, index_answers, python_platform
        from .plan import torch_swap

        glibc = target_glibc(m, env)
        pypi = index_url or env.indexes.pypi
        torch_index = torch_index_url or env.indexes.torch
        swap = bool(torch_index) and not index_answers(torch_index)
        if swap:
            click.echo(f"note: the PyTorch index {torch_index} does not answer; resolving torch "
                       f"{torch_swap(env)} in its place: the rest of the set is the profile's.")
        found = co_resolve(env, glibc, pypi, torch_index, swap)
        click.echo(f"OK: the whole pinned set co-resolves: {len(found)} packages from {pypi}"
                   + (f" and {torch_index}" if torch_index and not swap else "")
                   + f" for Python {env.python} on {python_platform(glibc)}.")


@cli.command()
@click.argument("profile", required=False)
@click.option("--all", "all_", is_flag=True, help="Render every profile, each into OUT/<profile>/.")
@click.option("--from", "from_", type=click.Path(path_type=Path),
              help="Replay an envbuild.json (from a render or an image's /etc/envbuild.json).")
@click.option("-o", "--out", type=click.Path(path_type=Path),
              help="Output folder: the files go into OUT/<profile>/, with one profile as with "
                   "--all (default out/).")
@click.option("--locked", "locked_dir", is_flag=False, flag_value="-", default=None,
              metavar="[DIR]", help="FROM image@sha256 and pip layers with --require-hashes, from "
              "the lock in DIR/<profile>/ (default lockfiles/), or DIR when it is the profile's "
              "lock.")
@click.option("--wheelhouse", type=click.Path(path_type=Path), metavar="DIR",
              help="Install from this wheelhouse (envbuild wheelhouse) with no index at all; "
              "implies --locked with the wheelhouse's copy of the lock.")
@click.option("--mirror", metavar="NAME", help="Point images, indexes, channels and endpoints at "
              "this mirror set's first endpoints (no probing: render stays offline).")
@click.option("--force", is_flag=True, help="Overwrite files in the output directory that "
              "envbuild did not write or that were edited since (it still deletes nothing it did "
              "not write).")
@override_options
def render(profile, all_, from_, out, locked_dir, wheelhouse, mirror, force, overrides, matrix_dirs):
    """Write Dockerfile, environment.yml, requirements.txt, run script, preflight.py, envbuild.json."""
    from . import render as R
    from .resolve import ResolvedEnv

    if sum(bool(x) for x in (profile, all_, from_)) > 1:
        raise UserError("Name one profile, or --all, or --from envbuild.json (exactly one). "
                        "`envbuild list` shows the profiles.")
    if locked_dir is not None and wheelhouse is not None:
        raise UserError("--locked and --wheelhouse both say where the lock comes from: a "
                        "wheelhouse carries its own copy of the lock. Pass one of them.")
    if from_:
        from .limits import read_text_bounded

        text = read_text_bounded(Path(from_), "--from file")
        # every value's kind and the whole shape checked, all problems named at once, before
        # any template reads it
        env = ResolvedEnv.from_json(text, str(from_))
        target = Path(out or "out") / plain_name(env.name, "the profile named in " + str(from_))
        locked = locked_context(env, locked_dir, all_, wheelhouse)
        files = R.render_files(env, locked)  # (a failure past the check is a bug: a traceback)
        R.write_dir(target, files, (locked or {}).get("links"), force=force)
        click.echo(f"rendered {env.name} from {from_} -> {target}/")
        return
    m = load_matrix(matrix_dirs)
    if not (profile or all_):
        profile = implied_profile(m, "render", click.get_current_context().obj)
    names = list(m.profiles) if all_ else [profile]
    base = out or Path("out")
    if base.exists() and not base.is_dir():
        raise UserError(f"{base} exists and is not a folder; -o names the folder that gets one "
                        "folder per profile. Pass a folder.")
    # resolve every profile first: an --all that cannot resolve one of them writes nothing
    envs = resolve_all(m, names, overrides, "nothing was written")
    from .plan import with_constraints

    choice = None
    if mirror:
        from . import mirrors as M

        choice = M.choice(mirror, M.get_set(m, mirror))
    for env in envs:
        target = base / plain_name(env.name, "a profile")
        # against the upstream spec (what the lock recorded); its images through the mirror
        locked = locked_context(env, locked_dir, all_, wheelhouse, choice)
        env = with_constraints(env)  # (requirements.txt and environment.yml, also when locked)
        if not locked and not env.constraints:
            from .plan import lock_hint

            how = lock_hint(env.name, overrides, out)
            click.echo(f"  note: {env.name} is not pinned beyond its top-level pins (no lock "
                       f"matches it): {how}.", err=True)
        if choice:
            env = M.apply_to_env(env, choice)
        R.render(env, target, locked, force=force)
        click.echo(f"rendered {env.name} -> {target}/")
        for w in env.warnings:
            click.echo(f"  WARNING: {w}")


def plain_name(name: str, what: str) -> str:
    """`name` as one folder name under out/ (a name from an overlay or a --from file that holds
    a '/' or is '..' would render outside it)."""
    from .outdir import shorten

    if not name or "/" in name or "\\" in name or name in (".", "..") or "\x00" in name:
        raise UserError(f"{what} is {shorten(name)!r}, which is not a plain folder name: it would "
                        "render outside out/. Rename the profile (letters, digits, '.', '_', '-').")
    return name


def locked_context(env, locked_dir, all_, wheelhouse=None, mirror=None):
    if wheelhouse is None and locked_dir is None:
        return None  # (and the lock module stays unimported on the plain render path)
    from .lock.lockfile import for_render

    if wheelhouse is not None:
        if not (Path(wheelhouse) / "manifest.json").is_file():
            raise UserError(f"{wheelhouse} is not an envbuild wheelhouse (no manifest.json). Make "
                            f"one with `envbuild wheelhouse {env.name} -o {wheelhouse}`.")
        return for_render(env, Path(wheelhouse) / "locks" / plain_name(env.name, "a profile"),
                          Path(wheelhouse), mirror)
    from .lock.lockfile import lock_dir_in

    root = Path("lockfiles" if locked_dir == "-" else locked_dir)
    return for_render(env, lock_dir_in(root, plain_name(env.name, "a profile")), mirror=mirror)


# Optional dependencies -> the extra that installs them (pyproject.toml's optional-dependencies).
EXTRAS = {"docker": "actions", "requests": "actions", "pynvml": "actions", "rattler": "lock",
          "conda_lock": "lock", "uv": "lock", "tomli": "lock", "packaging": "actions"}


def main(argv=None):
    try:
        try:
            cli.main(args=argv, prog_name="envbuild", standalone_mode=False)
        except ModuleNotFoundError as e:
            extra = EXTRAS.get((e.name or "").split(".")[0])
            if not extra:
                raise
            raise UserError(f"This command needs the {e.name!r} package, which is not installed: "
                            f"it comes with envbuild's [{extra}] extra. Install it with "
                            f"`pip install 'envbuild[{extra}]'` (from a checkout: "
                            f"`.venv/bin/pip install -e '.[actions,lock]'`).") from None
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(2 if e.exit_code == 2 else e.exit_code)
    except EnvbuildError as e:
        click.echo(f"envbuild: error: {bounded_message(str(e))}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except Exception as e:  # a bug: one paragraph, not a traceback (ENVBUILD_DEBUG=1 shows it)
        import os

        if os.environ.get("ENVBUILD_DEBUG") == "1":
            raise
        click.echo(internal_error_text(argv if argv is not None else sys.argv[1:], e), err=True)
        sys.exit(1)
    sys.exit(0)


def bounded_message(text: str) -> str:
    """A message as printed: any run of 200+ characters without a space (a value someone pasted
    or a hostile file carried, echoed back) cut to its start and its length."""
    import re

    from .quoting import redact  # (a URL's user:password@ is printed as ***@)

    return re.sub(r"\S{200,}", lambda m: f"{m[0][:80]}...({len(m[0])} characters)", redact(text))


def internal_error_text(argv, exc: BaseException) -> str:
    """The paragraph for an exception envbuild did not expect: which command, what broke, that
    it is envbuild's fault, and where to report it."""
    from .outdir import shorten

    command = next((a for a in argv if not str(a).startswith("-")), "")
    detail = shorten(str(exc).splitlines()[0] if str(exc) else "", 200)
    return (f"envbuild: internal error in `envbuild {command}`: {type(exc).__name__}"
            + (f": {detail}" if detail else "") + ". This is a bug in envbuild, not in your input. "
            f"Please report it at {issue_tracker()} with this message, the command line and "
            "`envbuild --version`; run again with ENVBUILD_DEBUG=1 to get the full traceback.")


def issue_tracker() -> str:
    """Where to report bugs: the package's Project-URL (Issues), if the metadata has one."""
    try:
        from importlib.metadata import metadata

        for entry in metadata("envbuild").get_all("Project-URL") or []:
            label, _, url = entry.partition(",")
            if label.strip().lower() in ("issues", "bug tracker", "tracker"):
                return url.strip()
    except Exception:
        pass
    return "envbuild's issue tracker"


if __name__ == "__main__":  # `python -m envbuilder.cli`: run the importable module (the action
    from envbuilder.cli import main as _main  # modules import their helpers from it, not __main__)

    _main()
