"""`envbuild lock` against loopback stand-ins of everything it talks to: a conda channel built
here (py-rattler-build + rattler.index, served over HTTP), two pypiservers with fixture wheels
named as the p40 profile pins them (a PyTorch-like index and a PyPI-like one), and a registry
with pushed manifests. One behaviour per test.

These tests must run in CI: a missing tool fails them (CI=true), it does not skip them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import unavailable
from envbuilder.cli import main

for module in ("rattler", "rattler_build", "conda_lock", "uv", "pypiserver", "requests"):
    if importlib.util.find_spec(module) is None:  # found, not imported: rattler runs in children
        unavailable(f"{module} is not installed (pip install -e '.[lock,test]')")

import lockfixtures as F  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NS = "envbuild-lock-test"  # our repositories in a (possibly shared) registry


def envbuild(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(map(str, args)))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.fixture(scope="module", autouse=True)
def isolated(tmp_path_factory):
    """No user caches or configuration leak into a lock (and none of ours into the user's);
    for this module's tests only: the environment is as it was once the module is done."""
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    for k, v in dict(
        ENVBUILD_NO_CACHE="1", XDG_CACHE_HOME=str(home / "cache"), UV_CACHE_DIR=str(home / "uv-cache")
    ).items():
        mp.setenv(k, v)
    for k in [k for k in os.environ if k.startswith(("UV_INDEX", "UV_EXTRA", "ENVBUILD_MATRIX"))]:
        mp.delenv(k)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def world(isolated, tmp_path_factory):
    """Channel, indexes and registry, with the p40 profile's base images pushed."""
    from envbuilder.model import matrix
    from envbuilder.model.resolve import resolve

    root = tmp_path_factory.mktemp("world")
    # torch weighs a few MiB so a download cut halfway has written something to resume from
    wheels = F.p40_wheels(root / "torch-index", root / "pypi", torch_payload=4 << 20)
    channel = F.build_channel(root / "channel")
    (channel / "label").mkdir()
    (channel / "label" / "cuda-11.8.0").symlink_to(channel)  # nvidia/label/cuda-X through a mirror
    chan = F.StaticServer(channel)
    env = resolve(matrix.load(), "p40")
    from fixture_wheels import apex_archive
    from httpfixtures import FileServer

    apex_path, apex_tgz = apex_archive(
        REPO / "tests" / "fixtures" / "apex-standin", env.to_dict()["apex"]["url"]
    )
    with (
        F.PypiServer(root / "torch-index") as torch_idx,
        F.PypiServer(root / "pypi") as pypi,
        F.registry(root / "registry") as reg,
        FileServer({apex_path: apex_tgz}) as github,
    ):
        r = F.Registry(reg)
        images = env.to_dict()["cuda"]["images"]
        pushed = {
            images["runtime"]: r.multiarch(
                f"{NS}/{images['runtime'].split(':')[0]}", images["runtime"].split(":")[1], oci=False
            ),
            images["devel"]: r.multiarch(
                f"{NS}/{images['devel'].split(':')[0]}", images["devel"].split(":")[1], oci=True
            ),
        }
        yield {
            "root": root,
            "wheels": wheels,
            "channel": chan,
            "channel_dir": channel,
            "torch": torch_idx.url,
            "pypi": pypi.url,
            "registry": reg,
            "pushed": pushed,
            "env": env,
            "mirror": f"{reg.split('://')[1]}/{NS}",
            "github": github.url("").rstrip("/"),
            "apex_tgz": apex_tgz,
        }
    chan.close()


def lock_args(world, out, *extra):
    """`envbuild lock p40 -o OUT`: the lock goes into OUT/p40/."""
    return [
        "lock",
        "p40",
        "-o",
        out,
        "--index-url",
        world["pypi"],
        "--torch-index-url",
        world["torch"],
        "--channel",
        world["channel"].url,
        "--registry-mirror",
        world["mirror"],
        "--github-url",
        world["github"],
        *extra,
    ]


@pytest.fixture(scope="module")
def p40_lock(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("locks")
    with pytest.MonkeyPatch.context():
        with pytest.raises(SystemExit) as exit_:
            main(lock_args(world, root))
    assert exit_.value.code == 0
    return root / "p40"


def closed_port() -> int:
    return F.free_port()  # bound and released: nothing listens there


# ---- what the lock holds ---------------------------------------------------------------------


def test_lock_writes_the_six_files(p40_lock):
    # -o DIR holds one folder per profile, DIR/p40/, with one profile as with --all
    assert [p.name for p in p40_lock.parent.iterdir()] == ["p40"]
    assert sorted(p.name for p in p40_lock.iterdir()) == [
        ".envbuild-files.json",  # (what envbuild wrote there: a re-lock deletes only that)
        "conda-lock.yml",
        "images.lock",
        "lock.json",
        "pylock.toml",
        "requirements.lock",
        "sources.lock",
    ]
    meta = json.loads((p40_lock / "lock.json").read_text())
    assert meta["parts"] == ["conda", "images", "pip", "sources"]
    assert meta["target"]["virtual_packages"]["__cuda"] == "11.8"
    assert meta["target"]["virtual_packages"]["__glibc"] == "2.35"  # Ubuntu 22.04's
    assert meta["target"]["python_platform"] == "x86_64-manylinux_2_35"
    assert set(meta["tools"]) >= {"uv", "py-rattler", "conda-lock", "requests", "envbuild"}


def test_conda_lock_yml_is_accepted_by_conda_lock(p40_lock, tmp_path):
    from conda_lock.lockfile import parse_conda_lock_file

    lock = parse_conda_lock_file(p40_lock / "conda-lock.yml")
    conda = {p.name: p for p in lock.package if p.manager == "conda"}
    pip = {p.name: p for p in lock.package if p.manager == "pip"}
    assert conda["python"].version == "3.10.0"
    assert conda["cuda-nvcc"].version == "11.8.89"  # p40 builds apex: nvcc 11.8 == torch's CUDA
    assert {"pip", "cuda-cudart-dev", "cuda-libraries-dev"} <= set(conda)
    assert all(p.hash.md5 and p.hash.sha256 for p in conda.values())
    assert pip["torch"].version == "2.6.0+cu118"
    assert all(p.hash.sha256 and p.url.startswith("http://127.0.0.1:") for p in pip.values())
    assert "filelock" in pip["torch"].dependencies

    shutil.copy(p40_lock / "conda-lock.yml", tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "conda_lock",
            "render",
            "-k",
            "explicit",
            "--platform",
            "linux-64",
            "conda-lock.yml",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    explicit = (tmp_path / "conda-linux-64.lock").read_text()
    assert "@EXPLICIT" in explicit
    assert re.search(
        r"^http://127\.0\.0\.1:\d+/linux-64/cuda-nvcc-11\.8\.89-h0_0\.conda#[0-9a-f]{32}$", explicit, re.M
    )
    assert "# pip torch @ http://127.0.0.1:" in explicit


def test_rattler_installs_the_locked_env_without_solving(world, p40_lock, tmp_path):
    before = len(world["channel"].log)
    assert F.install_locked(p40_lock / "conda-lock.yml", tmp_path / "env") == {"ok": True}
    fetched = world["channel"].log[before:]
    assert fetched and not any("repodata" in path for path in fetched), fetched
    installed = sorted(p.name.rsplit("-", 2)[0] for p in (tmp_path / "env" / "conda-meta").glob("*.json"))
    assert installed == [
        "cuda-cudart-dev",
        "cuda-libraries-dev",
        "cuda-nvcc",
        "cuda-version",
        "pip",
        "python",
    ]


def test_a_grace_profiles_conda_part_is_solved_for_linux_aarch64(world, tmp_path, capsys):
    """gh200's conda part comes from the channel's linux-aarch64 subdir (never linux-64's python
    of the same version), for __archspec aarch64, and installs as an aarch64 prefix."""
    code, _, err = envbuild(
        capsys, "lock", "gh200", "-o", tmp_path, "--only", "conda", "--channel", world["channel"].url
    )
    assert code == 0, err
    lock = tmp_path / "gh200"
    meta = json.loads((lock / "lock.json").read_text())
    assert meta["target"]["platform"] == "linux-aarch64"
    assert meta["target"]["virtual_packages"]["__archspec"] == "1 aarch64"
    from conda_lock.lockfile import parse_conda_lock_file

    parsed = parse_conda_lock_file(lock / "conda-lock.yml")
    assert parsed.metadata.platforms == ["linux-aarch64"]
    urls = {p.name: p.url for p in parsed.package}
    assert {p.platform for p in parsed.package} == {"linux-aarch64"}
    assert urls["python"].endswith("/linux-aarch64/python-3.12.0-h0_0.conda") and "/noarch/" in urls["pip"]
    assert F.install_locked(lock / "conda-lock.yml", tmp_path / "env") == {"ok": True}
    assert (tmp_path / "env" / "bin" / "python-3.12.0.txt").is_file()
    code, out, err = envbuild(capsys, "lock", "gh200", "--check", "--only", "conda", "-o", tmp_path)
    assert code == 0, out + err


def test_a_tampered_conda_sha256_fails_the_install(p40_lock, tmp_path):
    result = F.install_locked(p40_lock / "conda-lock.yml", tmp_path / "env", tamper="cuda-nvcc")
    assert "hash mismatch" in result.get("error", ""), result


def _python310() -> str:
    for candidate in [
        shutil.which("python3.10"),
        *sorted(
            Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")).glob("versions/3.10*/bin/python3.10")
        ),
    ]:
        if candidate and subprocess.run([str(candidate), "-c", "pass"], capture_output=True).returncode == 0:
            return str(candidate)
    pytest.fail("no Python 3.10 interpreter for the cp310 fixture wheels")


def _pip_install(world, venv: Path, requirements: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this host's pip.conf adds find-links
    return subprocess.run(
        [
            venv / "bin" / "pip",
            "install",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--index-url",
            world["pypi"],
            "--extra-index-url",
            world["torch"],
            "-r",
            requirements,
        ],
        capture_output=True,
        text=True,
        env=env,
    )


def test_requirements_lock_installs_with_require_hashes_and_a_tampered_hash_fails(world, p40_lock, tmp_path):
    subprocess.run([_python310(), "-m", "venv", tmp_path / "v"], check=True)
    proc = _pip_install(world, tmp_path / "v", p40_lock / "requirements.lock")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = subprocess.run(
        [
            tmp_path / "v" / "bin" / "python",
            "-c",
            "import torch, verl, numpy; print(torch.__version__, numpy.__version__)",
        ],
        capture_output=True,
        text=True,
    )
    assert out.stdout.split() == ["2.6.0+cu118", "1.26.4"]

    text = (p40_lock / "requirements.lock").read_text()
    torch_hash = hashlib.sha256(world["wheels"]["torch"].read_bytes()).hexdigest()
    (tmp_path / "tampered.txt").write_text(text.replace(torch_hash, "0" * 64))
    subprocess.run([_python310(), "-m", "venv", tmp_path / "v2"], check=True)
    proc = _pip_install(world, tmp_path / "v2", tmp_path / "tampered.txt")
    assert proc.returncode != 0
    assert "DO NOT MATCH THE HASHES" in proc.stderr


def test_torch_comes_from_the_torch_index_never_the_decoy(world, p40_lock):
    from conda_lock.lockfile import parse_conda_lock_file

    text = (p40_lock / "requirements.lock").read_text()
    real = hashlib.sha256(world["wheels"]["torch"].read_bytes()).hexdigest()
    decoy = hashlib.sha256(world["wheels"]["decoy"].read_bytes()).hexdigest()
    assert real in text and decoy not in text
    assert "numpy==1.26.4" in text  # the torch index has numpy, not this version: falls through
    pip = {
        p.name: p for p in parse_conda_lock_file(p40_lock / "conda-lock.yml").package if p.manager == "pip"
    }
    assert pip["torch"].url.startswith(world["torch"].replace("/simple/", "/"))
    assert pip["torch"].hash.sha256 == real


def test_images_lock_pins_the_list_digest_not_a_platform_child(world, p40_lock):
    images = json.loads((p40_lock / "images.lock").read_text())
    assert {ref: v["digest"] for ref, v in images.items()} == world["pushed"]
    media = {v["media_type"] for v in images.values()}
    assert media == {F.DOCKER_LIST, F.OCI_INDEX}


def test_anonymous_bearer_token_flow(world):
    from envbuilder.oci.registry import digest

    gate = F.TokenGate(world["registry"])
    try:
        ref = world["env"].to_dict()["cuda"]["images"]["runtime"]
        got = digest(ref, mirror=f"{gate.url}/{NS}")
    finally:
        gate.close()
    assert got.digest == world["pushed"][ref]
    assert gate.token_requests and "scope=repository" in gate.token_requests[0]


def test_a_mirror_set_supplies_indexes_channels_and_registry(world, p40_lock, tmp_path, capsys):
    import yaml

    chan = world["channel"].url.rstrip("/")
    (tmp_path / "mirrors.yaml").write_text(
        yaml.safe_dump(
            {
                "sources": {"mine": "https://example.org/m"},
                "mirrors": {
                    "loop": {
                        "description": "loopback stand-ins of every upstream",
                        "registries": {"docker.io": [world["mirror"]]},
                        "pypi": [world["pypi"]],
                        "pytorch": [world["torch"]],
                        "github": [world["github"]],
                        "conda": {"conda-forge": [chan], "nvidia": [chan]},
                        "source": "mine",
                    }
                },
            }
        )
    )
    rc, _, err = envbuild(
        capsys, "lock", "p40", "-o", tmp_path / "lock", "--mirror", "loop", "--matrix-dir", tmp_path
    )
    assert rc == 0, err
    lock = tmp_path / "lock" / "p40"
    meta = json.loads((lock / "lock.json").read_text())
    assert meta["sources"]["channels"] == [f"{chan}/label/cuda-11.8.0", chan]
    assert meta["sources"]["registry_mirror"] == {"docker.io": world["mirror"]}
    assert meta["sources"]["github"] == world["github"]
    assert meta["sources"]["pypi"] == world["pypi"] and meta["sources"]["torch"] == world["torch"]
    for name in ("requirements.lock", "images.lock"):  # the same artifacts as through the flags
        assert (lock / name).read_bytes() == (p40_lock / name).read_bytes()
    assert f"{chan}/label/cuda-11.8.0/linux-64/cuda-nvcc-11.8.89" in (lock / "conda-lock.yml").read_text()
    # each part says when it starts and how long it took (a line every 12 s between)
    for part in ("pip part", "sources", "conda part", "images"):
        assert f"p40: {part}: done in " in err, err


# ---- same inputs, same bytes; --check ------------------------------------------------------


def test_relocking_unchanged_inputs_changes_no_byte(world, p40_lock, tmp_path, capsys):
    rc, _, err = envbuild(capsys, *lock_args(world, tmp_path / "again"))
    assert rc == 0, err
    for f in p40_lock.iterdir():
        assert (tmp_path / "again" / "p40" / f.name).read_bytes() == f.read_bytes(), f.name
    rc, _, err = envbuild(capsys, *lock_args(world, p40_lock.parent))  # in place, over itself
    assert rc == 0, err


def test_a_release_published_between_the_two_uv_runs_does_not_split_the_lock(
    world, tmp_path, capsys, monkeypatch
):
    """requirements.lock and pylock.toml come from two uv runs; a release that appears between
    them (PyPI, 2026-12-07: loguru 0.8.0 and sentry-sdk 3.0.1 split `lock h100 --engine
    megatron` twice) must not make them differ: the second is resolved from the first's cache."""
    from fixture_wheels import make_wheel

    from envbuilder.lock import pip as P

    real, calls = P._run_uv, []
    newer = tmp_path / "newer"

    def run_uv(args, cwd, indexes):
        calls.append(list(args))
        real(args, cwd, indexes)
        if len(calls) == 1:  # (typing-extensions is pinned by nothing: the newest one wins)
            newer.mkdir()
            wheel = make_wheel(newer, "typing-extensions", "4.99.0")
            shutil.copy(wheel, world["root"] / "pypi" / wheel.name)

    monkeypatch.setattr(P, "_run_uv", run_uv)
    try:
        rc, _, err = envbuild(capsys, *lock_args(world, tmp_path / "locks", "--only", "pip"))
    finally:
        for w in (world["root"] / "pypi").glob("typing_extensions-4.99.0*"):
            w.unlink()
    assert rc == 0, err
    assert "--offline" in calls[1] and "--offline" not in calls[0]
    locked = (tmp_path / "locks" / "p40" / "requirements.lock").read_text()
    assert "typing-extensions==4.12.2" in locked


def test_check_passes_offline_and_detects_a_changed_matrix(world, tmp_path, capsys, monkeypatch):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "local.yaml").write_text("sources:\n  mine: https://example.org/a\n")
    lock_dir = tmp_path / "lock"
    rc, _, err = envbuild(capsys, *lock_args(world, lock_dir, "--matrix-dir", overlay))
    assert rc == 0, err

    def no_network(*a, **k):
        raise AssertionError("--check must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    rc, out, _ = envbuild(capsys, "lock", "p40", "--check", "-o", lock_dir, "--matrix-dir", overlay)
    assert rc == 0 and "p40: ok" in out

    # a changed fact: the p40's verl pins in an overlay
    (overlay / "local.yaml").write_text(
        "sources:\n  mine: https://example.org/a\nprofiles:\n"
        + _profile_yaml("p40", pins={"transformers": "4.52.0"})
    )
    rc, out, err = envbuild(capsys, "lock", "p40", "--check", "-o", lock_dir, "--matrix-dir", overlay)
    assert rc == 1
    assert "stale: changed since locking: pip.requirements" in out
    assert "pip.target" not in out and "conda." not in out and "images." not in out


@pytest.fixture
def edited_templates(tmp_path, monkeypatch):
    """envbuild's data folder as a copy whose Dockerfile template gained a comment."""
    from envbuilder import paths
    from envbuilder.render import files as R

    pkg = tmp_path / "pkg"
    for name in ("matrices", "templates", "lockfiles"):
        shutil.copytree(paths.data_dir(name), pkg / "_data" / name)
    dockerfile = pkg / "_data" / "templates" / "Dockerfile.j2"
    dockerfile.write_text(dockerfile.read_text() + "# a comment written after locking\n")
    paths.data_dir.cache_clear()
    monkeypatch.setattr(paths, "_PKG", pkg)
    monkeypatch.setattr(R, "_jinja", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    yield pkg
    paths.data_dir.cache_clear()


def test_a_template_comment_or_a_new_envbuild_leaves_a_lock_current(
    world, p40_lock, edited_templates, tmp_path, capsys, monkeypatch
):
    """A lock depends on what its solvers see, not on templates that cannot change a solution,
    nor on envbuild's version."""
    import envbuilder
    from envbuilder.model import assemble as AS  # (the assembly writes envbuild_version)

    monkeypatch.setattr(AS, "__version__", envbuilder.__version__ + ".post1")
    rc, out, _ = envbuild(capsys, "lock", "p40", "--check", "-o", p40_lock)
    assert rc == 0 and "p40: ok" in out, out
    rc, _, err = envbuild(capsys, "render", "p40", "-o", tmp_path / "out", "--locked", p40_lock)
    assert rc == 0, err
    dockerfile = (tmp_path / "out" / "p40" / "Dockerfile").read_text()
    assert "# a comment written after locking" in dockerfile and "--require-hashes" in dockerfile
    assert envbuilder.__version__ + ".post1" in (tmp_path / "out" / "p40" / "envbuild.json").read_text()


def _profile_yaml(name: str, **changes) -> str:
    import yaml

    from envbuilder.model import matrix

    record = dict(matrix.load().profiles[name], **changes, source="mine")
    return "  " + yaml.safe_dump({name: record}).replace("\n", "\n  ").rstrip() + "\n"


def test_check_reports_missing_and_hand_edited_locks(world, p40_lock, tmp_path, capsys):
    rc, out, _ = envbuild(capsys, "lock", "p40", "--check", "-o", tmp_path / "none")
    assert rc == 1 and "missing" in out
    shutil.copytree(p40_lock, tmp_path / "edited")
    lockfile = tmp_path / "edited" / "requirements.lock"
    lockfile.write_text(lockfile.read_text().replace("numpy==1.26.4", "numpy==2.1.2"))
    rc, out, _ = envbuild(capsys, "lock", "p40", "--check", "-o", tmp_path / "edited")
    assert rc == 1 and "modified: requirements.lock" in out


def test_check_all_lists_every_profile(p40_lock, tmp_path, capsys):
    root = tmp_path / "root"
    shutil.copytree(p40_lock, root / "p40")
    rc, out, _ = envbuild(capsys, "lock", "--all", "--check", "-o", root)
    assert rc == 1
    assert "p40: ok" in out and "4090: missing" in out and "h200: missing" in out


def _truncate(name: str, resign: bool):
    def damage(lock: Path) -> None:
        path = lock / name
        path.write_text(path.read_text()[: len(path.read_text()) // 2])
        if resign:  # a careless hand edit that re-signs lock.json over the damage
            meta = json.loads((lock / "lock.json").read_text())
            meta["files"][name] = hashlib.sha256(path.read_text().encode()).hexdigest()
            (lock / "lock.json").write_text(json.dumps(meta))

    return damage


def _edit_a_hash(lock: Path) -> None:
    path = lock / "requirements.lock"
    text = path.read_text()
    i = text.index("--hash=sha256:") + len("--hash=sha256:")
    path.write_text(text[:i] + ("1" if text[i] == "0" else "0") + text[i + 1 :])


def _list_outside(lock: Path) -> None:
    meta = json.loads((lock / "lock.json").read_text())
    meta["files"]["../outside.lock"] = "0" * 64
    (lock / "lock.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "damage, words",
    [
        (_truncate("pylock.toml", resign=False), "modified: pylock.toml"),
        (_truncate("pylock.toml", resign=True), "pylock.toml does not parse"),
        (_truncate("conda-lock.yml", resign=True), "conda-lock.yml"),
        (_edit_a_hash, "modified: requirements.lock"),
        (lambda lock: (lock / "requirements.lock").unlink(), "missing:"),
        (_list_outside, "'../outside.lock', which is no lock file"),
    ],
    ids=[
        "truncated-pylock",
        "truncated-pylock-resigned",
        "truncated-conda-lock-resigned",
        "edited-hash",
        "missing-requirements",
        "listed-outside",
    ],
)
def test_check_render_and_wheelhouse_refuse_a_damaged_lock_alike(p40_lock, tmp_path, capsys, damage, words):
    """One integrity check of a lock directory (lockfile.integrity) for all three readers: each
    file lock.json lists hashes right and parses, each locked part has its file."""
    lock = tmp_path / "lock"
    shutil.copytree(p40_lock, lock)
    damage(lock)
    rc, out, err = envbuild(capsys, "lock", "p40", "--check", "-o", lock)
    assert rc == 1 and words in out, out + err
    rc, _, err = envbuild(capsys, "render", "p40", "--locked", lock, "-o", tmp_path / "out")
    assert rc == 2 and words in err and "Re-lock" in err, err
    assert "Traceback" not in err and "internal error" not in err
    rc, _, err = envbuild(capsys, "wheelhouse", "p40", "--lock-dir", lock, "-o", tmp_path / "wh")
    assert rc == 2 and words in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "wh").exists()


# ---- errors ----------------------------------------------------------------------------------


def test_unsatisfiable_cuda_names_the_package_and_the_virtual_package(world, tmp_path, capsys):
    import yaml

    from envbuilder.model import matrix

    cuda = dict(matrix.load().cuda["11.8"], conda_nvcc="cuda-nvcc=12.4")  # nvcc too new for 11.8
    (tmp_path / "cuda.yaml").write_text(
        yaml.safe_dump(
            {"sources": {"mine": "https://example.org/b"}, "cuda": {"11.8": {**cuda, "source": "mine"}}}
        )
    )
    rc, _, err = envbuild(capsys, *lock_args(world, tmp_path / "lock", "--matrix-dir", tmp_path))
    assert rc == 2, err
    assert "cuda-nvcc" in err and "__cuda" in err and "__cuda=11.8" in err
    assert not (tmp_path / "lock").exists()  # nothing half-written


@pytest.mark.parametrize("what", ["index", "torch-index", "channel", "registry"])
def test_an_unreachable_endpoint_exits_1_naming_it(world, tmp_path, capsys, what):
    dead = f"127.0.0.1:{closed_port()}"
    args = lock_args(world, tmp_path / "lock")
    flag, value = {
        "index": ("--index-url", f"http://{dead}/simple/"),
        "torch-index": ("--torch-index-url", f"http://{dead}/simple/"),
        "channel": ("--channel", f"http://{dead}/"),
        "registry": ("--registry-mirror", f"{dead}/{NS}"),
    }[what]
    args[args.index(flag) + 1] = value
    rc, _, err = envbuild(capsys, *args)
    assert rc == 1, err
    assert dead in err
    if what in ("index", "torch-index"):  # only what is down is named, with its own way on
        head = err.split("Cannot lock the pip part", 1)[1].split("uv said:")[0]
        assert head.count(dead) == 1 and world["pypi"] not in head and world["torch"] not in head
        assert ("--torch-from-pypi" in head) == (what == "torch-index")
        assert ("--index-url a PyPI mirror" in head) == (what == "index")


def test_solver_conda_lock_without_a_conda_says_so(world, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, _, err = envbuild(capsys, *lock_args(world, tmp_path / "lock", "--solver", "conda-lock"))
    assert rc == 2
    assert "conda, mamba or micromamba" in err and "--solver rattler" in err


# ---- render --locked -------------------------------------------------------------------------


def test_render_locked_pins_images_and_requires_hashes(world, p40_lock, tmp_path, capsys):
    from envbuilder.lock.pip import parse

    rc, _, err = envbuild(capsys, "render", "p40", "-o", tmp_path / "out", "--locked", p40_lock)
    assert rc == 0, err
    out = tmp_path / "out" / "p40"
    dockerfile = (out / "Dockerfile").read_text()
    images = json.loads((p40_lock / "images.lock").read_text())
    for role, ref in world["env"].to_dict()["cuda"]["images"].items():
        assert f"ARG BASE_{role.upper()}={ref}@{images[ref]['digest']}\n" in dockerfile
    installs = re.findall(r"pip install .*", dockerfile)
    locked = [i for i in installs if "--require-hashes" in i]
    # torch and the build tools in the builder, then uv (by the matrix's sha256), torch, verl
    # deps, verl
    assert len(locked) == 6
    assert all("--no-deps" in i for i in locked)
    layer_files = sorted(p.name for p in out.glob("locked-*.txt"))
    assert layer_files == ["locked-build.txt", "locked-torch.txt", "locked-verl-deps.txt", "locked-verl.txt"]
    for name in layer_files:
        assert f"source={name},target=/tmp/envbuild/{name}" in dockerfile
    # the runtime layers hold each package once, the builder's tools the rest of the lock,
    # everything with all its hashes
    everything = parse((p40_lock / "requirements.lock").read_text())
    runtime = [parse((out / n).read_text()) for n in layer_files if n != "locked-build.txt"]
    build = parse((out / "locked-build.txt").read_text())
    names = [n for p in runtime for n in p]
    assert len(names) == len(set(names))
    assert set(names) | set(build) == set(everything)
    assert all(p[n].hashes == everything[n].hashes for p in runtime + [build] for n in p)
    torch_layer = parse((out / "locked-torch.txt").read_text())
    assert {"torch", "torchvision", "torchaudio", "filelock", "typing-extensions"} <= set(torch_layer)
    assert set(parse((out / "locked-verl.txt").read_text())) == {"verl", "pandas"}

    import dockerfile as buildkit_parser

    parsed = buildkit_parser.parse_string(dockerfile)
    assert [c.value[0] for c in parsed if c.cmd == "FROM"] == ["${BASE_DEVEL}", "${BASE_RUNTIME}"]


def test_render_locked_through_a_mirror_pins_the_mirrors_images_at_the_locked_digests(
    world, p40_lock, tmp_path, capsys
):
    """A digest names the content: through a mirror the locked Dockerfile pulls the mirror's
    reference at the digest the lock recorded, never the upstream Docker Hub one."""
    from envbuilder.model import matrix as MX
    from envbuilder.model import mirrors as M

    rc, _, err = envbuild(
        capsys, "render", "p40", "-o", tmp_path / "out", "--locked", p40_lock, "--mirror", "cn"
    )
    assert rc == 0, err
    dockerfile = (tmp_path / "out" / "p40" / "Dockerfile").read_text()
    images = json.loads((p40_lock / "images.lock").read_text())
    choice = M.choice("cn", M.get_set(MX.load(), "cn"))
    for role, ref in world["env"].to_dict()["cuda"]["images"].items():
        mirrored = choice.image(ref)
        assert mirrored != ref
        assert f"ARG BASE_{role.upper()}={mirrored}@{images[ref]['digest']}\n" in dockerfile
        assert f"={ref}@" not in dockerfile


def test_render_locked_installs_in_a_fresh_venv_layer_by_layer(world, p40_lock, tmp_path, capsys):
    rc, _, err = envbuild(capsys, "render", "p40", "-o", tmp_path / "out", "--locked", p40_lock)
    assert rc == 0, err
    subprocess.run([_python310(), "-m", "venv", tmp_path / "v"], check=True)
    for layer in ("torch", "verl-deps", "verl"):
        proc = _pip_install(world, tmp_path / "v", tmp_path / "out" / "p40" / f"locked-{layer}.txt")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    check = subprocess.run([tmp_path / "v" / "bin" / "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def test_unlocked_render_is_unchanged_by_the_lock_support(tmp_path, capsys):
    rc, _, _ = envbuild(capsys, "render", "p40", "-o", tmp_path / "out")
    assert rc == 0
    dockerfile = (tmp_path / "out" / "p40" / "Dockerfile").read_text()
    # (only uv itself installs by hash: the matrix pins its one wheel by sha256 in every mode)
    hashed = [line for line in dockerfile.splitlines() if "--require-hashes" in line]
    assert len(hashed) == 1 and "-r <(echo 'uv==" in hashed[0], hashed
    assert "@sha256:" not in dockerfile
    assert not list((tmp_path / "out" / "p40").glob("locked-*"))


def test_render_locked_refuses_a_partial_or_foreign_lock(world, tmp_path, capsys):
    rc, _, err = envbuild(capsys, *lock_args(world, tmp_path / "pip-only", "--only", "pip"))
    assert rc == 0, err
    # --locked DIR reads DIR/p40/ (as lock -o DIR wrote it), or DIR itself when it is p40's lock
    for locked in (tmp_path / "pip-only", tmp_path / "pip-only" / "p40"):
        rc, _, err = envbuild(capsys, "render", "p40", "-o", tmp_path / "o1", "--locked", locked)
        assert rc == 2 and "images.lock" in err, err
    # p40's lock where 4090's belongs
    shutil.copytree(tmp_path / "pip-only" / "p40", tmp_path / "mixed" / "4090")
    rc, _, err = envbuild(capsys, "render", "4090", "-o", tmp_path / "o2", "--locked", tmp_path / "mixed")
    assert rc == 2 and "is the lock of profile 'p40', not '4090'" in err
    assert "pip.requirements" in err
    # p40's lock itself, for 4090: not 4090's lock, so --locked looks for 4090's under it
    rc, _, err = envbuild(
        capsys, "render", "4090", "-o", tmp_path / "o2", "--locked", tmp_path / "pip-only" / "p40"
    )
    assert rc == 2 and "4090" in err, err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_the_apex_source_is_pinned_by_sha256(world, p40_lock):
    import hashlib

    apex = json.loads((p40_lock / "sources.lock").read_text())["apex"]
    assert apex["url"] == world["env"].to_dict()["apex"]["url"]  # the upstream URL, not the mirror's
    assert apex["sha256"] == hashlib.sha256(world["apex_tgz"]).hexdigest()
    assert apex["filename"] == "apex-25.08.tar.gz"


def test_render_locked_pins_the_builders_tools_and_the_apex_archive(p40_lock, tmp_path, capsys):
    code, _, err = envbuild(capsys, "render", "p40", "--locked", p40_lock, "-o", tmp_path / "o")
    assert code == 0, err
    dockerfile = (tmp_path / "o" / "p40" / "Dockerfile").read_text()
    builder = dockerfile.split("FROM ${BASE_RUNTIME}")[0]
    assert "-r /tmp/envbuild/locked-build.txt" in builder
    assert "pip install packaging ninja" not in builder
    sha = json.loads((p40_lock / "sources.lock").read_text())["apex"]["sha256"]
    assert f'"apex @ ${{APEX_URL}}#sha256={sha}"' in builder
    build_layer = (tmp_path / "o" / "p40" / "locked-build.txt").read_text()
    assert "setuptools==81.0.0" in build_layer and "--hash=sha256:" in build_layer
    # the tools stay in the builder: no runtime layer installs them, except setuptools as verl
    # 0.4.1's own pin (its `import pkg_resources` needs setuptools < 82 at run time)
    runtime_layers = {
        p.name: p.read_text()
        for p in (tmp_path / "o" / "p40").glob("locked-*.txt")
        if p.name != "locked-build.txt"
    }
    assert not any("ninja==" in t for t in runtime_layers.values())
    with_setuptools = [n for n, t in runtime_layers.items() if "setuptools==" in t]
    assert all("setuptools==81.0.0" in runtime_layers[n] for n in with_setuptools)


# ---- flash-attn's release wheels (sources.lock) ----------------------------------------------


def _fa_names(profile="3090"):
    from envbuilder.model import matrix
    from envbuilder.images.flash_attn_wheel import wheel_filename
    from envbuilder.model.resolve import Overrides, resolve

    d = resolve(matrix.load(), profile, Overrides(verl="0.6.1")).to_dict()  # flash-attn 2.8.3
    fa = d["flash_attn"]
    path = fa["release"].split("://", 1)[1].split("/", 1)[1]
    return {
        abi: (
            path,
            wheel_filename(
                fa["wheel"],
                fa["version"],
                d["torch"]["version"],
                d["torch"]["cuda"],
                d["python"],
                abi,
                fa["cuda_tags"],
            ),
        )
        for abi in (False, True)
    }


def test_the_flash_attn_release_wheels_of_both_abis_are_pinned_by_sha256(tmp_path, capsys):
    """The lock cannot read the target torch's C++ ABI (that needs its binary), so it pins both
    variants the release has; the builder picks the one the installed torch needs."""
    import hashlib

    from fixture_wheels import flash_attn_release_wheel
    from httpfixtures import FileServer

    names = _fa_names()
    files = {
        f"{path}/{name}": flash_attn_release_wheel(tmp_path / "rel", name, "2.8.3").read_bytes()
        for path, name in names.values()
    }
    with FileServer(files) as gh:
        code, _, err = envbuild(
            capsys,
            "lock",
            "3090",
            "--verl",
            "0.6.1",
            "--only",
            "sources",
            "--github-url",
            gh.url("").rstrip("/"),
            "-o",
            tmp_path / "lock",
        )
    assert code == 0, err
    assert names[False][1] == "flash_attn-2.8.3+cu12torch2.8cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"
    got = json.loads((tmp_path / "lock" / "3090" / "sources.lock").read_text())
    assert sorted(got) == ["flash-attn-cxx11abiFALSE", "flash-attn-cxx11abiTRUE"]
    for abi, (path, name) in names.items():
        e = got[f"flash-attn-cxx11abi{str(abi).upper()}"]
        assert e["url"] == f"https://github.com/{path}/{name}"  # upstream, not the mirror
        assert e["sha256"] == hashlib.sha256(files[f"{path}/{name}"]).hexdigest()
        assert (e["filename"], e["cxx11_abi"]) == (name, abi)


def test_a_release_without_any_wheel_for_the_target_fails_the_lock(tmp_path, capsys):
    from httpfixtures import FileServer

    with FileServer({}) as gh:
        code, _, err = envbuild(
            capsys,
            "lock",
            "3090",
            "--verl",
            "0.6.1",
            "--only",
            "sources",
            "--github-url",
            gh.url("").rstrip("/"),
            "-o",
            tmp_path / "lock",
        )
    assert code == 1 and "answered 404" in err and "--without flash-attn" in err
    assert not (tmp_path / "lock").exists()


def test_locking_flash_attn_where_github_does_not_answer_names_the_mirror_options(tmp_path, capsys):
    code, _, err = envbuild(
        capsys,
        "lock",
        "3090",
        "--verl",
        "0.6.1",
        "--only",
        "sources",
        "--github-url",
        f"http://127.0.0.1:{closed_port()}",
        "-o",
        tmp_path / "lock",
    )
    assert code == 1 and "Traceback" not in err
    assert "flash-attn's release wheel" in err and "--github-url" in err and "--mirror" in err
    assert not (tmp_path / "lock").exists()


def test_index_credentials_reach_no_lock_file_and_no_message(world, tmp_path, capsys):
    """An index with user:password@ (a private mirror) is used to solve, but lock.json, the
    requirement files and every line lock prints name it as ***@ or not at all."""

    def creds(url: str) -> str:
        return url.replace("http://", "http://locker:s3cret@", 1)

    args = lock_args(world, tmp_path / "lock")
    args[args.index("--index-url") + 1] = creds(world["pypi"])
    args[args.index("--torch-index-url") + 1] = creds(world["torch"])
    rc, out, err = envbuild(capsys, *args, "--only", "pip")
    assert rc == 0, err
    assert "s3cret" not in out + err and "***@" in err
    for f in (tmp_path / "lock" / "p40").iterdir():
        assert "s3cret" not in f.read_text(), f.name
    meta = json.loads((tmp_path / "lock" / "p40" / "lock.json").read_text())
    assert meta["sources"]["pypi"] == world["pypi"]


def test_a_missing_lock_names_the_command_that_makes_it_there(tmp_path, capsys):
    """`render --locked DIR` reads DIR/<profile>/: where there is none, the message names the
    `lock -o DIR` that writes it there (not a bare `envbuild lock`, which writes lockfiles/)."""
    rc, _, err = envbuild(capsys, "render", "p40", "--locked", tmp_path / "mylocks", "-o", tmp_path / "out")
    assert rc == 2 and f"envbuild lock p40 -o {tmp_path / 'mylocks'}" in err, err


# ---- the SBOM of a whole lock (conda, pip, images, sources) ----------------------------------


def test_the_sbom_of_a_whole_lock_lists_conda_packages_images_and_apex_source(p40_lock, capsys):
    """`envbuild sbom` of the lock made here: every conda package of conda-lock.yml (pkg:conda,
    its sha256 and URL), the base images at the digests pushed to the loopback registry, apex's
    source archive (URL and sha256), every pip package; valid CycloneDX 1.6."""
    import yaml
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    code, text, err = envbuild(capsys, "sbom", "p40", "--lock-dir", p40_lock.parent)
    assert code == 0, err
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    components = json.loads(text)["components"]
    conda = {c["name"]: c for c in components if c["purl"].startswith("pkg:conda/")}
    locked = [p for p in yaml.safe_load((p40_lock / "conda-lock.yml").read_text())["package"]]
    assert set(conda) == {p["name"] for p in locked if p["manager"] == "conda"} >= {"python", "cuda-nvcc"}
    for p in locked:
        if p["manager"] == "conda":
            c = conda[p["name"]]
            assert {"alg": "SHA-256", "content": p["hash"]["sha256"]} in c["hashes"]
            assert c["externalReferences"][0]["url"] == p["url"]
            assert c["purl"].startswith(f"pkg:conda/{p['name']}@{p['version']}?build=")
    images = json.loads((p40_lock / "images.lock").read_text())
    digests = {c["version"] for c in components if c["type"] == "container"}
    assert digests == {v["digest"] for v in images.values()}
    apex = json.loads((p40_lock / "sources.lock").read_text())["apex"]
    [source] = [c for c in components if c["name"] == "apex"]
    assert source["externalReferences"][0]["url"] == apex["url"]
    assert source["hashes"] == [{"alg": "SHA-256", "content": apex["sha256"]}]
    pip = {c["name"] for c in components if c["purl"].startswith("pkg:pypi/")}
    assert {"torch", "verl", "packaging"} <= pip
    [torch] = [c for c in components if c["name"] == "torch"]
    assert "repository_url=" in torch["purl"]  # (the +cu118 build, from the PyTorch index)


def test_check_co_resolves_is_check_resolve_without_click(world):
    """lock.pip.check_co_resolves, what `check --resolve` runs: the whole pinned set of p40 as
    one uv solution from the loopback indexes; with the PyTorch index out of reach it says so
    and resolves PyPI's torch in its place (which this PyPI stand-in does not serve: the
    conflict is a UserError, not a traceback)."""
    from envbuilder.errors import UserError
    from envbuilder.lock.pip import check_co_resolves
    from envbuilder.secret import SecretUrl
    from envbuilder.model import matrix
    from envbuilder.model.resolve import resolve
    from envbuilder.model.resolved import Overrides

    m = matrix.load(())
    env = resolve(m, "p40", Overrides())
    said = []
    found = check_co_resolves(m, env, SecretUrl(world["pypi"]), SecretUrl(world["torch"]), say=said.append)
    assert found.packages > 3 and not found.torch_swapped and said == []
    assert (found.pypi, found.torch_index, found.python) == (world["pypi"], world["torch"], env.python)
    assert found.platform.startswith("x86_64-manylinux_")
    dead = f"http://127.0.0.1:{closed_port()}/simple/"
    with pytest.raises(UserError):
        check_co_resolves(m, env, SecretUrl(world["pypi"]), SecretUrl(dead), say=said.append)
    assert len(said) == 1 and dead in said[0] and "does not answer" in said[0]
