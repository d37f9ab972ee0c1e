"""`envbuild diagnose` (issue 47): environments broken as users break them, each diagnosed, its
fix followed, and diagnosed again clean.

How the environments are made, honestly:
- The packages a profile installs (~250 for h200) are their dist-info folders as pip leaves them
  (METADATA, RECORD), written here (`stub_install`): diagnose reads only those files, and a real
  torch wheel is 0.9-2 GB. torch's version.py is written as the wheel has it.
- verl and transformers, where a test is about their declared ranges, are the real wheels from
  PyPI (the `pypi` tier; pip installs them with --no-deps over the stand-ins).
- Extensions are real shared objects made by gcc here: one built against a stand-in libtorch that
  exports a c10 symbol the torch beside it does not; one with a `.nv_fatbin` section holding a
  fat binary whose header this test writes (elf.fatbin_container: there is no nvcc here, so its
  payloads are placeholders, not SASS; the headers are what diagnose reads).
- The machines are the recorded ones of tests/fixtures/gpu (NVML and nvidia-smi answers).
"""

from __future__ import annotations

import json
import os
import shutil
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PYPI, pip_run, shipped
from click.testing import CliRunner
from test_detect import FakeNVML, smi

from envbuilder.cli import cli
from envbuilder.machine.detect import detect
from envbuilder.machine.diagnose import Host, diagnose, planned_pins
from envbuilder.machine.doctor import Probes
from envbuilder.machine.elf import fatbin_container, read_elf
from envbuilder.machine.target import read_target
from envbuilder.model.resolve import resolve
from envbuilder.model.resolved import Overrides, ResolvedEnv

PY = "3.12"
HOST = Host("2.36", None, None)  # (the libc checks read the real host where a test says so)


def machine(box: str):
    return detect(shipped(), FakeNVML(box), smi(box))


def probes(box: str) -> Probes:
    return Probes(nvml=FakeNVML(box), run=smi(box))


def invoke(args: list[str], box: str) -> tuple[int, str]:
    """The CLI on a recorded machine: the exit code main() would give, the output and the
    message of the error main() would print."""
    r = CliRunner().invoke(cli, args, obj=probes(box))
    code = getattr(r.exception, "exit_code", r.exit_code) if r.exception else r.exit_code
    return code, r.output + (str(r.exception) if r.exception else "")


def site_of(prefix: Path) -> Path:
    return prefix / "lib" / f"python{PY}" / "site-packages"


def dist_info(
    site: Path, name: str, version: str, requires: tuple[str, ...] = (), files: tuple[str, ...] = ()
):
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (folder / "METADATA").write_text("\n".join(lines) + "\n\n")
    (folder / "RECORD").write_text("".join(f"{f},,\n" for f in (*files, f"{folder.name}/METADATA")))
    return folder


def stub_install(prefix: Path, env: ResolvedEnv, envbuild_json: bool = True) -> Path:
    """What `envbuild install` leaves, as far as diagnose reads it: each planned package's
    dist-info, torch's version.py for its CUDA build, PREFIX/envbuild/envbuild.json."""
    site = site_of(prefix)
    site.mkdir(parents=True)
    (prefix / "bin").mkdir()
    (prefix / "bin" / "python").symlink_to(sys.executable)
    for name, version in planned_pins(env).items():
        dist_info(site, name, version)
    write_torch(site, f"{env.torch.version}+{env.torch.variant}", env.torch.cuda)
    if envbuild_json:
        (prefix / "envbuild").mkdir()
        (prefix / "envbuild" / "envbuild.json").write_text(env.to_json())
    return site


def write_torch(site: Path, version: str, cuda: str | None) -> None:
    for old in site.glob("torch-*.dist-info"):
        shutil.rmtree(old)
    dist_info(site, "torch", version)
    (site / "torch").mkdir(exist_ok=True)
    (site / "torch" / "version.py").write_text(
        f"from typing import Optional\n\n__all__ = ['__version__']\n__version__ = '{version}'\n"
        f"debug = False\ncuda: Optional[str] = {cuda!r}\ngit_version = 'abc'\n"
    )


def diagnosed(prefix: Path, box: str, profile: str | None = None, host: Host = HOST):
    return diagnose(shipped(), read_target(prefix), machine(box), profile, host)


def rules(d) -> list[str]:
    return [f.rule for f in d.findings]


# -- gcc-made shared objects ---------------------------------------------------------------------


def gcc(tmp: Path, name: str, source: str, *args: str) -> Path:
    if not shutil.which("gcc"):
        pytest.skip("gcc is not installed")
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / name
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True, capture_output=True
    )
    return out


# a c10 function by its mangled name (C has no namespaces; the symbol is what the linker sees)
OLD_SYMBOL = "_ZN3c1019UndefinedTensorImpl10_singletonE"
NEW_SYMBOL = "_ZN3c1020UndefinedTensorImpl210_singletonE"


def libtorch(folder: Path, symbol: str) -> Path:
    """A stand-in torch/lib/libc10.so exporting one c10 symbol."""
    folder.mkdir(parents=True, exist_ok=True)
    return gcc(folder, "libc10.so", f"int {symbol} = 1;\n")


def extension(folder: Path, name: str, needs: str, against: Path) -> Path:
    """An extension that uses `needs` from the libc10.so it is linked against."""
    folder.mkdir(parents=True, exist_ok=True)
    return gcc(
        folder,
        name,
        f"extern int {needs};\nint ext_entry(void) {{ return {needs}; }}\n",
        f"-L{against.parent}",
        "-lc10",
    )


def with_fatbin(path: Path, entries: list[tuple[str, int, bytes]]) -> Path:
    """`path` with a .nv_fatbin section holding one fat binary of these entries."""
    blob = path.with_suffix(".fatbin")
    blob.write_bytes(fatbin_container(entries))
    subprocess.run(
        [
            "objcopy",
            "--add-section",
            f".nv_fatbin={blob}",
            "--set-section-flags",
            ".nv_fatbin=alloc,readonly",
            str(path),
        ],
        check=True,
        capture_output=True,
    )
    blob.unlink()
    return path


# -- the ELF reader ------------------------------------------------------------------------------


def test_elf_reader_reads_the_fat_binary_and_the_symbols_gcc_wrote(tmp_path):
    lib = libtorch(tmp_path / "torch", OLD_SYMBOL)
    ext = with_fatbin(
        extension(tmp_path, "ext.so", OLD_SYMBOL, lib),
        [("sass", 80, b"\x01" * 13), ("sass", 90, b"\x02" * 8), ("ptx", 90, b".version 8.0")],
    )
    elf = read_elf(ext)
    assert elf is not None and elf.has_fatbin
    assert [c.label() for c in elf.gpu] == ["compute_90", "sm_80", "sm_90"]
    assert OLD_SYMBOL in elf.undefined and "ext_entry" in elf.defined
    assert OLD_SYMBOL in read_elf(lib).defined


def test_elf_reader_refuses_what_is_not_an_elf_it_reads(tmp_path):
    (tmp_path / "text.so").write_text("not an ELF")
    assert read_elf(tmp_path / "text.so") is None
    ext = with_fatbin(gcc(tmp_path, "x.so", "int f(void){return 1;}\n"), [("sass", 80, b"\0" * 8)])
    data = bytearray(ext.read_bytes())
    data[0x28:0x30] = (len(data) * 4).to_bytes(8, "little")  # section headers past the end
    bad = tmp_path / "bad.so"
    bad.write_bytes(bytes(data))
    assert read_elf(bad) is None


def test_a_fat_binary_container_that_does_not_move_the_walk_on_is_refused_at_once(tmp_path):
    """A crafted container of header size 0 and fat size 0 (an image's extension may be one):
    the walk stood on it forever. Run in a child with a deadline, so a hang fails the test."""
    import struct

    ext = gcc(tmp_path, "x.so", "int f(void){return 1;}\n")
    blob = tmp_path / "zero.fatbin"
    blob.write_bytes(struct.pack("<IHHQ", 0xBA55ED50, 1, 0, 0))
    subprocess.run(
        ["objcopy", "--add-section", f".nv_fatbin={blob}", str(ext)], check=True, capture_output=True
    )
    code = f"from envbuilder.machine.elf import read_elf; print(read_elf(__import__('pathlib').Path({str(ext)!r})))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.strip() == "None", p.stderr


# -- an environment envbuild installed ----------------------------------------------------------


def h200_env() -> ResolvedEnv:
    return resolve(shipped(), "h200", Overrides())


def test_an_envbuild_installed_environment_is_clean(tmp_path):
    stub_install(tmp_path / "env", h200_env())
    d = diagnosed(tmp_path / "env", "h200")
    assert d.findings == (), d.findings
    assert d.nearest is not None and d.nearest.profile == "h200" and d.nearest.changes == ()
    code, out = invoke(["diagnose", "--prefix", str(tmp_path / "env")], "h200")
    assert code == 0, out
    assert "CLEAN" in out and "nearest profile: h200" in out


def test_bad_input_is_exit_2_with_what_to_do(tmp_path):
    code, out = invoke(["diagnose", "--prefix", str(tmp_path / "nothing")], "h200")
    assert code == 2 and "not a folder" in out
    (tmp_path / "empty").mkdir()
    code, out = invoke(["diagnose", "--prefix", str(tmp_path / "empty")], "h200")
    assert code == 2 and "no lib/pythonX.Y/site-packages" in out
    code, out = invoke(["diagnose"], "h200")
    assert code == 2 and "pass one of --python PATH" in out
    code, out = invoke(["diagnose", "--python", str(tmp_path / "python")], "h200")
    assert code == 2 and "bin/python" in out
    # a malformed image reference: refused before any engine or registry is asked (it was exit 1,
    # the code of findings, from the engine's own error)
    for ref in ("a b", "x@sha256:zz", "Team/RL:1", "127.0.0.1:5000/"):
        code, out = invoke(["diagnose", "--image", ref], "h200")
        assert code == 2 and "is not an image reference" in out, (ref, code, out)


# -- torch cu130 on a 535 driver ------------------------------------------------------------------


def test_torch_cu130_on_a_recorded_535_driver_names_the_stack_it_runs(tmp_path):
    prefix = tmp_path / "env"
    stub_install(prefix, resolve(shipped(), "h100", Overrides()), envbuild_json=False)  # torch 2.11 cu130
    d = diagnosed(prefix, "h100-535")
    assert "driver" in rules(d)
    finding = next(f for f in d.findings if f.rule == "driver")
    assert "CUDA 13.0" in finding.what and "535.183.01" in finding.why
    near = d.nearest
    assert near is not None and near.profile == "h100" and "--driver" in near.flags
    assert near.env.driver.mode in ("native", "minor-version-compatibility")
    assert f"envbuild install h100{near.command_flags}" in finding.fix
    code, out = invoke(["diagnose", "--prefix", str(prefix), "--json"], "h100-535")
    assert code == 1
    report = json.loads(out[: out.rindex("}") + 1])
    assert report["nearest"]["profile"] == "h100" and not report["clean"]
    # the fix followed: the nearest profile's environment, as envbuild install makes it
    fixed = tmp_path / "fixed"
    stub_install(fixed, near.env)
    again = diagnosed(fixed, "h100-535")
    assert again.findings == (), again.findings


def test_a_torch_cuda_the_matrix_does_not_know_is_named_not_passed_over(tmp_path):
    # (the driver check needs the matrix's record of torch's CUDA; without one it was skipped in
    # silence and the report could say CLEAN on a driver too old for it)
    prefix = tmp_path / "env"
    site = stub_install(prefix, resolve(shipped(), "h100", Overrides()), envbuild_json=False)
    version = site / "torch" / "version.py"
    version.write_text(version.read_text().replace("= '13.0'", "= '13.9'"))
    d = diagnosed(prefix, "h100-535")
    assert any("CUDA 13.9" in n and "not checked" in n for n in d.notes), d.notes


# -- an extension without the card's SM ----------------------------------------------------------


def test_an_extension_without_the_cards_sm_is_named_and_a_rebuild_for_it_passes(tmp_path):
    prefix = tmp_path / "env"
    site = stub_install(prefix, h200_env())
    pkg = site / "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so"
    shutil.copy(
        with_fatbin(gcc(tmp_path, "fa.so", "int f(void){return 1;}\n"), [("sass", 80, b"\1" * 8)]), pkg
    )
    dist_info(site, "flash-attn", "2.8.3", files=(pkg.name,))
    d = diagnosed(prefix, "h200")
    assert rules(d) == ["gpu-code"]
    f = d.findings[0]
    assert "flash-attn" in f.what and "CC 9.0" in f.what and "sm_80" in f.why
    assert "TORCH_CUDA_ARCH_LIST=9.0" in f.fix
    # flash-attn's setup.py builds only when told to (else it fetches its prebuilt wheel, for
    # whatever archs that has), and the rebuild leaves torch as it is
    assert "FLASH_ATTENTION_FORCE_BUILD=TRUE" in f.fix and "--no-deps" in f.fix
    # PTX for an older arch is compiled by the driver on this card: no finding
    shutil.copy(
        with_fatbin(gcc(tmp_path, "ptx.so", "int f(void){return 1;}\n"), [("ptx", 80, b"x" * 8)]), pkg
    )
    assert diagnosed(prefix, "h200").findings == ()
    # the fix followed: rebuilt with sm_90
    shutil.copy(
        with_fatbin(gcc(tmp_path, "fa90.so", "int f(void){return 1;}\n"), [("sass", 90, b"\1" * 8)]), pkg
    )
    assert diagnosed(prefix, "h200").findings == ()


# -- an extension built against another torch ---------------------------------------------------


def test_an_extension_built_against_another_torch_is_named(tmp_path):
    prefix = tmp_path / "env"
    site = stub_install(prefix, h200_env())
    libtorch(site / "torch" / "lib", NEW_SYMBOL)  # the torch installed: exports the new name
    old = libtorch(tmp_path / "old-torch" / "lib", OLD_SYMBOL)  # the torch it was built against
    ext = site / "sgl_kernel" / "common_ops.so"
    ext.parent.mkdir()
    shutil.copy(extension(tmp_path / "build", "common_ops.so", OLD_SYMBOL, old), ext)
    dist_info(site, "sgl-kernel", "0.3.0", files=("sgl_kernel/common_ops.so",))
    d = diagnosed(prefix, "h200")
    assert rules(d) == ["abi"]
    f = d.findings[0]
    assert (
        "sgl-kernel" in f.what
        and OLD_SYMBOL in f.why
        and "--no-cache-dir --no-deps --no-binary sgl-kernel --force-reinstall sgl-kernel==0.3.0" in f.fix
    )
    # the fix followed: rebuilt against the torch beside it
    new = site / "torch" / "lib" / "libc10.so"
    shutil.copy(extension(tmp_path / "rebuild", "common_ops.so", NEW_SYMBOL, new), ext)
    assert diagnosed(prefix, "h200").findings == ()


def test_an_extension_that_needs_a_newer_glibc_than_the_host_has(tmp_path):
    prefix = tmp_path / "env"
    site = stub_install(prefix, h200_env())
    built = gcc(
        tmp_path,
        "c.so",
        "#include <string.h>\nint f(char *a, char *b){ return (int)strlen(a) + (int)strlen(b); }\n",
    )
    host = Host("2.36", None, None)
    assert b"GLIBC_2.2.5" in built.read_bytes()
    # as if built on a newer host: the version its .dynstr names (same length, the ELF stays whole)
    (site / "newer.so").write_bytes(built.read_bytes().replace(b"GLIBC_2.2.5", b"GLIBC_9.2.5"))
    d = diagnosed(prefix, "h200", host=host)
    assert rules(d) == ["libc"], d.findings
    assert "GLIBC_9.2.5" in d.findings[0].what and "GLIBC_2.36" in d.findings[0].why
    # no libstdc++ gives a newer C library: the fix is a build here or the image route
    assert "libstdc" not in d.findings[0].fix and "build" in d.findings[0].fix
    # the fix followed: built on this host
    shutil.copy(built, site / "newer.so")
    assert diagnosed(prefix, "h200", host=host).findings == ()


# -- verl unpatched on a P40 ---------------------------------------------------------------------


def test_verl_unpatched_on_a_p40_is_found_and_apply_patches_fixes_it(tmp_path, verl_trees, cli, monkeypatch):
    env = resolve(shipped(), "p40", Overrides())
    assert env.patches
    prefix = tmp_path / "env"
    site = stub_install(prefix, env, envbuild_json=False)
    shutil.rmtree(next(site.glob("verl-*.dist-info")))
    tree = verl_trees[env.verl.version]
    for item in tree.iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy)(item, site / item.name)
    d = diagnosed(prefix, "p40")
    assert d.nearest is not None and d.nearest.profile == "p40"
    assert {f.rule for f in d.findings} == {"patch"}, d.findings
    assert {f.what.split("(")[-1].rstrip(")") for f in d.findings} <= {p.name for p in env.patches}
    fix = d.findings[0].fix
    assert "apply_patches.py --site" in fix
    # the fix followed as printed, in a folder of its own: its render, then its apply_patches.py
    # (with this Python: the stub environment's bin/python runs nothing)
    render_cmd, apply_cmd = fix.split("`")[1].split(" && ")
    render_words = shlex.split(render_cmd)
    assert render_words[0] == "envbuild"
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(*render_words[1:])
    assert code == 0, err
    _python, script, *rest = shlex.split(apply_cmd)
    assert (tmp_path / script).is_file(), f"the printed fix runs {script}, which its render did not write"
    r = subprocess.run([sys.executable, script, *rest], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert diagnosed(prefix, "p40").findings == ()


# -- transformers outside verl 0.9.1's range (real wheels) --------------------------------------


def pip_into(site: Path, *reqs: str, cache: Path) -> None:
    """The real wheels of `reqs` from PyPI (kept in `cache`), installed into `site` as pip does."""
    pip_run("download", "--no-deps", "--only-binary=:all:", "--index-url", PYPI, "-d", str(cache), *reqs)
    pip_run(
        "install",
        "--no-deps",
        "--no-index",
        "--find-links",
        str(cache),
        "--target",
        str(site),
        "--upgrade",
        *reqs,
    )


@pytest.fixture(scope="session")
def wheel_cache(real_pypi, tmp_path_factory):
    return tmp_path_factory.mktemp("diagnose-wheels")


def test_transformers_outside_verl_091s_range_and_the_pin_that_fixes_it(tmp_path, wheel_cache):
    env = h200_env()
    assert env.verl.version == "0.9.1"
    prefix = tmp_path / "env"
    site = stub_install(prefix, env)
    for name in ("verl", "transformers"):
        for old in site.glob(f"{name}-*.dist-info"):
            shutil.rmtree(old)
    pip_into(site, "verl==0.9.1", "transformers==5.12.0", cache=wheel_cache)
    d = diagnosed(prefix, "h200")
    bad = [f for f in d.findings if f.rule == "requires"]
    assert bad and all("transformers 5.12.0" in f.what for f in bad), d.findings
    assert "verl 0.9.1" in bad[0].what
    want = planned_pins(env)["transformers"]
    assert f"transformers=={want}" in bad[0].fix
    # the fix followed: the profile's pin
    shutil.rmtree(next(site.glob("transformers-*.dist-info")))
    pip_into(site, f"transformers=={want}", cache=wheel_cache)
    again = diagnosed(prefix, "h200")
    assert [f for f in again.findings if f.rule == "requires"] == [], again.findings


def test_python_names_the_environment_without_running_it(tmp_path):
    prefix = tmp_path / "env"
    stub_install(prefix, h200_env())
    (prefix / "bin" / "python").unlink()
    (prefix / "bin" / "python").write_text("#!/bin/sh\ntouch ran\nexit 3\n")  # never run
    (prefix / "bin" / "python").chmod(0o755)
    code, out = invoke(["diagnose", "--python", str(prefix / "bin" / "python"), "--json"], "h200")
    assert code == 0, out
    report = json.loads(out)
    assert report["clean"] and report["nearest"]["profile"] == "h200"
    assert report["environment"]["distributions"] > 200 and report["machine"]["compute_capability"] == "9.0"
    assert not (tmp_path / "ran").exists() and not Path("ran").exists()


def test_the_bench_finds_an_installed_200_package_environment_clean_in_under_5_s():
    from conftest import bench_module

    bench = bench_module("bench_diagnose")
    assert bench.main(["--runs", "1", "--venv", str(Path(sys.prefix))]) == 0


# -- an image, read from a registry ---------------------------------------------------------------


def layer(files: dict[str, bytes]) -> bytes:
    """A gzip'd tar layer of these files (an empty `.wh.NAME` file is a whiteout)."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def tree(folder: Path, under: str) -> dict[str, bytes]:
    return {
        f"{under}/{p.relative_to(folder)}": p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def image_blobs(layers: list[bytes]) -> tuple[bytes, dict[str, bytes]]:
    """(manifest, {digest: blob}) of an image of these layers, as a registry stores them."""
    import hashlib

    def digest(b: bytes) -> str:
        return "sha256:" + hashlib.sha256(b).hexdigest()

    import gzip

    diff_ids = [digest(gzip.decompress(b)) for b in layers]  # (what an engine checks on a pull)
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": len(config),
            "digest": digest(config),
        },
        "layers": [
            {
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "size": len(b),
                "digest": digest(b),
            }
            for b in layers
        ],
    }
    return json.dumps(manifest).encode(), {digest(b): b for b in [config, *layers]}


def broken_image_layers(tmp_path: Path) -> tuple[bytes, bytes]:
    """Layer 1: h200's environment as envbuild installs it at /opt/venv (and /etc/envbuild.json);
    layer 2: a `pip install vllm==0.8.5` over it (the old dist-info whited out)."""
    env = h200_env()
    stub_install(tmp_path / "venv", env)
    base = tree(tmp_path / "venv", "opt/venv")
    base["etc/envbuild.json"] = env.to_json().encode()
    site = f"opt/venv/lib/python{PY}/site-packages"
    old = f"vllm-{env.vllm.version}.dist-info"
    top = {
        f"{site}/.wh.{old}": b"",
        f"{site}/vllm-0.8.5.dist-info/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.8.5\n\n",
    }
    return layer(base), layer(top)


def served(manifest: bytes, blobs: dict[str, bytes], repo: str = "team/rl") -> dict[str, bytes]:
    return {f"v2/{repo}/manifests/1": manifest, **{f"v2/{repo}/blobs/{d}": b for d, b in blobs.items()}}


def test_an_image_whose_top_layer_breaks_verls_range_names_that_layer(tmp_path):
    from httpfixtures import FileServer

    base, top = broken_image_layers(tmp_path)
    manifest, blobs = image_blobs([base, top])
    with FileServer(served(manifest, blobs)) as srv:
        code, out = invoke(["diagnose", "--image", f"127.0.0.1:{srv.port}/team/rl:1"], "h200")
    assert code == 1, out
    assert "vllm 0.8.5 is outside verl 0.9.1's range ==0.24.0, installed by layer 2/2" in out
    assert "nearest profile: h200" in out and "/opt/venv/bin/python -m pip install vllm==0.24.0" in out
    # the fix followed: the image without that layer
    manifest, blobs = image_blobs([base])
    with FileServer(served(manifest, blobs)) as srv:
        code, out = invoke(["diagnose", "--image", f"127.0.0.1:{srv.port}/team/rl:1"], "h200")
        assert code == 0, out
        assert "CLEAN" in out and "environment: /opt/venv" in out
        code, out = invoke(["diagnose", "--image", f"127.0.0.1:{srv.port}/team/rl:1", "--json"], "h200")
    report = json.loads(out[out.index("{") :])
    assert report["clean"] and report["environment"]["image"] == f"127.0.0.1:{srv.port}/team/rl:1"
    assert report["environment"]["prefix"] == "/opt/venv"
    assert report["environment"]["site_packages"] == f"/opt/venv/lib/python{PY}/site-packages"


def test_an_image_layer_whose_bytes_do_not_match_its_digest_is_refused(tmp_path):
    from httpfixtures import FileServer

    base, top = broken_image_layers(tmp_path)
    manifest, blobs = image_blobs([base, top])
    files = served(manifest, blobs)
    top_digest = json.loads(manifest)["layers"][1]["digest"]
    with FileServer(files, script={f"v2/team/rl/blobs/{top_digest}": ["corrupt"]}) as srv:
        code, out = invoke(["diagnose", "--image", f"127.0.0.1:{srv.port}/team/rl:1"], "h200")
    assert code == 1, out
    assert f"Layer {top_digest}" in out and "hashes to sha256:" in out and "Push the image again" in out


def declaring(manifest: bytes, layer: int, size: int) -> bytes:
    """The manifest with layer `layer`'s declared size changed (its digest left as it is)."""
    doc = json.loads(manifest)
    doc["layers"][layer]["size"] = size
    return json.dumps(doc).encode()


def test_an_image_layer_whose_size_is_not_the_manifests_is_refused(tmp_path):
    from httpfixtures import FileServer

    base, top = broken_image_layers(tmp_path)
    manifest, blobs = image_blobs([base, top])
    digest = json.loads(manifest)["layers"][1]["digest"]
    for declared, says in (
        (len(top) - 10, f"more than the {len(top) - 10} bytes its manifest declares"),
        (len(top) + 1000, f"{len(top)} bytes, not the {len(top) + 1000} its manifest declares"),
    ):
        with FileServer(served(declaring(manifest, 1, declared), blobs)) as srv:
            code, out = invoke(["diagnose", "--image", f"127.0.0.1:{srv.port}/team/rl:1"], "h200")
        assert code == 1, out
        assert f"Layer {digest}" in out and says in out and "Push the image again" in out, out
        assert "nearest profile" not in out  # (nothing of the image was judged)


REGISTRY = f"127.0.0.1:{os.environ.get('ENVBUILD_TEST_REGISTRY_PORT', '5000')}"


def push(repo: str, tag: str, manifest: bytes, blobs: dict[str, bytes]) -> None:
    """An image pushed to the loopback registry through its v2 API (no engine needed)."""
    import requests

    for digest, blob in blobs.items():
        r = requests.post(f"http://{REGISTRY}/v2/{repo}/blobs/uploads/", timeout=30)
        assert r.status_code == 202, r.text
        location = r.headers["Location"]
        location = location if location.startswith("http") else f"http://{REGISTRY}{location}"
        sep = "&" if "?" in location else "?"
        r = requests.put(f"{location}{sep}digest={digest}", data=blob, timeout=60)
        assert r.status_code == 201, r.text
    r = requests.put(
        f"http://{REGISTRY}/v2/{repo}/manifests/{tag}",
        data=manifest,
        headers={"Content-Type": "application/vnd.docker.distribution.manifest.v2+json"},
        timeout=30,
    )
    assert r.status_code == 201, r.text


@pytest.mark.docker
def test_an_image_in_the_loopback_registry_with_a_mismatched_layer(tmp_path):
    import requests

    from conftest import need

    try:
        up = requests.get(f"http://{REGISTRY}/v2/", timeout=3).status_code in (200, 401)
    except requests.RequestException:
        up = False
    need(up, f"no registry on {REGISTRY} (tests/run.sh, run as root, provisions it)")
    base, top = broken_image_layers(tmp_path)
    push("envbuild-test/diagnose", "broken", *image_blobs([base, top]))
    push("envbuild-test/diagnose", "fixed", *image_blobs([base]))
    code, out = invoke(["diagnose", "--image", f"{REGISTRY}/envbuild-test/diagnose:broken"], "h200")
    assert code == 1 and "installed by layer 2/2" in out, out
    assert "nearest profile: h200" in out and "-m pip install vllm==0.24.0" in out, out
    code, out = invoke(["diagnose", "--image", f"{REGISTRY}/envbuild-test/diagnose:fixed", "--json"], "h200")
    assert code == 0, out
    assert json.loads(out[out.index("{") :])["clean"]
    # a manifest whose layer is not the blob the registry serves (distribution accepts it: it
    # checks that the blob exists, not its size); an engine's pull refuses it, and so does diagnose
    manifest, blobs = image_blobs([base])
    digest = json.loads(manifest)["layers"][0]["digest"]
    push("envbuild-test/diagnose", "mismatched", declaring(manifest, 0, len(base) + 7), blobs)
    code, out = invoke(["diagnose", "--image", f"{REGISTRY}/envbuild-test/diagnose:mismatched"], "h200")
    assert code == 1 and f"Layer {digest}" in out and "its manifest declares" in out, out
    # the fix followed: the image pushed again, whole
    push("envbuild-test/diagnose", "mismatched", manifest, blobs)
    code, out = invoke(["diagnose", "--image", f"{REGISTRY}/envbuild-test/diagnose:mismatched"], "h200")
    assert code == 0 and "CLEAN" in out, out


def test_a_package_installed_twice_and_versions_no_one_reads_are_judged_without_a_traceback(tmp_path):
    prefix = tmp_path / "env"
    site = stub_install(prefix, h200_env())
    dist_info(site, "numpy", "1.26.4")  # (a second dist-info beside the planned one)
    dist_info(site, "odd", "not/a version\x1b[31m", requires=("numpy>=oops", "verl ; extra == 'x'"))
    d = diagnosed(prefix, "h200")
    assert rules(d) == ["twice"], d.findings
    assert "numpy is installed 2 times" in d.findings[0].what
    code, out = invoke(["diagnose", "--prefix", str(prefix)], "h200")
    assert code == 1 and "\x1b" not in out


def test_an_unknown_profile_is_exit_2(tmp_path):
    stub_install(tmp_path / "env", h200_env())
    code, out = invoke(["diagnose", "--prefix", str(tmp_path / "env"), "--profile", "nope"], "h200")
    assert code == 2 and "no profile of the matrix" in out


def test_requirement_markers_are_judged_for_the_machine_the_environment_is_on(tmp_path, monkeypatch):
    """A local environment is judged for this host's machine (an aarch64 venv does not lack torch's
    x86_64-only wheels); an image is read as linux/amd64."""
    prefix = tmp_path / "env"
    site = stub_install(prefix, h200_env())
    dist_info(
        site,
        "arm-only",
        "1.0",
        requires=(
            "nvidia-x86-only-cu12 ; platform_machine == 'x86_64'",
            "nvidia-arm-only-cu12 ; platform_machine == 'aarch64'",
        ),
    )
    here = os.uname()
    arm = os.uname_result((here.sysname, here.nodename, here.release, here.version, "aarch64"))
    monkeypatch.setattr(os, "uname", lambda: arm)
    d = diagnosed(prefix, "h200")
    assert [f.what for f in d.findings] == [
        "arm-only 1.0 requires nvidia-arm-only-cu12, which is not installed"
    ], d.findings
    image = read_target(prefix)._replace(image="127.0.0.1:5000/team/rl:1")
    d = diagnose(shipped(), image, machine("h200"), None, HOST)
    assert [f.what for f in d.findings] == [
        "arm-only 1.0 requires nvidia-x86-only-cu12, which is not installed"
    ], d.findings


# -- an attention the card cannot run ------------------------------------------------------------


def test_flash_attn_on_a_card_below_its_floor_is_named_and_uninstalling_it_passes(tmp_path):
    env = resolve(shipped(), "p40", Overrides())
    assert env.flash_attn is None and env.attention == "eager"
    prefix = tmp_path / "env"
    site = stub_install(prefix, env)
    # flash-attn as its sm_80 wheel installs it (a gcc-made ELF with the fat binary's header)
    ext = site / "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so"
    shutil.copy(
        with_fatbin(gcc(tmp_path, "fa.so", "int f(void){return 1;}\n"), [("sass", 80, b"\1" * 8)]), ext
    )
    folder = dist_info(site, "flash-attn", "2.8.3", files=(ext.name,))
    d = diagnosed(prefix, "p40")
    assert rules(d) == ["attention"], d.findings  # (not gpu-code: no rebuild gives it a P40 kernel)
    f = d.findings[0]
    assert "flash-attn 2.8.3" in f.what and "CC 6.1" in f.what and "CC >= 8.0" in f.why
    assert "pip uninstall -y flash-attn" in f.fix and "eager" in f.fix
    # the fix followed: uninstalled
    ext.unlink()
    shutil.rmtree(folder)
    assert diagnosed(prefix, "p40").findings == ()


@pytest.mark.docker
def test_an_image_in_the_local_engine_is_read_from_it(tmp_path):
    """An image only in the Docker engine (pulled from the loopback registry, renamed, the
    registry's name removed): read through `docker save`, each layer against its diff_id."""
    import requests

    from conftest import need
    from envbuilder.engines.docker import engine

    try:
        up = requests.get(f"http://{REGISTRY}/v2/", timeout=3).status_code in (200, 401)
    except requests.RequestException:
        up = False
    need(up, f"no registry on {REGISTRY} (tests/run.sh, run as root, provisions it)")
    client = engine()
    base, top = broken_image_layers(tmp_path)
    push("envbuild-test/diagnose", "engine-broken", *image_blobs([base, top]))
    push("envbuild-test/diagnose", "engine-fixed", *image_blobs([base]))
    local = "envbuild-test-diagnose-local"
    try:
        for tag in ("broken", "fixed"):
            remote = f"{REGISTRY}/envbuild-test/diagnose:engine-{tag}"
            client.images.pull(remote).tag(local, tag)
            client.images.remove(remote)
        code, out = invoke(["diagnose", "--image", f"{local}:broken"], "h200")
        assert code == 1, out
        assert "from the Docker engine" in out and "vllm 0.8.5 is outside verl 0.9.1's range" in out
        assert "installed by layer 2/2" in out and "-m pip install vllm==0.24.0" in out
        # the fix followed: the image without that layer
        code, out = invoke(["diagnose", "--image", f"{local}:fixed"], "h200")
        assert code == 0 and "CLEAN" in out, out
    finally:
        for tag in ("broken", "fixed"):
            try:
                client.images.remove(f"{local}:{tag}")
            except Exception:  # noqa: BLE001 - (already gone)
                pass


def test_an_image_neither_the_engine_nor_a_registry_has_is_refused_without_asking_docker_hub(tmp_path):
    code, out = invoke(["diagnose", "--image", "envbuild-test-nothing-here:1"], "h200")
    assert code == 1 and "No image envbuild-test-nothing-here:1 in the Docker engine" in out, out
    assert "no registry host" in out and "docker.io" not in out.split("(docker.io/NAME:TAG")[0]


def test_image_without_the_actions_extra_names_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "requests" else real(name, *a)
    )
    code, out = invoke(["diagnose", "--image", "127.0.0.1:9/team/rl:1"], "h200")
    assert code == 2 and "envbuild[actions]" in out and "requests" in out, out


def libstdcxx(folder: Path, newest: str) -> Path:
    """A stand-in libstdc++.so.6 whose version nodes go up to GLIBCXX_`newest` (gcc and a
    version script: the names the loader matches, as the real one defines them)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "v.map"
    script.write_text(
        "GLIBCXX_3.4 { global: base_fn; local: *; };\n"
        f"GLIBCXX_{newest} {{ global: new_fn; }} GLIBCXX_3.4;\n"
    )
    return gcc(
        folder,
        "libstdc++.so.6",
        "int base_fn(void){return 1;}\nint new_fn(void){return 2;}\n",
        f"-Wl,--version-script={script}",
        "-Wl,-soname,libstdc++.so.6",
    )


def test_a_conda_prefixs_own_older_libstdcxx_is_the_one_judged_and_a_newer_one_fixes_it(tmp_path):
    """GLIBCXX_3.4.30 not found (AReaL#282): an extension built with a newer compiler than the
    libstdc++ the conda prefix ships, which the environment loads before the system's."""
    from envbuilder.machine.diagnose import read_host

    prefix = tmp_path / "env"
    site = stub_install(prefix, h200_env())
    new = libstdcxx(tmp_path / "new", "3.4.30")
    ext = gcc(
        tmp_path,
        "needs_new.so",
        "extern int new_fn(void);\nint ext_entry(void){ return new_fn(); }\n",
        f"-L{new.parent}",
        "-l:libstdc++.so.6",
    )
    assert b"GLIBCXX_3.4.30" in ext.read_bytes()
    shutil.copy(ext, site / "needs_new.so")
    shutil.copy(libstdcxx(tmp_path / "old", "3.4.20"), prefix / "lib" / "libstdc++.so.6")
    host = read_host(prefix)
    assert host.libstdcxx == str(prefix / "lib" / "libstdc++.so.6") and host.glibcxx == "3.4.20"
    d = diagnosed(prefix, "h200", host=host)
    assert rules(d) == ["libc"], d.findings
    f = d.findings[0]
    assert "needs GLIBCXX_3.4.30" in f.what and str(prefix / "lib") in f.why and "3.4.20" in f.why
    # a command that runs as printed: the GCC whose libstdc++ first has GLIBCXX_3.4.30 (12.1)
    assert "`conda install -c conda-forge 'libstdcxx-ng>=12.1'`" in f.fix and "..." not in f.fix
    # the fix followed: a newer libstdc++ in the prefix
    shutil.copy(new, prefix / "lib" / "libstdc++.so.6")
    assert diagnosed(prefix, "h200", host=read_host(prefix)).findings == ()


def standin_torch(folder: Path, symbol: str) -> Path:
    """torch/ as an extension build sees it: lib/libc10.so exporting `symbol`, and the header
    that names it (as c10's headers give each torch release's mangled names)."""
    libtorch(folder / "lib", symbol)
    (folder / "include").mkdir(parents=True, exist_ok=True)
    (folder / "include" / "c10_api.h").write_text(f"#define C10_SINGLETON {symbol}\nextern int {symbol};\n")
    return folder


def sgl_kernel_sdist(folder: Path) -> Path:
    """An sdist whose setup.py builds sgl_kernel.common_ops against the torch at $STANDIN_TORCH."""
    import tarfile

    src = folder / "sgl_kernel-0.3.0"
    (src / "sgl_kernel").mkdir(parents=True)
    (src / "sgl_kernel" / "__init__.py").write_text("")
    (src / "csrc").mkdir()
    (src / "csrc" / "ops.c").write_text(
        '#include "c10_api.h"\nint ext_entry(void) { return C10_SINGLETON; }\n'
    )
    (src / "setup.py").write_text(
        "import os\nfrom setuptools import Extension, setup\n"
        "torch = os.environ['STANDIN_TORCH']\n"
        "setup(name='sgl-kernel', version='0.3.0', packages=['sgl_kernel'], ext_modules=[Extension("
        "'sgl_kernel.common_ops', ['csrc/ops.c'], include_dirs=[torch + '/include'], "
        "library_dirs=[torch + '/lib'], libraries=['c10'])])\n"
    )
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: sgl-kernel\nVersion: 0.3.0\n")
    out = folder / "sgl_kernel-0.3.0.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return out


def test_an_extension_wheel_built_against_one_torch_then_torch_upgraded_and_the_printed_fix_run(
    tmp_path, monkeypatch
):
    """A real wheel built here (setuptools, gcc) against one torch and pip-installed; torch then
    upgraded under it (sglang#30562's shape). The fix diagnose prints is run with pip, as
    printed, pointed at this site-packages and the local sdist (no index)."""
    pytest.importorskip("setuptools")
    prefix = tmp_path / "env"
    site = stub_install(prefix, h200_env())
    sdists = tmp_path / "sdists"
    sdists.mkdir()
    sgl_kernel_sdist(sdists)
    old = standin_torch(tmp_path / "old" / "torch", OLD_SYMBOL)
    monkeypatch.setenv("STANDIN_TORCH", str(old))
    cache = str(tmp_path / "pip-cache")  # (pip's wheel cache, as a user's ~/.cache/pip keeps it)
    pip_run(
        "wheel",
        "--cache-dir",
        cache,
        "--no-build-isolation",
        "--no-deps",
        "--no-index",
        "-w",
        str(tmp_path / "wheels"),
        str(sdists / "sgl_kernel-0.3.0.tar.gz"),
    )
    wheel = next((tmp_path / "wheels").glob("sgl_kernel-0.3.0-*.whl"))
    pip_run("install", "--no-deps", "--no-index", "--target", str(site), str(wheel))
    standin_torch(site / "torch", NEW_SYMBOL)  # torch upgraded: the new release's c10
    d = diagnosed(prefix, "h200")
    assert rules(d) == ["abi"], d.findings
    f = d.findings[0]
    assert f.what.startswith("sgl_kernel/common_ops.") and "(sgl-kernel)" in f.what and OLD_SYMBOL in f.why
    fix = f.fix.split("`")[1]
    assert fix.startswith(
        f"{prefix}/bin/python -m pip install --no-build-isolation --no-cache-dir --no-deps --no-binary sgl-kernel"
    )
    # the fix followed: the printed pip command (its own --no-deps: --force-reinstall would
    # reinstall torch), built against the torch now beside it; only where it finds things is ours
    monkeypatch.setenv("STANDIN_TORCH", str(site / "torch"))
    args = fix.split(" -m pip ")[1].split()
    pip_run(
        args[0],
        "--cache-dir",
        cache,
        *args[1:],
        "--no-index",
        "--find-links",
        str(sdists),
        "--target",
        str(site),
        "--upgrade",
    )
    assert diagnosed(prefix, "h200").findings == ()


def test_an_h200_environment_carried_to_a_p40_names_torchs_archs_and_vllms_floor(tmp_path):
    """torch 2.11+cu130 (no sm_61 in its arch list) and vLLM on a recorded P40 with a 535
    driver: each finding, and the P40's profile as the fix, which then diagnoses clean."""
    prefix = tmp_path / "env"
    stub_install(prefix, h200_env(), envbuild_json=False)
    d = diagnosed(prefix, "p40")
    assert rules(d) == ["driver", "torch-arch", "vllm-card"], d.findings
    arch = d.findings[1]
    assert "Tesla P40 (CC 6.1)" in arch.what and "7.5;8.0" in arch.why and "no kernel image" in arch.why
    assert "vLLM 0.24.0" in d.findings[2].what and ">= 7.5" in d.findings[2].why
    assert d.nearest is not None and d.nearest.profile == "p40"
    assert all("`envbuild install p40 --prefix NEW_PREFIX`" in f.fix for f in d.findings)
    # the fix followed: p40's environment, as envbuild install makes it
    stub_install(tmp_path / "fixed", d.nearest.env)
    assert diagnosed(tmp_path / "fixed", "p40").findings == ()


def test_an_envbuild_installed_h200_environment_on_a_p40_is_pointed_at_the_p40s_profile(tmp_path):
    """The same environment with the envbuild.json envbuild install leaves: its own profile
    (h200) does not run on the card found, so the fix is the card's profile, not `envbuild
    install h200` (which, followed, gave the same broken environment again)."""
    prefix = tmp_path / "env"
    stub_install(prefix, h200_env(), envbuild_json=True)
    d = diagnosed(prefix, "p40")
    assert "torch-arch" in rules(d), d.findings
    assert d.nearest is not None and d.nearest.profile == "p40"
    assert not any("install h200" in f.fix for f in d.findings), [f.fix for f in d.findings]
    stub_install(tmp_path / "fixed", d.nearest.env)
    assert diagnosed(tmp_path / "fixed", "p40").findings == ()


def test_a_hostile_image_layer_writes_nothing_outside_diagnoses_folder(tmp_path, monkeypatch):
    """Members that climb out (`../`), links that point out (absolute, `..`), then a later
    layer's files through those links: nothing lands outside the temporary folder."""
    import io
    import tarfile

    from httpfixtures import FileServer

    outside = tmp_path / "outside"
    outside.mkdir()
    site = f"opt/venv/lib/python{PY}/site-packages"

    def hostile() -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:gz") as tar:
            links = (
                (f"{site}/abs.so", str(outside)),
                (f"{site}/up.so", "../../.."),
                ("lib/libc.so.6", str(outside)),
            )
            for name, target in links:
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            for name in (f"../../outside/{site}/climb.so", f"/{outside}/{site}/rooted.dist-info/METADATA"):
                data = b"Metadata-Version: 2.1\nName: climb\nVersion: 1\n\n"
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return out.getvalue()

    through = layer(
        {
            f"{site}/abs.so/evil.so": b"\x7fELF written through a link",
            f"{site}/up.so/{site}/evil.so": b"\x7fELF written through a link",
            "lib/libc.so.6/libstdc++.so.6": b"\x7fELF written through a link",
        }
    )
    base, _ = broken_image_layers(tmp_path / "img")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with FileServer(served(*image_blobs([base, hostile(), through]))) as srv:
        code, out = invoke(["diagnose", "--image", f"127.0.0.1:{srv.port}/team/rl:1"], "h200")
    assert code in (0, 1) and "Traceback" not in out, out
    assert list(outside.iterdir()) == [], list(outside.rglob("*"))
    assert not (tmp_path / "opt").exists() and not (tmp_path / "outside" / "opt").exists()
    assert list((tmp_path / "tmp").iterdir()) == []  # (the temporary folder removed)


def test_a_whiteout_of_its_own_folder_or_the_one_above_removes_nothing(tmp_path):
    """A layer's `.wh..` or `.wh...` named `.` or `..` as the file it deletes: the folder it is
    in, or the one above (diagnose's own unpacking root). They are not files a layer can delete."""
    from envbuilder.machine.target import _apply

    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "keep.txt").write_text("x")
    for rel in ("a/b/.wh..", "a/b/.wh...", "a/.wh..."):
        assert _apply(None, None, rel, root) is False
        assert (root / "a" / "b" / "keep.txt").is_file(), rel


def test_a_compiled_file_diagnose_cannot_read_is_named_not_passed_over(tmp_path):
    """A `.so` that is no ELF this reads (a linker script, a truncated file) is no extension any
    check saw: the report names it instead of saying nothing."""
    prefix = tmp_path / "env"
    site = stub_install(prefix, h200_env())
    (site / "odd.so").write_text("/* GNU ld script */ GROUP ( libodd.so.1 )\n")
    d = diagnosed(prefix, "h200")
    assert d.findings == ()
    assert any("odd.so" in n and "not checked" in n for n in d.notes), d.notes
