"""pixi.toml (issue 24): it validates against pixi's own manifest schema at a pinned release
(tests/fixtures/pixi/, v0.77.0), says what environment.yml and requirements.txt say (the same
install plan), and its conda part solves with py-rattler on the loopback conda channel the lock
tests build (tests/lockfixtures.py), for p40, 4090 and h200. pixi itself is not installable here
(its binary comes from GitHub), so its schema and rattler (pixi's own solver library) stand in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import unavailable

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from envbuilder.cli import main

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "tests" / "fixtures" / "pixi" / "manifest-schema-v0.77.0.json"
PROFILES = ("p40", "4090", "h200")
# pixi's own defaults for linux-64 where a manifest names none (its docs: system requirements)
PIXI_GLIBC, PIXI_LINUX = "2.28", "4.18"


def envbuild(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(map(str, args)))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("pixi")
    for profile in PROFILES:
        with pytest.raises(SystemExit) as exit_:
            main(["render", profile, "-o", str(out)])
        assert exit_.value.code == 0
    return out


def manifest(folder: Path) -> dict:
    return tomllib.loads((folder / "pixi.toml").read_text(encoding="utf-8"))


def validator():
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    assert schema["$id"] == "https://pixi.sh/v0.77.0/schema/manifest/schema.json"
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("profile", PROFILES)
def test_pixi_toml_validates_against_pixis_own_schema(rendered, profile):
    doc = manifest(rendered / profile)
    errors = sorted(validator().iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_the_schema_refuses_what_pixi_refuses(rendered):
    """The validation can fail: a key pixi does not know (at the top, in a task, in a pypi
    dependency), a platform that is no name."""
    v = validator()
    good = manifest(rendered / "4090")
    assert v.is_valid(good)
    for bad in (
        dict(good, workspace=dict(good["workspace"], platforms=["linux 64"])),
        dict(good, **{"system-requirement": {"cuda": "12.1"}}),
        dict(good, tasks={"preflight": {"cmd": "python preflight.py", "cwdd": "."}}),
        dict(good, **{"pypi-dependencies": {"torch": {"version": "==2.4.0", "indx": "x"}}}),
    ):
        assert not v.is_valid(bad)


def _pip_pins(folder: Path) -> dict[str, str]:
    """name -> version of every pin requirements.txt installs (its own and its constraints')."""
    from envbuilder.render.plan import REQ, normalize

    pins = {}
    for path in [folder / "requirements.txt", *sorted((folder / "constraints").glob("*.txt"))]:
        if path.name == "build.txt":  # (the builder's tools: not installed at run time)
            continue
        for line in path.read_text().splitlines():
            m = REQ.match(line)
            if m:
                pins[normalize(m[1])] = m[2]
    return pins


@pytest.mark.parametrize("profile", PROFILES)
def test_pixi_toml_holds_the_same_install_plan(rendered, profile):
    folder = rendered / profile
    doc = manifest(folder)
    spec = json.loads((folder / "envbuild.json").read_text())
    env_yml = yaml.safe_load((folder / "environment.yml").read_text())
    # the conda part: environment.yml's channels and specs (conda's `=V` is pixi's `V.*`)
    assert doc["workspace"]["channels"] == env_yml["channels"]
    conda = [d for d in env_yml["dependencies"] if isinstance(d, str)]
    assert [f"{n}={v[:-2]}" if v != "*" else n for n, v in doc["dependencies"].items()] == conda
    assert doc["workspace"]["platforms"] == ["linux-64"]
    assert doc["system-requirements"] == {"cuda": spec["cuda"]["version"]}
    # every pip pin requirements.txt installs, at its version, and nothing else
    pypi = doc["pypi-dependencies"]
    versions = {n: (v if isinstance(v, str) else v["version"]) for n, v in pypi.items()}
    assert versions == {n: f"=={v}" for n, v in _pip_pins(folder).items()}
    assert pypi["ray"]["extras"] == ["default"]
    # torch's own packages from the PyTorch index where the profile needs it, as requirements.txt
    torch_index = spec["torch"]["index_url"]
    for name in ("torch", "torchvision", "torchaudio"):
        assert (pypi[name].get("index") if isinstance(pypi[name], dict) else None) == torch_index
    assert doc["pypi-options"] == {"index-url": spec["indexes"]["pypi"]}
    # the tasks run the rendered scripts, which are there
    tasks = doc["tasks"]
    assert list(tasks) == ["patch", "preflight", "prepare-data", "train"]
    for task in tasks.values():
        for script in re.findall(r"\S+\.(?:py|sh)\b", task["cmd"]):
            assert (folder / script).is_file(), task
    assert tasks["train"]["env"] == {"ENVBUILD_HOME": "$PIXI_PROJECT_ROOT"}
    # pixi's train and preflight patch verl and audit it first, as the image's build does
    assert tasks["train"]["depends-on"] == ["patch"] and tasks["preflight"]["depends-on"] == ["patch"]
    assert tasks["patch"]["cmd"].endswith("python audit_precision.py")
    assert ("python apply_patches.py" in tasks["patch"]["cmd"]) == (folder / "apply_patches.py").is_file()


def test_a_mirror_reaches_pixi_toml_as_it_reaches_requirements_txt(tmp_path, capsys):
    code, _, err = envbuild(capsys, "render", "p40", "--mirror", "cn", "-o", tmp_path)
    assert code == 0, err
    folder = tmp_path / "p40"
    doc = manifest(folder)
    req = (folder / "requirements.txt").read_text().splitlines()
    index = next(line.split()[1] for line in req if line.startswith("--extra-index-url "))
    torch_index = next(line.split()[1] for line in req if line.startswith("--index-url "))
    assert doc["pypi-options"]["index-url"] == index != "https://pypi.org/simple"
    assert doc["pypi-dependencies"]["torch"]["index"] == torch_index
    assert (
        doc["workspace"]["channels"] == yaml.safe_load((folder / "environment.yml").read_text())["channels"]
    )
    assert validator().is_valid(doc)


# ---- the conda part solves with py-rattler on the loopback channel ---------------------------


@pytest.fixture(scope="module")
def channel_root(tmp_path_factory):
    """The lock tests' loopback channel, served under every channel name a pixi.toml names
    (conda-forge, nvidia, nvidia/label/cuda-X), so the solve takes the manifest's channels in its
    order, each pointed at loopback."""
    import importlib.util

    for module in ("rattler", "rattler_build"):
        if importlib.util.find_spec(module) is None:
            unavailable(f"{module} is not installed (pip install -e '.[lock,test]')")
    import lockfixtures as F

    root = tmp_path_factory.mktemp("channels")
    channel = F.build_channel(root / "channel")
    (root / "conda-forge").symlink_to(channel)
    (root / "nvidia").mkdir()
    for sub in ("linux-64", "noarch"):
        (root / "nvidia" / sub).symlink_to(channel / sub)
    (root / "nvidia" / "label").mkdir()
    for label in ("cuda-11.8.0", "cuda-12.1.0", "cuda-12.4.0", "cuda-13.0.0"):
        (root / "nvidia" / "label" / label).symlink_to(channel)
    server = F.StaticServer(root)
    yield server
    server.close()


@pytest.mark.parametrize("profile", PROFILES)
def test_the_conda_part_solves_with_rattler_on_the_loopback_channel(rendered, channel_root, profile):
    from envbuilder.lock.rattler_worker import call

    doc = manifest(rendered / profile)
    specs = [f"{name} {spec}" for name, spec in doc["dependencies"].items()]
    result = call(
        {
            "channels": [channel_root.url + name for name in doc["workspace"]["channels"]],
            "specs": specs,
            "platforms": [*doc["workspace"]["platforms"], "noarch"],
            "virtual_packages": {
                "__cuda": doc["system-requirements"]["cuda"],
                "__glibc": PIXI_GLIBC,
                "__linux": PIXI_LINUX,
                "__unix": "0",
                "__archspec": "1 x86_64",
            },
        }
    )
    assert "ok" in result, result
    solved = {r["name"]: r["version"] for r in result["ok"]}
    python = json.loads((rendered / profile / "envbuild.json").read_text())["python"]
    assert solved["python"].startswith(python + ".") and "pip" in solved
    if profile == "p40":  # nvcc of torch's CUDA, for apex
        assert solved["cuda-nvcc"].startswith("11.8.") and solved["cuda-version"] == "11.8"
    else:
        assert not any(n.startswith("cuda-") for n in solved), solved
    # and the channel's packages were fetched from loopback, under the manifest's channel names
    assert all(r["url"].startswith(channel_root.url) for r in result["ok"])


def test_the_solve_fails_for_a_cuda_the_driver_does_not_offer(rendered, channel_root):
    """The solve can fail: p40's nvcc 11.8 on a driver whose CUDA is 11.0 (the system requirement
    is what rattler gets as __cuda)."""
    from envbuilder.lock.rattler_worker import call

    doc = manifest(rendered / "p40")
    result = call(
        {
            "channels": [channel_root.url + name for name in doc["workspace"]["channels"]],
            "specs": [f"{name} {spec}" for name, spec in doc["dependencies"].items()],
            "platforms": ["linux-64", "noarch"],
            "virtual_packages": {"__cuda": "11.0", "__glibc": PIXI_GLIBC, "__unix": "0"},
        }
    )
    assert "unsat" in result and "__cuda" in result["unsat"], result
