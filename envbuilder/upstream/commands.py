"""`envbuild refresh` and `envbuild affected` whole, callable without click: the matrix read
against an index's JSON API (upstream/pypi.py fetches, upstream/refresh.py compares), and the
profiles a matrix overlay changes.

    report = refresh_report(m, "https://pypi.org", say=print)
    found = affected(matrix.load(()), matrix.load(("refresh-overlay",)))
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from envbuilder.errors import EnvbuildError

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix
    from envbuilder.upstream.refresh import Report


def refresh_report(
    m: Matrix,
    index_url: str,
    *,
    newest: int = 3,
    timeout: float = 30.0,
    overlay_dir: Path | None = None,
    matrix_dirs: Iterable[str | Path] = (),
    say: Callable[[str], None] = print,
) -> Report:
    """What the index at `index_url` (the root of PyPI's JSON API) says now against matrix `m`:
    the drift report (upstream.refresh.compare) under "index" (without user:password@); with
    `overlay_dir`, DIR/refresh.yaml written (an overlay over `matrix_dirs`) and named under
    "overlay". Refused before any request when `packaging` is missing or DIR is unfit."""

    from envbuilder.text import redact
    from envbuilder.upstream import refresh as R
    from envbuilder.upstream.overlay import check_overlay_dir, sources_of, write_overlay
    from envbuilder.upstream.pypi import PyPIJson

    from envbuilder.errors import need_extra

    need_extra("refresh", "actions", ("packaging",))  # (PyPI's requirement strings, PEP 508)
    if overlay_dir is not None:
        check_overlay_dir(Path(overlay_dir), matrix_dirs)
    index = PyPIJson(index_url, timeout)
    shown = redact(index_url)  # (an index URL's user:password@ is printed as ***@)
    say(f"reading {shown}/pypi/<name>/json for {', '.join(R.PACKAGES)} ...")
    projects = index.projects(R.PACKAGES)
    wanted = R.wanted_metadata(m, projects, newest)
    say(f"reading the metadata of {sum(map(len, wanted.values()))} releases ...")
    metadata = index.metadata_of(wanted, projects)
    drift = R.compare(m, projects, metadata, where=m.where)
    report: Report = {
        "index": shown,
        "packages": drift["packages"],
        "drift": drift["drift"],
        "notes": drift["notes"],
    }
    if overlay_dir is not None:
        path = write_overlay(Path(overlay_dir), R.overlay_text(report, m, sources_of(m)), matrix_dirs)
        report["overlay"] = str(path)
    return report


def affected(base: Matrix, over: Matrix) -> dict[str, list[str]]:
    """The profiles whose environment matrix `over` (the matrix with an overlay) resolves
    otherwise than `base`: each profile of `over` resolved in both, as shipped and with
    `--verl X` for every stack either knows, compared field by field (a refusal counts as a
    value). Profile -> one line per variant that differs, naming the fields."""
    from envbuilder.model.resolve import resolve
    from envbuilder.model.resolved import Overrides
    from envbuilder.text import redact

    stacks = sorted({*(base.sections.get("stacks") or {}), *(over.sections.get("stacks") or {})})
    found: dict[str, list[str]] = {}
    for name in over.profiles:
        for verl in (None, *stacks):
            ov = Overrides(verl=verl) if verl else Overrides()
            got: list[dict[str, object] | str | None] = []
            for m in (base, over):
                try:
                    got.append(resolve(m, name, ov).to_dict() if name in m.profiles else None)
                except EnvbuildError as e:
                    got.append(f"refused: {str(e).splitlines()[0]}")
            if got[0] != got[1]:
                a, b = got
                what = (
                    sorted(k for k in b if a.get(k) != b.get(k))
                    if isinstance(a, dict) and isinstance(b, dict)
                    else [str(b)]
                )
                found.setdefault(name, []).append(  # (a refusal may name a URL: ***@, never its password)
                    redact(f"{'--verl ' + verl if verl else 'as shipped'}: {', '.join(what)}")
                )
    return found
