"""The newcomer: every `envbuild ...` command the docs print, run as written.

Where the commands come from: README.md and docs/*.md (test_docs.COMMANDS, the same parser),
the README.md that `envbuild render PROFILE` writes for each shipped profile, and the next-step
lines the CLI prints (detect's `next:` line on each recorded machine of tests/fixtures/gpu).

Each command falls in one class of CLASSES, first rule that matches, each with its reason:
RUN runs here (offline, no GPU, no Docker); the others are listed, not run, with what they need.
A documented command that no rule matches is an error: adding one to the docs forces a decision.

How a RUN command runs: in-process through envbuild's own main(), from a fresh folder per page
(a rendered README's commands from a fresh copy of the folder it sits in), with the page's
relative paths; a line's `cd DIR &&` moves that line's later calls, and lines run in the page's
order, so `render --from out/p40/envbuild.json` finds what `render p40` wrote above it. Values a
page leaves to the reader (REGISTRY, sha256:...) come from PLACEHOLDERS, and folders it assumes
the reader made (my-facts) from READER_MADE. It passes when the exit code is the one the line's
comment gives (`# exit 2: ...`, else 0) and the files it says it writes are there: its
-o/--out/--html target, the path its comment starts with (`# out/p40/, ...`) or names after
`writes`.

`python tests/newcomer.py` prints the plan (every command with its class and reason) and runs it;
tests/test_newcomer.py runs the same in the suite.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from test_docs import COMMANDS, shell_calls  # noqa: E402

RUN = "runs here"
GPU = "needs a GPU machine"
DOCKER = "needs Docker and a base image"
NET = "needs the internet"
AFTER = "needs what a command not run here writes"

# (pattern over the command's words joined by spaces, class, why): the first match decides.
CLASSES: list[tuple[str, str, str]] = [
    (r"^(detect|doctor)\b", GPU, "reads this machine's GPU, driver and container runtime"),
    (r"^diagnose\b", AFTER, "reads an environment of the reader's own (a venv or conda prefix)"),
    (
        r"^build\b",
        DOCKER,
        "builds an image FROM nvidia/cuda (Docker Hub or a mirror); CI has a loopback registry "
        "with Debian bases only",
    ),
    (r"^export-image\b", DOCKER, "exports an image `build` made"),
    (r"^import-image\b", DOCKER, "loads the archive `export-image` writes into a registry"),
    (r"^apptainer\b.*--oci-archive\b", AFTER, "reads the archive `export-image` writes"),
    (r"^install\b", NET, "installs the profile's packages (GBs) from PyPI and the PyTorch index"),
    (r"^verify\b", NET, "installs the profile's pins (GBs) into a throwaway venv"),
    (r"^wheelhouse\b", NET, "fetches every locked file (GBs), the PyTorch index's too"),
    (r"^lock\b(?!.*--check)", NET, "solves against PyPI and the PyTorch index"),
    (r"--wheelhouse\b", AFTER, "reads the wheelhouse `envbuild wheelhouse` fetched"),
    (r"\bmylocks\b", AFTER, "reads mylocks/, which `envbuild lock ... -o mylocks` solves online"),
    (
        r"^render\b.*--locked\b",
        AFTER,
        "reads the whole lock `envbuild lock PROFILE` solves online into ./lockfiles (image "
        "digests, the PyTorch index's torch); the shipped locks pin pip only, some with PyPI's torch",
    ),
    (r"^refresh\b", NET, "asks PyPI for every release since the matrix's"),
    (r"^affected refresh\b", AFTER, "reads the overlay `envbuild refresh --write-overlay` writes"),
    (r"^mirrors probe\b", NET, "probes every endpoint of a mirror set on the internet"),
    (r"^check\b.*--resolve\b", NET, "co-resolves the pinned set on the real index with uv"),
    (
        r"^(render|show|check|list|grid|launch (slurm|kuberay|ray)|bake|apptainer|sbom"
        r"|lock\b.*--check|mirrors list|affected)\b",
        RUN,
        "offline: reads the matrix and the shipped locks, writes files",
    ),
]

# What a page leaves to the reader, and the value the newcomer types.
PLACEHOLDERS = {
    "REGISTRY": "registry.example:5000",
    "sha256:...": "sha256:" + "0123456789abcdef" * 4,
}


def _my_facts(folder: Path) -> None:
    """reference.md's overlay folder: p40's record, whole, with another description."""
    import yaml

    from envbuilder.model import matrix

    rec = dict(matrix.load(()).profiles["p40"], description="my p40")
    doc = {"sources": {rec["source"]: "https://example.org/my-p40"}, "profiles": {"p40": rec}}
    folder.mkdir()
    (folder / "p40.yaml").write_text(yaml.safe_dump(doc))


# Folders a page assumes the reader made before its commands.
def _long_context(folder: Path) -> None:
    """megatron.md's overlay folder: a copy of tests/fixtures/long-context (32K-token responses)."""
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "long-context", folder)


READER_MADE: dict[str, Callable[[Path], None]] = {"my-facts": _my_facts, "long-context": _long_context}


@dataclass
class Step:
    """One documented envbuild call: where it is printed, its line, its words after `envbuild`."""

    source: str
    line: str
    words: list[str]
    cwd: str = "."  # relative to the page's folder: a `cd DIR &&` before it on its line
    kind: str = ""
    why: str = ""

    @property
    def command(self) -> str:
        return "envbuild " + shlex.join(self.words)


@dataclass
class Page:
    """The steps of one source, run in its order from one fresh folder (`seed` copied in first)."""

    source: str
    steps: list[Step] = field(default_factory=list)
    seed: Path | None = None


def classify(words: list[str]) -> tuple[str, str]:
    """(class, why) of a documented command, or ('', '') where no rule decides."""
    text = " ".join(words)
    for pattern, kind, why in CLASSES:
        if re.search(pattern, text):
            return kind, why
    return "", ""


def fill(word: str) -> str:
    """A word with the reader's values in place of the page's placeholders (REGISTRY/envbuild/
    p40@sha256:... is two)."""
    for name, value in PLACEHOLDERS.items():
        word = re.sub(rf"(?<![\w.]){re.escape(name)}(?![\w.])", value, word)
    return word


def steps_of(source: str, line: str) -> Iterator[Step]:
    """The envbuild calls of one shell line, each with the folder a `cd` before it moved to."""
    cwd = "."
    for call in shell_calls(line):
        if call[0] == "cd" and len(call) == 2:
            cwd = os.path.normpath(os.path.join(cwd, call[1]))
        elif call[0] == "envbuild" or call[0].endswith("/envbuild"):
            words = [fill(w) for w in call[1:]]
            kind, why = classify(words)
            yield Step(source, line, words, cwd, kind, why)


def doc_pages() -> list[Page]:
    """README.md and docs/*.md, each page's commands in its order."""
    pages: dict[str, Page] = {}
    for where, line in COMMANDS:
        pages.setdefault(where, Page(where)).steps.extend(steps_of(where, line))
    return list(pages.values())


def readme_commands(text: str) -> list[str]:
    """The `envbuild ...` spans of a rendered README (inline code, not fenced blocks)."""
    return re.findall(r"`(envbuild [^`]+)`", text)


def rendered_pages(profiles: list[str], into: Path) -> list[Page]:
    """Each shipped profile rendered once, as its README says it was (`Written by envbuild render
    PROFILE`), from a fresh folder; then a page of the README's commands, run from a fresh copy
    of the folder they sit in."""
    pages = []
    for profile in profiles:
        home = into / profile
        home.mkdir(parents=True)
        code, out = invoke(["render", profile], home)
        assert code == 0, f"envbuild render {profile}: exit {code}\n{out}"
        folder = home / "out" / profile
        text = (folder / "README.md").read_text()
        assert f"Written by `envbuild render {profile}`." in text, f"{profile}: README names another render"
        source = f"render {profile}: out/{profile}/README.md"
        page = Page(source, seed=folder)
        for line in readme_commands(text):
            page.steps.extend(steps_of(source, line))
        pages.append(page)
    return pages


def cli_next_steps() -> list[Page]:
    """The `next:` line detect prints on each recorded machine (tests/fixtures/gpu)."""
    from test_detect import host, invoke as invoke_with

    page = Page("detect's next: line")
    for box in sorted(
        p.name for p in (TESTS / "fixtures" / "gpu").iterdir() if (p / "nvidia-smi.txt").exists()
    ):
        try:
            _, out = invoke_with(["detect"], host(box))
        except Exception:  # (a recorded machine detect cannot read: no next line to follow)
            continue
        for line in out.splitlines():
            if line.strip().startswith("next: "):
                page.steps.extend(steps_of(f"detect on {box}", line.strip()[len("next: ") :]))
    return [page]


# What the CLI prints as a next step, where it prints it (a string in envbuilder/), and how the
# newcomer follows it: a printed step that is not here fails test_every_printed_next_step_is_known.
PRINTED_NEXT_STEPS = {
    "next: envbuild doctor": "machine/detect.py: followed on every recorded machine (cli_next_steps)",
    "load it with: envbuild import-image": f"cli/image.py: import-image, {DOCKER}",
    "train with": "machine/install.py: after install's READY, a shell line, no envbuild command; " + NET,
}


def invoke(words: list[str], cwd: Path) -> tuple[int, str]:
    """envbuild WORDS from `cwd`, in-process: (exit code, what it printed)."""
    from envbuilder.cli import main

    buf = io.StringIO()
    here = Path.cwd()
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("ENVBUILD_")}
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                main(list(words))
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(here)
        os.environ.update(saved)
    return code, buf.getvalue()


def expected_exit(line: str) -> int:
    m = re.search(r"#\s*exit (\d+):", line)  # (`# exit 1 if ...` is a condition, not a promise)
    return int(m.group(1)) if m else 0


def promised_files(step: Step) -> list[str]:
    """The paths a step says it writes: its -o/--out/--html value, the path its comment starts
    with (`# out/p40/, with ...`), and one named after `writes` in it."""
    found = []
    words = step.words
    for i, w in enumerate(words[:-1]):
        if w in ("-o", "--out", "--html"):
            found.append(words[i + 1])
    comment = step.line.partition(" #")[2].strip() if " #" in step.line else ""
    first = re.match(r"([\w.-]+/[\w./-]*)[:,]?(\s|$)", comment)
    if first:
        found.append(first.group(1))
    found += re.findall(r"\bwrites (\./[\w./-]+)", comment)
    return found


def run_page(page: Page, folder: Path) -> list[str]:
    """Run a page's RUN steps in order from `folder`; the failures, each with its output."""
    if page.seed is not None:
        shutil.copytree(page.seed, folder, dirs_exist_ok=True)
    for name, make in READER_MADE.items():
        if any(name in s.words for s in page.steps) and not (folder / name).exists():
            make(folder / name)
    failures = []
    for step in page.steps:
        if step.kind != RUN:
            continue
        cwd = folder / step.cwd
        code, out = invoke(step.words, cwd)
        want = expected_exit(step.line)
        problems = []
        if code != want:
            problems.append(f"exit {code}, the text says {want}")
        problems += [f"no {p}" for p in promised_files(step) if not (cwd / p).exists()]
        if problems:
            failures.append(
                f"{step.source}: `{step.command}` (cwd {step.cwd}): {'; '.join(problems)}\n{out[-1500:]}"
            )
    return failures


def all_pages(into: Path) -> list[Page]:
    from envbuilder.model import matrix

    return [*doc_pages(), *rendered_pages(list(matrix.load(()).profiles), into), *cli_next_steps()]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="envbuild-newcomer-") as tmp:
        pages = all_pages(Path(tmp) / "renders")
        failures = []
        for page in pages:
            for s in page.steps:
                print(
                    f"{s.kind or 'UNCLASSIFIED':<40} {s.source}: {s.command}"
                    + (f"  ({s.why})" if s.kind != RUN else "")
                )
        for i, page in enumerate(pages):
            folder = Path(tmp) / f"page-{i}"
            folder.mkdir()
            failures += run_page(page, folder)
        unclassified = [s for p in pages for s in p.steps if not s.kind]
        for f in failures:
            print("FAILED", f)
        for s in unclassified:
            print("UNCLASSIFIED", s.source, s.command)
        return 1 if failures or unclassified else 0


if __name__ == "__main__":
    sys.exit(main())
