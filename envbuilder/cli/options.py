"""What every command shares: the override options, --matrix-dir, the matrix, resolving
several profiles, the profile a command takes when none is named, and profile names as folders."""

from __future__ import annotations

from functools import wraps
from pathlib import Path

import click

from envbuilder.cli import complete

from envbuilder.errors import EnvbuildError, UserError


def split_names(values: tuple[str, ...]) -> tuple[str, ...]:
    """--without apex,flash-attn and --without apex --without flash-attn both work."""
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def driver_version(ctx, param, value):
    from envbuilder.model.versions import is_driver_version

    if value is not None and not is_driver_version(value):
        raise click.BadParameter(
            f"{value!r} is not an NVIDIA driver version like 550.54.14 "
            "(nvidia-smi shows it as 'Driver Version')."
        )
    return value


def override_options(f):
    opts = [
        click.option(
            "--cuda",
            shell_complete=complete.from_matrix("cuda"),
            help="CUDA toolkit of the image, e.g. 12.4.",
        ),
        click.option(
            "--torch",
            "torch_",
            metavar="VERSION",
            shell_complete=complete.from_matrix("torch"),
            help="torch release, e.g. 2.6.0.",
        ),
        click.option(
            "--python", shell_complete=complete.from_matrix("python"), help="Python version, e.g. 3.10."
        ),
        click.option("--verl", shell_complete=complete.from_matrix("verl"), help="verl release, e.g. 0.4.1."),
        click.option("--rollout", type=click.Choice(["hf", "vllm", "sglang"]), help="Rollout backend."),
        click.option(
            "--vllm", shell_complete=complete.from_matrix("vllm"), help="vLLM release (vllm rollout)."
        ),
        click.option(
            "--with",
            "with_",
            shell_complete=complete.from_matrix("components"),
            multiple=True,
            metavar="NAMES",
            help="Add optional components: apex, flash-attn (comma-separated).",
        ),
        click.option(
            "--without",
            shell_complete=complete.from_matrix("components"),
            multiple=True,
            metavar="NAMES",
            help="Leave components out: apex, flash-attn (comma-separated).",
        ),
        click.option(
            "--driver",
            metavar="VERSION",
            callback=driver_version,
            help="Check against this NVIDIA driver version, e.g. 550.54.14.",
        ),
        click.option(
            "--allow-unsupported",
            is_flag=True,
            help="Render even when the hardware is below a floor; the warnings go into the files.",
        ),
        click.option(
            "--model",
            metavar="HF_ID|FOLDER",
            help="Train this model: a hub repo id (its config.json is read through "
            "HF_ENDPOINT, then cached) or a folder holding its config.json. The memory "
            "plan, batch sizes and run script follow its shape.",
        ),
        click.option(
            "--algo",
            shell_complete=complete.from_matrix("algorithms"),
            metavar="ESTIMATOR",
            help="verl's advantage estimator: gae (PPO with a critic, the default), grpo, "
            "rloo, reinforce_plus_plus, remax, ... (`envbuild show PROFILE` lists the "
            "release's); the run script, critic and memory plan follow it.",
        ),
        click.option(
            "--nodes",
            type=click.IntRange(1, 1024),
            help="Train across this many nodes (a Ray cluster); default 1.",
        ),
        click.option(
            "--gpus-per-node",
            type=click.IntRange(1, 64),
            help="GPUs on each node (default: the profile's count). The memory plan "
            "shards over nodes x GPUs.",
        ),
        click.option(
            "--interconnect",
            shell_complete=complete.from_matrix("interconnects"),
            metavar="nvlink|pcie|ib|roce|tcp",
            help="How the GPUs talk: nvlink or pcie inside a node; ib, roce or tcp "
            "between nodes (default tcp with --nodes above 1). Sets NCCL's variables.",
        ),
        click.option(
            "--ecc",
            type=click.Choice(["on", "off"]),
            help="Plan memory for the board with ECC on (GDDR datacenter boards' default, "
            "which costs memory) or off (nvidia-smi -e 0 and a reboot).",
        ),
    ]
    f = matrix_dir_option(f)
    for opt in reversed(opts):
        f = opt(f)

    @wraps(f)
    def wrapper(
        *args,
        cuda,
        torch_,
        python,
        verl,
        rollout,
        vllm,
        with_,
        without,
        driver,
        allow_unsupported,
        model,
        algo,
        nodes,
        gpus_per_node,
        interconnect,
        ecc,
        **kwargs,
    ):
        from envbuilder.model.resolve import Overrides

        both = sorted(set(split_names(with_)) & set(split_names(without)))
        if both:
            raise UserError(
                f"--with and --without both name {', '.join(both)}: say once whether the profile gets it."
            )
        model_key, arch = None, None
        if model is not None:
            from envbuilder.model.architectures import with_model

            table = load_matrix(kwargs.get("matrix_dirs") or ())
            m, model_key = with_model(table, model)
            arch = None if model_key in table.models else m.models[model_key]
        kwargs["overrides"] = Overrides(
            cuda=cuda,
            torch=torch_,
            python=python,
            verl=verl,
            rollout=rollout,
            vllm=vllm,
            with_=split_names(with_),
            without=split_names(without),
            driver=driver,
            allow_unsupported=allow_unsupported,
            ecc=ecc,
            model=model_key,
            model_arch=arch,
            algo=algo,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            interconnect=interconnect,
        )
        return f(*args, **kwargs)

    return wrapper


def matrix_dir_option(f):
    """--matrix-dir (and ENVBUILD_MATRIX_DIR), the same on every command that reads the
    matrix: the command gets `matrix_dirs`, a tuple of folders."""
    return click.option(
        "--matrix-dir",
        "matrix_dirs",
        multiple=True,
        type=click.Path(path_type=Path),
        envvar="ENVBUILD_MATRIX_DIR",
        help="Extra matrix folder(s) whose *.yaml add or override profiles, facts and mirror sets.",
    )(f)


def implied_profile(m, command: str, probes=None) -> str:
    """The profile a command without PROFILE takes: the one `envbuild detect` picks for this
    machine's GPUs, said on stderr with why; with no GPU a profile fits, a refusal that lists
    the profiles (exit 2)."""
    from envbuilder.machine.detect import detect, recommend
    from envbuilder.machine.doctor import Probes

    probes = probes if probes is not None else Probes()
    machine = detect(m, probes.nvml, probes.run)
    rec = recommend(m, machine)
    if rec.profile and rec.gpu is not None:
        click.echo(
            f"{command}: no PROFILE given: this machine's {rec.gpu.name} (CC "
            f"{rec.gpu.compute_capability}) fits profile {rec.profile} best (`envbuild "
            f"detect` says why); name another to override",
            err=True,
        )
        return rec.profile
    why = machine.problem if not machine.gpus else "; ".join(rec.notes) or "no profile fits its GPU"
    raise UserError(
        f"Name a profile: `envbuild {command} PROFILE`"
        + (" (or --all, or --from envbuild.json)" if command == "render" else "")
        + ". None was given, "
        + ("there is no rendered folder here (no envbuild.json), " if command.startswith("build") else "")
        + f"and detect picks none for this machine ({why}). Profiles: "
        f"{', '.join(m.profiles)} (`envbuild list` shows each one's GPU)."
    )


def load_matrix(matrix_dirs):
    from envbuilder.model import matrix

    return matrix.load(tuple(matrix_dirs))


def resolve_all(m, names: list[str], overrides, nothing: str) -> list:
    """Every named profile resolved before anything is done: each failure is printed, then one
    error says how many failed and that `nothing` happened. One name alone raises its own."""
    from envbuilder.model.resolve import resolve

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
        raise UserError(
            f"{len(failed)} of {len(names)} profiles did not resolve ({', '.join(failed)}); {nothing}."
        )
    return envs


def plain_name(name: str, what: str) -> str:
    """`name` as one folder name under out/ (a name from an overlay or a --from file that holds
    a '/' or is '..' would render outside it)."""
    from envbuilder.text import shorten

    if not name or "/" in name or "\\" in name or name in (".", "..") or "\x00" in name:
        raise UserError(
            f"{what} is {shorten(name)!r}, which is not a plain folder name: it would "
            "render outside out/. Rename the profile (letters, digits, '.', '_', '-')."
        )
    return name
