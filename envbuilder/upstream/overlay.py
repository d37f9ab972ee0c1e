"""`envbuild refresh --write-overlay DIR`: refresh.yaml written into a folder checked first,
whole or not at all, after the matrix loads with it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, cast

from envbuilder.errors import ActionError, EnvbuildError, UserError

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix


def check_overlay_dir(folder: Path, matrix_dirs: Iterable[str | Path]) -> None:
    from envbuilder.upstream import refresh as R
    from envbuilder.paths import data_dir

    shipped = data_dir("matrices").resolve()
    target = folder.resolve()
    if target == shipped or shipped in target.parents:
        raise UserError(
            f"--write-overlay {folder} is envbuild's own matrices folder: refresh "
            "never edits the shipped matrix. Pass another folder (e.g. "
            "--write-overlay refresh) and fold reviewed facts into matrices/ by hand."
        )
    if folder.exists() and not folder.is_dir():
        raise UserError(
            f"--write-overlay {folder} exists and is not a folder. Pass a folder: "
            "refresh writes refresh.yaml into it."
        )
    existing = folder / "refresh.yaml"
    if existing.is_symlink() or (existing.exists() and not existing.is_file()):
        raise UserError(
            f"{existing} is not a regular file; refresh writes only a file of its "
            "own there. Remove it or pass another folder."
        )
    if existing.is_file():
        with open(existing, encoding="utf-8", errors="replace") as f:
            head = f.read(len(R.OVERLAY_HEADER))
        if head != R.OVERLAY_HEADER:
            raise UserError(
                f"{existing} exists and was not written by envbuild refresh (it "
                f"does not start with {R.OVERLAY_HEADER!r}); refresh overwrites only "
                "its own file. Move it away or pass another folder."
            )


def sources_of(m: Matrix) -> Callable[[str, str], dict[str, str]]:
    """(section, key) -> its file's `sources:` map, to write a copied record's sources as URLs."""
    from envbuilder.limits import load_yaml, read_text_bounded

    cache: dict[str, dict[str, str]] = {}

    def sources(section: str, key: str) -> dict[str, str]:
        path = m.origin.get((section, key))
        if not path:
            return {}
        if path not in cache:
            doc: object = load_yaml(read_text_bounded(Path(path), "matrix file"), path)
            cache[path] = _sources(doc)
        return cache[path]

    return sources


def _sources(doc: object) -> dict[str, str]:
    """A matrix file's `sources:` (key -> URL; the matrix checked it when it loaded), {} for none."""
    top = cast("dict[object, object]", doc) if isinstance(doc, dict) else {}
    got = top.get("sources")
    items = cast("dict[object, object]", got).items() if isinstance(got, dict) else ()
    return {k: v for k, v in items if isinstance(k, str) and isinstance(v, str)}


def write_overlay(folder: Path, text: str, matrix_dirs: Iterable[str | Path]) -> Path:
    """Write folder/refresh.yaml after checking that the matrix loads with it (a copy that the
    schema refuses would be a bug of refresh's, not a fact to review)."""
    import shutil
    import tempfile

    from envbuilder.model import matrix
    from envbuilder.render.outdir import write_text_atomic

    stage = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".refresh-", dir=folder))
        write_text_atomic(stage / "refresh.yaml", text, fsync=True)
        matrix.load_files(matrix.matrix_files((*map(Path, matrix_dirs), stage)))
        os.replace(stage / "refresh.yaml", folder / "refresh.yaml")  # (whole, or the old one)
    except OSError as e:
        raise write_error(folder, e) from None
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
    return folder / "refresh.yaml"


def write_error(folder: Path, e: OSError) -> EnvbuildError:
    """A folder that cannot take refresh.yaml: exit 2 where the folder refuses writes (the
    user's choice of folder), exit 1 where the disk failed (full, an I/O error)."""
    import errno

    why = e.strerror or type(e).__name__
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
        return UserError(
            f"--write-overlay {folder}: cannot write refresh.yaml there ({why}). "
            "Nothing was written. Pass --write-overlay a folder you can write."
        )
    return ActionError(
        f"--write-overlay {folder}: writing refresh.yaml failed ({why}); any "
        "refresh.yaml there is as it was. Free space there (or pass another "
        "folder) and run refresh again."
    )
