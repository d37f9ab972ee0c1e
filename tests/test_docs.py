"""The docs hold to the code: README.md stays a short page that starts with its two commands
(what CI runs), every relative link in README.md and docs/*.md leads to a file (and an #anchor
to a heading there), and every `envbuild ...` line in their bash/sh/console blocks parses with
envbuild's own click options, as the rendered folder's README is checked in test_render.py.
And the docs' example outputs and claims are made or checked from today's matrix and locks
(build.md's detect, lockfiles/README.md's table, README's profiles and verl releases,
reference.md's overlays), so a matrix update that changes one fails until the page follows."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import click
import pytest
from envbuilder.render.context import BuildContext

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FIRST_COMMANDS = [
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/envbuild render p40",
    "bash tests/run.sh",
]
MAX_README_LINES = 260
SHELLS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
OPERATORS = set("();&|<>")


def split_blocks(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The lines outside fenced code, and each fenced block as (language, lines)."""
    prose: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    fence = None
    for line in text.splitlines():
        m = FENCE.match(line.strip())
        if fence is None and m:
            fence, lang, body = m.group(1), m.group(2).lower(), []
            blocks.append((lang, body))
        elif fence is not None and line.strip().startswith(fence) and not line.strip()[len(fence) :].strip():
            fence = None
            prose.append("")  # (keeps nothing of the block, but one line per line is not needed)
        elif fence is not None:
            body.append(line)
        else:
            prose.append(line)
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    prose, _ = split_blocks(text)
    seen: dict[str, int] = {}
    out = set()
    for line in prose:
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path, text: str | None = None) -> list[str]:
    """Every relative link of a page that leads nowhere: a missing file, or a missing heading."""
    text = page.read_text() if text is None else text
    prose, _ = split_blocks(text)
    problems = []
    for line in prose:
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                problems.append(f"{page.name}: {target}: no {path}")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest.read_text())):
                problems.append(f"{page.name}: {target}: no heading #{anchor} in {dest.name}")
    return problems


def command_lines(text: str) -> list[str]:
    """The shell lines of a page's bash/sh/console blocks, continuations joined; in a console
    block only the `$ ` lines (the rest is output)."""
    _, blocks = split_blocks(text)
    lines = []
    for lang, body in blocks:
        if lang not in SHELLS:
            continue
        joined = "\n".join(body).replace("\\\n", " ").splitlines()
        for line in joined:
            if lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if line.strip():
                lines.append(line)
    return lines


def shell_calls(line: str) -> list[list[str]]:
    """Every call on a shell line, in order (`cd out/p40 && envbuild build` is two), split at
    `&&`, `;`, `|`, parentheses, with leading VAR=value assignments and comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    calls: list[list[str]] = []
    current: list[str] = []
    for token in [*lexer, ";"]:
        if token and set(token) <= OPERATORS:
            while current and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", current[0]):
                current.pop(0)
            if current:
                calls.append(current)
            current = []
        else:
            current.append(token)
    return calls


def envbuild_commands(line: str) -> list[list[str]]:
    """The argument lists of every `envbuild` (or `.../envbuild`) call on a shell line."""
    return [c[1:] for c in shell_calls(line) if c[0] == "envbuild" or c[0].endswith("/envbuild")]


def parse(words: list[str]) -> None:
    """Parse an envbuild command line with envbuild's own click options, without running it;
    raises click's UsageError (or BadParameter) on an unknown command, option or value."""
    from envbuilder.cli import cli as group

    cmd: click.Command = group
    ctx = click.Context(group, info_name="envbuild")
    while isinstance(cmd, click.Group):
        if not words:
            raise click.UsageError("no command", ctx)
        name, words = words[0], words[1:]
        sub = cmd.get_command(ctx, name)
        if sub is None:
            raise click.UsageError(f"no such command {name!r}", ctx)
        if isinstance(sub, click.Group):
            ctx = click.Context(sub, parent=ctx, info_name=name)
        else:
            grammar_only(sub).make_context(name, list(words), parent=ctx, resilient_parsing=False)
        cmd = sub


def grammar_only(cmd: click.Command) -> click.Command:
    """A copy of cmd whose path parameters accept paths that do not exist here: a page's
    commands name the files that the commands before them wrote (`affected refresh`)."""
    copy_ = copy.copy(cmd)
    copy_.params = []
    for param in cmd.params:
        param = copy.copy(param)
        if isinstance(param.type, click.Path) and param.type.exists:
            param.type = copy.copy(param.type)
            param.type.exists = False
        copy_.params.append(param)
    return copy_


def all_commands() -> list[tuple[str, str]]:
    return [
        (page.relative_to(ROOT).as_posix(), line)
        for page in PAGES
        for line in command_lines(page.read_text())
        if envbuild_commands(line)
    ]


def test_the_docs_pages_are_there():
    names = {p.name for p in PAGES}
    assert {
        "README.md",
        "concepts.md",
        "memory.md",
        "offline.md",
        "mirrors.md",
        "verify.md",
        "reference.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
    } <= names


def test_the_readme_starts_with_its_two_commands():
    lines = README.read_text().splitlines()
    assert lines[0] == "# envbuild"
    first = next(i for i, line in enumerate(lines) if line.startswith("```"))
    assert lines[first] == "```bash", "the README's first block is not a bash block"
    end = lines.index("```", first + 1)
    assert lines[first + 1 : end] == FIRST_COMMANDS
    assert all(not line.strip() for line in lines[1:first]), "something comes before the commands"


def test_ci_runs_only_what_the_readme_names():
    """`.ci/run` calls the README's test command and nothing else."""
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    calls = [
        line.strip()
        for line in run
        if line.strip() and not line.lstrip().startswith("#") and not line.startswith(("set ", "cd "))
    ]
    assert calls and all(call in FIRST_COMMANDS for call in calls), calls


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, (
        f"README.md is {n} lines (at most {MAX_README_LINES}): move the detail into docs/"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


COMMANDS = all_commands()


@pytest.mark.parametrize(
    "where,line", COMMANDS, ids=[f"{where}:{i}" for i, (where, _) in enumerate(COMMANDS)]
)
def test_every_envbuild_command_in_the_docs_parses(where, line):
    for words in envbuild_commands(line):
        try:
            parse(words)
        except click.ClickException as e:
            pytest.fail(f"{where}: `{line.strip()}`: {e.format_message()}")


def test_the_checks_can_fail(tmp_path):
    """A broken link, a missing heading and a misspelt option are each caught."""
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading: here\n")
    text = (
        "[ok](there.md#a-heading-here) [gone](nowhere.md) [no heading](there.md#elsewhere)\n"
        "`[in code](nowhere.md)`\n```bash\n[x](nowhere.md)\n```\n"
    )
    assert broken_links(page, text) == [
        "page.md: nowhere.md: no nowhere.md",
        "page.md: there.md#elsewhere: no heading #elsewhere in there.md",
    ]
    block = "```bash\ncd out && envbuild render p40 --no-such-flag  # comment\n```\n"
    (calls,) = [envbuild_commands(line) for line in command_lines(block)]
    assert calls == [["render", "p40", "--no-such-flag"]]
    with pytest.raises(click.UsageError):
        parse(calls[0])
    with pytest.raises(click.UsageError):
        parse(["mirrors", "lsit"])
    parse(["mirrors", "probe", "--mirror", "cn"])
    console = "```console\n$ envbuild detect\nenvbuild output --not-an-option\n```\n"
    assert [envbuild_commands(line) for line in command_lines(console)] == [[["detect"]]]


# -- example outputs and claims, against today's matrix and locks (issue 34 #7) ----------------
# Each doc example below is made or checked from today's matrix: a matrix or lock update that
# changes it fails here until the page is updated (the failure prints what it should say).


def console_output(page: Path, command: str) -> list[str]:
    """The output lines a page's console block shows under `$ COMMAND`."""
    _, blocks = split_blocks(page.read_text())
    for lang, body in blocks:
        if lang == "console" and body and body[0] == f"$ {command}":
            return [line for line in body[1:] if not line.startswith("$ ")]
    raise AssertionError(f"{page.name} has no console block of `$ {command}`")


def test_build_md_detect_example_is_what_detect_prints_today():
    """docs/build.md's `envbuild detect` on an H200 is the recorded H200 machine
    (tests/fixtures/gpu/h200) read by today's detect and matrix."""
    from test_detect import host, invoke

    code, out = invoke(["detect"], host("h200"))
    assert code == 0
    want = [line for line in out.splitlines() if line.strip()]
    assert console_output(ROOT / "docs" / "build.md", "envbuild detect") == want, "\n".join(want)


def locks_table() -> list[str]:
    """lockfiles/README.md's table of the locks present, from the locks themselves: which parts,
    verl, torch and Python each pins, and how it was made (a torch swapped for PyPI's build)."""
    from envbuilder.model import matrix

    rows: dict[tuple[str, ...], list[str]] = {}
    order = list(matrix.load(()).profiles)
    for lock in sorted((ROOT / "lockfiles").glob("*/lock.json"), key=lambda p: order.index(p.parent.name)):
        import json

        meta = json.loads(lock.read_text())
        pins = (lock.parent / "requirements.lock").read_text()
        torch = re.search(r"^torch==(\S+)", pins, re.M).group(1)  # type: ignore[union-attr]
        verl = re.search(r"^verl==(\S+)", pins, re.M).group(1)  # type: ignore[union-attr]
        parts = ", ".join(meta["parts"]) + " (" + ", ".join(f"`{f}`" for f in sorted(meta["files"])) + ")"
        swapped = meta.get("torch_swapped")
        how = (
            f"`envbuild lock PROFILE --only pip --torch-from-pypi`, torch swapped: {swapped}"
            if swapped
            else "`envbuild lock PROFILE --only pip`, a real solve by uv against PyPI"
        )
        key = (meta["target"]["platform"], verl, torch, meta["target"]["python"], parts, how)
        rows.setdefault(key, []).append(lock.parent.name)
    out = ["| profile | platform | verl | torch | Python | parts | how |", "|---|---|---|---|---|---|---|"]
    for (platform, verl, torch, python, parts, how), names in rows.items():
        out.append(
            f"| {', '.join(f'`{n}`' for n in names)} | {platform} | {verl} | {torch} | {python} | {parts} | {how} |"
        )
    return out


def test_lockfiles_readme_lists_the_locks_present():
    text = (ROOT / "lockfiles" / "README.md").read_text()
    section = text.split("## Which locks are present", 1)[1]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert table == locks_table(), "\n".join(locks_table())


def test_readme_profiles_table_is_what_each_profile_resolves_to():
    """README's Profiles table: each row's CUDA, torch, verl and rollout are what its profiles
    resolve to today."""
    from envbuilder.model import matrix
    from envbuilder.model.resolve import resolve

    m = matrix.load(())
    section = README.read_text().split("## Profiles", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    seen = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", cells[0])
        for name in names:
            env = resolve(m, name)
            seen.append(name)
            assert cells[2] == env.cuda.version, (name, cells[2])
            assert cells[3].split()[0].split("+")[0] == env.torch.version, (name, cells[3])
            verl, rollout = (c.strip() for c in cells[4].split("/", 1))
            assert verl == env.verl.version, (name, verl)
            want = f"vLLM {env.vllm.version}" if env.rollout == "vllm" else "HF"
            assert rollout.startswith(want), (name, rollout, want)
    assert sorted(seen) == sorted(m.profiles)


def test_readme_names_the_verl_releases_that_take_a_pinned_set():
    """ "Every verl release ... is one flag away" names exactly the releases with a stack
    (matrices' `stacks`), and those without one (0.5.0) as such."""
    from envbuilder.model import matrix

    m = matrix.load(())
    text = " ".join(README.read_text().split())
    claim = re.search(r"\*\*verl ([\d., and]+) are each one flag away\*\*", text)
    assert claim, "README's claim about --verl moved"
    named = re.findall(r"\d+\.\d+\.\d+", claim.group(1))
    assert sorted(named) == sorted(m.stacks), (named, sorted(m.stacks))
    without = sorted(set(m.verl) - set(m.stacks))
    for v in without:
        assert f"verl {v} has no pinned set" in text, v


def test_reference_overlays_replace_whole_records(tmp_path):
    """reference.md says an overlay's record replaces the shipped one whole (so it must be
    complete); a one-field overlay is refused, a whole record with one field changed is taken."""
    import yaml

    from envbuilder.errors import UserError
    from envbuilder.model import matrix

    text = " ".join((ROOT / "docs" / "reference.md").read_text().split())
    assert "replace the shipped record of the same key whole" in text
    assert "key by key" not in text
    one = tmp_path / "one"
    one.mkdir()
    (one / "p.yaml").write_text(yaml.safe_dump({"profiles": {"p40": {"description": "mine"}}}))
    with pytest.raises(UserError, match="required key is missing"):
        matrix.load((one,))
    whole = tmp_path / "whole"
    whole.mkdir()
    rec = dict(matrix.load(()).profiles["p40"], description="mine")
    doc = {"sources": {rec["source"]: "https://example.org/mine"}, "profiles": {"p40": rec}}
    (whole / "p.yaml").write_text(yaml.safe_dump(doc))
    assert matrix.load((whole,)).profiles["p40"]["description"] == "mine"


def test_concepts_stack_table_is_the_matrix_stacks():
    """docs/concepts.md's table of the pinned sets: one row per stack of matrices/stacks.yaml,
    with its CUDA, torch and vLLM; its heading names no release without one."""
    from envbuilder.model import matrix

    m = matrix.load(())
    text = (ROOT / "docs" / "concepts.md").read_text()
    section = text.split("holds the whole pinned set of each release:", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].split()[0]] = (cells[1].split(" / ")[0], cells[2], cells[3])
    want = {v: (s["cuda"], s["torch"], s["vllm"]) for v, s in m.stacks.items()}
    assert rows == want, want
    assert "Every verl release from" not in text  # (0.5.0 has no pinned set)


def test_readme_driver_example_says_what_check_prints():
    """README's `envbuild check h100 --driver 550.54.15     # verl X on CUDA Y` is what check
    picks today."""
    from click.testing import CliRunner

    from envbuilder.cli import cli

    line = next(x for x in README.read_text().splitlines() if x.startswith("envbuild check h100 --driver"))
    command, _, comment = line.partition("#")
    verl, cuda = re.match(r"\s*verl (\S+) on CUDA (\S+),", comment).groups()  # type: ignore[union-attr]
    out = CliRunner().invoke(cli, shlex.split(command)[1:]).output
    assert out.startswith("OK:") and f"CUDA {cuda}," in out and f"verl {verl} " in out, out


def test_concepts_names_the_fix_check_gives_for_verl_050():
    from click.testing import CliRunner

    from envbuilder.cli import cli

    text = " ".join((ROOT / "docs" / "concepts.md").read_text().split())
    fix, profile = re.search(r"to add \(`([^`]+)` on an (\w+)\)", text).groups()  # type: ignore[union-attr]
    r = CliRunner().invoke(cli, ["check", profile, "--verl", "0.5.0"])
    out = r.output + str(r.exception)  # (the refusal is an error, raised to main)
    assert f"use {fix} (with it {profile} resolves)" in out, out


# Every way envbuilder/ reads a variable by its name: os.environ.get("X") / os.environ["X"] /
# "X" in os.environ / os.getenv("X") / click's envvar="X"
READS = re.compile(
    r"""environ(?:\.get)?\s*[\[(]\s*["']([A-Za-z_][A-Za-z0-9_]*)["']"""
    r"""|getenv\(\s*["']([A-Za-z_][A-Za-z0-9_]*)["']"""
    r"""|["']([A-Za-z_][A-Za-z0-9_]*)["']\s+(?:not\s+)?in\s+os\.environ\b"""
    r"""|envvar\s*=\s*["']([A-Za-z_][A-Za-z0-9_]*)["']"""
)


def variables_read(text: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in READS.finditer(text)}


def test_every_environment_variable_the_code_reads_is_named_in_the_reference():
    """docs/reference.md's promise: a variable it does not name changes nothing. Every variable
    envbuilder/ reads by name is named there (in backticks), and no code reads the environment
    through a name held elsewhere (environ.get(name)), which this check could not see."""
    reference = (ROOT / "docs" / "reference.md").read_text()
    read: dict[str, list[str]] = {}
    hidden = []
    for path in sorted((ROOT / "envbuilder").rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(ROOT).as_posix()
        for name in variables_read(text):
            read.setdefault(name, []).append(where)
        hidden += [
            f"{where}: {m.group(0)}"
            for m in re.finditer(r"(?:environ\.get|getenv)\(\s*[A-Za-z_][\w.]*\s*[,)]", text)
        ]
    assert len(read) >= 15, sorted(read)  # the scan finds what is there (ENVBUILD_CONFIG, ...)
    assert hidden == []
    missing = {name: where for name, where in sorted(read.items()) if f"`{name}" not in reference}
    assert missing == {}, "read by envbuilder/ but not named in docs/reference.md"


def test_the_variable_scan_sees_every_way_of_reading_one():
    text = """
    a = os.environ.get("ONE") or os.environ['TWO']
    if "THREE" in os.environ and 'FOUR' not in os.environ: os.getenv("FIVE")
    @click.option("--x", envvar="SIX")
    """
    assert variables_read(text) == {"ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX"}


def mypy_layers(pyproject: str) -> tuple[set[str], set[str]]:
    """(the packages [tool.mypy] checks strictly, the ones an override relaxes)."""
    try:
        import tomllib
    except ImportError:  # (Python 3.10: the lock extra's tomli)
        import tomli as tomllib

    mypy = tomllib.loads(pyproject)["tool"]["mypy"]
    checked = {f.split("/")[1] for f in mypy["files"] if re.fullmatch(r"envbuilder/[a-z_]+", f)}
    relaxed = {
        m.split(".")[1]
        for o in mypy["overrides"]
        if o.get("disallow_untyped_defs") is False
        for m in o["module"]
        if m.startswith("envbuilder.")
    }
    return checked - relaxed, relaxed


def test_architecture_names_exactly_the_layers_mypy_holds_to_strict():
    """ARCHITECTURE.md's claim is [tool.mypy]'s: every package it calls strict is checked with
    no relaxation, and the ones it says are not yet strict are the relaxed ones (or, where no
    override relaxes any, it says so)."""
    strict, relaxed = mypy_layers((ROOT / "pyproject.toml").read_text())
    text = " ".join((ROOT / "docs" / "ARCHITECTURE.md").read_text().split())
    claim = text[text.index("`mypy` runs from `tests/run.sh`") :]
    end = "not yet held to strict" if relaxed else "with no layer relaxed"
    claim = claim[: claim.index(end)]
    said_strict = set(re.findall(r"`envbuilder/([a-z_]+)/`", claim))
    found = re.search(r"the other action layers \(([^)]*)\)", claim)
    said_relaxed = set(found[1].replace(",", " ").split()) if found else set()
    assert {"model", "render", "tools", "oci"} <= strict
    assert (said_strict, said_relaxed) == (strict, relaxed)


def wheelhouse_lines() -> list[tuple[str, list[str]]]:
    """Each page's `envbuild wheelhouse` calls that export the shipped lock: not one given by
    --lock-dir, nor one a whole `envbuild lock PROFILE` earlier on the page wrote."""
    found, locked = [], set()
    for where, line in COMMANDS:
        for words in envbuild_commands(line):
            if words[:1] == ["lock"] and not {"--only", "--torch-from-pypi", "-o", "--out"} & set(words):
                locked |= {(where, w) for w in words[1:] if not w.startswith("-")}
            profile = next((w for w in words[1:] if not w.startswith("-")), None)
            if words[:1] == ["wheelhouse"] and "--lock-dir" not in words and (where, profile) not in locked:
                found.append((where, words))
    return found


WHEELHOUSE_LINES = wheelhouse_lines()


@pytest.mark.parametrize(
    "where,words", WHEELHOUSE_LINES, ids=[f"{w}:{' '.join(c)}" for w, c in WHEELHOUSE_LINES]
)
def test_every_documented_wheelhouse_of_a_shipped_lock_is_accepted_as_written(where, words):
    """Issue 44, Medium 3. Before: offline.md's `envbuild wheelhouse 4090 -o wh/4090` was
    refused on the shipped pip-only lock, without the --accept-partial the page did not show.
    (Only the refusal before any fetch is checked: lock_shortfalls, what export runs first.)"""
    from conftest import shipped
    from envbuilder.offline.checks import lock_shortfalls

    profiles = [w for w in words[1:] if not w.startswith("-")][:1]
    assert profiles, f"{where}: {' '.join(words)} names no profile"
    why = lock_shortfalls(
        shipped(),
        profiles[0],
        ROOT / "lockfiles" / profiles[0],
        "--accept-pypi-torch" in words,
        "--accept-partial" in words,
    )
    assert not why, f"{where}: `envbuild {' '.join(words)}` is refused: {why}"


# -- docs/ARCHITECTURE.md's table of packages and their modules -----------------------------------
ARCH_ROW = re.compile(r"^\| \d+ \| `envbuilder/(?:([a-z_]+)/)?` (?:\(top\) )?\| (.*) \|$")
PY_NAME = re.compile(r"`((?:[a-z_]+/)*[a-z_0-9]+\.py)`")


def architecture_rows() -> dict[str, str]:
    """{package folder ('' for the top level): what its row says}, from the rank table."""
    rows = {}
    for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines():
        m = ARCH_ROW.match(line) or re.match(r"^\| \d+ \| `([a-z_]+)/` \| (.*) \|$", line)
        if m:
            rows[m[1] or ""] = m[2]
    return rows


def test_the_architecture_table_names_every_module_and_only_modules_that_exist():
    """Each package's row names each of its modules (cli/ names its shared ones: the rest are one
    per command), and every module a row names exists (bare in that package or below it, or as
    PACKAGE/NAME.py from envbuilder/ or a path from the checkout)."""
    pkg_root = ROOT / "envbuilder"
    rows = architecture_rows()
    packages = {"", *(p.name for p in pkg_root.iterdir() if (p / "__init__.py").exists())}
    assert set(rows) == packages, "a package without its row, or a row without its package"
    gone, missing = [], []
    for pkg, text in rows.items():
        folder = pkg_root / pkg
        named = PY_NAME.findall(text)
        for name in named:
            found = (
                (pkg_root / name).is_file() or (ROOT / name).is_file()
                if "/" in name
                else any(folder.rglob(name))
            )
            if not found:
                gone.append(f"{pkg or '(top)'}: {name}")
        if pkg == "cli":
            continue
        modules = folder.glob("*.py") if pkg == "" else folder.rglob("*.py")
        for path in modules:
            if path.name in ("__init__.py", "__main__.py"):
                continue
            rel = path.relative_to(folder).as_posix()
            if not any(n in (path.name, rel, f"{pkg}/{rel}") for n in named):
                missing.append(f"{pkg or '(top)'}: {rel}")
    assert gone == [], f"docs/ARCHITECTURE.md names modules that do not exist: {gone}"
    assert missing == [], f"docs/ARCHITECTURE.md's table leaves out: {missing}"


def test_the_readmes_file_table_names_every_file_a_render_writes():
    """README's table of what `render` writes leaves none out (it lacked apptainer.def)."""
    from conftest import resolved
    from envbuilder.render.files import render_files

    rows = set(re.findall(r"^\| `([^`]+?)/?` \|", README.read_text(encoding="utf-8"), re.M))
    written = {
        name.split("/")[0] for p in ("p40", "4090") for name in render_files(BuildContext.of(resolved(p)))
    }
    assert written - rows == set()
