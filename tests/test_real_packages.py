"""The real-package tier: the training path names only modules that exist in the real releases.

Downloads from PyPI: every verl release in the matrix (conftest's verl_wheels, about 1 MB
each), the file listing of every vLLM wheel in the matrix (its zip central directory only, read
with HTTP Range requests, not the 300 MB wheel), and the flash-attn sdists the profiles install (whose setup.py
also names the prebuilt release wheel: envbuild's name must be that one).
apex is not on PyPI (its source comes from GitHub), so its module names are not checked here.
PyPI unreachable: skipped with the reason printed; under CI=true that fails instead.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import PurePosixPath

import pytest

from conftest import shipped
from envbuilder.model.resolve import INSTALLABLE_ROLLOUTS, training_path

pytestmark = pytest.mark.pypi

SIMPLE = "https://pypi.org/simple"
TIMEOUT = 60


def _get(url: str, headers: dict | None = None) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=TIMEOUT) as r:
        return r.read()


@pytest.fixture(scope="module")
def pypi(real_pypi):
    return real_pypi


def files_of(project: str) -> list[dict]:
    """The project's files from PyPI's JSON simple API (PEP 691): filename, url, ..."""
    body = _get(f"{SIMPLE}/{project}/", {"Accept": "application/vnd.pypi.simple.v1+json"})
    return json.loads(body)["files"]


def modules_in(names: list[str]) -> set[str]:
    """Importable module names of an archive's member paths: a.py, a/__init__.py, a.*.so."""
    out = set()
    for name in names:
        p = PurePosixPath(name)
        if p.suffix == ".py":
            parts = p.parts[:-1] if p.name == "__init__.py" else (*p.parts[:-1], p.stem)
        elif p.suffix == ".so":
            parts = (*p.parts[:-1], p.name.split(".", 1)[0])
        else:
            continue
        if parts and all(part.isidentifier() for part in parts):
            out.add(".".join(parts))
    return out


class RangeFile(io.RawIOBase):
    """A remote file read through HTTP Range requests: zipfile needs only its central directory."""

    def __init__(self, url: str):
        head = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(head, timeout=TIMEOUT) as r:
            self.size = int(r.headers["Content-Length"])
        self.url, self.pos = url, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=0):
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def readinto(self, buf):
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        data = _get(self.url, {"Range": f"bytes={self.pos}-{self.pos + n - 1}"})
        if len(data) > n:  # a server that ignored Range: fail loudly, do not download 300 MB twice
            raise OSError(f"{self.url} ignored the Range request")
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)


@pytest.mark.parametrize("version", list(shipped().verl))
def test_every_verl_module_of_the_training_path_is_in_that_releases_wheel(verl_wheels, version):
    m = shipped()
    record = m.verl[version]["training_path"]
    listed = record["modules"] + [x for mods in record["rollouts"].values() for x in mods]
    # verl's modules, and the pure-Python packages its own code imports that its METADATA does
    # not require (0.9.1's v1 trainer: transfer_queue, from the TransferQueue pin)
    assert all(x.split(".")[0] in ("verl", "transfer_queue") for x in listed), (
        "a verl record names a module of neither verl nor a package verl.yaml pins for it"
    )
    with zipfile.ZipFile(verl_wheels[version]) as z:
        have = modules_in(z.namelist())
    rollouts = [r for r in m.verl[version]["rollouts"] if r in INSTALLABLE_ROLLOUTS]
    assert rollouts and set(rollouts) <= set(record["rollouts"])
    for rollout in rollouts:
        path = training_path(m, version, rollout, ("flash-attn", "apex"))
        missing = [x for x in path if x.split(".")[0] == "verl" and x not in have]
        assert not missing, f"verl {version} ({rollout} rollout) has no {', '.join(missing)}"


@pytest.mark.parametrize("version", list(shipped().vllm))
def test_vllms_training_path_modules_are_in_every_vllm_wheel(pypi, version):
    wheels = [
        f
        for f in files_of("vllm")
        if f["filename"].startswith(f"vllm-{version}-")
        and f["filename"].endswith("x86_64.whl")
        and "manylinux" in f["filename"]
    ]
    assert wheels, f"PyPI has no x86_64 manylinux wheel of vllm {version}"
    with zipfile.ZipFile(io.BufferedReader(RangeFile(wheels[0]["url"]), buffer_size=1 << 16)) as z:
        have = modules_in(z.namelist())
    m = shipped()
    want = m.vllm[version].get("modules") or m.vllm_training_path["modules"]
    missing = [x for x in want if x not in have]
    assert not missing, f"{wheels[0]['filename']} has no {', '.join(missing)}"


def flash_attn_versions() -> list[str]:
    profiles = shipped().profiles.values()
    return sorted(
        {p.get(k, {}).get("flash-attn") for p in profiles for k in ("components", "optional_components")}
        - {None}
    )


@pytest.mark.parametrize("version", flash_attn_versions())
def test_flash_attns_training_path_modules_are_what_its_sdist_builds(pypi, version, tmp_path):
    """PyPI has only flash-attn's sdist: its setup.py names the CUDA extension, its tree the rest."""
    sdists = [f for f in files_of("flash-attn") if f["filename"] == f"flash_attn-{version}.tar.gz"]
    assert sdists, f"PyPI has no sdist of flash-attn {version}"
    with tarfile.open(fileobj=io.BytesIO(_get(sdists[0]["url"])), mode="r:gz") as tar:
        names = tar.getnames()
        root = f"flash_attn-{version}/"
        setup = tar.extractfile(root + "setup.py").read().decode()
    have = modules_in([n[len(root) :] for n in names if n.startswith(root)])
    have |= set(re.findall(r'CUDAExtension\(\s*name="([A-Za-z0-9_]+)"', setup))
    missing = [x for x in shipped().flash_attn["training_path"]["modules"] if x not in have]
    assert not missing, f"flash-attn {version} builds or ships no {', '.join(missing)}"


def _setup_get_wheel_url(setup: str, version: str):
    """flash-attn's own get_wheel_url (and get_platform), executed from the sdist's setup.py
    with a stand-in `torch` whose attributes the caller sets: the function is plain Python over
    torch.__version__, torch.version.cuda, torch._C._GLIBCXX_USE_CXX11_ABI and sys.version_info."""
    import ast
    import types

    from packaging.version import parse

    tree = ast.parse(setup)
    wanted = {"get_wheel_url", "get_platform", "get_package_version"}
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    body += [
        n
        for n in tree.body
        if isinstance(n, ast.Assign)
        and any(getattr(t, "id", None) in ("BASE_WHEEL_URL", "PACKAGE_NAME") for t in n.targets)
    ]
    assert {n.name for n in body if isinstance(n, ast.FunctionDef)} >= {"get_wheel_url", "get_platform"}
    torch = types.SimpleNamespace(
        __version__="",
        version=types.SimpleNamespace(cuda="", hip=None),
        _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=False),
    )
    sys_ = types.SimpleNamespace(platform="linux", version_info=None)
    ns = {
        "torch": torch,
        "sys": sys_,
        "parse": parse,
        "IS_ROCM": False,
        "os": os,
        "platform": types.SimpleNamespace(uname=lambda: types.SimpleNamespace(machine="x86_64")),
        "get_package_version": lambda: version,
    }
    exec(
        compile(
            ast.Module(
                body=[n for n in body if getattr(n, "name", "") != "get_package_version"], type_ignores=[]
            ),
            "setup.py",
            "exec",
        ),
        ns,
    )
    return ns["get_wheel_url"], torch, sys_


@pytest.mark.parametrize("version", flash_attn_versions())
def test_the_wheel_name_is_the_one_flash_attns_setup_py_guesses(pypi, version):
    """envbuild names the release wheel as the sdist's own setup.py does, for the torch/CUDA/
    Python of every profile that installs this version, both C++ ABIs and both CUDA majors
    (where the release published no wheel for a major, envbuild names none)."""
    from envbuilder.images.flash_attn_wheel import wheel_filename
    from envbuilder.model.resolve import Overrides, resolve

    sdists = [f for f in files_of("flash-attn") if f["filename"] == f"flash_attn-{version}.tar.gz"]
    assert sdists, f"PyPI has no sdist of flash-attn {version}"
    with tarfile.open(fileobj=io.BytesIO(_get(sdists[0]["url"])), mode="r:gz") as tar:
        setup = tar.extractfile(f"flash_attn-{version}/setup.py").read().decode()
    get_wheel_url, torch, sys_ = _setup_get_wheel_url(setup, version)
    m = shipped()
    targets = set()
    for name, p in m.profiles.items():
        if version in (
            (p.get("components") or {}).get("flash-attn"),
            (p.get("optional_components") or {}).get("flash-attn"),
        ):
            d = resolve(m, name, Overrides(with_=("flash-attn",))).to_dict()
            targets.add((d["torch"]["version"], d["torch"]["cuda"], d["python"]))
    assert targets, f"no profile installs flash-attn {version}"
    targets |= {(t, "11.8", py) for t, _, py in targets}  # the CUDA 11 branch too
    rel = m.flash_attn["release_wheels"]
    tags = m.flash_attn["versions"][version].get("wheel_cuda") or {}
    for torch_v, cuda, python in sorted(targets):
        for abi in (False, True):
            torch.__version__, torch.version.cuda = torch_v, cuda
            torch._C._GLIBCXX_USE_CXX11_ABI = abi
            sys_.version_info = types_version(python)
            want_url, want_name = get_wheel_url()
            got = wheel_filename(rel["filename"], version, torch_v, cuda, python, abi, tags)
            if cuda.split(".")[0] not in tags:
                # setup.py guesses a name the release never published (its publish.yml builds no
                # such CUDA): envbuild names none and compiles without asking for it
                assert got is None, (torch_v, cuda, python, abi)
                continue
            assert got == want_name, (torch_v, cuda, python, abi)
            assert rel["url"].format(version=version) + "/" + got == want_url


def types_version(python: str):
    import types

    major, minor = map(int, python.split(".")[:2])
    return types.SimpleNamespace(major=major, minor=minor)


@pytest.mark.parametrize("version", list(shipped().sglang))
def test_sglangs_training_path_modules_are_in_its_wheel_and_its_kernel_wheel(pypi, version):
    """sglang's modules in its own wheel, sgl_kernel in the kernel wheel it pins (sgl-kernel, or
    sglang-kernel from 0.5.12): each zip's central directory, read with Range requests."""
    m = shipped()
    sr = m.sglang[version]
    want = sr.get("modules") or m.sglang_training_path["modules"]
    kernel = sr["kernel"]
    have = set()
    for project, ver in (("sglang", version), (kernel["package"], kernel["version"])):
        prefix = f"{project.replace('-', '_')}-{ver}-"
        wheels = [
            f
            for f in files_of(project)
            if f["filename"].startswith(prefix)
            and f["filename"].endswith(".whl")
            and ("none-any" in f["filename"] or "x86_64" in f["filename"])
        ]
        assert wheels, f"PyPI has no x86_64 or pure wheel of {project} {ver}"
        with zipfile.ZipFile(io.BufferedReader(RangeFile(wheels[0]["url"]), buffer_size=1 << 16)) as z:
            have |= modules_in(z.namelist())
    missing = [x for x in want if x not in have]
    assert not missing, (
        f"sglang {version} with {kernel['package']} {kernel['version']} has no {', '.join(missing)}"
    )


# ---- flash-attn on today's stack (issue 37, item 2): the facts extensions.yaml records ---------


def _sdist_member(project: str, filename: str, member: str) -> str:
    (f,) = [f for f in files_of(project) if f["filename"] == filename]
    with tarfile.open(fileobj=io.BytesIO(_get(f["url"])), mode="r:gz") as tar:
        return tar.extractfile(member).read().decode()


def test_verl_091_takes_flash_attn_283_from_its_wheelhouse_index(pypi):
    """verl 0.9.1's sdist pyproject: flash-attn==2.8.3 (torch 2.11 / cu130) from the index
    named verl-wheelhouse, whose URL is the one extensions.yaml records."""
    import tomllib

    doc = tomllib.loads(_sdist_member("verl", "verl-0.9.1.tar.gz", "verl-0.9.1/pyproject.toml"))
    extras = doc["project"]["optional-dependencies"]
    assert extras["flash-attn-cu130torch211"] == ["flash-attn==2.8.3"]
    assert doc["tool"]["uv"]["sources"]["flash-attn"] == {"index": "verl-wheelhouse"}
    (index,) = [i for i in doc["tool"]["uv"]["index"] if i["name"] == "verl-wheelhouse"]
    assert index["url"] == "https://verl-project.github.io/verl-wheelhouse/simple/"
    assert "torch==2.11.0" in extras["fsdp"]
    from envbuilder.model.versions import in_range

    fa = shipped().flash_attn
    assert in_range("2.11.0", fa["versions"]["2.8.3"]["torch"])
    assert "verl-project.github.io/verl-wheelhouse/" in fa["wheel_indexes"]["verl-wheelhouse"]["url"]


def test_flash_attn_283_and_its_post_releases_are_sdists_only_on_pypi(pypi):
    names = {f["filename"] for f in files_of("flash-attn")}
    for version in shipped().flash_attn["pypi_sdist_only"]:
        assert f"flash_attn-{version}.tar.gz" in names, version
        assert not [n for n in names if n.startswith(f"flash_attn-{version}-") and n.endswith(".whl")], (
            version
        )


def test_flash_attn_cuda_archs_are_the_ones_283s_setup_py_builds(pypi):
    setup = _sdist_member("flash-attn", "flash_attn-2.8.3.tar.gz", "flash_attn-2.8.3/setup.py")
    default = re.search(r'os\.getenv\("FLASH_ATTN_CUDA_ARCHS", "([0-9;]+)"\)', setup)
    assert default and default.group(1).split(";") == shipped().flash_attn["sdist_build"]["archs"]
    gencodes = re.findall(r'"(\d+)" in cuda_archs\(\)', setup)
    assert gencodes == shipped().flash_attn["sdist_build"]["archs"]
