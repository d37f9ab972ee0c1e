"""`envbuild wheelhouse`: export a real lock (made in test_lock's loopback world: a rattler-made
conda channel and two pypiservers) and install from it with no network."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from test_lock import _python310, isolated, lock_args, p40_lock, world  # noqa: F401  (fixtures)

from conftest import resolved
from envbuilder.cli import main
from envbuilder.lock.pip import load_toml
from httpfixtures import FileServer


def envbuild(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def github(world) -> list[str]:
    """The apex archive's upstream is GitHub: in these tests, the world's loopback stand-in."""
    return ["--url-map", f"https://github.com={world['github']}"]


@pytest.fixture(scope="module")
def exported(world, p40_lock, tmp_path_factory):
    out = tmp_path_factory.mktemp("wh") / "p40"
    with pytest.raises(SystemExit) as exit_:
        main(["wheelhouse", "p40", "--lock-dir", str(p40_lock), "-o", str(out), *github(world)])
    assert exit_.value.code == 0
    return out


def pip_urls(lock_dir: Path) -> dict[str, str]:
    """{file name as in the URL: URL} of the lock's pip files."""
    pylock = load_toml((lock_dir / "pylock.toml").read_text())
    urls = [w["url"] for p in pylock["packages"] for w in p.get("wheels", [])]
    return {u.rsplit("/", 1)[-1]: u for u in urls}


def relocated_lock(lock_dir: Path, dest: Path, new_base: str) -> Path:
    """A copy of the lock whose pip URLs point at `new_base` (lock.json re-signed to match), as
    a lock made against another index would be."""
    shutil.copytree(lock_dir, dest)
    pylock = (dest / "pylock.toml").read_text()
    for name, url in pip_urls(lock_dir).items():
        pylock = pylock.replace(url, f"{new_base}/{name}")
    (dest / "pylock.toml").write_text(pylock)
    meta = json.loads((dest / "lock.json").read_text())
    meta["files"]["pylock.toml"] = hashlib.sha256(pylock.encode()).hexdigest()
    (dest / "lock.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return dest


def test_export_holds_every_pinned_file_verified(exported, p40_lock):
    manifest = json.loads((exported / "manifest.json").read_text())
    pins = load_toml((p40_lock / "pylock.toml").read_text())["packages"]
    pip_files = {p: f for p, f in manifest["files"].items() if f["kind"] == "pip"}
    assert {f["name"] for f in pip_files.values()} == {p["name"].lower() for p in pins}
    assert any(f["kind"] == "conda" and f["name"] == "cuda-nvcc" for f in manifest["files"].values())
    for path, f in manifest["files"].items():
        data = (exported / path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["size"]
    assert sorted(manifest["profiles"]["p40"]["files"]) == sorted(manifest["files"])
    assert (exported / "simple" / "torch" / "index.html").read_text().count("#sha256=") == 1
    assert (exported / "locks" / "p40" / "lock.json").exists()


def run_install_sh(wheelhouse: Path, prefix: Path, **extra: str) -> subprocess.CompletedProcess:
    """The wheelhouse's install.sh run by hand, with the lock's Python and no pip settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PYTHON=_python310(), PIP_CONFIG_FILE=os.devnull, PATH="/usr/bin:/bin", **extra)
    return subprocess.run(
        [str(wheelhouse / "install.sh"), "--prefix", str(prefix)], env=env, capture_output=True, text=True
    )


def test_install_sh_installs_the_pip_part_with_no_index(exported, tmp_path):
    r = run_install_sh(exported, tmp_path / "env")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "skipping the conda part" in r.stderr  # no micromamba here: said, not hidden
    # then verl's recorded patches for the P40 and the precision audit, as the image's build does
    assert "apply_patches: verl/workers/fsdp_workers.py" in r.stderr + r.stdout
    assert "audit_precision: FAILED" not in r.stderr + r.stdout
    site = next((tmp_path / "env").glob("lib/python*/site-packages"))
    assert 'attn_implementation="eager"' in (site / "verl/workers/fsdp_workers.py").read_text()
    assert (exported / "scripts" / "p40" / "apply_patches.py").is_file()
    assert (exported / "scripts" / "p40" / "envbuild-scripts.json").is_file()  # (the data they read)
    check = subprocess.run(
        [tmp_path / "env" / "bin" / "python", "-c", "import torch, verl; print(torch.__version__)"],
        capture_output=True,
        text=True,
    )
    assert check.stdout.strip() == "2.6.0+cu118"


def test_install_sh_goes_on_in_a_venv_left_without_pip(exported, tmp_path):
    """A venv whose pip never arrived (its venv step stopped by Ctrl-C, or made without pip):
    the re-run seeds pip and installs, instead of failing on `No module named pip` for good."""
    subprocess.run([_python310(), "-m", "venv", "--without-pip", str(tmp_path / "env")], check=True)
    r = run_install_sh(exported, tmp_path / "env")
    assert r.returncode == 0 and "has no whole pip: seeding it" in r.stderr, r.stderr[-2000:]
    assert "installed p40 into" in r.stdout


def test_install_sh_finds_the_locks_python_or_refuses_before_installing_anything(exported, tmp_path):
    """The p40 lock is for Python 3.10: python3 here is another (3.11), so with no PYTHON the
    script looks for python3.10 by name; where there is none, or PYTHON or an existing
    environment is another version, it refuses (exit 2) naming the version it needs and how
    to give it one, and creates nothing."""
    import sys

    base = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    base.update(PIP_CONFIG_FILE=os.devnull)
    bins = tmp_path / "bin"
    bins.mkdir()
    (bins / "python3").symlink_to(sys.executable)  # a Python 3.11, as on the field report
    other = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert other != "3.10"
    r = subprocess.run(
        [str(exported / "install.sh"), "--prefix", str(tmp_path / "a")],
        env=dict(base, PATH=f"{bins}:/usr/bin:/bin"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2, r.stderr
    assert f"the p40 lock is for Python 3.10, and python3 is Python {other}" in r.stderr
    assert "PYTHON=/path/to/python3.10" in r.stderr and not (tmp_path / "a").exists()
    r = subprocess.run(
        [str(exported / "install.sh"), "--prefix", str(tmp_path / "b")],
        env=dict(base, PATH="/usr/bin:/bin", PYTHON=sys.executable),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and f"is Python {other}" in r.stderr and not (tmp_path / "b").exists()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "c")], check=True)
    r = subprocess.run(
        [str(exported / "install.sh"), "--prefix", str(tmp_path / "c")],
        env=dict(base, PATH="/usr/bin:/bin"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and str(tmp_path / "c" / "bin" / "python") in r.stderr
    (bins / "python3.10").symlink_to(_python310())  # found by name, with no PYTHON
    r = subprocess.run(
        [str(exported / "install.sh"), "--prefix", str(tmp_path / "d")],
        env=dict(base, PATH=f"{bins}:/usr/bin:/bin"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "from python3.10 (Python 3.10)" in r.stderr


def test_the_conda_part_is_a_channel_rattler_solves_offline(exported, p40_lock):
    from envbuilder.lock.rattler_worker import call

    meta = json.loads((p40_lock / "lock.json").read_text())
    result = call(
        {
            "channels": [(exported / "conda").as_uri()],
            "specs": ["cuda-nvcc 11.8.*", "python 3.10.*"],
            "platforms": ["linux-64", "noarch"],
            "virtual_packages": meta["target"]["virtual_packages"],
        }
    )
    assert "ok" in result, result
    urls = {r["url"] for r in result["ok"]}
    assert all(u.startswith((exported / "conda").as_uri()) for u in urls)
    explicit = (exported / "conda" / "p40.txt").read_text().splitlines()
    assert explicit[1] == "@EXPLICIT" and all(l.startswith("./conda/") for l in explicit[2:])


def test_a_second_export_downloads_nothing(world, exported, p40_lock, capsys):
    before = json.loads((exported / "manifest.json").read_text())
    code, out, _ = envbuild(
        capsys, "wheelhouse", "p40", "--lock-dir", p40_lock, "-o", exported, *github(world)
    )
    assert code == 0
    assert " 0 downloaded (0.0 MB)" in out
    assert json.loads((exported / "manifest.json").read_text()) == before


def test_a_dropped_connection_resumes_with_a_range_request(world, p40_lock, tmp_path, capsys):
    urls = pip_urls(p40_lock)
    torch = next(n for n in urls if n.startswith("torch-"))
    files = {n: Path(unquote(urlsplit(u).path)).name for n, u in urls.items()}
    import requests

    blobs = {name: requests.get(url, timeout=10).content for name, url in urls.items()}
    with FileServer(blobs, script={torch: ["drop"]}) as srv:
        lock = relocated_lock(p40_lock, tmp_path / "lock", srv.url("").rstrip("/"))
        code, out, err = envbuild(
            capsys, "wheelhouse", "p40", "--lock-dir", lock, "-o", tmp_path / "wh", *github(world)
        )
        ranges = [r.range for r in srv.requests_for(torch)]
    assert code == 0, err
    assert ranges[0] is None and ranges[1] and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    assert (tmp_path / "wh" / "pypi" / files[torch]).read_bytes() == blobs[torch]


def test_a_file_whose_hash_never_matches_fails_and_stays_out_of_the_manifest(
    world, p40_lock, tmp_path, capsys
):
    import requests

    urls = pip_urls(p40_lock)
    blobs = {name: requests.get(url, timeout=10).content for name, url in urls.items()}
    bad = next(n for n in urls if n.startswith("transformers-"))
    with FileServer(blobs, script={bad: ["corrupt"] * 50}) as srv:
        lock = relocated_lock(p40_lock, tmp_path / "lock", srv.url("").rstrip("/"))
        code, out, err = envbuild(
            capsys, "wheelhouse", "p40", "--lock-dir", lock, "-o", tmp_path / "wh", *github(world)
        )
    assert code == 1
    bad_file = unquote(bad)
    assert bad_file in err and "sha256" in err and "Traceback" not in err
    manifest = json.loads((tmp_path / "wh" / "manifest.json").read_text())
    assert f"pypi/{bad_file}" not in manifest["files"]
    assert not (tmp_path / "wh" / "pypi" / bad_file).exists()
    assert "p40" not in manifest["profiles"]  # incomplete: no install.sh profile for it
    assert any(p.startswith("pypi/torch-") for p in manifest["files"])  # the rest is kept


def test_tar_packs_the_wheelhouse_reproducibly(world, exported, p40_lock, tmp_path, capsys):
    code, out, _ = envbuild(
        capsys, "wheelhouse", "p40", "--lock-dir", p40_lock, "-o", exported, "--tar", *github(world)
    )
    assert code == 0
    tar = exported.with_name("p40.tar")
    first = tar.read_bytes()
    envbuild(capsys, "wheelhouse", "p40", "--lock-dir", p40_lock, "-o", exported, "--tar", *github(world))
    assert tar.read_bytes() == first
    import tarfile

    with tarfile.open(tar) as t:
        assert "p40/install.sh" in t.getnames() and "p40/manifest.json" in t.getnames()


def test_two_profiles_in_one_wheelhouse_store_shared_files_once(world, p40_lock, tmp_path, capsys):
    code, _, err = envbuild(capsys, *lock_args(world, tmp_path / "lock-noapex", "--without", "apex"))
    assert code == 0, err
    variant = tmp_path / "lock-noapex" / "p40"
    wh = tmp_path / "wh"
    assert envbuild(capsys, "wheelhouse", "p40", "--lock-dir", p40_lock, "-o", wh, *github(world))[0] == 0
    before = {p.name: p.stat().st_ino for p in (wh / "pypi").iterdir()}
    from envbuilder.offline.wheelhouse import export

    report = export({"p40-noapex": variant}, wh)  # a variant: the same wheels, fewer conda packages
    assert report.downloaded == [] or all(p.startswith("conda/") for p in report.downloaded)
    after = {p.name: p.stat().st_ino for p in (wh / "pypi").iterdir()}
    assert after == before  # no pip file stored twice or replaced
    manifest = json.loads((wh / "manifest.json").read_text())
    assert set(manifest["profiles"]) == {"p40", "p40-noapex"}
    assert "p40 p40-noapex" in (wh / "install.sh").read_text()


def test_render_with_the_wheelhouse_needs_no_index(world, tmp_path, capsys):
    variant = tmp_path / "lock"  # holds p40/, as `lock -o` writes it: --lock-dir takes it
    assert envbuild(capsys, *lock_args(world, variant, "--without", "apex"))[0] == 0
    wh = tmp_path / "wh"
    assert envbuild(capsys, "wheelhouse", "p40", "--lock-dir", variant, "-o", wh, *github(world))[0] == 0
    code, _, err = envbuild(
        capsys, "render", "p40", "--without", "apex", "--wheelhouse", wh, "-o", tmp_path / "out"
    )
    assert code == 0, err
    out = tmp_path / "out" / "p40"
    dockerfile = (out / "Dockerfile").read_text()
    pip_lines = [l for l in dockerfile.splitlines() if "pip install" in l and not l.startswith("#")]
    assert pip_lines and all("--no-index --find-links /wheelhouse" in l for l in pip_lines)
    assert "PIP_INDEX_URL}" not in "".join(pip_lines)
    assert sorted(p.name for p in (out / "wheelhouse").iterdir()) == sorted(
        p.name for p in (wh / "pypi").iterdir()
    )


def test_render_with_a_wheelhouse_builds_apex_from_its_pinned_source(exported, tmp_path, capsys):
    code, _, err = envbuild(capsys, "render", "p40", "--wheelhouse", exported, "-o", tmp_path / "o")
    assert code == 0, err
    dockerfile = (tmp_path / "o" / "p40" / "Dockerfile").read_text()
    builder = dockerfile.split("FROM ${BASE_RUNTIME}")[0]
    assert "ARG APEX_URL=file:///wheelhouse/sources/apex-25.08.tar.gz" in builder
    assert (
        "--no-index --find-links /wheelhouse --no-deps --require-hashes -r /tmp/envbuild/locked-build.txt"
        in builder
    )
    src = tmp_path / "o" / "p40" / "wheelhouse" / "sources" / "apex-25.08.tar.gz"
    assert src.read_bytes() == (exported / "sources" / "apex-25.08.tar.gz").read_bytes()


def test_the_wheelhouse_carries_the_cuda_compiler_its_lock_pins(world, p40_lock, tmp_path, capsys):
    """What the Megatron engine's lock pins beside the extension's sdist, PyPI's CUDA compiler
    and the build's requirements (sources.lock's toolchain-<project> keys), the export fetches
    and verifies like every source file: under sources/, each in the manifest's files with its
    sha256 and in the profile's (what install --from-wheelhouse checks before it compiles)."""
    from test_megatron import toolchain_wheels

    from envbuilder.lock.sources import TOOLCHAIN_KEY

    wheels = toolchain_wheels(tmp_path / "files")
    with FileServer({f"files/{w.name}": w.read_bytes() for w in wheels.values()}) as srv:
        lock = tmp_path / "lock" / "p40"
        shutil.copytree(p40_lock, lock)
        pins = json.loads((lock / "sources.lock").read_text())
        for project, w in wheels.items():
            data = w.read_bytes()
            pins[TOOLCHAIN_KEY + project] = {
                "url": srv.url(f"/files/{w.name}"),
                "filename": w.name,
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "ref": w.name.split("-")[1],
            }
        text = json.dumps(pins, indent=2, sort_keys=True) + "\n"
        (lock / "sources.lock").write_text(text)
        meta = json.loads((lock / "lock.json").read_text())
        meta["files"]["sources.lock"] = hashlib.sha256(text.encode()).hexdigest()
        (lock / "lock.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        wh = tmp_path / "wh"
        code, _, err = envbuild(capsys, "wheelhouse", "p40", "--lock-dir", lock, "-o", wh, *github(world))
    assert code == 0, err
    manifest = json.loads((wh / "manifest.json").read_text())
    for project, w in wheels.items():
        path = f"sources/{w.name}"
        assert manifest["files"][path]["sha256"] == hashlib.sha256(w.read_bytes()).hexdigest()
        assert (
            manifest["files"][path]["kind"] == "source"
            and manifest["files"][path]["name"] == TOOLCHAIN_KEY + project
        )
        assert path in manifest["profiles"]["p40"]["files"]
        assert (wh / path).read_bytes() == w.read_bytes()
    assert json.loads((wh / "locks" / "p40" / "sources.lock").read_text()) == pins


def test_render_with_a_wheelhouse_takes_flash_attn_profiles_from_their_export(exported, capsys):
    """flash-attn's release wheel is pinned in sources.lock now, so a flash-attn profile is no
    longer refused; it needs its own export (tests/test_build.py builds one offline)."""
    code, _, err = envbuild(capsys, "render", "3090", "--wheelhouse", exported, "-o", "/nonexistent/x")
    assert code == 2
    assert "No lock in" in err and "locks/3090" in err and "--without flash-attn" not in err


def test_a_build_index_that_is_no_url_is_bad_input(p40_lock, tmp_path, capsys):
    code, _, err = envbuild(
        capsys,
        "wheelhouse",
        "p40",
        "--lock-dir",
        p40_lock,
        "-o",
        tmp_path / "wh",
        "--build-index-url",
        "pypi.org/simple",
    )
    assert code == 2 and "is not an index URL" in err and "Traceback" not in err
    assert not (tmp_path / "wh").exists()


def test_render_with_a_wheelhouse_whose_manifest_leads_outside_is_refused(exported, tmp_path, capsys):
    """A path in manifest.json becomes a file of the build context: one that climbs out of
    pypi/ would have render write over a file outside its output directory."""
    wh = tmp_path / "wh"
    shutil.copytree(exported, wh)
    victim = tmp_path / "victim.whl"  # (a wheel's name: not taken for an sdist to build)
    victim.write_text("keep me\n")
    manifest = json.loads((wh / "manifest.json").read_text())
    crafted, first = "pypi/../../victim.whl", next(p for p in manifest["files"] if p.startswith("pypi/"))
    manifest["files"][crafted] = manifest["files"][first]
    manifest["profiles"]["p40"]["files"].append(crafted)
    (wh / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = envbuild(capsys, "render", "p40", "--wheelhouse", wh, "-o", tmp_path / "out")
    assert code == 2 and "manifest.json is not as envbuild wrote it" in err, err
    assert victim.read_text() == "keep me\n" and not (tmp_path / "out").exists()


# ---- a lock that would export something other than what the profile installs -------------------


def _edited_lock(p40_lock: Path, dest: Path, **changes) -> Path:
    shutil.copytree(p40_lock, dest)
    meta = json.loads((dest / "lock.json").read_text())
    meta.update(changes)
    (dest / "lock.json").write_text(json.dumps(meta, indent=1))
    return dest


def test_a_lock_with_pypis_torch_in_place_of_the_profiles_is_refused_naming_what_it_means(
    world, p40_lock, tmp_path, capsys
):
    """The shipped p40 lock was solved with PyPI's torch (the PyTorch index was out of reach):
    exported as it is, the wheelhouse would install CUDA 12.4's torch on a CUDA 11.8 profile and
    say nothing. It is refused (exit 2, nothing written) with what the swap means and both ways
    out; --accept-pypi-torch exports it."""
    lock = _edited_lock(p40_lock, tmp_path / "lock", torch_swapped="2.6.0+cu118 -> 2.6.0 (PyPI's build)")
    code, _, err = envbuild(
        capsys, "wheelhouse", "p40", "--lock-dir", lock, "-o", tmp_path / "wh", *github(world)
    )
    assert code == 2, err
    assert "torch is a swap" in err and "CUDA 12.4 build" in err and "driver >= 525.60.13" in err
    assert "not the cu118 build for CUDA 11.8" in err
    assert "--torch-index-url" in err and "--accept-pypi-torch" in err
    assert not (tmp_path / "wh").exists()
    code, out, err = envbuild(
        capsys,
        "wheelhouse",
        "p40",
        "--lock-dir",
        lock,
        "-o",
        tmp_path / "wh",
        "--accept-pypi-torch",
        *github(world),
    )
    assert code == 0, err
    assert (tmp_path / "wh" / "manifest.json").is_file()


def test_a_lock_without_the_conda_part_or_apex_source_is_refused_unless_accepted(
    world, p40_lock, tmp_path, capsys
):
    lock = _edited_lock(p40_lock, tmp_path / "lock", parts=["pip", "images"])
    meta = json.loads((lock / "lock.json").read_text())
    for name in ("conda-lock.yml", "sources.lock"):
        meta["files"].pop(name, None)
        (lock / name).unlink()
    (lock / "lock.json").write_text(json.dumps(meta, indent=1))
    code, _, err = envbuild(
        capsys, "wheelhouse", "p40", "--lock-dir", lock, "-o", tmp_path / "wh", *github(world)
    )
    assert code == 2, err
    assert "no conda part (conda-lock.yml) and no source archive of apex" in err
    assert "--accept-partial" in err and not (tmp_path / "wh").exists()
    code, _, err = envbuild(
        capsys,
        "wheelhouse",
        "p40",
        "--lock-dir",
        lock,
        "-o",
        tmp_path / "wh",
        "--accept-partial",
        *github(world),
    )
    assert code == 0, err
    assert not (tmp_path / "wh" / "conda").exists()


def test_outside_a_checkout_the_shipped_lock_is_found_as_render_finds_it(capsys, tmp_path, monkeypatch):
    """No ./lockfiles here: the wheelhouse reads envbuild's own shipped lock (the p40 one is a
    PyPI-torch swap made with --only pip, so it is refused for what it is, not for being
    missing)."""
    from envbuilder.paths import data_dir

    monkeypatch.chdir(tmp_path)
    code, _, err = envbuild(capsys, "wheelhouse", "p40", "-o", tmp_path / "wh")
    assert code == 2, err
    assert "No lock" not in err and str(data_dir("lockfiles") / "p40") in err
    assert "torch is a swap" in err and "no conda part" in err


def test_export_profiles_is_the_command_without_click(world, exported, p40_lock, tmp_path):
    """offline.wheelhouse.export_profiles: the checks and the export `envbuild wheelhouse` runs,
    called as another program would; into a folder that already holds the export, nothing is
    fetched again, and the uv wheel of the matrix's pin is looked for."""
    from envbuilder.model.matrix import load
    from envbuilder.offline.wheelhouse import export_profiles

    said = []
    out = tmp_path / "again"
    shutil.copytree(exported, out)
    report = export_profiles(
        load(()),
        ["p40"],
        out,
        lock_dir=p40_lock,
        url_map=[("https://github.com", world["github"])],
        say=said.append,
    )
    assert report.downloaded == [] and report.files == len(report.skipped) > 0
    assert "p40" in json.loads((out / "manifest.json").read_text())["profiles"]
    # the matrix's uv pin was looked for (this loopback index serves no uv: said, not fatal)
    assert any("uv" in s and "Dockerfile's runtime stage installs with" in s for s in said)


def _install(args: list[str], tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    """`envbuild install` in a process of its own, with no network (unshare -n) where the
    sandbox allows a namespace, as on an air-gapped cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "ENVBUILD_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin", **extra)
    cmd = [sys.executable, "-m", "envbuilder", "install", *args]
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        cmd = ["unshare", "-n", *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)


def test_envbuild_install_from_the_wheelhouse_patches_and_audits_offline(exported, tmp_path):
    """The offline route: install.sh's hash-checked installs, verl's patches for the P40 and the
    audit, then preflight's smoke test with the environment's Python. The stand-in torch here is
    no real build, so the smoke test's torch and import checks fail: what it must say is that
    verl is patched and audited."""
    r = _install(
        [
            "p40",
            "--prefix",
            str(tmp_path / "env"),
            "--from-wheelhouse",
            str(exported),
            "--interpreter",
            _python310(),
            "--json",
        ],
        tmp_path,
    )
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["route"] == "wheelhouse"
    assert report["steps"][0]["step"] == "install.sh" and report["steps"][0]["ok"], r.stderr[-3000:]
    smoke = {c["check"]: c for c in report["smoke"]}
    assert smoke["verl patched"]["ok"] and smoke["precision audit"]["ok"], smoke
    assert (tmp_path / "env" / "envbuild" / "run_ppo_gsm8k.sh").is_file()
    assert r.returncode == 1  # (the stand-in torch: not READY, and the report says why)


def verl_checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A verl source tree of the patched release, as a user keeps one on PYTHONPATH, and its
    files' text."""
    checkout = tmp_path / "verl-src"
    shutil.copytree(Path(__file__).parent / "fixtures" / "verl-0.4.1", checkout)
    return checkout, {str(p): p.read_text() for p in sorted(checkout.rglob("*.py"))}


def test_a_verl_checkout_on_pythonpath_is_not_what_the_wheelhouse_install_patches(exported, tmp_path):
    """PYTHONPATH names a verl checkout: envbuild install (and install.sh run by hand) patch the
    environment's verl and leave the checkout as it was; the smoke test finds verl patched."""
    import envbuilder

    checkout, before = verl_checkout(tmp_path)
    ours = Path(envbuilder.__file__).parent.parent
    r = _install(
        ["p40", "--prefix", str(tmp_path / "env"), "--from-wheelhouse", str(exported)]
        + ["--interpreter", _python310(), "--json"],
        tmp_path,
        PYTHONPATH=f"{checkout}:{ours}",
    )
    assert {str(p): p.read_text() for p in sorted(checkout.rglob("*.py"))} == before, r.stderr[-3000:]
    smoke = {c["check"]: c for c in json.loads(r.stdout)["smoke"]}
    assert smoke["verl patched"]["ok"], smoke["verl patched"]

    r = run_install_sh(exported, tmp_path / "env2", PYTHONPATH=str(checkout))
    assert r.returncode == 0, r.stderr[-2000:]
    assert {str(p): p.read_text() for p in sorted(checkout.rglob("*.py"))} == before
    site = next((tmp_path / "env2").glob("lib/python*/site-packages"))
    assert 'attn_implementation="eager"' in (site / "verl/workers/fsdp_workers.py").read_text()


def test_a_wheelhouse_install_into_a_uv_made_environment_leaves_uvs_cache_unpatched(exported, tmp_path):
    """verl installed by uv is hard-linked to uv's cache; pip calls it already satisfied, and a
    patch written in place would reach every later `uv pip install verl` on the machine. The
    install gives each patched file its own inode first: the cache keeps verl as released."""
    from envbuilder.tools.uv import uv_bin

    prefix, cache = tmp_path / "env", tmp_path / "uv-cache"
    subprocess.run([_python310(), "-m", "venv", str(prefix)], check=True)
    verl = next((exported / "pypi").glob("verl-*.whl"))
    subprocess.run(
        [uv_bin(), "pip", "install", "--no-config", "--python", str(prefix / "bin" / "python")]
        + ["--no-index", "--no-deps", "--link-mode", "hardlink", str(verl)],
        env={**os.environ, "UV_CACHE_DIR": str(cache)},
        check=True,
        capture_output=True,
    )
    site = next(prefix.glob("lib/python*/site-packages"))
    linked = site / "verl" / "workers" / "fsdp_workers.py"
    st = linked.stat()
    assert st.st_nlink > 1  # (uv's hard link to its cache: the case under test)
    released = linked.read_text()
    in_cache = [p for p in cache.rglob("fsdp_workers.py") if p.stat().st_ino == st.st_ino]
    assert in_cache
    r = _install(["p40", "--prefix", str(prefix), "--from-wheelhouse", str(exported), "--json"], tmp_path)
    assert 'attn_implementation="eager"' in linked.read_text(), r.stderr[-3000:]
    assert all(p.read_text() == released for p in in_cache)


def test_envbuild_install_of_an_unpatched_wheelhouse_says_so(exported, tmp_path):
    wh = tmp_path / "wh"
    shutil.copytree(exported, wh, symlinks=True)
    shutil.rmtree(wh / "scripts" / "p40")  # (a wheelhouse of a lock that pins another verl)
    r = _install(
        [
            "p40",
            "--prefix",
            str(tmp_path / "env"),
            "--from-wheelhouse",
            str(wh),
            "--interpreter",
            _python310(),
            "--json",
        ],
        tmp_path,
    )
    report = json.loads(r.stdout)
    smoke = {c["check"]: c for c in report["smoke"]}
    assert smoke["verl patched"]["ok"] is False and "python apply_patches.py" in smoke["verl patched"]["fix"]
    assert r.returncode == 1 and "no patch scripts for p40" in r.stderr


def test_envbuild_install_refuses_a_prefix_that_does_not_fit_before_touching_anything(exported, tmp_path):
    other = tmp_path / "other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    ours = "%d.%d" % sys.version_info[:2]  # (the test runner's Python: not the lock's 3.10)
    assert ours != "3.10"
    r = _install(["p40", "--prefix", str(other), "--from-wheelhouse", str(exported)], tmp_path)
    assert r.returncode == 2 and f"is a Python {ours} environment" in r.stderr and "3.10" in r.stderr
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    r = _install(["p40", "--prefix", str(junk), "--from-wheelhouse", str(exported)], tmp_path)
    assert r.returncode == 2 and "holds no Python environment" in r.stderr
    assert sorted(p.name for p in junk.iterdir()) == ["notes.txt"]


def test_envbuild_install_refuses_bad_options_before_anything(tmp_path):
    """An unknown mirror set, a --locked folder with no lock, or wheelhouse and online options
    mixed: exit 2, and no prefix made."""
    prefix = tmp_path / "env"
    r = _install(["p40", "--prefix", str(prefix), "--mirror", "nosuch"], tmp_path)
    assert r.returncode == 2 and "Unknown mirror set 'nosuch'" in r.stderr
    r = _install(["p40", "--prefix", str(prefix), "--interpreter", sys.executable], tmp_path)
    assert r.returncode == 2 and "is not a CPython 3.10 with venv" in r.stderr
    r = _install(["p40", "--prefix", str(prefix), "--locked", str(tmp_path / "nolock")], tmp_path)
    assert r.returncode == 2 and "No lock in" in r.stderr
    r = _install(
        ["p40", "--prefix", str(prefix), "--from-wheelhouse", str(tmp_path), "--mirror", "cn"], tmp_path
    )
    assert r.returncode == 2 and "installs offline" in r.stderr
    assert not prefix.exists()


def test_install_compiles_apex_only_with_torchs_nvcc_and_else_names_what_is_missing(tmp_path, monkeypatch):
    """p40's apex: with no nvcc of CUDA 11.8 on PATH it is named, with the command that builds
    it; with one (a stand-in nvcc that prints CUDA 11.8's version line: the toolkit cannot be
    installed here), the environment's pip runs that command."""
    from envbuilder.machine.install import InstallReport, build_extensions

    env = resolved("p40")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    report = InstallReport("p40", str(tmp_path), "online")
    assert build_extensions(env, tmp_path / "env", report, lambda s: None)
    (apex,) = report.not_installed
    assert apex["component"] == "apex" and "there is no nvcc here" in apex["why"]
    assert "'apex @ https://github.com/NVIDIA/apex/archive/" in apex["why"]

    (bin_dir / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    (bin_dir / "nvcc").chmod(0o755)
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    log = tmp_path / "pip.args"
    python.write_text(f'#!/bin/sh\necho "$TORCH_CUDA_ARCH_LIST $*" > {log}\n')
    python.chmod(0o755)
    report = InstallReport("p40", str(tmp_path), "online")
    assert build_extensions(env, tmp_path / "env", report, lambda s: None)
    assert report.not_installed == [] and report.steps[0]["step"] == "build apex" and report.steps[0]["ok"]
    args = log.read_text()
    assert args.startswith("6.1 -m pip install -v --no-build-isolation") and "apex @ https://" in args


def test_an_interrupted_online_install_goes_on_where_it_stopped(tmp_path, monkeypatch):
    """Ctrl-C during an online install keeps what arrived (the prefix says which profile it is
    making); the same command then goes on in that environment, and a prefix another tool made
    is still refused."""
    from envbuilder.machine.install import MARKER, check_prefix

    prefix = tmp_path / "env"
    prefix.mkdir()
    (prefix / MARKER).write_text("p40\n")
    check_prefix(prefix, "3.10", resumable=True)  # (only the marker: as new)
    subprocess.run([_python310(), "-m", "venv", "--without-pip", str(prefix)], check=True)
    check_prefix(prefix, "3.10", resumable=True)  # an environment of the lock's Python: goes on
    from envbuilder.errors import UserError

    with pytest.raises(UserError, match="did not start"):
        check_prefix(prefix, "3.10", resumable=False)


def test_an_online_install_probes_its_index_before_making_anything(tmp_path):
    """The online route's probe, as build's: an index that does not answer (a closed loopback
    port) stops it before the prefix is made, naming the ways on (exit 1)."""
    prefix = tmp_path / "env"
    r = _install(["p40", "--prefix", str(prefix), "--index-url", "http://127.0.0.1:9/simple"], tmp_path)
    assert r.returncode == 1 and "does not answer from here" in r.stderr and "--mirror" in r.stderr
    assert not prefix.exists()


def test_a_fifo_in_place_of_the_install_marker_does_not_hang(tmp_path):
    from envbuilder.machine.install import MARKER

    prefix = tmp_path / "env"
    prefix.mkdir()
    os.mkfifo(prefix / MARKER)
    r = _install(["p40", "--prefix", str(prefix)], tmp_path)  # (_install: a 900 s limit; this takes ~1 s)
    assert r.returncode == 2 and "not a regular file" in r.stderr and "Traceback" not in r.stderr
    assert stat.S_ISFIFO((prefix / MARKER).lstat().st_mode)  # (left as it was)
