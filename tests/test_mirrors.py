"""Mirror sets: image references, Dockerfile rewriting, rendering through a set, the user's config."""

from __future__ import annotations

import json

import pytest

from envbuilder.model import mirrors as M
from envbuilder.cli import main


def run(capsys, *args, **env):
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        from envbuilder.model import config

        config._load.cache_clear()
        with pytest.raises(SystemExit) as exit_:
            main([str(a) for a in args])
        config._load.cache_clear()
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.mark.parametrize(
    "ref, expected",
    [
        ("ubuntu:22.04", ("docker.io", "library/ubuntu", ":22.04")),
        (
            "nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04",
            ("docker.io", "nvidia/cuda", ":11.8.0-cudnn8-devel-ubuntu22.04"),
        ),
        ("docker.io/library/python", ("docker.io", "library/python", ":latest")),
        ("nvcr.io/nvidia/pytorch:24.01-py3", ("nvcr.io", "nvidia/pytorch", ":24.01-py3")),
        (
            "localhost:5000/envbuild/p40@sha256:" + "a" * 64,
            ("localhost:5000", "envbuild/p40", "@sha256:" + "a" * 64),
        ),
        (
            "127.0.0.1:5000/nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04",
            ("127.0.0.1:5000", "nvidia/cuda", ":12.4.1-cudnn-runtime-ubuntu22.04"),
        ),
    ],
)
def test_image_references_follow_dockers_rules(ref, expected):
    from envbuilder.oci.registry import parse_image

    got = parse_image(ref)
    assert (got.registry, got.repository, got.reference) == expected


def test_a_mirror_rewrites_images_of_the_registries_it_covers():
    choice = M.MirrorChoice("x", {"docker.io": "hub.example/proxy", "nvcr.io": None})
    assert choice.image("ubuntu:22.04") == "hub.example/proxy/library/ubuntu:22.04"
    assert (
        choice.image("nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04")
        == "hub.example/proxy/nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04"
    )
    assert choice.image("nvcr.io/nvidia/pytorch:24.01-py3") == "nvcr.io/nvidia/pytorch:24.01-py3"


def test_render_through_a_mirror_points_every_endpoint_at_it(capsys, tmp_path):
    code, _, err = run(capsys, "render", "p40", "--mirror", "cn", "-o", tmp_path)  # -> p40/
    assert code == 0, err
    dockerfile = (tmp_path / "p40" / "Dockerfile").read_text()
    args = dict(
        line[4:].split("=", 1) for line in dockerfile.splitlines() if line.startswith("ARG ") and "=" in line
    )
    assert args["BASE_RUNTIME"].startswith("docker.m.daocloud.io/nvidia/cuda:11.8.0")
    assert args["PIP_INDEX_URL"] == "https://pypi.tuna.tsinghua.edu.cn/simple"
    assert args["TORCH_INDEX_URL"] == "https://mirrors.nju.edu.cn/pytorch/whl/cu118"
    assert args["HF_ENDPOINT"] == "https://hf-mirror.com"
    assert args["APT_MIRROR"] == '"http://mirrors.tuna.tsinghua.edu.cn/ubuntu"'
    env_yml = (tmp_path / "p40" / "environment.yml").read_text()
    assert "https://mirrors.tuna.tsinghua.edu.cn/anaconda/cloud/conda-forge" in env_yml
    assert "--index-url https://mirrors.nju.edu.cn/pytorch/whl/cu118" in env_yml


def test_users_add_mirror_sets_in_their_config(capsys, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        json.dumps(
            {
                "mirrors": {
                    "corp": {
                        "description": "our proxy",
                        "registries": {"docker.io": ["registry.corp.example/hub"]},
                        "pypi": ["https://pypi.corp.example/simple"],
                    }
                }
            }
        )
    )
    code, out, _ = run(capsys, "mirrors", "list", ENVBUILD_CONFIG=str(cfg))
    assert code == 0
    assert "corp: our proxy" in out and "registry.corp.example/hub" in out
    code, _, _ = run(
        capsys, "render", "4090", "--mirror", "corp", "-o", tmp_path / "o", ENVBUILD_CONFIG=str(cfg)
    )
    assert code == 0
    assert (
        "ARG BASE_RUNTIME=registry.corp.example/hub/nvidia/cuda:"
        in (tmp_path / "o" / "4090" / "Dockerfile").read_text()
    )


def test_a_broken_config_is_exit_2_naming_the_file(capsys, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("mirrors: [unclosed\n")
    code, _, err = run(capsys, "mirrors", "list", ENVBUILD_CONFIG=str(cfg))
    assert code == 2
    assert str(cfg) in err and "Traceback" not in err


def test_an_unknown_mirror_set_is_exit_2_with_a_suggestion(capsys, tmp_path):
    code, _, err = run(capsys, "render", "p40", "--mirror", "cm", "-o", tmp_path / "x")
    assert code == 2
    assert "did you mean 'cn'" in err
    assert not (tmp_path / "x").exists()


def test_mirrors_list_and_probe_read_an_overlay_mirror_set(capsys, tmp_path):
    """--matrix-dir works on `mirrors` as on render: a set an overlay adds is listed and probed
    (here a loopback PyPI that answers and one that does not)."""
    from httpfixtures import FileServer, closed_port_url

    server, dead = FileServer({"simple/": b"<html></html>"}), closed_port_url("simple/")
    with server:
        overlay = tmp_path / "overlay"
        overlay.mkdir()
        (overlay / "lab.yaml").write_text(
            json.dumps(
                {
                    "sources": {"lab": "our lab's mirrors"},
                    "mirrors": {
                        "lab": {
                            "description": "the lab's proxy",
                            "pypi": [server.url("simple/"), dead],
                            "source": "lab",
                        }
                    },
                }
            )
        )
        code, out, err = run(capsys, "mirrors", "list", "--matrix-dir", overlay)
        assert code == 0, err
        assert "lab: the lab's proxy" in out
        code, out, err = run(capsys, "mirrors", "probe", "--mirror", "lab", "--json", "--matrix-dir", overlay)
    assert code == 0, err
    probes = {p["endpoint"]: p["ok"] for p in json.loads(out)}
    assert probes == {server.url("simple/"): True, dead: False}
    code, _, err = run(capsys, "mirrors", "probe", "--mirror", "lab")
    assert code == 2 and "lab" in err  # without the overlay, no such set


def test_build_through_a_mirror_asks_it_only_for_the_base_images_the_dockerfile_uses(tmp_path, monkeypatch):
    """4090 without flash-attn has no builder stage, so its Dockerfile's one FROM is the runtime
    image: a mirror that carries that image alone (what docs/mirrors.md's "only PyPI answers"
    route has a user push) serves the build. It was refused for lacking the devel image."""
    import uuid

    import lockfixtures as F
    from envbuilder.engines.docker import mirror_choice
    from envbuilder.model import config, matrix
    from envbuilder.model.resolve import resolve

    m = matrix.load()
    env = resolve(m, "4090")
    assert not env.needs_builder
    prefix = f"mirror-pick-{uuid.uuid4().hex[:12]}"
    with F.registry(tmp_path / "registry") as url:
        repo, tag = env.cuda.images["runtime"].split(":", 1)
        F.Registry(url).image(f"{prefix}/{repo}", tag, "amd64", oci=False)
        endpoint = f"{url.removeprefix('http://')}/{prefix}"
        cfg = tmp_path / "config.yaml"
        cfg.write_text(
            json.dumps({"mirrors": {"own": {"description": "own", "registries": {"docker.io": [endpoint]}}}})
        )
        monkeypatch.setenv("ENVBUILD_CONFIG", str(cfg))
        config._load.cache_clear()
        said: list[str] = []
        try:
            choice, _ = mirror_choice(m, "own", env, {}, said.append)
        finally:
            config._load.cache_clear()
    assert choice is not None and choice.registries == {"docker.io": endpoint}
    assert f"serves {env.cuda.images['runtime']}" in "\n".join(said)
