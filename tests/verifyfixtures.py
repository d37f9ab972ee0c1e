"""A loopback world for `envbuild verify`'s mechanics: a tiny profile overlay whose torch,
transformers, accelerate and verl are stand-in wheels, served by pypiserver next to the REAL
hydra-core, omegaconf, antlr4-python3-runtime, PyYAML and packaging (repacked from the test
venv's own installed copies, so no network is needed), and a stand-in verl 0.4.1 whose
`verl.trainer.main_ppo` is verl's own Hydra entry point over verl 0.4.1's real ppo_trainer.yaml.

The venv is made from an interpreter of the test runner's own Python version (the overlay's
CUDA records say the image ships it), so the repacked compiled wheel (PyYAML) fits.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.metadata as md
import sys
import zipfile
from pathlib import Path

from fixture_wheels import ZIP_DATE, dist_name, make_wheel

from conftest import FIXTURES, shipped

PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
# what real Hydra needs at run time, all taken from the test venv
REAL = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "PyYAML", "packaging")
GUARD = "verl/envbuild_guard.py"
GUARD_FIND = 'raise ImportError("unpatched: the recorded patch was not applied")\n'
MAIN_PPO = '''"""Stand-in for verl.trainer.main_ppo (envbuild tests): verl 0.4.1's own Hydra entry point."""
import hydra


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config):
    raise SystemExit("envbuild test stand-in: training started; verify must only compose")


if __name__ == "__main__":
    main()
'''
CONFIG = FIXTURES / "verl-0.4.1" / "verl" / "trainer" / "config" / "ppo_trainer.yaml"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack_installed(name: str, dest: Path) -> Path:
    """A wheel of an installed distribution, from its RECORD: its files as installed (no
    bytecode, no scripts outside site-packages), its dist-info with a fresh RECORD, named with
    the first tag of its own WHEEL file."""
    dist = md.distribution(name)
    version = dist.version
    files: dict[str, bytes] = {}
    info = None
    for f in dist.files or ():
        rel = str(f)
        if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc"):
            continue
        parts = rel.split("/")
        if parts[0].endswith(".dist-info"):
            info = parts[0]
            if parts[-1] in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue
        files[rel] = Path(dist.locate_file(f)).read_bytes()
    assert info, f"{name}: no .dist-info in its RECORD"
    tags = [
        ln.split(":", 1)[1].strip()
        for ln in files[f"{info}/WHEEL"].decode().splitlines()
        if ln.startswith("Tag:")
    ]
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist_name(name)}-{version}-{tags[0]}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            zi = zipfile.ZipInfo(p, ZIP_DATE)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            z.writestr(zi, d)
    return path


def overlay_doc(pins: dict[str, str] | None = None) -> dict:
    """A matrix overlay with profile `tiny`: an RTX 4090, torch 2.6.0, verl 0.4.1 with the HF
    rollout and a handful of pins, on CUDA images that ship the test runner's Python. verl 0.4.1's
    patches are replaced by one test patch that a stand-in module needs before it imports."""
    m = shipped()
    cuda = {k: dict(copy.deepcopy(m.sections["cuda"][k]), python=PY) for k in ("11.8", "12.4")}
    verl = copy.deepcopy(m.sections["verl"]["0.4.1"])
    verl["pins"] = pins or {
        "hydra-core": md.version("hydra-core"),
        "transformers": "4.51.3",
        "accelerate": "1.7.0",
    }
    verl["patches"] = ["envbuild-test-guard"]
    profile = copy.deepcopy(m.sections["profiles"]["4090"])
    profile.update(
        description="envbuild verify test profile",
        cuda="12.4",
        torch="2.6.0",
        components={},
        optional_components={},
        pins={},
    )
    torch = copy.deepcopy(m.sections["torch"]["2.6.0"])
    if PY not in torch["python"]:
        torch["python"] = torch["python"] + [PY]
    doc = {
        "sources": {"verify_tests": "envbuild tests/verifyfixtures.py: a loopback test profile"},
        "cuda": cuda,
        "torch": {"2.6.0": torch},
        "verl": {"0.4.1": verl},
        "patches": {
            "envbuild-test-guard": {
                "why": "envbuild's tests: a stand-in module that imports only once patched",
                "when": "always",
                "files": [GUARD],
                "replace": [{"find": GUARD_FIND, "with": "GUARDED = False\n"}],
                "source": "verify_tests",
            }
        },
        "profiles": {"tiny": profile},
    }
    _cite(doc)
    return doc


def _cite(node) -> None:
    """Every fact of the overlay names this file's own source (as the schema asks)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "source" and isinstance(value, str):
                node[key] = "verify_tests"
            else:
                _cite(value)
    elif isinstance(node, list):
        for item in node:
            _cite(item)


def module_files(modules: list[str], top: str) -> dict[str, str]:
    """Importable stand-in files for the modules under `top` (each as a package)."""
    out = {}
    for mod in modules:
        parts = mod.split(".")
        if parts[0] != top:
            continue
        for i in range(1, len(parts) + 1):
            out.setdefault("/".join(parts[:i]) + "/__init__.py", "")
    return out


def build(
    pypi: Path,
    torch_index: Path,
    d: dict,
    modules: list[str],
    *,
    conflict: bool = False,
    raising: str | None = None,
    config: str | None = None,
) -> None:
    """Wheels for resolved env `d` (the overlay's `tiny`): PyPI-like `pypi`, PyTorch-like
    `torch_index` (+cu118 builds only). `conflict`: torchvision and accelerate pin different
    versions of one shared package, so the later layer moves it and pip check must fail.
    `raising`: a module that raises on import (a two-line message). `config`: verl's config
    text instead of the real one."""
    shared = {"torchvision": "envbuild-shared==1.0", "accelerate": "envbuild-shared==2.0"}
    for v in ("1.0", "2.0"):
        make_wheel(pypi, "envbuild-shared", v)

    def files_for(top: str, extra: dict | None = None) -> dict:
        files = module_files(modules, top)
        for path in extra or {}:  # a module given as a file is not also a stand-in package
            if path.endswith(".py") and not path.endswith("/__init__.py"):
                files.pop(path[:-3] + "/__init__.py", None)
        files.update(extra or {})
        if raising and raising.split(".")[0] == top:
            path = raising.replace(".", "/") + "/__init__.py"
            files[path] = (
                'raise RuntimeError("libcuda.so.1: cannot open shared object file: No '
                'such file or directory\\nsecond line of the message")\n'
            )
        return files

    for local, dest in (("", pypi), ("+cu118", torch_index)):
        make_wheel(dest, "torch", f"2.6.0{local}", files=files_for("torch"))
        make_wheel(
            dest,
            "torchvision",
            f"0.21.0{local}",
            requires=(f"torch==2.6.0{local}",) + ((shared["torchvision"],) if conflict else ()),
        )
        make_wheel(dest, "torchaudio", f"2.6.0{local}", requires=(f"torch==2.6.0{local}",))
    real = {dist_name(n) for n in REAL}
    for name, version in d["verl"]["pins"].items():
        base = name.split("[")[0]
        if dist_name(base) in real:
            assert md.version(base) == version, f"the overlay pins {base}=={version}"
            continue
        reqs = (shared["accelerate"],) if conflict and base == "accelerate" else ()
        make_wheel(pypi, base, version, requires=reqs, files=files_for(dist_name(base)))
    for name in REAL:
        repack_installed(name, pypi)
    provided = (
        {dist_name(n.split("[")[0]) for n in d["verl"]["pins"]}
        | real
        | {"torch", "torchvision", "torchaudio"}
    )
    verl_files = {
        "verl/__init__.py": "from . import envbuild_guard  # imports once patched\n",
        "verl/trainer/__init__.py": "",
        "verl/trainer/main_ppo.py": MAIN_PPO,
        "verl/trainer/config/ppo_trainer.yaml": config or CONFIG.read_text("utf-8"),
        GUARD: GUARD_FIND,
    }
    for top in dict.fromkeys(m.split(".")[0] for m in modules):
        if top not in provided and top != "verl":  # verl's own files: the make_wheel below
            verl_files = {**files_for(top), **verl_files}
    make_wheel(
        pypi, "verl", d["verl"]["version"], requires=("hydra-core",), files=files_for("verl", verl_files)
    )
