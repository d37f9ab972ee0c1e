"""What every command does between its flags and `resolve`: the overrides built from the
override flags (--with/--without, --model, ...), and several profiles resolved at once, every
failure named before anything is done. Callable without click: the command line only passes
its flags through.

    ov = overrides_from_flags({"torch_": "2.6.0", "with_": ("apex",)}, lambda: matrix.load(()))
    envs = resolve_all(m, ["p40", "4090"], ov, "nothing was written", say=print)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Callable, Mapping

from envbuilder.errors import EnvbuildError, UserError

# the flags' parameter names -> Overrides' fields
from envbuilder.model.flags import FLAG_FIELDS, FLAGS, NAMES

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import Overrides, ResolvedEnv


def split_names(values: Iterable[str]) -> tuple[str, ...]:
    """--without apex,flash-attn and --without apex --without flash-attn both work."""
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def _names(value: object, flag: str) -> tuple[str, ...]:
    """A repeated flag's values (click's tuple of strings), split at commas; () when unset."""
    if not value:
        return ()
    if isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value):
        return split_names(value)
    raise TypeError(f"{flag}: expected a tuple of names, got {value!r}")


def overrides_from_flags(
    flags: Mapping[str, object], load_matrix: Callable[[], Matrix], mirror: str | None = None
) -> Overrides:
    """The Overrides the override flags ask for (keys: FLAG_FIELDS'; a missing one is unset).
    --with and --without naming one component is refused; --model (a hub id or a folder) is
    looked up in the matrix that `load_matrix()` returns, called only then; a hub id is read
    through `mirror`'s Hugging Face endpoint where that mirror set (--mirror) has one."""
    from envbuilder.model.resolved import Overrides

    given = {FLAG_FIELDS[k]: v for k, v in flags.items() if v is not None}
    # (--with, --without, --offload)
    names = {f.field: _names(given.get(f.field), f.flag) for f in FLAGS if f.kind == NAMES}
    given.update(names)
    both = sorted(set(names["with_"]) & set(names["without"]))
    if both:
        raise UserError(
            f"--with and --without both name {', '.join(both)}: say once whether the profile gets it."
        )
    given["allow_unsupported"] = bool(given.get("allow_unsupported"))
    index = given.get("flash_attn_index")
    if index is not None:
        from envbuilder.model.components.flash_attn import check_index_url

        given["flash_attn_index"] = check_index_url(str(index))
    model = given.get("model")
    if model is not None:
        from envbuilder.model.architectures import with_model

        table = load_matrix()
        hub = None
        if mirror:
            from envbuilder.model import mirrors as Mi

            hub = Mi.choice(mirror, Mi.get_set(table, mirror)).huggingface
        m, model_key = with_model(table, str(model), hub)
        given["model"] = model_key
        given["model_arch"] = None if model_key is None or model_key in table.models else m.models[model_key]
    return Overrides()._replace(**given)  # (each value of its field's type: click's, checked above)


def resolve_all(
    m: Matrix, names: list[str], overrides: Overrides | None, nothing: str, say: Callable[[str], None] = print
) -> list[ResolvedEnv]:
    """Every named profile resolved before anything is done: each failure is said
    ("envbuild: NAME: why"), then one error says how many failed and that `nothing` happened.
    One name alone raises its own error."""
    from envbuilder.model.resolve import resolve

    envs, failed = [], []
    for name in names:
        try:
            envs.append(resolve(m, name, overrides))
        except EnvbuildError as e:
            if len(names) == 1:
                raise
            failed.append(name)
            say(f"envbuild: {name}: {e}")
    if failed:
        raise UserError(
            f"{len(failed)} of {len(names)} profiles did not resolve ({', '.join(failed)}); {nothing}."
        )
    return envs
