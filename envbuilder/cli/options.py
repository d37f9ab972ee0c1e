"""What every command shares: the override options (declared here; the Overrides they make
come from envbuilder/model/profiles.py), --matrix-dir, the matrix, and `say` (stderr)."""

from __future__ import annotations

from functools import wraps
from pathlib import Path

import click

from envbuilder.cli import complete
from envbuilder.cli.callbacks import driver_version, not_empty
from envbuilder.model.profiles import FLAG_FIELDS, split_names  # noqa: F401  (re-exported)
from envbuilder.model.resolved import GPU_MEMORY_MIB


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
        click.option("--python", shell_complete=complete.from_matrix("python"), help="Python, e.g. 3.10."),
        click.option("--verl", shell_complete=complete.from_matrix("verl"), help="verl, e.g. 0.4.1."),
        click.option("--rollout", type=click.Choice(["hf", "vllm", "sglang"]), help="Rollout backend."),
        click.option("--vllm", shell_complete=complete.from_matrix("vllm"), help="vLLM release."),
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
            "--allow-unsupported", is_flag=True, help="Render below a hardware floor, warnings in the files."
        ),
        click.option(
            "--model",
            metavar="HF_ID|FOLDER",
            callback=not_empty,
            help="Train this model: a hub repo id (its config.json is read through "
            "--mirror's hub or HF_ENDPOINT, then cached) or a folder with its config.json. The memory "
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
        click.option(
            "--gpu-memory",
            type=click.IntRange(*GPU_MEMORY_MIB),
            metavar="MiB",
            help="Plan for a card of this size as nvidia-smi prints it (e.g. 40960: an A100 40GB).",
        ),
    ]
    f = matrix_dir_option(f)
    for opt in reversed(opts):
        f = opt(f)

    @wraps(f)
    def wrapper(*args, **kwargs):
        from envbuilder.model.profiles import overrides_from_flags

        flags = {name: kwargs.pop(name) for name in FLAG_FIELDS}
        dirs = kwargs.get("matrix_dirs") or ()
        kwargs["overrides"] = overrides_from_flags(flags, lambda: load_matrix(dirs), kwargs.get("mirror"))
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


def load_matrix(matrix_dirs):
    from envbuilder.model import matrix

    return matrix.load(tuple(matrix_dirs))


def say(text: str) -> None:
    """A line of progress or a note, on stderr (stdout holds the command's result)."""
    click.echo(text, err=True)


def implied_profile(m, command: str, probes=None) -> str:
    """The profile `envbuild detect` picks when PROFILE is not named (machine.doctor)."""
    from envbuilder.machine.doctor import implied_profile as pick

    return pick(m, command, probes, say)
