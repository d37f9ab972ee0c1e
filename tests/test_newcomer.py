"""The newcomer test (issue 44): every `envbuild ...` command README.md, docs/*.md, each shipped
profile's rendered README and detect's `next:` line print is in a class of tests/newcomer.py
(a command added to the docs in none fails here), and the ones that run here do, as written,
from a fresh folder: the exit code and the files the text promises."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import newcomer as N
from conftest import PROFILES
from newcomer import ROOT
from test_docs import FIRST_COMMANDS

DOC_PAGES = N.doc_pages()


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> list[N.Page]:
    """Each shipped profile rendered once, as its README says, and its README's commands."""
    return N.rendered_pages(PROFILES, tmp_path_factory.mktemp("renders"))


def unclassified(pages: list[N.Page]) -> list[str]:
    return [f"{s.source}: {s.command}" for p in pages for s in p.steps if not s.kind]


def test_every_documented_command_is_in_a_class(rendered):
    pages = [*DOC_PAGES, *rendered, *N.cli_next_steps()]
    assert unclassified(pages) == [], "add a rule to tests/newcomer.py's CLASSES, with its reason"
    runs = [s for p in pages for s in p.steps if s.kind == N.RUN]
    assert len(runs) >= 100, len(runs)  # (the sources were read: a parser change is seen)
    kinds = {s.kind for p in pages for s in p.steps}
    assert kinds == {N.RUN, N.GPU, N.DOCKER, N.NET, N.AFTER}


@pytest.mark.parametrize("page", DOC_PAGES, ids=[p.source for p in DOC_PAGES])
def test_a_pages_commands_run_as_written(page, tmp_path):
    assert N.run_page(page, tmp_path) == []


def test_each_rendered_readmes_commands_run_as_written(rendered, tmp_path):
    failures = []
    for i, page in enumerate(rendered):
        assert any(s.kind == N.RUN for s in page.steps), page.source
        failures += N.run_page(page, tmp_path / str(i))
    assert failures == []


def test_detects_next_steps_run_as_written(tmp_path):
    (page,) = N.cli_next_steps()
    assert {s.words[0] for s in page.steps} == {"doctor", "render"}
    assert N.run_page(page, tmp_path) == []


def test_every_printed_next_step_is_where_the_table_says():
    from pathlib import Path

    code = Path(N.ROOT, "envbuilder")
    for phrase, where in N.PRINTED_NEXT_STEPS.items():
        path = code / where.split(":", 1)[0]
        assert phrase in path.read_text(), f"{path} no longer prints {phrase!r}: update PRINTED_NEXT_STEPS"


def test_the_newcomer_can_fail(tmp_path):
    """A command in no class, an exit code other than the text's, a promised file not written,
    are each caught; a `cd` on a line moves that line's later calls."""
    assert N.classify(["frobnicate", "p40"]) == ("", "")
    digest = N.PLACEHOLDERS["sha256:..."]
    assert N.fill("REGISTRY/envbuild/p40@sha256:...") == f"registry.example:5000/envbuild/p40@{digest}"
    assert N.classify(["render", "p40", "--wheelhouse", "wh/p40"])[0] == N.AFTER
    lines = [
        "envbuild render p40 && cd out/p40 && envbuild show p40 --json -o plan.json",
        "envbuild check p40 --rollout vllm",  # (exits 2; the text says nothing: 0)
        "envbuild render t4                 # elsewhere/t4/, with a README",
        "envbuild check p40 --rollout vllm  # exit 2: vLLM needs CC >= 7.0",
    ]
    page = N.Page("planted")
    for line in lines:
        page.steps.extend(N.steps_of("planted", line))
    assert [s.cwd for s in page.steps][:2] == [".", "out/p40"]
    failures = N.run_page(page, tmp_path)
    assert [f.split("\n")[0] for f in failures] == [
        "planted: `envbuild show p40 --json -o plan.json` (cwd out/p40): exit 2, the text says 0; no plan.json",
        "planted: `envbuild check p40 --rollout vllm` (cwd .): exit 2, the text says 0",
        "planted: `envbuild render t4` (cwd .): no elsewhere/t4/",
    ]


def test_the_readmes_first_line_then_each_extra_as_the_readme_names_it(real_pypi, tmp_path):
    """The README's first line, as written, in a copy of the tree with no venv: a real
    `pip install .` (the base, no extras) from the index the machine's pip uses, then
    `envbuild render p40`. In that bare venv the actions stop at once naming the extra the README
    lists them under (exit 2, nothing written); `pip install '.[actions]'` as the README says then
    makes `detect` run (no GPU here: it says so, not a missing module)."""
    tree = tmp_path / "envbuild"
    files = (
        subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        src = Path(ROOT, name)
        if src.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / name)

    def sh(line: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        return subprocess.run(
            ["bash", "-c", line], cwd=tree, capture_output=True, text=True, timeout=timeout, env=env
        )

    r = sh(FIRST_COMMANDS[0])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tree / "out/p40/Dockerfile").is_file() and (tree / "out/p40/run_ppo_gsm8k.sh").is_file()
    frozen = sh(".venv/bin/python -m pip freeze --exclude-editable").stdout.lower()
    # what the README says the base brings: render, list, show and check
    r = sh(".venv/bin/envbuild list && .venv/bin/envbuild show p40 && .venv/bin/envbuild check p40")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for heavy in ("docker==", "uv==", "py-rattler==", "nvidia-ml-py=="):
        assert heavy not in frozen, f"the base install brought {heavy}: {frozen}"

    for argv, extra in (("detect", "actions"), ("wheelhouse p40 -o wh", "lock")):
        r = sh(f".venv/bin/envbuild {argv}")
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert f"envbuild[{extra}]" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tree / "wh").exists()

    r = sh(".venv/bin/pip install -q '.[actions]' && .venv/bin/envbuild detect")
    assert "Traceback" not in r.stderr and "envbuild[actions]" not in r.stderr, r.stderr
    assert r.returncode in (0, 1, 2) and "No module named" not in r.stdout + r.stderr
