"""The rendered run script's own inputs (MODEL, DATA_DIR, N_GPUS): values that would reach
verl's Hydra overrides as something else (a sweep, an interpolation, a parse error after the data
set was prepared, a silently stripped space) are refused before any work, naming the character."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import resolved
from envbuilder.render.files import render_files


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "run_ppo_gsm8k.sh"
    path.write_text(render_files(resolved("p40"))["run_ppo_gsm8k.sh"])
    return path


def run(script, **env):
    base = {"PATH": os.environ["PATH"], "HOME": str(script.parent), "ENVBUILD_HOME": "/nonexistent"}
    return subprocess.run(
        ["bash", str(script)], env=dict(base, **env), capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "var,value,char",
    [
        ("MODEL", "/models/qwen,v2", ","),
        ("MODEL", "${oc.env:HF_TOKEN}", "$"),
        ("MODEL", "/models/a'b", "'"),
        ("MODEL", "/models/[x]", "["),
        ("DATA_DIR", "/data/gsm8k ", " "),
        ("DATA_DIR", "/data/{x}", "{"),
        ("DATA_DIR", "/data/#x", "#"),
        ("DATA_DIR", "/data/a=b", "="),
    ],
)
def test_a_value_hydra_would_misread_is_refused_before_any_work(script, var, value, char):
    env = {"DATA_DIR": "/nonexistent-data"}
    env[var] = value
    r = run(script, **env)
    assert r.returncode == 2
    assert f"the character '{char}'" in r.stderr and var in r.stderr
    assert "GSM8K" not in r.stderr  # nothing prepared, nothing run


def test_n_gpus_takes_digits_only(script):
    r = run(script, N_GPUS="$(touch /tmp/envbuild-pwned)")
    assert r.returncode == 2 and "digits only" in r.stderr
    assert not os.path.exists("/tmp/envbuild-pwned")


def test_an_ordinary_hub_id_and_path_pass_the_check(script):
    r = run(script, MODEL="Qwen/Qwen2.5-0.5B-Instruct", DATA_DIR="/nonexistent-data/gsm8k_v1.2+x@y:z")
    # past the check: the script goes on to prepare the data set (and stops there, no ENVBUILD_HOME)
    assert "cannot reach verl's Hydra overrides" not in r.stderr and "GSM8K not found" in r.stderr
