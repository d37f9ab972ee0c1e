"""Credentials never leave the secret path: a URL's user:password@ from an overlay, the user's
config or a `render --from` file is written into no rendered file (nor envbuild.json, the run
script, the README, a bake file or an Apptainer definition), reaches the build only as the
`endpoints` BuildKit secret, and is printed as ***@ (issue 21).
"""

from __future__ import annotations
import json
import re
import subprocess
from pathlib import Path
import pytest
import yaml
from conftest import shipped
from envbuilder.render.context import BuildContext
from test_refresh_overlay import hostile_index  # noqa: F401  (a fixture)

SECRET = "s3cr3t-Pw0rd"
USER = "alice"


# -- credentials never leave the secret path ---------------------------------------------------


def _render(cli, folder, tmp_path, profile="p40"):
    return cli("render", profile, "--matrix-dir", folder, "-o", tmp_path / "out")


def creds(url: str) -> str:
    return url.replace("://", f"://{USER}:{SECRET}@", 1)


def assert_no_secret(folder: Path) -> None:
    assert folder.is_dir(), f"{folder} was not written"
    leaks = [
        str(p.relative_to(folder))
        for p in sorted(folder.rglob("*"))
        if p.is_file() and SECRET.encode() in p.read_bytes()
    ]
    assert leaks == [], f"the password is written into {leaks}"


def assert_secret_mounted(dockerfile: str) -> None:
    """Every RUN step that reads an endpoint mounts the `endpoints` secret and sources it."""
    steps = re.findall(r"^RUN .*?(?<!\\)$", dockerfile, flags=re.M | re.S)
    readers = [
        s
        for s in steps
        if re.search(
            r"\$\{?(PIP_INDEX_URL|TORCH_INDEX_URL|APT_MIRROR|"
            r"APEX_URL|FLASH_ATTN_RELEASE)",
            s,
        )
    ]
    assert readers
    for s in readers:
        assert "--mount=type=secret,id=endpoints" in s and ". /usr/local/bin/envbuild-secrets" in s


def secret_sourced(text: str, tmp_path: Path) -> dict:
    """The variables a RUN step has after sourcing the `endpoints` secret with this text."""
    f = tmp_path / "endpoints"
    f.write_text(text)
    p = subprocess.run(
        ["bash", "-c", f". {f} && env -0"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=10,
    )
    assert p.returncode == 0, p.stderr
    return dict(kv.split("=", 1) for kv in p.stdout.split("\0") if "=" in kv)


@pytest.fixture
def no_config(monkeypatch, tmp_path):
    from envbuilder.model import config

    (tmp_path / "empty-config.yaml").write_text("{}\n")
    monkeypatch.setenv("ENVBUILD_CONFIG", str(tmp_path / "empty-config.yaml"))
    config._load.cache_clear()
    yield monkeypatch
    config._load.cache_clear()


def test_credentials_in_overlay_defaults_reach_the_build_only_as_the_secret(
    cli, overlay, tmp_path, no_config
):
    from envbuilder.model import matrix as M
    from envbuilder.model import mirrors
    from envbuilder.model.resolve import resolve

    pypi, hf = "https://pypi.corp.example/simple/", "https://hf.corp.example"
    folder = overlay({"defaults": dict(shipped().defaults, pypi_index=creds(pypi), huggingface=creds(hf))})
    code, out, err = _render(cli, folder, tmp_path)
    assert code == 0, err
    out = tmp_path / "out" / "p40"
    assert_no_secret(out)
    dockerfile = (out / "Dockerfile").read_text()
    assert f"ARG PIP_INDEX_URL={pypi}\n" in dockerfile and f"ARG HF_ENDPOINT={hf}\n" in dockerfile
    assert_secret_mounted(dockerfile)
    assert json.loads((out / "envbuild.json").read_text())["indexes"]["pypi"] == pypi
    # what `envbuild build` hands the RUN steps: the endpoints secret, credentials and all
    env, _, own = mirrors.split_credentials(resolve(M.load((folder,)), "p40"))
    assert env.indexes.pypi == pypi and env.huggingface == hf
    got = secret_sourced(mirrors.endpoints_secret(own), tmp_path)
    assert got["PIP_INDEX_URL"] == creds(pypi) and got["HF_ENDPOINT"] == creds(hf)
    # a mirror set's own endpoint replaces the profile's, credentials and all
    choice = mirrors.MirrorChoice("lab", {}, pypi="https://mirror.example/simple")
    text = mirrors.endpoints_secret({**own, **choice.endpoints(env)})
    assert "PIP_INDEX_URL" not in text and SECRET in text  # (HF_ENDPOINT stays the profile's)


def test_credentials_in_a_from_file_are_written_into_no_rendered_file(cli, tmp_path, no_config):
    from envbuilder.model import mirrors
    from envbuilder.model.runplan import env_from_json
    from envbuilder.render.files import MARKER, render_files
    from envbuilder.model.resolve import resolve

    spec = json.loads(render_files(BuildContext.of(resolve(shipped(), "p40")))[MARKER])
    assert spec["indexes"]["torch"] and spec["apex"]  # (p40: a +cu118 torch, apex compiled)
    spec["indexes"]["pypi"] = creds(spec["indexes"]["pypi"])
    spec["huggingface"] = creds(spec["huggingface"])
    spec["indexes"]["torch"] = spec["torch"]["index_url"] = creds(spec["indexes"]["torch"])
    spec["apex"]["url"] = creds(spec["apex"]["url"])
    spec["uv"]["url"] = creds(spec["uv"]["url"])
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    code, out, err = cli("render", "--from", tmp_path / "spec.json", "-o", tmp_path / "out")
    assert code == 0, err
    assert SECRET not in out + err
    assert_no_secret(tmp_path / "out" / "p40")
    assert_secret_mounted((tmp_path / "out" / "p40" / "Dockerfile").read_text())
    # pixi.toml names the indexes, bare (pixi reads its credentials from its own config)
    import tomllib

    pixi = tomllib.loads((tmp_path / "out" / "p40" / "pixi.toml").read_text())
    assert pixi["pypi-options"]["index-url"] == mirrors.without_credentials(spec["indexes"]["pypi"])
    assert pixi["pypi-dependencies"]["torch"]["index"] == mirrors.without_credentials(
        spec["indexes"]["torch"]
    )
    env, _, own = mirrors.split_credentials(env_from_json(json.dumps(spec), "spec.json"))
    assert own["PIP_INDEX_URL"] == spec["indexes"]["pypi"]
    assert own["HF_ENDPOINT"] == spec["huggingface"]
    assert own["TORCH_INDEX_URL"] == spec["indexes"]["torch"] and own["APEX_URL"] == spec["apex"]["url"]
    assert SECRET not in env.to_json()


def test_credentials_of_a_configured_mirror_set_stay_out_of_the_files(cli, tmp_path, no_config):
    """(Round one's case, kept: a mirror set in the user's config.)"""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "mirrors": {
                    "corp": {
                        "description": "corp",
                        "pypi": [creds("https://pypi.corp.example/simple")],
                        "huggingface": [creds("https://hf.corp.example")],
                        "apt": [creds("http://apt.corp.example/ubuntu")],
                        "github": [creds("https://gh.corp.example")],
                    }
                }
            }
        )
    )
    no_config.setenv("ENVBUILD_CONFIG", str(cfg))
    from envbuilder.model import config

    config._load.cache_clear()
    code, out, err = cli("render", "a100", "--mirror", "corp", "-o", tmp_path / "out")
    assert code == 0, err
    assert_no_secret(tmp_path / "out" / "a100")


def test_credentials_reach_no_bake_file_and_no_apptainer_definition(cli, overlay, tmp_path, no_config):
    folder = overlay(
        {
            "defaults": dict(
                shipped().defaults,
                pypi_index=creds("https://pypi.corp.example/simple"),
                huggingface=creds("https://hf.corp.example"),
            )
        }
    )
    code, out, err = cli("bake", "p40", "--matrix-dir", folder, "-o", tmp_path / "bake")
    assert code == 0, err
    assert_no_secret(tmp_path / "bake")
    digest = "sha256:" + "a" * 64
    code, out, err = cli(
        "apptainer",
        "p40",
        "--matrix-dir",
        folder,
        "--image",
        f"registry.example/envbuild/p40@{digest}",
        "-o",
        tmp_path / "p40.def",
    )
    assert code == 0, err
    assert SECRET not in (tmp_path / "p40.def").read_text()


def test_an_index_url_with_credentials_is_printed_as_stars(cli, frozen_matrix, hostile_index, tmp_path):
    base = hostile_index().replace("://", f"://{USER}:{SECRET}@")
    out_dir = tmp_path / "proposed"
    code, out, err = cli("refresh", "--index-url", base, "--write-overlay", out_dir)
    assert code in (0, None), err
    assert SECRET not in out + err and "http://***@127.0.0.1:" in out
    assert_no_secret(out_dir)
    code, out, err = cli("refresh", "--json", "--index-url", base)
    assert SECRET not in out + err
    # an index that does not answer: the error names it without the password
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = cli(
        "refresh", "--index-url", f"http://{USER}:{SECRET}@127.0.0.1:{port}", "--timeout", "2"
    )
    assert code == 1 and SECRET not in out + err and "***@127.0.0.1" in err, err
