"""The GitHub workflows: each validates against the workflow schema (check-jsonschema's built-in
copy, offline; actionlint is not installable here), a deliberately broken copy does not, and
the CI workflow does what the README promises: render and lint every profile on pull requests,
run the README's test command, and bake and push the matrix on main and tags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import unavailable

WORKFLOWS = sorted((Path(__file__).resolve().parent.parent / ".github" / "workflows").glob("*.yml"))


def check_jsonschema() -> str:
    exe = Path(sys.executable).parent / "check-jsonschema"
    if not exe.exists():
        unavailable("check-jsonschema is not installed (the test extra lists it: pip install -e '.[test]')")
    return str(exe)


def validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [check_jsonschema(), "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_workflows_are_there():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "lock.yml", "refresh.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_workflow_validates(path):
    r = validate(path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_broken_workflow_does_not_validate(tmp_path):
    doc = yaml.safe_load(WORKFLOWS[0].read_text())
    job = next(iter(doc["jobs"].values()))
    job["runs-on"] = {"not": ["a", "runner"]}
    job["steps"] = "not a list"
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(doc))
    assert validate(broken).returncode != 0


def test_ci_renders_lints_tests_and_bakes_the_matrix():
    doc = yaml.safe_load((WORKFLOWS[0].parent / "ci.yml").read_text())
    on = doc[True]  # (YAML 1.1 reads the key `on` as true)
    assert "pull_request" in on and on["push"]["branches"] == ["main"] and on["push"]["tags"]
    runs = {name: "\n".join(s.get("run", "") for s in job["steps"]) for name, job in doc["jobs"].items()}
    assert "envbuild render --all" in runs["render-and-lint"] and "hadolint" in runs["render-and-lint"]
    assert "bash tests/run.sh" in runs["tests"]  # the README's second command, nothing else
    images = doc["jobs"]["images"]
    assert images["if"] == "github.event_name == 'push'"
    assert "envbuild bake --all" in runs["images"]
    bake = [s for s in images["steps"] if str(s.get("uses", "")).startswith("docker/bake-action@")]
    assert bake and bake[0]["with"]["push"] is True and bake[0]["with"]["files"] == "docker-bake.hcl"


def test_the_workflows_work_on_github_as_written():
    """What the first-hour review found: a pull request opened with GITHUB_TOKEN runs no
    workflow (both PR-opening jobs take ENVBUILD_PR_TOKEN first); lock.yml's path filter
    names everything the lock inputs are made from; GHCR wants a lowercase owner; and
    provision.sh keeps a runner's own Docker instead of installing docker.io beside it."""
    root = WORKFLOWS[0].parent
    for name in ("lock.yml", "refresh.yml"):
        doc = yaml.safe_load((root / name).read_text())
        pr = [
            s
            for j in doc["jobs"].values()
            for s in j["steps"]
            if str(s.get("uses", "")).startswith("peter-evans/create-pull-request@")
        ]
        assert pr and all(s["with"]["token"].startswith("${{ secrets.ENVBUILD_PR_TOKEN") for s in pr), name
    paths = yaml.safe_load((root / "lock.yml").read_text())[True]["pull_request"]["paths"]
    for feeds in (
        "envbuilder/render/plan.py",
        "envbuilder/model/mirrors.py",
        "pyproject.toml",
        "matrices/**",
        "envbuilder/lock/**",
    ):
        assert feeds in paths, feeds
    ci = (root / "ci.yml").read_text()
    assert "github.repository_owner" not in ci and "${GITHUB_REPOSITORY_OWNER,,}" in ci
    provision = (root.parent.parent / "tests" / "infra" / "provision.sh").read_text()
    assert '[[ "$p" == docker.io ]] && command -v dockerd' in provision


def test_the_lowercase_owner_step_lowercases(tmp_path):
    """The step's own shell line, run by bash with GitHub's variables."""
    doc = yaml.safe_load((WORKFLOWS[0].parent / "ci.yml").read_text())
    step = next(s for s in doc["jobs"]["images"]["steps"] if "GITHUB_ENV" in s.get("run", ""))
    env_file = tmp_path / "env"
    subprocess.run(
        ["bash", "-c", step["run"]],
        check=True,
        env={"GITHUB_REPOSITORY_OWNER": "My-Org", "GITHUB_ENV": str(env_file), "PATH": "/usr/bin:/bin"},
    )
    assert env_file.read_text() == "REGISTRY=ghcr.io/my-org\n"


def test_every_workflow_holds_its_token_to_what_it_needs():
    """Issue 33 #18: lock.yml had no permissions block (a job got the repository's default token
    scope); third-party actions were pinned by tag (a tag moves: peter-evans/create-pull-request@v6
    ran with contents: write); and checkout left its token in .git/config in jobs that
    pip-install packages they do not pin. Every workflow now sets `permissions:` at the top,
    every action is pinned by a full commit SHA (its tag in a comment), and every checkout keeps
    no credentials (create-pull-request pushes with its own token input). (On the code before,
    all three failed.)"""
    import re

    for path in WORKFLOWS:
        text = path.read_text()
        doc = yaml.safe_load(text)
        assert "permissions" in doc, f"{path.name}: no top-level permissions"
        for name, job in doc["jobs"].items():
            for step in job["steps"]:
                uses = step.get("uses")
                if uses is None or uses.startswith("./"):
                    continue
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", uses), f"{path.name} {name}: {uses}"
                if uses.startswith("actions/checkout@"):
                    assert (step.get("with") or {}).get("persist-credentials") is False, f"{path.name} {name}"
        # the tag each SHA stands for is named beside it, for review and for bumping
        for line in text.splitlines():
            if re.search(r"uses: [\w.-]+/[\w./-]+@[0-9a-f]{40}", line):
                assert re.search(r"@[0-9a-f]{40}\s+# v\d+\.\d+\.\d+$", line), line
