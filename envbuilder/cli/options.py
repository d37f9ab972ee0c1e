"""What every command shares: the override options (declared in envbuilder/model/flags.py; the
Overrides they make come from envbuilder/model/profiles.py), --matrix-dir, the matrix, and `say` (stderr)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from envbuilder.cli import complete
from envbuilder.cli.callbacks import driver_version, not_empty
from envbuilder.model import flags as F
from envbuilder.model.flags import FLAG_FIELDS

if TYPE_CHECKING:
    from envbuilder.machine.doctor import Probes
    from envbuilder.model.matrix import Matrix

Command = Callable[..., object]  # a click command's function
Decorator = Callable[[Command], Command]
Dirs = tuple[Path, ...]  # --matrix-dir's folders, as a command gets them


# what the command line adds to a flag of model/flags.py: completion from the matrix, a check
_EXTRA: dict[str, dict[str, Any]] = {
    "cuda": {"shell_complete": complete.from_matrix("cuda")},
    "torch": {"shell_complete": complete.from_matrix("torch")},
    "python": {"shell_complete": complete.from_matrix("python")},
    "verl": {"shell_complete": complete.from_matrix("verl")},
    "vllm": {"shell_complete": complete.from_matrix("vllm")},
    "with_": {"shell_complete": complete.from_matrix("components")},
    "without": {"shell_complete": complete.from_matrix("components")},
    "driver": {"callback": driver_version},
    "model": {"callback": not_empty},
    "algo": {"shell_complete": complete.from_matrix("algorithms")},
    "interconnect": {"shell_complete": complete.from_matrix("interconnects")},
}


def _option(fl: F.Flag) -> Decorator:
    kinds: dict[str, dict[str, Any]] = {
        F.SWITCH: {"is_flag": True},
        F.NAMES: {"multiple": True},
        F.CHOICE: {"type": click.Choice(list(fl.choices))},
        F.INT: {"type": click.IntRange(*fl.bounds) if fl.bounds else int},
    }
    kind = kinds.get(fl.kind, {})
    meta: dict[str, Any] = {"metavar": fl.metavar} if fl.metavar else {}
    return click.option(fl.flag, fl.param, help=fl.help, **kind, **meta, **_EXTRA.get(fl.field, {}))


def override_options(f: Command) -> Command:
    opts = [_option(fl) for fl in F.FLAGS]
    f = matrix_dir_option(f)
    for opt in reversed(opts):
        f = opt(f)

    @wraps(f)
    def wrapper(*args: object, **kwargs: object) -> object:
        from envbuilder.model.profiles import overrides_from_flags

        flags = {name: kwargs.pop(name) for name in FLAG_FIELDS}
        dirs = cast(Dirs, kwargs.get("matrix_dirs") or ())  # (matrix_dir_option's folders)
        mirror = kwargs.get("mirror")  # (text, where the command has --mirror)
        kwargs["overrides"] = overrides_from_flags(
            flags, lambda: load_matrix(dirs), mirror if isinstance(mirror, str) else None
        )
        return f(*args, **kwargs)

    return wrapper


def matrix_dir_option(f: Command) -> Command:
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


def load_matrix(matrix_dirs: Dirs | list[Path]) -> Matrix:
    from envbuilder.model import matrix

    return matrix.load(tuple(matrix_dirs))


def say(text: str) -> None:
    """A line of progress or a note, on stderr (stdout holds the command's result); a URL's
    user:password@ in it as ***@, whoever wrote the line."""
    from envbuilder.text import redact

    click.echo(redact(text), err=True)


def passed_probes(ctx: click.Context | None = None) -> Probes | None:
    """The probes a test passed as click's context object (`invoke(cli, args, obj=Probes(...))`),
    None where there are none (the real ones are used)."""
    obj: object = (ctx or click.get_current_context()).obj
    if obj is None:
        return None
    from envbuilder.machine.doctor import Probes

    if not isinstance(obj, Probes):
        raise TypeError(f"click's context object is {type(obj).__name__}, not Probes")
    return obj


def implied_profile(m: Matrix, command: str, probes: Probes | None = None) -> str:
    """The profile `envbuild detect` picks when PROFILE is not named (machine.doctor)."""
    from envbuilder.machine.doctor import implied_profile as pick

    return pick(m, command, probes, say)
