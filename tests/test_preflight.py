"""The rendered preflight.py, run for real with `python -S` (no site-packages: only what a test
puts on PYTHONPATH is importable): without torch, with a broken or foreign torch, without a GPU,
with stand-in packages for every module of the training path, and with a compiled module that
links libcuda.so.1. It never raises: every failure is a line with its fix. No network, no Docker.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import FIXTURES, frozen, frozen_with, need, place_script, resolved
from fixture_wheels import module_files, wheels_for_env
from envbuilder.model import matrix as M
from envbuilder.render.files import smoke_command
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext

CHECK, CROSS = "\u2713", "\u2717"


def render(tmp_path: Path, profile: str, matrix: M.Matrix | None = None, **kw) -> tuple[Path, dict]:
    """preflight's logic on the frozen fixture matrix (conftest) unless a matrix is given."""
    env = resolved(profile, matrix or frozen(), **kw)
    out = tmp_path / "rendered"
    out.mkdir(exist_ok=True)
    for name, text in render_files(BuildContext.of(env)).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return out / "preflight.py", env.to_dict()


def run(script: Path, *args: str, site: Path | None = None) -> subprocess.CompletedProcess:
    """preflight.py in a fresh interpreter that sees only `site` (and the standard library)."""
    empty = script.parent / "empty-bin"
    empty.mkdir(exist_ok=True)  # no nvidia-smi on PATH
    env = {"PATH": str(empty), "LANG": "C.UTF-8"}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-S", str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=script.parent,
    )


def torch_standin(version: str, cuda: str, gpu: bool = False) -> dict[str, str]:
    """A torch package that says which build it is and sees no GPU (or one that answers)."""
    return {
        "torch/__init__.py": "from . import cuda, version\n__version__ = version.__version__\n",
        "torch/version.py": f"__version__ = {version!r}\ncuda = {cuda!r}\n",
        "torch/cuda.py": f"def is_available():\n    return {gpu!r}\n",
        "torch/distributed/__init__.py": "# as in torch 2.3.1: no DeviceMesh here\n",
    }


def site_with(tmp_path: Path, files: dict[str, str]) -> Path:
    site = tmp_path / "site"
    for path, text in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    return site


# verl patched for the GPU and audited (preflight's last two checks): stand-in verl packages are
# not the real release, so these tests judge everything else and leave those two to
# tests/test_preflight_patches.py, which runs them on the real wheels
PATCH_CHECKS = ("verl patched", "precision audit")


def ready_but_patches(r: subprocess.CompletedProcess, patched: bool = False) -> None:
    """Every check passed but the patch checks on a stand-in verl, which say how to finish it."""
    report = [ln for ln in (r.stdout + r.stderr).splitlines() if ln[:2] in (f"{CHECK} ", f"{CROSS} ")]
    others = [ln for ln in report if ln[2:].split(": ", 1)[0] not in PATCH_CHECKS]
    assert others and all(ln.startswith(CHECK) for ln in others), r.stdout + r.stderr
    assert any(ln[2:].startswith("precision audit") for ln in report), r.stdout + r.stderr
    if patched:
        assert any(ln.startswith(f"{CHECK} verl patched") for ln in report), r.stdout + r.stderr
    elif r.returncode == 1:
        assert "apply_patches.py" in r.stdout + r.stderr


def no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr


def lines(r: subprocess.CompletedProcess) -> dict[str, str]:
    """check name -> its line, from the text report."""
    out = {}
    for line in r.stdout.splitlines():
        if line[:2] in (f"{CHECK} ", f"{CROSS} "):
            out[line[2:].split(": ", 1)[0]] = line
    return out


P40_TORCH = ("2.6.0+cu118", "11.8")


# -- torch missing, broken or foreign ---------------------------------------------------------


def test_without_torch_every_check_is_a_line_and_the_imports_still_run(tmp_path):
    script, d = render(tmp_path, "p40")
    r = run(script)
    no_traceback(r)
    assert r.returncode == 1
    got = lines(r)
    assert got["import torch"].startswith(
        f"{CROSS} import torch: ModuleNotFoundError: No module named 'torch'"
    )
    assert "torch==2.6.0+cu118 from https://download.pytorch.org/whl/cu118" in r.stdout
    assert got["GPU visible"].startswith(CROSS)
    for module in d["training_path"]:
        assert got[f"import {module}"].startswith(CROSS), module
    report = json.loads(run(script, "--json").stdout)
    assert report["ready"] is False
    assert [c["check"] for c in report["checks"] if c["check"].startswith("import ")][1:] == [
        f"import {m}" for m in d["training_path"]
    ]
    # apex is compiled in the builder stage, not in requirements.txt: its fix is the build
    apex = next(c for c in report["checks"] if c["check"] == "import apex")
    assert "not in requirements.txt" in apex["fix"] and "--cuda_ext" in apex["fix"], apex


HOSTILE = {
    "no torch.version": (
        {"torch/__init__.py": "__version__ = '2.6.0+cu118'\n"},
        "torch build",
        "is not a PyTorch build",
    ),
    "raises on import": (
        {
            "torch/__init__.py": "raise RuntimeError('CUDA driver initialization "
            "failed\\nsecond line of the story')\n"
        },
        "import torch",
        "RuntimeError: CUDA driver initialization failed",
    ),
    "exits on import": ({"torch/__init__.py": "import sys\nsys.exit(3)\n"}, "import torch", "SystemExit: 3"),
    "foreign version attribute": (
        {"torch/__init__.py": "__version__ = '1.0'\nversion = 'a string'\n"},
        "torch build",
        "is not a PyTorch build",
    ),
    "is_available raises": (
        dict(
            torch_standin(*P40_TORCH),
            **{
                "torch/cuda.py": "def is_available():\n    raise RuntimeError('Unexpected error from "
                "cudaGetDeviceCount()')\n"
            },
        ),
        "GPU visible",
        "RuntimeError: Unexpected error from cudaGetDeviceCount()",
    ),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_broken_or_foreign_torch_is_a_cross_not_a_traceback(tmp_path, case):
    files, check, detail = HOSTILE[case]
    script, d = render(tmp_path, "p40")
    r = run(script, site=site_with(tmp_path, files))
    no_traceback(r)
    assert r.returncode == 1
    got = lines(r)
    assert got[check].startswith(f"{CROSS} {check}: ") and detail in got[check], r.stdout
    assert "second line" not in r.stdout
    assert all(f"import {m}" in got for m in d["training_path"])  # and the imports still ran


def test_another_torch_build_than_rendered_says_which_to_reinstall(tmp_path):
    script, _ = render(tmp_path, "p40")
    r = run(script, "--json", site=site_with(tmp_path, torch_standin("2.6.0+cu124", "12.4")))
    no_traceback(r)
    build = {c["check"]: c for c in json.loads(r.stdout)["checks"]}["torch build"]
    assert not build["ok"] and "CUDA 12.4 (expected 2.6.0 for CUDA 11.8)" in build["detail"]
    assert "torch==2.6.0+cu118" in build["fix"] and "download.pytorch.org/whl/cu118" in build["fix"]


# -- no GPU: the GPU checks fail, the imports are still checked --------------------------------


def test_without_a_gpu_the_training_path_is_still_imported_one_by_one(tmp_path):
    script, d = render(tmp_path, "t4")
    site = site_with(tmp_path, dict(module_files(d["training_path"]), **torch_standin("2.6.0+cu124", "12.4")))
    r = run(script, site=site)
    no_traceback(r)
    assert r.returncode == 1
    got = lines(r)
    assert got["GPU visible"] == f"{CROSS} GPU visible: no GPU visible (torch.cuda.is_available() is False)"
    assert got["torch build"].startswith(CHECK)
    for module in d["training_path"]:
        assert got[f"import {module}"].startswith(CHECK), got[f"import {module}"]
    assert "vllm._C" in d["training_path"]  # vllm's ops imported without a GPU are not a failure

    smoke = run(script, "--smoke", site=site)
    ready_but_patches(smoke)
    assert "GPU visible" not in smoke.stdout


def test_each_failing_import_is_its_own_cross_with_the_errors_first_line(tmp_path):
    script, d = render(tmp_path, "p40", without=["apex"])
    files = dict(module_files(d["training_path"]), **torch_standin(*P40_TORCH))
    files["verl/workers/fsdp_workers.py"] = "from torch.distributed import DeviceMesh\n"
    files["verl/workers/actor/dp_actor.py"] = (
        "raise ImportError('flash_attn is broken\\n  and here is a long explanation')\n"
    )
    files["verl/utils/reward_score/gsm8k.py"] = "import sys\nsys.exit('gsm8k gave up')\n"
    files["verl/utils/dataset/rl_dataset.py"] = "print('a chatty package logs to stdout')\n"
    r = run(script, "--json", site=site_with(tmp_path, files))
    no_traceback(r)
    assert r.returncode == 1
    report = json.loads(r.stdout)  # the chatty import did not break --json
    assert "a chatty package" in r.stderr
    checks = {c["check"]: c for c in report["checks"]}
    fsdp = checks["import verl.workers.fsdp_workers"]
    assert not fsdp["ok"]
    assert fsdp["detail"].startswith("ImportError: cannot import name 'DeviceMesh' from 'torch.distributed'")
    assert "rebuild the image" in fsdp["fix"]
    actor = checks["import verl.workers.actor.dp_actor"]
    assert actor["detail"] == "ImportError: flash_attn is broken"
    assert checks["import verl.utils.reward_score.gsm8k"]["detail"] == "SystemExit: gsm8k gave up"
    failed = {"verl.workers.fsdp_workers", "verl.workers.actor.dp_actor", "verl.utils.reward_score.gsm8k"}
    for module in d["training_path"]:
        assert checks[f"import {module}"]["ok"] is (module not in failed), module


def test_a_module_missing_from_the_image_says_so(tmp_path):
    script, d = render(tmp_path, "p40", without=["apex"])
    files = dict(module_files(d["training_path"]), **torch_standin(*P40_TORCH))
    del files["verl/workers/rollout/hf_rollout.py"]
    files["verl/workers/sharding_manager/base.py"] = "import tensordict\n"
    r = run(script, "--smoke", site=site_with(tmp_path, files))
    assert r.returncode == 1
    got = lines(r)
    assert (
        "No module named 'verl.workers.rollout.hf_rollout'" in got["import verl.workers.rollout.hf_rollout"]
    )
    assert "verl.workers.sharding_manager.base needs tensordict" in r.stdout
    assert r.stdout.strip().splitlines()[-1].startswith("smoke FAILED: p40")


def test_an_unknown_argument_is_exit_2_with_the_usage(tmp_path):
    script, _ = render(tmp_path, "p40")
    r = run(script, "--jsn")
    assert r.returncode == 2 and r.stdout == ""
    assert "unknown argument '--jsn'" in r.stderr and "--json" in r.stderr


# -- compiled modules that link libcuda.so.1 (vllm._C) on a machine without the driver -----------


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def test_without_a_driver_the_cuda_images_compat_libcuda_lets_compiled_modules_load(tmp_path, overlay):
    """vllm._C is linked against libcuda.so.1 (readelf -d of the 0.8.5.post1 wheel), which only
    the driver provides. A real extension module linked the same way stands in for it."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    need(cc is not None, "no C compiler (cc) to build the libcuda-linked stand-in")
    if _driver_present():
        pytest.skip(
            "this machine has an NVIDIA driver (libcuda.so.1 loads); the compat library "
            "is for machines without one"
        )
    build = tmp_path / "build"
    compat = tmp_path / "compat"
    build.mkdir()
    compat.mkdir()
    (build / "cuda.c").write_text("int cuInit(unsigned int flags) { return 100; }\n")
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(compat / "libcuda.so.1"),
            str(build / "cuda.c"),
        ],
        check=True,
    )
    (build / "ops.c").write_text(
        "#include <Python.h>\nint cuInit(unsigned int);\n"
        "static PyObject *init(PyObject *s, PyObject *a) { return PyLong_FromLong(cuInit(0)); }\n"
        'static PyMethodDef m[] = {{"init", init, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};\n'
        'static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, m};\n'
        "PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&d); }\n"
    )
    script, d = render(tmp_path, "t4")
    files = dict(module_files(d["training_path"]), **torch_standin("2.6.0+cu124", "12.4"))
    del files["vllm/_C.py"]  # the compiled one below takes its place
    site = site_with(tmp_path, files)
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-I",
            sysconfig.get_paths()["include"],
            str(build / "ops.c"),
            "-L",
            str(compat),
            "-l:libcuda.so.1",
            "-o",
            str(site / "vllm" / ("_C" + sysconfig.get_config_var("EXT_SUFFIX"))),
        ],
        check=True,
    )

    def with_compat(path: Path) -> Path:
        folder = tmp_path / f"matrix-{path.parent.name}"
        folder.mkdir()
        (folder / "compat.yaml").write_text(
            json.dumps(
                {
                    "cuda_compat": {
                        "libcuda": str(path),
                        "source": "https://docs.nvidia.com/deploy/cuda-compatibility/",
                    }
                }
            )
        )
        return folder

    absent = tmp_path / "nowhere" / "libcuda.so.1"
    script, _ = render(tmp_path, "t4", frozen_with(with_compat(absent)))
    r = run(script, "--smoke", site=site)
    no_traceback(r)
    got = lines(r)
    assert r.returncode == 1
    assert "libcuda.so.1: cannot open shared object file" in got["import vllm._C"]
    assert "needs the NVIDIA driver's libcuda.so.1" in r.stdout and "--gpus all" in r.stdout
    assert "libcuda for imports" not in got

    script, _ = render(tmp_path, "t4", frozen_with(with_compat(compat / "libcuda.so.1")))
    r = run(script, "--smoke", site=site)
    no_traceback(r)
    got = lines(r)
    ready_but_patches(r)
    assert got["libcuda for imports"].startswith(
        f"{CHECK} libcuda for imports: no NVIDIA driver here: {compat / 'libcuda.so.1'}"
    )
    assert got["import vllm._C"].startswith(CHECK)


# -- the build's smoke test, against the stand-in packages an image build installs ---------------


def _install_standins(tmp_path: Path, d: dict) -> Path:
    """What `pip install` puts into the image: the stand-in wheels of test_build, unpacked."""
    pkgs = tmp_path / "pkgs"
    wheels_for_env(pkgs, d, FIXTURES / "verl-0.4.1")
    if d["apex"]:
        cc = shutil.which(os.environ.get("CC", "cc"))
        need(cc is not None, "no C compiler (cc) to build the apex stand-in")
        src = tmp_path / "apex-src"
        shutil.copytree(FIXTURES / "apex-standin", src)
        subprocess.run(
            [sys.executable, "-c", "import backend, sys; backend.build_wheel(sys.argv[1])", str(pkgs)],
            cwd=src,
            check=True,
            capture_output=True,
        )
    site = tmp_path / "site-packages"
    for wheel in sorted(pkgs.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
    return site


@pytest.mark.parametrize("profile", ["p40", "t4"])
def test_the_smoke_test_imports_the_training_path_of_the_installed_image(tmp_path, profile):
    script, d = render(tmp_path, profile)
    site = _install_standins(tmp_path, d)
    env = {"PYTHONPATH": str(site), "PATH": os.environ.get("PATH", "")}
    if (script.parent / "apply_patches.py").exists():  # as the Dockerfile's RUN does
        subprocess.run(
            [sys.executable, "-S", str(script.parent / "apply_patches.py"), "--site", str(site)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    cmd = smoke_command(str(script))
    r = subprocess.run([sys.executable, "-S", *cmd[1:]], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout == ""  # the whole report is on stderr, where docker's error carries it
    ready_but_patches(r, patched=True)
    for module in d["training_path"]:
        assert f"{CHECK} import {module}:" in r.stderr, module


def test_a_failed_smoke_test_names_the_import_that_failed(tmp_path):
    from docker.errors import ContainerError

    from envbuilder.engines.docker import smoke
    from envbuilder.errors import ActionError

    script, d = render(tmp_path, "p40")
    site = _install_standins(tmp_path, d)
    (site / "verl" / "workers" / "fsdp_workers.py").write_text("from torch.distributed import DeviceMesh\n")
    cmd = smoke_command(str(script))
    r = subprocess.run(
        [sys.executable, "-S", *cmd[1:]],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site), "PATH": ""},
        timeout=120,
    )
    assert r.returncode == 1

    class Containers:  # docker's side of it: the command's exit status and stderr, as docker raises them
        def run(self, image, command, **kw):
            raise ContainerError(None, r.returncode, command, image, r.stderr.encode())

    class Client:
        containers = Containers()

    with pytest.raises(ActionError) as e:
        smoke(Client(), "envbuild/p40:test", cmd)
    message = str(e.value)
    assert "The smoke test failed in envbuild/p40:test:" in message
    # the stand-in torch has no torch.distributed at all
    assert (
        f"{CROSS} import verl.workers.fsdp_workers: ModuleNotFoundError: No module named 'torch.distributed'"
    ) in message
    assert "training run would fail" in message


# -- issue 33 #6: refused overrides judged as Hydra parses them ----------------------------------

OFFLOAD = "actor_rollout_ref.actor.fsdp_config.param_offload"


def overrides_run(tmp_path: Path, profile: str, *overrides: str) -> subprocess.CompletedProcess:
    """preflight.py --overrides with this interpreter (hydra-core and omegaconf, as verl's
    image has them); the refused overrides are judged before anything else runs."""
    script = place_script(render_files(BuildContext.of(resolved(profile))), "preflight.py", tmp_path)
    return subprocess.run(
        [sys.executable, str(script), "--quiet", "--overrides", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    "override",
    [
        f"{OFFLOAD}=True",
        f"{OFFLOAD}='true'",
        f'{OFFLOAD}="True"',
        f"{OFFLOAD}=1",
        f"{OFFLOAD}=yes",
        f"{OFFLOAD}=tRuE",
        f"{OFFLOAD}=False,True",
        f"{OFFLOAD}=${{oc.env:OFFLOAD}}",
        "actor_rollout_ref.actor.fsdp_config={param_offload:true}",
        "actor_rollout_ref.actor={fsdp_config:{param_offload:1}}",
        f"++{OFFLOAD}=on",
    ],
)
def test_a_refused_override_is_refused_however_hydra_would_spell_it(tmp_path, override):
    """Only `=True` was refused: quoted, numeric, other spellings of true, and a dict set on a
    parent key all reach verl's bool field as True. The value is judged as Hydra's own override
    parser reads it and OmegaConf's bool node converts it. (On the code before, every case but
    =True and =tRuE passed.)"""
    r = overrides_run(tmp_path, "p40", override)
    assert r.returncode == 2, r.stderr
    assert "cannot generate from an offloaded actor" in r.stderr and "NOT STARTED" in r.stderr


@pytest.mark.parametrize(
    "override",
    [
        f"{OFFLOAD}=False",
        f"{OFFLOAD}='false'",
        f"{OFFLOAD}=0",
        "actor_rollout_ref.actor.fsdp_config={param_offload:false}",
    ],
)
def test_the_allowed_value_passes_however_it_is_spelt(tmp_path, override):
    r = overrides_run(tmp_path, "p40", override)
    assert "cannot generate from an offloaded actor" not in r.stderr, r.stderr


def test_the_driver_fix_says_what_applies_where_preflight_runs(tmp_path, monkeypatch):
    """`envbuild install` runs preflight in a venv on the host, where "run the container with
    --gpus all" does not apply; in a Docker/Podman container it does, in Apptainer it is --nv."""
    from envbuilder.images import preflight as P

    docker, apptainer = tmp_path / ".dockerenv", tmp_path / ".singularity.d"
    marks = {
        "docker": str(docker),
        "podman": str(tmp_path / "run" / ".containerenv"),
        "apptainer": str(apptainer),
    }
    monkeypatch.setattr(P, "CONTAINER_MARKS", marks)
    monkeypatch.delenv("container", raising=False)
    host = P.driver_fix()
    assert "--gpus" not in host and "container" not in host and "nvidia-smi" in host
    docker.touch()
    assert "run the container with --gpus all" in P.driver_fix()
    docker.unlink()
    apptainer.mkdir()
    assert "--nv" in P.driver_fix() and "--gpus" not in P.driver_fix()
