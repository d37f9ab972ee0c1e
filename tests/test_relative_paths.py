"""Every command works from any folder with relative paths (issue 44, High 1 and 2).

Before: `envbuild wheelhouse 4090 -o wh/4090` failed building an sdist ("Source
`wh/4090/pypi/.partial/build-…/antlr4-python3-runtime-4.9.3.tar.gz` does not exist": uv build
ran in the scratch folder and read the relative path from there), and `export-image … -o
p40.tar` failed in skopeo ("stat .p40.tar.envbuild-…: no such file"), skopeo running in its
work folder. A path is made absolute once, where it enters: every path option of every command
(AbsPath), and the library calls that hand a path to a child running in another folder.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import click
import pytest

from envbuilder.cli.app import LAZY_COMMANDS, cli
from fixture_wheels import make_sdist
from httpfixtures import closed_port_url


def path_params() -> list[tuple[str, click.Parameter]]:
    found = []
    ctx = click.Context(cli)
    for name in LAZY_COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None
        for param in command.params:
            if isinstance(param.type, click.Path) and param.name != "matrix_dirs":
                found.append((name, param))
    return found


def test_there_are_path_options_to_check():
    names = {(c, p.name) for c, p in path_params()}
    assert {("wheelhouse", "out"), ("export-image", "out"), ("install", "prefix")} <= names
    assert {("verify", "keep"), ("sbom", "lock_dir"), ("lock", "out")} <= names


@pytest.mark.parametrize("command,param", path_params(), ids=lambda v: getattr(v, "name", v))
def test_every_path_option_is_made_absolute_where_it_enters(command, param, tmp_path, monkeypatch):
    """(--matrix-dir, read in this process only, stays as given.) Before: every one stayed
    relative, and those that reach a child in another folder named a missing file."""
    monkeypatch.chdir(tmp_path)
    for given in ("p40.tar", "./p40.tar", "wh/4090"):
        if param.type.exists:  # (an input that must be there: made, as the type wants it)
            if param.type.file_okay:
                (tmp_path / given).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / given).touch()
            else:
                (tmp_path / given).mkdir(parents=True, exist_ok=True)
        got = param.type.convert(given, param, None)
        assert os.path.isabs(got), (command, param.name, got)
        assert Path(got).resolve() == (tmp_path / given).resolve()
    if not param.type.exists:  # (left to not_empty's refusal)
        assert param.type.convert("", param, None) in ("", Path(""))


def test_a_relative_wheelhouse_builds_an_sdist(tmp_path, monkeypatch):
    """build_wheel with a relative wheelhouse folder (what `wheelhouse -o wh/4090` handed it).
    The sdist's backend lives in it (requires = []): no index is asked, none is reachable."""
    from envbuilder.offline.wheelbuild import build_wheel, host_glibc

    sdist = make_sdist(
        tmp_path / "src", "antlr4-python3-runtime", "4.9.3", module="antlr4", in_tree_backend=True
    )
    monkeypatch.chdir(tmp_path)
    glibc = host_glibc()
    assert glibc
    target = {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "python_platform": f"x86_64-manylinux_{glibc[0]}_{glibc[1]}",
    }
    built = build_wheel(
        Path("src") / sdist.name,
        hashlib.sha256(sdist.read_bytes()).hexdigest(),
        "antlr4-python3-runtime",
        "4.9.3",
        target,
        closed_port_url("simple/"),
        Path("wh/4090/pypi"),
    )
    assert built.filename == "antlr4_python3_runtime-4.9.3-py3-none-any.whl"
    assert (tmp_path / "wh/4090/pypi" / built.filename).is_file()


def test_export_images_work_folder_is_absolute_for_a_relative_output(tmp_path, monkeypatch):
    """skopeo runs in the work folder with TMPDIR set to it: the folder export_image makes for
    `-o p40.tar` or `-o ./p40.tar` must not be relative."""
    from envbuilder.engines.archive import Work
    from envbuilder.engines.export import work_folder

    monkeypatch.chdir(tmp_path)
    for given in ("p40.tar", "./p40.tar"):
        work: Work = work_folder(Path(given))
        try:
            assert work.path.is_absolute() and work.path.parent == tmp_path, work.path
        finally:
            work.close()
