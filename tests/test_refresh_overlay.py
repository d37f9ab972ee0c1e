"""`envbuild refresh`'s overlay and report when the index is hostile: PyPI's strings (a
release's requires_python, a yanked_reason) fill typed values of refresh's overlay and never
become its structure; control characters and terminal escapes in them reach neither the
terminal, nor the overlay's comments, nor the pull request body the refresh workflow opens;
--write-overlay into a folder that cannot take the file is one paragraph, not a traceback, and
leaves nothing half-written (issue 21).

The index is a loopback server with PyPI's JSON layout (test_refresh's), serving the recorded
answers of tests/fixtures/pypi-json with one field made hostile. No Docker, no network beyond
127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import unicodedata
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from conftest import FROZEN, clean_env, envbuild_exe, frozen, shipped
from mounts import mounted  # noqa: F401  (a fixture)
from test_refresh import PYPI_JSON, WORKFLOW, _Index, rec

SECRET = "s3cr3t-Pw0rd"
USER = "alice"


# -- a loopback index whose answers we make hostile ---------------------------------------------


@pytest.fixture
def hostile_index(tmp_path):
    """hostile_index(edit) -> base URL of a loopback index serving a copy of the recorded PyPI
    answers after `edit(root)` changed them."""
    servers = []

    def start(edit=None) -> str:
        root = tmp_path / f"index{len(servers)}"
        shutil.copytree(PYPI_JSON, root)
        if edit:
            edit(root)
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
        srv.root, srv.per_release_json, srv.ranges, srv.extra, srv.served = root, True, True, {}, []
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def edit_json(root: Path, name: str, change) -> None:
    doc = json.loads((root / f"{name}.json").read_text())
    change(doc)
    (root / f"{name}.json").write_text(json.dumps(doc))


def yank(package: str, version: str, reason: str):
    def change(doc):
        for f in doc["releases"][version]:
            f["yanked"], f["yanked_reason"] = True, reason

    return lambda root: edit_json(root, package, change)


# what a hostile index writes into requires_python: live YAML (a mirror set, and a patch whose
# code would run inside verl in the image) once a newline ends the comment it is copied into
INJECTED = (
    ">=3.10\nmirrors:\n  pwned:\n    description: from the index\n"
    "    pypi: [https://evil.example/simple]\n"
    "patches:\n  verl-hardcoded-fa2:\n    why: x\n    when: always\n"
    "    files: [verl/__init__.py]\n"
    "    replace: [{find: import, with: 'import os; os.system(\"touch /tmp/pwned\")'}]\n"
    "    source: https://evil.example\n#"
)
# terminal escapes (an OSC 8 hyperlink, a CSI clear-screen and cursor-up, a C1 CSI), a bidi
# override, a line separator, a NEL, then a fence that would close the pull request's code
# block and Markdown that would render (a link, an image, HTML, a mention)
ESCAPES = (
    "\x1b]8;;https://evil.example/\x07click here\x1b]8;;\x07 \x1b[2J\x1b[1A\x9b31m "
    "\u202egnp.exe\u202c \u2028\x85\r\n```\n\n[link](https://evil.example) "
    "![x](https://evil.example/x.png) <img src=x onerror=alert(1)> @octocat\n~~~\n"
)


def unsafe_chars(text: str) -> list[str]:
    """The characters of `text` that a terminal or a Markdown reader acts on: control
    characters other than the newline (C0, DEL, C1, so ESC and every CSI/OSC sequence), format
    characters (the bidi overrides) and line or paragraph separators."""
    return sorted(
        {repr(c) for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")}
    )


# -- an index writes our YAML -----------------------------------------------------------------------


def test_a_newline_in_requires_python_never_becomes_overlay_structure(
    cli, frozen_matrix, hostile_index, tmp_path
):
    from envbuilder.model import matrix as M

    def edit(root):
        edit_json(root, "verl-0.9.1", lambda d: d["info"].__setitem__("requires_python", INJECTED))

    out = tmp_path / "proposed"
    code, stdout, err = cli("refresh", "--index-url", hostile_index(edit), "--write-overlay", out)
    assert code in (0, None), err
    text = (out / "refresh.yaml").read_text()
    # the string is in the TODO report, on one comment line, its newlines written as \n
    [line] = [ln for ln in text.splitlines() if "evil.example" in ln]
    assert line.startswith("#") and r">=3.10\nmirrors:\n  pwned:" in line
    assert not any(re.match(r"(mirrors|patches):", ln) for ln in text.splitlines())
    doc = yaml.safe_load(text)
    assert doc is None or not {"mirrors", "patches"} & set(doc)
    m = M.load((out,), base=FROZEN)
    assert "pwned" not in m.mirrors
    assert m.patches == frozen().patches
    # the terminal report shows the same string on one line too
    assert r"requires_python >=3.10\nmirrors:\n  pwned:" in stdout
    assert not any(ln.startswith(("mirrors:", "patches:", "  pwned:")) for ln in stdout.splitlines())


def test_terminal_escapes_from_the_index_reach_neither_the_terminal_nor_the_overlay(
    cli, frozen_matrix, hostile_index, overlay, tmp_path
):
    folder = overlay({"profiles": {"v100": rec("profiles", "v100", pins={"transformers": "4.57.0"})}})
    base = hostile_index(yank("transformers", "4.57.0", ESCAPES))
    out = tmp_path / "proposed"
    code, stdout, err = cli("refresh", "--index-url", base, "--matrix-dir", folder, "--write-overlay", out)
    assert code in (0, None), err
    assert unsafe_chars(stdout) == [] and unsafe_chars(err) == []
    [line] = [ln for ln in stdout.splitlines() if "transformers 4.57.0 is yanked" in ln]
    assert r"\x1b]8;;https://evil.example/\x07click here" in line and r"\u202egnp.exe" in line
    text = (out / "refresh.yaml").read_text()
    assert unsafe_chars(text) == []
    [line] = [ln for ln in text.splitlines() if "4.57.0 is yanked" in ln]
    assert line.startswith("# - [contradicted]") and r"\x1b[2J" in line
    assert yaml.safe_load(text) is None  # comments only: nothing to fix mechanically here
    # --json escapes them as JSON does, and keeps the reason whole
    code, stdout, err = cli("refresh", "--json", "--index-url", base, "--matrix-dir", folder)
    report = json.loads(stdout)
    [y] = [r for r in report["drift"] if r["fact"] == "yanked"]
    assert y["pypi"] == f"yanked: {ESCAPES}"


def _workflow_step(name: str) -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return next(s for s in doc["jobs"]["refresh"]["steps"] if s.get("name") == name)


def _fence_blocks(body: str) -> list[tuple[int, int]]:
    """(first, last) line numbers of each fenced code block of `body`, as CommonMark reads
    fences: an opening run of 3+ backticks or tildes (up to 3 spaces in), closed by a line of
    at least as many of the same character and nothing else."""
    lines, blocks, i = body.split("\n"), [], 0
    while i < len(lines):
        m = re.fullmatch(r" {0,3}(`{3,}|~{3,})[^`]*", lines[i])
        if not m:
            i += 1
            continue
        fence, start = m.group(1), i
        i += 1
        while i < len(lines) and not re.fullmatch(
            rf" {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}"
            r"[ \t]*",
            lines[i],
        ):
            i += 1
        blocks.append((start, i))
        i += 1
    return blocks


# Markdown alone (no control character but the newline): it closes the code block and renders
MARKDOWN = "ok\n```\n\n[link](https://evil.example) <img src=x> @octocat\n````\n"


@pytest.mark.parametrize("reason", [ESCAPES, MARKDOWN], ids=["escapes", "markdown"])
def test_the_pull_request_body_keeps_every_index_string_inside_its_code_block(
    hostile_index, tmp_path, reason
):
    """The refresh workflow's own step, run by bash as the runner runs it, against an index
    whose yanked_reason for a transformers release the shipped matrix pins holds terminal
    escapes and Markdown: the body the pull request gets is the preamble and one code block,
    and the code block holds no character a terminal or a Markdown reader acts on."""
    from envbuilder.upstream import refresh as R

    recorded = json.loads((PYPI_JSON / "transformers.json").read_text())["releases"]
    pinned = sorted(v for v in R.named_versions(shipped().sections)["transformers"] if recorded.get(v))
    assert pinned
    base = hostile_index(yank("transformers", pinned[0], reason))
    step = _workflow_step("envbuild refresh --write-overlay refresh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "envbuild").symlink_to(envbuild_exe())
    work, runner_temp = tmp_path / "checkout", tmp_path / "runner-temp"
    work.mkdir()
    runner_temp.mkdir()
    env = clean_env(
        INDEX=base,
        RUN_URL="https://github.com/o/r/actions/runs/1",
        RUNNER_TEMP=str(runner_temp),
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        PYTHONPATH=str(Path(__file__).resolve().parent.parent),
    )
    p = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", step["run"]],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    body = (runner_temp / "refresh-report.md").read_text()
    blocks = _fence_blocks(body)
    assert len(blocks) == 1, body
    first, last = blocks[0]
    lines = body.split("\n")
    assert last < len(lines) and all(not ln.strip() for ln in lines[last + 1 :]), body
    inside = "\n".join(lines[first + 1 : last])
    assert f"transformers {pinned[0]} is yanked" in inside
    assert "[link](https://evil.example)" in inside  # (inert: inside the code block)
    assert unsafe_chars(body) == []
    assert (work / "refresh" / "refresh.yaml").is_file()


def test_a_pin_the_matrix_schema_would_refuse_is_no_mechanical_fix(
    cli, frozen_matrix, hostile_index, tmp_path
):
    """An exact pin PyPI's grammar takes (`===`, any characters) but the matrix's does not
    stays a TODO: it never reaches the overlay's live records (where the schema would refuse
    the whole file and the weekly job would fail)."""

    def edit(root):
        def change(d):
            d["info"]["requires_dist"] = [
                "torch===2.6.0\u01c5" if r.startswith("torch==") else r for r in d["info"]["requires_dist"]
            ]

        edit_json(root, "vllm-0.8.5.post1", change)

    out = tmp_path / "proposed"
    code, stdout, err = cli("refresh", "--index-url", hostile_index(edit), "--write-overlay", out)
    assert code in (0, None), err
    assert "vllm 0.8.5.post1: the matrix says it pins torch==2.6.0" in stdout
    doc = yaml.safe_load((out / "refresh.yaml").read_text()) or {}
    assert "0.8.5.post1" not in (doc.get("vllm") or {})


# -- refresh --write-overlay into a folder that cannot take it ---------------------------------


def test_write_overlay_into_a_read_only_folder_is_one_paragraph(cli, frozen_matrix, hostile_index, mounted):
    ro = mounted("size=1m,ro")
    code, out, err = cli("refresh", "--index-url", hostile_index(), "--write-overlay", ro / "proposed")
    assert code == 2, err
    assert "--write-overlay" in err and "read-only" in err.lower() and "Traceback" not in err
    assert not any(ro.iterdir())
    code, out, err = cli("refresh", "--index-url", hostile_index(), "--write-overlay", ro)
    assert code == 2, err
    assert not any(ro.iterdir())


def _fill(disk: Path) -> Path:
    """Write a file on `disk` until no byte more fits."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError:
            pass
    return filler


def test_write_overlay_into_a_full_folder_is_one_paragraph_and_leaves_nothing(
    cli, frozen_matrix, hostile_index, mounted
):
    disk = mounted("size=1m")
    target = disk / "proposed"
    target.mkdir()
    filler = _fill(disk)
    code, out, err = cli("refresh", "--index-url", hostile_index(), "--write-overlay", target)
    assert code == 1, err
    assert "No space left" in err and "--write-overlay" in err and "Traceback" not in err
    assert list(target.iterdir()) == []  # no refresh.yaml, no staging folder
    # an overlay written before stays whole when the next one cannot be
    filler.unlink()
    code, out, err = cli("refresh", "--index-url", hostile_index(), "--write-overlay", target)
    assert code in (0, None), err
    before = (target / "refresh.yaml").read_bytes()
    _fill(disk)
    code, out, err = cli("refresh", "--index-url", hostile_index(), "--write-overlay", target)
    assert code == 1, err
    assert (target / "refresh.yaml").read_bytes() == before
    assert [p.name for p in target.iterdir()] == ["refresh.yaml"]
