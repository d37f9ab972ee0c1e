"""`envbuild bake`: one docker-bake.hcl for the profile matrix. buildx is not installable here,
so the file is parsed with python-hcl2 (tests/bakefile.py); tests/test_build.py builds a target
with exactly the args the file gives through the Docker engine that is here."""

from __future__ import annotations

import json

import pytest

from bakefile import load
from conftest import PROFILES, resolved
from envbuilder.engines.bake import default_tag, hcl_string


def test_bake_all_writes_a_target_and_a_context_per_profile(cli, tmp_path):
    code, out, err = cli("bake", "--all", "-o", tmp_path / "bake", "--registry", "127.0.0.1:5999")
    assert code == 0, err
    bake = load(tmp_path / "bake" / "docker-bake.hcl")
    assert bake["groups"]["default"] == PROFILES
    assert sorted(bake["targets"]) == sorted(PROFILES)
    assert {t["platforms"][0] for n, t in bake["targets"].items() if n in ("gh200", "gb200")} == {
        "linux/arm64"
    }
    for name, t in bake["targets"].items():
        env = resolved(name)
        assert (tmp_path / "bake" / t["context"] / "Dockerfile").is_file()
        assert json.loads((tmp_path / "bake" / name / "envbuild.json").read_text())["profile"] == name
        tag = default_tag(env)
        assert t["tags"][0] == f"127.0.0.1:5999/{tag}"
        assert t["cache-from"] == [f"type=registry,ref=127.0.0.1:5999/envbuild/{name}:buildcache"]
        assert t["cache-to"][0].endswith(":buildcache,mode=max")
        assert t["labels"]["io.envbuild.profile"] == name
        # its host's platform: the Grace systems' images are arm64 (buildx cross-builds them)
        assert t["platforms"] == ["linux/arm64" if env.gpu.machine == "aarch64" else "linux/amd64"]
        assert t["args"]["PIP_INDEX_URL"] == env.indexes.pypi
        assert t["args"].get("TORCH_INDEX_URL") == env.indexes.torch
        # every build arg the file passes is one the Dockerfile declares
        dockerfile = (tmp_path / "bake" / name / "Dockerfile").read_text()
        for arg in t["args"]:
            assert f"ARG {arg}=" in dockerfile, (name, arg)


def test_a_variable_overridden_when_baking_reaches_every_target(cli, tmp_path):
    assert cli("bake", "p40", "t4", "-o", tmp_path / "b")[0] == 0
    bake = load(
        tmp_path / "b" / "docker-bake.hcl",
        {"REGISTRY": "reg.corp:5000", "PIP_INDEX_URL": "https://pypi.corp/simple"},
    )
    for t in bake["targets"].values():
        assert t["tags"][0].startswith("reg.corp:5000/envbuild/")
        assert t["args"]["PIP_INDEX_URL"] == "https://pypi.corp/simple"


def test_bake_through_a_mirror_points_the_contexts_at_it(cli, tmp_path):
    assert cli("bake", "4090", "--mirror", "cn", "-o", tmp_path / "b")[0] == 0
    from conftest import shipped
    from envbuilder.model import mirrors as M

    cn = M.choice("cn", M.get_set(shipped(), "cn"))
    dockerfile = (tmp_path / "b" / "4090" / "Dockerfile").read_text()
    bake = load(tmp_path / "b" / "docker-bake.hcl")
    assert bake["variables"]["PIP_INDEX_URL"] == cn.pypi
    assert bake["targets"]["4090"]["args"]["PIP_INDEX_URL"] == cn.pypi
    assert f"ARG BASE_RUNTIME={cn.image(resolved('4090').cuda.images['runtime'])}" in dockerfile


def test_hcl_strings_keep_template_markers_literal():
    import hcl2

    for value in ["plain", 'a "quoted" ${NOT_A_VAR} %{x} \\ back']:
        parsed = hcl2.loads(f"x = {hcl_string(value)}\n")["x"]
        assert (
            parsed[1:-1].replace("$${", "${").replace("%%{", "%{").encode().decode("unicode_escape") == value
        )


def test_bake_needs_profiles_or_all(cli, tmp_path):
    assert cli("bake", "-o", tmp_path / "b")[0] == 2
    assert cli("bake", "p40", "--all", "-o", tmp_path / "b")[0] == 2
    code, _, err = cli("bake", "nosuch", "-o", tmp_path / "b")
    assert code == 2 and not (tmp_path / "b").exists()


# ---- 3: a registry is a registry, not bake settings ----------------------------------------------

EVIL_REGISTRIES = [
    "reg.example:5000,type=local,dest=/tmp/stolen",
    "reg.example:5000 x",
    "reg.example/Upper",
    "reg.example:99999",
    "http://reg.example:5000",
    "reg.example:5000/a//b",
    "reg.example:5000\n",
    "reg.example:５０００",
]


@pytest.mark.parametrize("value", EVIL_REGISTRIES)
@pytest.mark.parametrize("where", ["--registry", "ENVBUILD_REGISTRY_LOCAL"])
def test_a_registry_that_is_not_host_port_path_is_refused(run_envbuild, tmp_path, value, where):
    """Before: bake wrote the value into REGISTRY, whose comma adds cache-to settings (here: a
    local cache exported to /tmp/stolen), exit 0. Failed before the fix: yes."""
    args, env = ["bake", "t4", "-o", tmp_path / "bake"], {"XDG_CONFIG_HOME": str(tmp_path)}
    if where == "--registry":
        args += ["--registry", value]
    else:
        env["ENVBUILD_REGISTRY_LOCAL"] = value
    r = run_envbuild(*args, env=env)
    assert r.returncode == 2, (
        r.stderr,
        (tmp_path / "bake" / "docker-bake.hcl").read_text()
        if (tmp_path / "bake" / "docker-bake.hcl").exists()
        else "",
    )
    assert where in r.stderr and "HOST[:PORT]" in r.stderr
    assert not (tmp_path / "bake").exists()


@pytest.mark.parametrize(
    "value",
    [
        "localhost:5000",
        "127.0.0.1:5000",
        "reg.example.com",
        "reg.example.com:443/team/sub-path",
        "[::1]:5000",
        "ghcr.io/my-org",
    ],
)
def test_a_registry_of_host_port_path_is_baked_as_given(run_envbuild, tmp_path, value):
    """(A guard for the fix: these passed before and still do.)"""
    r = run_envbuild(
        "bake", "t4", "-o", tmp_path / "bake", "--registry", value, env={"XDG_CONFIG_HOME": str(tmp_path)}
    )
    assert r.returncode == 0, r.stderr
    hcl = (tmp_path / "bake" / "docker-bake.hcl").read_text()
    assert f'variable "REGISTRY" {{\n  default = {json.dumps(value)}\n}}' in hcl
