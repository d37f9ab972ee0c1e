"""Shell completion's candidates (click's `shell_complete`): profile names, mirror sets, and the
versions and names each override takes, read from the matrix (with the command line's
--matrix-dir, else ENVBUILD_MATRIX_DIR) and the user's config. Completion never fails: a
matrix or config that does not load completes nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (imported when <Tab> asks: every command names these callbacks)
    import click
    from click.shell_completion import CompletionItem

    from envbuilder.model.matrix import Matrix

    Complete = Callable[[click.Context | None, click.Parameter | None, str], list[CompletionItem]]


def _matrix(ctx: click.Context | None) -> Matrix:
    from envbuilder.model.matrix import load, overlays_from_env

    dirs = (ctx.params.get("matrix_dirs") if ctx is not None else None) or overlays_from_env()
    return load(tuple(dirs))


def _items(
    names: Iterable[str], incomplete: str, helps: dict[str, str | None] | None = None
) -> list[CompletionItem]:
    from click.shell_completion import CompletionItem

    helps = helps or {}
    return [CompletionItem(n, help=helps.get(n)) for n in names if n.startswith(incomplete)]


def profiles(
    ctx: click.Context | None, param: click.Parameter | None, incomplete: str
) -> list[CompletionItem]:
    try:
        m = _matrix(ctx)
        return _items(list(m.profiles), incomplete, {n: p.get("description") for n, p in m.profiles.items()})
    except Exception:  # (a broken overlay is reported by the command itself, not by <Tab>)
        return []


def mirror_sets(
    ctx: click.Context | None, param: click.Parameter | None, incomplete: str, auto: bool = False
) -> list[CompletionItem]:
    try:
        from envbuilder.model.mirrors import mirror_sets as sets

        found = sets(_matrix(ctx))
        helps = {n: (b or {}).get("description") for n, b in found.items()}
        return _items([*found, *(["auto"] if auto else [])], incomplete, helps)
    except Exception:
        return []


def mirror_sets_or_auto(
    ctx: click.Context | None, param: click.Parameter | None, incomplete: str
) -> list[CompletionItem]:
    """For the commands whose --mirror also takes `auto` (the first set that answers)."""
    return mirror_sets(ctx, param, incomplete, auto=True)


def gpus(ctx: click.Context | None, param: click.Parameter | None, incomplete: str) -> list[CompletionItem]:
    try:
        m = _matrix(ctx)
        return _items([*m.gpus, *(p for p in m.profiles if p not in m.gpus)], incomplete)
    except Exception:
        return []


def pythons(m: Matrix) -> list[str]:
    from envbuilder.model.versions import version_key

    found = {r["python"] for r in m.cuda.values()} | {v for r in m.torch.values() for v in r["python"]}
    return sorted(found, key=version_key)


def from_matrix(section: str) -> Complete:
    """The candidates of an override that names a key of a matrix section (cuda, torch, verl,
    vllm, algorithms, interconnects), newest version first; `components` and `python` too."""

    def complete(
        ctx: click.Context | None, param: click.Parameter | None, incomplete: str
    ) -> list[CompletionItem]:
        try:
            from envbuilder.model.versions import version_key

            m = _matrix(ctx)
            if section == "components":
                from envbuilder.model.components.registry import names

                return _items(names(), incomplete)
            if section == "python":
                return _items(list(reversed(pythons(m))), incomplete)
            table = m.sections.get(section) or {}
            if section in ("algorithms", "interconnects", "models"):
                return _items(list(table), incomplete)
            return _items(sorted(table, key=version_key, reverse=True), incomplete)
        except Exception:
            return []

    return complete
