"""A lock's sdists become wheels at export (issue 9, item 5).

The far side of the air gap installs with `pip --no-index`: pip's build isolation looks for
setuptools in the offline index, finds none, and stops (`Could not find a version that satisfies
the requirement setuptools>=40.8.0`); verl pulls in antlr4-python3-runtime 4.9.3 through
hydra-core, and PyPI has only its sdist. So `envbuild wheelhouse` builds every sdist into a
wheel for the lock's target while it is online, and installs use the wheel.

The world: test_lock's p40 stand-ins on loopback pypiservers, where hydra-core needs a stand-in
antlr4-python3-runtime 4.9.3 sdist (a real setuptools sdist made here, laid out like the real
one) and a real setuptools wheel sits beside it, as on PyPI. Real-package tier: that setuptools
and the newest pip come from PyPI, and one test builds the real antlr4 sdist of the shipped 4090
lock. These skip, saying why, only when PyPI is unreachable, and fail instead under CI=true.
Installs run inside `unshare -n`: a network namespace with no network at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NoReturn

import pytest

from conftest import unavailable as _unavailable
from test_lock import _python310, isolated  # noqa: F401  (fixtures)

import lockfixtures as F
from envbuilder.cli import main
from envbuilder.errors import UserError
from envbuilder.lock.pip import load_toml, parse
from fixture_wheels import make_sdist, make_wheel
from httpfixtures import closed_port_url

pytestmark = pytest.mark.pypi

REPO = Path(__file__).resolve().parents[1]
PYPI = "https://pypi.org/simple"
SDIST = "pypi/antlr4-python3-runtime-4.9.3.tar.gz"
WHEEL = "pypi/antlr4_python3_runtime-4.9.3-py3-none-any.whl"


def envbuild(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def unavailable(why: str) -> NoReturn:
    """The real-package tier's one way out (conftest's), said on stderr too."""
    print(f"SKIP: {why}", file=sys.stderr)
    _unavailable(why)


def pip_env(**extra) -> dict:
    """The environment minus this host's pip settings (find-links, extra index, constraints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip reads no configuration file at all
    env.update({k: str(v) for k, v in extra.items()})
    return env


# ---- the real-package tier: PyPI, the newest pip, a network namespace with no network --------


@pytest.fixture(scope="session")
def pypi(real_pypi) -> str:
    return real_pypi


@pytest.fixture(scope="session")
def downloads(pypi, tmp_path_factory) -> dict[str, Path]:
    """The newest pip wheel from PyPI, and the setuptools wheel the p40 profile pins (verl
    0.4.1's pin: the last with pkg_resources), fetched once."""
    import requests

    from conftest import shipped

    setuptools = shipped().verl["0.4.1"]["pins"]["setuptools"]
    d = tmp_path_factory.mktemp("pypi-downloads")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--index-url",
            pypi,
            "-d",
            d,
            "pip",
            f"setuptools=={setuptools}",
        ],
        env=pip_env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    newest = requests.get("https://pypi.org/pypi/pip/json", timeout=20).json()["info"]["version"]
    got = {p.name.split("-")[0]: p for p in d.glob("*.whl")}
    assert got["pip"].name.split("-")[1] == newest  # the newest pip, not a cached older one
    return got


@pytest.fixture(scope="session")
def offline() -> list[str]:
    """The prefix that runs a command in a new network namespace: only a loopback, down."""
    exe = shutil.which("unshare")
    probe = (
        subprocess.run(
            [exe, "-n", "--", sys.executable, "-c", "import socket; print(socket.if_nameindex())"],
            capture_output=True,
            text=True,
        )
        if exe
        else None
    )
    if probe is None or probe.returncode != 0:
        unavailable(
            f"`unshare -n` does not work here ({probe.stderr.strip() if probe else 'no unshare'}"
            "); the offline installs need a network namespace (run as root)"
        )
    assert probe.stdout.strip() == "[(1, 'lo')]", probe.stdout
    return [exe, "-n", "--"]


def newest_pip_venv(path: Path, downloads) -> Path:
    """A fresh venv of Python 3.10 (the p40 target's) with the newest pip from PyPI."""
    subprocess.run([_python310(), "-m", "venv", path], check=True)
    r = subprocess.run(
        [path / "bin" / "python", "-m", "pip", "install", "--no-index", "--upgrade", downloads["pip"]],
        env=pip_env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    version = pip_version(path)
    assert version == downloads["pip"].name.split("-")[1] and int(version.split(".")[0]) >= 25
    return path


def pip_version(venv: Path) -> str:
    return subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "--version"], env=pip_env(), capture_output=True, text=True
    ).stdout.split()[1]


# ---- the world: p40 stand-ins whose hydra-core needs an sdist-only antlr4 ---------------------


@pytest.fixture(scope="module")
def world(downloads, tmp_path_factory):
    root = tmp_path_factory.mktemp("sdist-world")
    F.p40_wheels(root / "torch-index", root / "pypi")
    make_wheel(
        root / "pypi",
        "hydra-core",
        "1.3.2",
        requires=("omegaconf<2.4,>=2.2", "antlr4-python3-runtime==4.9.*"),
    )
    sdist = make_sdist(root / "pypi", "antlr4-python3-runtime", "4.9.3", module="antlr4")
    for standin in (root / "pypi").glob("setuptools-*.whl"):
        standin.unlink()  # the builder's stand-in is no build backend; PyPI serves the real one
        # (at the profile's pin)
    shutil.copy(downloads["setuptools"], root / "pypi")
    with F.PypiServer(root / "torch-index") as torch, F.PypiServer(root / "pypi") as pypi:
        yield {"root": root, "pypi": pypi.url, "torch": torch.url, "sdist": sdist}


@pytest.fixture(scope="module")
def lock(world, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("locks")
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "lock",
                "p40",
                "--without",
                "apex",
                "--only",
                "pip",
                "-o",
                str(root),
                "--index-url",
                world["pypi"],
                "--torch-index-url",
                world["torch"],
            ]
        )
    assert exit_.value.code == 0
    out = root / "p40"  # lock -o DIR: DIR/<profile>/
    pylock = {p["name"]: p for p in load_toml((out / "pylock.toml").read_text())["packages"]}
    assert "wheels" not in pylock["antlr4-python3-runtime"]  # the lock pins the sdist: the case
    return out


@pytest.fixture(scope="module")
def exported(lock, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wh") / "p40"
    with pytest.raises(SystemExit) as exit_:
        main(["wheelhouse", "p40", "--lock-dir", str(lock), "-o", str(out)])
    assert exit_.value.code == 0
    return out


def sdist_sha256(lock: Path) -> str:
    pylock = {p["name"]: p for p in load_toml((lock / "pylock.toml").read_text())["packages"]}
    return pylock["antlr4-python3-runtime"]["sdist"]["hashes"]["sha256"]


# ---- export --------------------------------------------------------------------------------


def test_the_sdist_is_built_into_a_wheel_recorded_with_its_provenance(world, lock, exported, downloads):
    manifest = json.loads((exported / "manifest.json").read_text())
    for path, f in manifest["files"].items():  # the manifest rule: listed only when it hashes right
        data = (exported / path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["size"], path
    assert manifest["files"][SDIST]["sha256"] == sdist_sha256(lock)
    wheel = manifest["files"][WHEEL]
    assert wheel["built_from"] == {"path": SDIST, "sha256": sdist_sha256(lock)}
    build = wheel["build"]
    assert build["backend"] == "setuptools.build_meta:__legacy__"  # no pyproject.toml, as antlr4
    assert build["requires"] == ["setuptools>=40.8.0"]
    setuptools = downloads["setuptools"].name.split("-")[1]
    assert build["generator"] == f"setuptools ({setuptools})"  # the backend from the lock's index
    assert build["index"] == world["pypi"] and build["python"].startswith("3.10.")
    assert build["tool"].startswith("uv ")
    profile = manifest["profiles"]["p40"]
    assert profile["built"] == {"antlr4-python3-runtime": WHEEL}
    assert WHEEL in profile["files"] and SDIST in profile["files"]
    with zipfile.ZipFile(exported / WHEEL) as z:
        assert z.read("antlr4/__init__.py").startswith(b'__version__ = "4.9.3"')
    assert (
        f"#sha256={wheel['sha256']}"
        in (exported / "simple" / "antlr4-python3-runtime" / "index.html").read_text()
    )


def test_install_requirements_name_the_wheel_and_the_lock_stays_untouched(lock, exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    locked = parse((lock / "requirements.lock").read_text())
    installs = parse((exported / "requirements" / "p40.lock").read_text())
    assert installs["antlr4-python3-runtime"].hashes == (f"sha256:{manifest['files'][WHEEL]['sha256']}",)
    assert locked["antlr4-python3-runtime"].hashes == (f"sha256:{sdist_sha256(lock)}",)
    assert {n: e for n, e in installs.items() if n != "antlr4-python3-runtime"} == {
        n: e for n, e in locked.items() if n != "antlr4-python3-runtime"
    }
    for name in os.listdir(lock):  # the lock's files (not the directory's write record)
        if not name.startswith("."):
            assert (exported / "locks" / "p40" / name).read_bytes() == (lock / name).read_bytes()


def test_a_second_export_builds_and_downloads_nothing(lock, exported, capsys):
    before = json.loads((exported / "manifest.json").read_text())
    wheel_inode = (exported / WHEEL).stat().st_ino
    code, out, err = envbuild(capsys, "wheelhouse", "p40", "--lock-dir", lock, "-o", exported)
    assert code == 0, err
    assert " 0 downloaded (0.0 MB)" in out and "0 wheel(s) built from sdists" in out
    assert "building a wheel" not in err
    assert json.loads((exported / "manifest.json").read_text()) == before
    assert (exported / WHEEL).stat().st_ino == wheel_inode


# ---- the far side: offline, the newest pip -------------------------------------------------


def test_install_sh_works_offline_with_the_newest_pip(exported, downloads, offline, tmp_path):
    """The issue's case: install.sh into a fresh venv whose pip is the newest, with no network.
    Before sdists were built at export, pip stopped on antlr4 with `Could not find a version
    that satisfies the requirement setuptools>=40.8.0`."""
    venv = newest_pip_venv(tmp_path / "env", downloads)
    version = pip_version(venv)
    r = subprocess.run(
        [*offline, exported / "install.sh", "--prefix", venv],
        env=pip_env(PATH="/usr/bin:/bin", XDG_CACHE_HOME=tmp_path / "cache"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "antlr4_python3_runtime-4.9.3-py3-none-any.whl" in r.stdout  # the wheel, not a build
    check = subprocess.run(
        [
            venv / "bin" / "python",
            "-c",
            "import antlr4, hydra_core, torch, verl; print(antlr4.__version__, torch.__version__)",
        ],
        capture_output=True,
        text=True,
    )
    assert check.stdout.split() == ["4.9.3", "2.6.0+cu118"], check.stderr
    assert pip_version(venv) == version  # installed by that pip, in that environment


def test_render_with_the_wheelhouse_installs_the_wheel_offline(
    exported, downloads, offline, tmp_path, capsys
):
    """render --wheelhouse: each layer's hashed requirements name the built wheel, which is in
    the build context; its pip commands, run here as written (paths mapped), need no network."""
    code, _, err = envbuild(
        capsys, "render", "p40", "--without", "apex", "--wheelhouse", exported, "-o", tmp_path / "out"
    )
    assert code == 0, err
    out = tmp_path / "out" / "p40"
    wheel_sha = json.loads((exported / "manifest.json").read_text())["files"][WHEEL]["sha256"]
    layers = {p.name: parse(p.read_text()) for p in out.glob("locked-*.txt")}
    holding = [n for n, pins in layers.items() if "antlr4-python3-runtime" in pins]
    assert len(holding) == 1
    assert layers[holding[0]]["antlr4-python3-runtime"].hashes == (f"sha256:{wheel_sha}",)
    assert (out / "wheelhouse" / Path(WHEEL).name).read_bytes() == (exported / WHEEL).read_bytes()
    dockerfile = (out / "Dockerfile").read_text()
    commands = re.findall(
        r"pip install (--no-index --find-links /wheelhouse [^\\&\n]*?"
        r"-r /tmp/envbuild/locked-[\w-]+\.txt)",
        dockerfile,
    )
    assert len(commands) == len([n for n in layers if n != "locked-build.txt"])
    venv = newest_pip_venv(tmp_path / "image", downloads)
    for args in commands:
        args = args.replace("/tmp/envbuild/", f"{out}/").replace("/wheelhouse", f"{out}/wheelhouse")
        r = subprocess.run(
            [*offline, venv / "bin" / "python", "-m", "pip", "install", "--isolated", *args.split()],
            env=pip_env(XDG_CACHE_HOME=tmp_path / "cache"),
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, args + "\n" + r.stdout[-2000:] + r.stderr[-2000:]
    check = subprocess.run(
        [venv / "bin" / "python", "-c", "import antlr4, verl"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def test_render_refuses_a_wheelhouse_exported_before_sdists_were_built(exported, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(exported, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["files"][WHEEL], manifest["profiles"]["p40"]["built"]
    manifest["profiles"]["p40"]["files"].remove(WHEEL)
    (old / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = envbuild(
        capsys, "render", "p40", "--without", "apex", "--wheelhouse", old, "-o", tmp_path / "out"
    )
    assert code == 2
    assert "antlr4-python3-runtime" in err and "sdists only" in err and "envbuild wheelhouse p40" in err
    assert not (tmp_path / "out").exists()


# ---- failures ------------------------------------------------------------------------------


@pytest.mark.parametrize("index", ["torch", "closed"])
def test_a_failed_build_names_the_package_exits_1_and_resumes(world, lock, tmp_path, capsys, index):
    """An index without the build backend (the torch index has no setuptools), or none at all:
    the downloads are kept and verified, the profile stays incomplete, and the next export with
    a working index builds only what is missing."""
    url = world["torch"] if index == "torch" else closed_port_url("simple/")
    wh = tmp_path / "wh"
    code, _, err = envbuild(
        capsys, "wheelhouse", "p40", "--lock-dir", lock, "-o", wh, "--build-index-url", url
    )
    assert code == 1, err
    assert "antlr4-python3-runtime 4.9.3" in err and "--build-index-url" in err and url in err
    assert "Traceback" not in err
    manifest = json.loads((wh / "manifest.json").read_text())
    assert SDIST in manifest["files"] and WHEEL not in manifest["files"]
    assert "p40" not in manifest["profiles"] and not (wh / WHEEL).exists()
    assert not (wh / "pypi" / ".partial").exists()  # the build's scratch space is gone
    code, out, err = envbuild(capsys, "wheelhouse", "p40", "--lock-dir", lock, "-o", wh)
    assert code == 0, err
    assert " 0 downloaded" in out and "1 wheel(s) built from sdists" in out


def _target(python: str, glibc: tuple[int, int]) -> dict:
    return {"python": python, "python_platform": f"x86_64-manylinux_{glibc[0]}_{glibc[1]}"}


def _host_glibc() -> tuple[int, int]:
    from envbuilder.offline.wheelbuild import host_glibc

    g = host_glibc()
    assert g, "these tests expect a glibc host"
    return g


def test_a_platform_sdist_builds_with_the_target_python(world, tmp_path):
    from envbuilder.offline.wheelbuild import build_wheel

    sdist = make_sdist(tmp_path / "src", "tinyext", "1.0", platform=True)
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    w = build_wheel(
        sdist, sha, "tinyext", "1.0", _target("3.10", _host_glibc()), world["pypi"], tmp_path / "pypi"
    )
    assert w.filename == "tinyext-1.0-cp310-cp310-linux_x86_64.whl"
    assert w.build["python"].startswith("3.10.") and w.build["machine"] == "x86_64"
    assert hashlib.sha256((tmp_path / "pypi" / w.filename).read_bytes()).hexdigest() == w.sha256


def test_a_platform_wheel_linked_against_a_newer_glibc_than_the_target_is_refused(world, tmp_path):
    from envbuilder.offline.wheelbuild import build_wheel

    sdist = make_sdist(tmp_path / "src", "tinyext", "1.0", platform=True)
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    major, minor = _host_glibc()
    with pytest.raises(UserError) as e:
        build_wheel(
            sdist,
            sha,
            "tinyext",
            "1.0",
            _target("3.10", (major, minor - 1)),
            world["pypi"],
            tmp_path / "pypi",
        )
    assert e.value.exit_code == 2
    assert f"glibc {major}.{minor}" in str(e.value) and "tinyext" in str(e.value)
    assert not list((tmp_path / "pypi").rglob("*.whl"))


def test_without_the_target_python_only_a_pure_wheel_will_do(world, tmp_path):
    """No Python 3.99 anywhere: a pure wheel built by another Python fits everywhere; a platform
    wheel is refused, naming the interpreter it needs."""
    from envbuilder.offline.wheelbuild import build_wheel, find_python

    assert find_python("3.99") is None
    sha = hashlib.sha256(world["sdist"].read_bytes()).hexdigest()
    pure = build_wheel(
        world["sdist"],
        sha,
        "antlr4-python3-runtime",
        "4.9.3",
        _target("3.99", _host_glibc()),
        world["pypi"],
        tmp_path / "pure",
    )
    assert pure.filename == Path(WHEEL).name
    assert pure.build["python"] == ".".join(map(str, sys.version_info[:3]))
    sdist = make_sdist(tmp_path / "src", "tinyext", "1.0", platform=True)
    with pytest.raises(UserError) as e:
        build_wheel(
            sdist,
            hashlib.sha256(sdist.read_bytes()).hexdigest(),
            "tinyext",
            "1.0",
            _target("3.99", _host_glibc()),
            world["pypi"],
            tmp_path / "plat",
        )
    assert e.value.exit_code == 2 and "Python 3.99" in str(e.value) and "python3.99" in str(e.value)
    assert not list((tmp_path / "plat").rglob("*.whl"))


# ---- the real antlr4 of the shipped 4090 lock -----------------------------------------------


def antlr4_of_the_4090_lock(dest: Path) -> Path:
    """The shipped 4090 lock cut down to its antlr4-python3-runtime pin, byte for byte (the
    same URL and sha256; lock.json re-signed over the smaller files)."""
    real = REPO / "lockfiles" / "4090"
    pylock = (real / "pylock.toml").read_text()
    head, *blocks = pylock.split("[[packages]]\n")
    block = next(b for b in blocks if b.startswith('name = "antlr4-python3-runtime"\n'))
    requirements = (real / "requirements.lock").read_text()
    pin = re.search(r"^antlr4-python3-runtime==4\.9\.3 .*?(?=^\S)", requirements, re.M | re.S)[0]
    files = {
        "pylock.toml": head + "[[packages]]\n" + block.rstrip("\n") + "\n",
        "requirements.lock": "".join(requirements.splitlines(True)[:2]) + pin,
    }
    meta = json.loads((real / "lock.json").read_text())
    meta["files"] = {n: hashlib.sha256(t.encode()).hexdigest() for n, t in files.items()}
    dest.mkdir(parents=True)
    for name, text in {**files, "lock.json": json.dumps(meta, indent=2, sort_keys=True) + "\n"}.items():
        (dest / name).write_text(text)
    return dest


def test_the_real_antlr4_sdist_of_the_4090_lock_builds_and_installs_offline(
    downloads, offline, tmp_path, capsys
):
    lock = antlr4_of_the_4090_lock(tmp_path / "lock")
    pylock = load_toml((lock / "pylock.toml").read_text())["packages"]
    assert [p["name"] for p in pylock] == ["antlr4-python3-runtime"] and "wheels" not in pylock[0]
    real_sha = pylock[0]["sdist"]["hashes"]["sha256"]
    assert real_sha == "f224469b4168294902bb1efa80a8bf7855f24c99aef99cbefc1bcd3cce77881b"
    wh = tmp_path / "wh"
    code, out, err = envbuild(
        capsys, "wheelhouse", "4090", "--lock-dir", lock, "-o", wh, "--accept-partial"
    )  # (the shipped lock is the pip part alone)
    assert code == 0, err
    # the sdist, and the uv wheel the matrix pins (PyPI, the lock's index, serves it)
    assert "2 downloaded" in out and "1 wheel(s) built from sdists" in out
    manifest = json.loads((wh / "manifest.json").read_text())
    wheel = manifest["files"][WHEEL]
    assert wheel["built_from"] == {"path": SDIST, "sha256": real_sha}
    assert wheel["build"]["index"] == PYPI and wheel["build"]["python"].startswith("3.10.")
    assert wheel["build"]["generator"].startswith("setuptools (")
    venv = newest_pip_venv(tmp_path / "env", downloads)
    r = subprocess.run(
        [*offline, wh / "install.sh", "--prefix", venv],
        env=pip_env(PATH="/usr/bin:/bin", XDG_CACHE_HOME=tmp_path / "cache"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    check = subprocess.run(
        [
            venv / "bin" / "python",
            "-c",
            "import antlr4; from antlr4 import CommonTokenStream, InputStream; print(InputStream('x').size)",
        ],
        capture_output=True,
        text=True,
    )
    assert check.stdout.strip() == "1", check.stderr
