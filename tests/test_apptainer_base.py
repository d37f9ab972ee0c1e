"""The rendered folder's apptainer.def: the image built by Apptainer alone, from the profile's
CUDA base image and the Dockerfile's install steps (render/sif.py), for clusters with Apptainer
and no Docker. Apptainer does not install here, so the file is read as Apptainer reads it (the
sections split of tests/test_apptainer.py, and spython's parser), its %post is checked by bash,
and its steps are held to the Dockerfile's: the same pip steps with the same constraints in the
same order, the patches, the audit, the smoke test."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import resolved
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext
from envbuilder.render.plan import install_plan
from test_apptainer import parse, sections


def _render(tmp_path, profile, **flags):
    env = resolved(profile, **flags)
    files = render_files(BuildContext.of(env))
    path = tmp_path / "apptainer.def"
    path.write_text(files["apptainer.def"])
    return env, files, path


@pytest.mark.parametrize(
    "profile,flags", [("4090", {}), ("p40", {}), ("h200", {}), ("t4", {"rollout": "vllm"})]
)
def test_the_definition_builds_the_dockerfiles_steps_from_the_base_image(tmp_path, profile, flags):
    env, files, path = _render(tmp_path, profile, **flags)
    text = path.read_text()
    headers, body = sections(text)
    assert len(headers) == 1 and headers[0]["bootstrap"] == "docker"
    base = env.cuda.images["devel" if env.needs_builder else "runtime"]
    assert headers[0]["from"] == base
    assert set(body) == {"files", "post", "environment", "test", "runscript", "help"}
    # every file %files copies is one the folder holds
    for line in body["files"].strip().splitlines():
        src, dest = line.split()
        assert src in files, src
    post = body["post"].split("\n", 1)[1]  # (after `%post -c /bin/bash`'s own line)
    # bash reads %post as a script
    r = subprocess.run(["bash", "-n"], input=post, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # each pip step of the Dockerfile, in order, with its constraints and the earlier steps'
    commands = [ln.strip() for ln in post.splitlines() if "pip install" in ln]
    plan = install_plan(env, None)
    for i, layer in enumerate(plan.layers):
        cmd = commands[i]
        for req in layer.requirements:
            assert req in cmd, (layer.name, req)
        for earlier in plan.layers[: i + 1]:
            assert f"-c /opt/envbuild/{earlier.constraints_file}" in cmd
        assert plan.pypi in cmd
    # then the patches, the audit; the smoke test is %test
    steps = [ln.strip() for ln in post.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    audit = next(i for i, s in enumerate(steps) if s.endswith("audit_precision.py"))
    if env.patches:
        assert steps[audit - 1].endswith("apply_patches.py")
    assert body["test"].strip() == "python /opt/envbuild/preflight.py --smoke"
    _, recipe, _ = parse(path)
    assert recipe.fromHeader == base
    if env.apex:
        assert any("apex @ " in s and "TORCH_CUDA_ARCH_LIST" in s for s in steps)


def test_a_value_reaches_the_definition_quoted(tmp_path):
    """The environment's values land in %environment quoted for sh, and the Python check
    names the profile's version."""
    env, _, path = _render(tmp_path, "p40")
    _, body = sections(path.read_text())
    assert re.search(r"export HF_ENDPOINT=\S+", body["environment"])
    assert f'if [ "$got" != {env.python} ]' in body["post"]
