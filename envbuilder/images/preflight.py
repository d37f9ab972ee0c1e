#!/usr/bin/env python3
"""Preflight for an envbuild profile: run inside the image (or beside the environment `envbuild
install` made), with its Python.

The same rules envbuild's resolver applied when it rendered this image, checked against the real
GPU: its arch against torch.cuda.get_arch_list(), the dtype it supports, the driver; and every
module of the training path, what `python -m verl.trainer.main_ppo` imports down to the FSDP
workers, the rollout and the compiled extensions. No check raises: a failure is a line with its
fix. Without a GPU the GPU checks fail and the imports are checked all the same. What the
profile expects (its GPU, torch build, driver, training path, patches) is read from
envbuild-scripts.json beside this file, as `envbuild render` wrote it.

  --json    the report as JSON
  --quiet   print nothing when every check passes
  --smoke   only the checks that need no GPU (torch build, imports): what `envbuild build` runs
  --overrides ARGS...   (last) the run's extra Hydra overrides, checked before anything starts:
            one this verl release cannot run (the profile's refused_overrides) and a `+`/`++` key
            that verl's own config does not have and its code does not read (Hydra's `++`
            adds any key silently, and a misspelt one is never read) are refused, exit 2

Exit 0 when every check passes, 1 when one fails, 2 on a bad argument or a missing sidecar.
"""

from __future__ import annotations

import importlib
import errno
import importlib.util
import json
import os
import pathlib
import re
import stat
import subprocess
import sys
from typing import Callable, ParamSpec, Protocol, TypedDict, TypeVar, Union, cast

T = TypeVar("T")
P = ParamSpec("P")
# what a sidecar value may be: a kind (a key of KINDS) or a shape made of kinds (shape_problem)
Kind = Union[type, str, None]
Shape = Union[Kind, "frozenset[str]", "set[str]", "tuple[Kind, ...]", "list[Shape]", "dict[Kind, Shape]"]

SIDECAR = "envbuild-scripts.json"  # written beside this file by `envbuild render`
KEY = "preflight"  # this script's part of it
MAX_SIDECAR_BYTES = 4 << 20  # the sidecar is ~10 KB: anything this large is not one
KINDS: dict[Kind, str] = {
    str: "a string",
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    None: "null",
    "text": "a non-empty string",
    "path": "a relative path of a .py file (letters, digits, _ and /; no '..', no leading /)",
    "module": "a dotted module name",
    "version": "a version (digits and dots)",
    "pattern": "a regular expression",
}
# the matrix's RELPATH (envbuilder/model/schema.py), held equal by a test: what render, overlays
# and `render --from` let a patch name, so a sidecar names nothing else
PATTERNS = {
    "path": r"[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*\.py",
    "module": r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
    "version": r"[0-9]+(\.[0-9]+)*",
}
PATCH: Shape = {"name": "text", "files": ["path"], "replace": [["text", "text"]]}  # apply_patches.py's
SHAPE: dict[Kind, Shape] = {
    "profile": str,
    "gpu": str,
    "compute_capability": "version",
    "torch_version": str,
    "torch_cuda": str,
    "torch_requirement": str,
    "torch_index": str,
    "dtype": str,
    "torch_dtype": {"float32", "float16", "bfloat16"},
    "torch_compile": bool,
    "model_vram_gb": float,
    "min_driver": "version",
    "compat_driver": "version",
    "driver_cuda": "version",
    "compat_libcuda": str,
    "training_path": ["module"],
    "verl_version": str,
    "config_reads": [str],
    "refused_overrides": [{"key": str, "value": str, "why": str, "fix": str}],
    "patches": [PATCH],
    "finish": str,
    "built": {str: (str, None)},
}
FLAGS = ("--json", "--quiet", "--smoke")
# what each container leaves at its root: preflight runs in one (the image) or in a venv on the
# host (`envbuild install`), and the fix for a GPU it cannot see differs
CONTAINER_MARKS = {"docker": "/.dockerenv", "podman": "/run/.containerenv", "apptainer": "/.singularity.d"}


class Patch(TypedDict):
    name: str
    files: list[str]
    replace: list[list[str]]


class Refused(TypedDict):
    key: str
    value: str
    why: str
    fix: str


class Expect(TypedDict):
    """This script's part of the sidecar, as SHAPE holds it."""

    profile: str
    gpu: str
    compute_capability: str
    torch_version: str
    torch_cuda: str
    torch_requirement: str
    torch_index: str
    dtype: str
    torch_dtype: str
    torch_compile: bool
    model_vram_gb: float
    min_driver: str
    compat_driver: str
    driver_cuda: str
    compat_libcuda: str
    training_path: list[str]
    verl_version: str
    config_reads: list[str]
    refused_overrides: list[Refused]
    patches: list[Patch]
    finish: str
    built: dict[str, str | None]


class Check(TypedDict):
    check: str
    ok: bool
    detail: str
    fix: str | None


# what the checks call of torch and of NVML: each call is guarded
# (Report.guard, or a try around it), so a module without them is a failed check, not a crash
class Tensor(Protocol):
    def __mul__(self, other: int) -> Tensor: ...
    def sum(self) -> Tensor: ...
    def item(self) -> float: ...


class DeviceProperties(Protocol):
    total_memory: int


class Cuda(Protocol):
    def is_available(self) -> bool: ...
    def device_count(self) -> int: ...
    def get_arch_list(self) -> list[str]: ...
    def get_device_name(self, device: int) -> str: ...
    def get_device_capability(self, device: int) -> tuple[int, int]: ...
    def get_device_properties(self, device: int) -> DeviceProperties: ...
    def is_bf16_supported(self) -> bool: ...


class Torch(Protocol):
    cuda: Cuda

    def ones(self, size: int, *, device: str, dtype: object) -> Tensor: ...


class Nvml(Protocol):
    def nvmlInit(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> object: ...


def driver_fix() -> str:
    """The fix for a GPU or driver preflight cannot see, for where it runs."""
    if os.path.exists(CONTAINER_MARKS["apptainer"]):
        return "run the container with --nv (apptainer run --nv) and check nvidia-smi"
    if any(os.path.exists(CONTAINER_MARKS[k]) for k in ("docker", "podman")) or os.environ.get("container"):
        return "run the container with --gpus all (NVIDIA Container Toolkit) and check nvidia-smi"
    return "install the NVIDIA driver and check that nvidia-smi lists the GPU"


def read_regular(path: pathlib.Path, limit: int) -> bytes:
    """The bytes of `path` when it is a regular file of at most `limit` bytes, OSError otherwise:
    a FIFO is never waited on, a device such as /dev/zero never read without end."""
    fd = os.open(str(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    finally:
        os.close(fd)


def kind_ok(value: object, kind: Kind) -> bool:
    """`value` is of `kind`, a key of KINDS (a string: one that UTF-8 can write)."""
    if kind is None or kind is bool:
        return value is None if kind is None else isinstance(value, bool)
    if kind is int or kind is float:
        return isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
        if kind == "pattern":
            re.compile(value)
    except (UnicodeError, re.error, RecursionError, OverflowError):
        return False
    if isinstance(kind, str) and kind in PATTERNS:
        return re.fullmatch(PATTERNS[kind], value) is not None
    return kind is str or value != ""


def shape_problem(value: object, shape: Shape, where: str) -> str | None:
    """What in `value` is not as `shape` says, as a phrase naming the place; None when all is.
    A shape is a kind (KINDS), a set of the strings allowed, a tuple (either shape), [item]
    (a list of items), [first, second] (a list of exactly these), {key: shape} (an object with
    these keys; others are left alone) or {str: shape} (an object whose every value is shape)."""
    if isinstance(shape, tuple):
        if any(shape_problem(value, s, where) is None for s in shape):
            return None
        what = " or ".join(KINDS.get(s, "another shape") for s in shape)
    elif isinstance(shape, (set, frozenset)):
        if isinstance(value, str) and value in shape:
            return None
        what = "one of " + ", ".join(sorted(shape))
    elif isinstance(shape, list):
        if isinstance(value, list) and len(shape) in (1, len(value)):
            items: list[object] = value
            for i, item in enumerate(items):
                problem = shape_problem(item, shape[0] if len(shape) == 1 else shape[i], f"{where}[{i}]")
                if problem:
                    return problem
            return None
        what = "a list" if len(shape) == 1 else f"a list of {len(shape)}"
    elif isinstance(shape, dict):
        if isinstance(value, dict):
            fields: dict[object, object] = value
            missing = [k for k in shape if k is not str and k not in fields]
            if missing:
                return f"has no {missing[0]!r} in its {where!r} part"
            pairs: list[tuple[object, Shape]]
            pairs = [(k, shape[str]) for k in fields] if str in shape else list(shape.items())
            for k, s in pairs:
                problem = shape_problem(k, str, f"{where} key") or shape_problem(fields[k], s, f"{where}.{k}")
                if problem:
                    return problem
            return None
        what = "an object"
    else:
        if kind_ok(value, shape):
            return None
        what = KINDS[shape]
    shown = "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else ascii(value)
    return f"has {where} = {shown[:80]}, not {what}"


def load_data(key: str, shape: dict[Kind, Shape]) -> dict[str, object] | None:
    """This script's part (`key`) of the sidecar beside it, as `shape` says it is, or None, said
    on stderr, when the file is missing or no regular file, is no JSON object, lacks a field or
    holds a value that is not what it should be."""
    path = pathlib.Path(__file__).resolve().with_name(SIDECAR)
    try:
        data: object = json.loads(read_regular(path, MAX_SIDECAR_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        why = f"cannot be read ({type(e).__name__}: {e})"
    else:
        doc: dict[object, object] = data if isinstance(data, dict) else {}
        part = doc.get(key)
        if not isinstance(part, dict):
            why = f"holds no {key!r} object"
        else:
            problem = shape_problem(part, shape, key)
            if problem is None:
                return part
            why = problem
    print(
        f"{key}: {path} {why}. This script reads the profile's data from the {SIDECAR} that "
        f"`envbuild render` writes beside it: render the profile again and keep the two together.",
        file=sys.stderr,
    )
    return None


def torch_fix(e: Expect) -> str:
    req, index = e["torch_requirement"], e["torch_index"]
    return (
        f"reinstall {req} from {index} (pip install --force-reinstall --no-deps '{req}' "
        f"--index-url {index}), or rebuild the image"
    )


def first_line(exc: BaseException) -> str:
    """`Type: message`, first non-empty line only (an ImportError's chain can run for pages)."""
    for line in f"{type(exc).__name__}: {exc}".splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def cc_tuple(text: object) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def version_tuple(text: object) -> tuple[int, ...]:
    return tuple(int(p) for p in str(text).split(".") if p.isdigit())


def arch_runs(cc: tuple[int, ...], arch_list: list[str]) -> bool:
    """A cubin sm_XY runs on CC X.Z when Z >= Y; compute_XY (PTX) JIT-compiles for later GPUs."""
    major, minor = cc[0], cc[1]
    for arch in arch_list:
        kind, _, num = str(arch).partition("_")
        if not num.isdigit():
            continue
        a_major, a_minor = int(num[:-1]), int(num[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= tuple(cc):
            return True
    return False


class Report:
    def __init__(self) -> None:
        self.results: list[Check] = []

    def add(self, name: str, ok: object, detail: object, fix: str | None = "") -> None:
        self.results.append({"check": name, "ok": bool(ok), "detail": str(detail), "fix": "" if ok else fix})

    def guard(self, name: str, fix: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        """fn(*args), or None with a failed check `name` when it raises anything."""
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # SystemExit from a module is a failure too, not an exit
            self.add(name, False, first_line(e), fix)
            return None


def load_torch(r: Report, e: Expect) -> Torch | None:
    """torch, or None with the reason reported: missing, raising, or not PyTorch at all."""
    try:
        torch = importlib.import_module("torch")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        r.add("import torch", False, first_line(exc), "torch is missing or broken: " + torch_fix(e))
        return None
    where = getattr(torch, "__file__", None) or "(no file)"
    version: object = getattr(torch, "__version__", None)
    info: object = getattr(torch, "version", None)
    if info is None:
        try:
            info = importlib.import_module("torch.version")
        except KeyboardInterrupt:
            raise
        except BaseException:
            info = None
    if version is None or info is None or not hasattr(info, "cuda"):
        r.add(
            "torch build",
            False,
            f"the torch at {where} is not a PyTorch build (no torch.__version__ or torch.version.cuda)",
            "a foreign or broken 'torch' shadows PyTorch: remove it and " + torch_fix(e),
        )
        return None
    base = str(version).split("+")[0]
    cuda: object = info.cuda
    ok = str(cuda) == e["torch_cuda"] and base == e["torch_version"]
    r.add(
        "torch build",
        ok,
        f"torch {version}, CUDA {cuda} (expected {e['torch_version']} for CUDA {e['torch_cuda']})",
        "the image holds another torch than the one rendered: " + torch_fix(e),
    )
    return cast(Torch, torch)  # (a PyTorch build, as checked: what the checks call of it is guarded)


def gpu_checks(r: Report, e: Expect, torch: Torch) -> None:
    available = r.guard("GPU visible", driver_fix(), torch.cuda.is_available)
    if available is None:
        return
    if not available:
        r.add("GPU visible", False, "no GPU visible (torch.cuda.is_available() is False)", driver_fix())
        return
    count = r.guard("GPU visible", driver_fix(), torch.cuda.device_count)
    if count is None:
        return
    r.add("GPU visible", True, f"{count} device(s)")
    arch_list = r.guard(
        "torch arch list", "torch's CUDA runtime is broken: " + torch_fix(e), torch.cuda.get_arch_list
    )
    for i in range(count):
        r.guard(f"GPU {i}", driver_fix(), device_checks, r, e, torch, i, arch_list or [])
    r.guard(
        "CUDA kernel runs",
        "the driver or torch build does not fit this GPU; see the checks above",
        kernel_check,
        r,
        e,
        torch,
    )


def device_checks(r: Report, e: Expect, torch: Torch, i: int, arch_list: list[str]) -> None:
    name = torch.cuda.get_device_name(i)
    cc = tuple(int(x) for x in torch.cuda.get_device_capability(i))
    cc_text = f"{cc[0]}.{cc[1]}"
    r.add(
        f"GPU {i} arch",
        arch_runs(cc, arch_list),
        f"{name}: CC {cc_text}; torch kernels: {' '.join(map(str, arch_list))}",
        f"this torch build has no kernels for sm_{cc[0]}{cc[1]} ('no kernel image is available'); "
        f"render a profile for this GPU (envbuild detect)",
    )
    if cc_tuple(cc_text) != cc_tuple(e["compute_capability"]):
        r.add(
            f"GPU {i} profile",
            cc_tuple(cc_text) >= cc_tuple(e["compute_capability"]) and arch_runs(cc, arch_list),
            f"image rendered for CC {e['compute_capability']} ({e['gpu']}), running on CC {cc_text}",
            "render the profile that matches this GPU (envbuild detect)",
        )

    def vram_gib() -> float:
        return float(torch.cuda.get_device_properties(i).total_memory) / 2**30

    vram = r.guard(f"GPU {i} memory", driver_fix(), vram_gib)
    if vram is not None:
        r.add(
            f"GPU {i} memory",
            vram + 1 >= e["model_vram_gb"],
            f"{vram:.0f} GiB for a model needing about {e['model_vram_gb']} GiB",
            "use a smaller MODEL, more offload, or more GPUs",
        )
    if e["dtype"] == "bf16":
        bf16 = r.guard(f"GPU {i} bf16", "this GPU needs an fp16/fp32 profile", torch.cuda.is_bf16_supported)
        if bf16 is not None:
            r.add(
                f"GPU {i} bf16",
                bf16,
                "bf16 supported" if bf16 else "no native bf16",
                "this GPU needs an fp16/fp32 profile",
            )
    if e["torch_compile"]:
        r.add(
            f"GPU {i} triton",
            cc_tuple(cc_text) >= (7, 0),
            f"CC {cc_text} (Triton needs 7.0)",
            "set TORCHDYNAMO_DISABLE=1",
        )


def kernel_check(r: Report, e: Expect, torch: Torch) -> None:
    dtype: object = getattr(torch, e["torch_dtype"])
    t = torch.ones(4, device="cuda", dtype=dtype)
    ok = float((t * 2).sum().item()) == 8.0
    r.add(
        "CUDA kernel runs",
        ok,
        f"elementwise {e['torch_dtype']} on device 0",
        "the driver or torch build does not fit this GPU; see the checks above",
    )


def driver_version() -> str | None:
    try:
        pynvml = cast(Nvml, importlib.import_module("pynvml"))  # optional: nvidia-ml-py

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:
        pass
    import shutil

    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return lines[0].strip() if lines else None


def driver_check(r: Report, e: Expect) -> None:
    driver = r.guard("driver", driver_fix(), driver_version)
    if not driver:
        return
    native = version_tuple(driver) >= version_tuple(e["min_driver"])
    compat = version_tuple(driver) >= version_tuple(e["compat_driver"])
    r.add(
        "driver",
        compat,
        f"{driver} (CUDA {e['driver_cuda']} needs >= {e['min_driver']}"
        + ("" if native else f"; running under minor-version compatibility, >= {e['compat_driver']}")
        + ")",
        f"upgrade the NVIDIA driver to >= {e['min_driver']}",
    )


def libcuda_for_imports(r: Report, e: Expect) -> None:
    """Compiled modules may link libcuda.so.1 (vllm._C does), which only the driver provides.
    Without one, the CUDA image's forward-compat libcuda stands in, for loading modules only."""
    try:
        import ctypes
    except ImportError:  # a Python built without ctypes loads no compiled module through it either
        return
    try:
        ctypes.CDLL("libcuda.so.1")
        return
    except OSError:
        pass
    compat = str(e["compat_libcuda"])
    if not os.path.exists(compat):
        return
    try:
        ctypes.CDLL(compat, mode=getattr(ctypes, "RTLD_GLOBAL", 0))
    except OSError as exc:
        r.add("libcuda for imports", False, first_line(exc), f"{compat} is broken; " + driver_fix())
        return
    r.add(
        "libcuda for imports",
        True,
        f"no NVIDIA driver here: {compat} (the image's CUDA forward-compat library) stands in so "
        "that modules linked against libcuda load; GPU work still needs the driver",
    )


def import_check(r: Report, e: Expect, module: str) -> None:
    try:
        mod = importlib.import_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        text = first_line(exc)
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        built = e["built"]
        if missing and built.get(missing) and (module == missing or module.startswith(missing + ".")):
            fix = (
                f"{missing} is compiled from source for this GPU, not in requirements.txt: run "
                f"this inside the envbuild image, or build it (needs nvcc): {built[missing]}"
            )
        elif missing and (module == missing or module.startswith(missing + ".")):
            fix = (
                f"{missing} is not installed here: run this inside the envbuild image, or install "
                "the profile's requirements.txt"
            )
        elif missing:
            fix = f"{module} needs {missing}, which is not installed: rebuild the image"
        elif "libcuda.so" in text:
            fix = f"{module} needs the NVIDIA driver's libcuda.so.1: " + driver_fix()
        else:
            fix = (
                f"{module} is broken or was built against another torch/CUDA; rebuild the image "
                "(training would stop at this import)"
            )
        r.add(f"import {module}", False, text, fix)
        return
    version = getattr(mod, "__version__", None)
    r.add(f"import {module}", True, str(version) if isinstance(version, str) else "ok")


def patch_check(r: Report, e: Expect) -> None:
    """verl patched for this GPU and audited, without importing verl: each recorded replacement of
    apply_patches.py in place in the installed release's files, then audit_precision.py (beside
    this file) run on them. A route without Docker that skipped them leaves a verl that computes
    in bf16 or imports flash-attn where this GPU cannot."""
    here = pathlib.Path(__file__).resolve().parent
    fix = f"run `{e['finish']}` in {here} with this Python"
    spec = importlib.util.find_spec("verl")  # (finds verl; imports nothing)
    if spec is None or not spec.submodule_search_locations:
        r.add("verl patched", False, "verl is not installed", "install the profile's requirements first")
        return
    root = pathlib.Path(list(spec.submodule_search_locations)[0]).parent
    missing = []
    for patch in e["patches"]:
        for rel in patch["files"]:
            path = root / rel
            text = path.read_text(errors="replace") if path.is_file() else None
            if text is None or any(
                new not in text or (find in text and find not in new) for find, new in patch["replace"]
            ):
                missing.append(f"{patch['name']} ({rel})")
    if missing:
        r.add("verl patched", False, f"not applied in {root}: {', '.join(missing)}", fix)
    else:
        r.add(
            "verl patched",
            True,
            f"{len(e['patches'])} recorded patch(es) in place"
            if e["patches"]
            else "no patch recorded for this GPU",
        )
    audit = here / "audit_precision.py"
    if not audit.is_file():
        r.add(
            "precision audit",
            False,
            f"{audit.name} is not beside {pathlib.Path(__file__).name}",
            "run preflight.py from the rendered folder (or the image's envbuild folder)",
        )
        return
    p = subprocess.run([sys.executable, str(audit)], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit {p.returncode}"
    r.add("precision audit", p.returncode == 0, last, None if p.returncode == 0 else fix)


def checks(e: Expect, smoke: bool) -> list[Check]:
    r = Report()
    torch = load_torch(r, e)
    if not smoke:
        if torch is None:
            r.add("GPU visible", False, "not checked: torch did not load", "fix torch first (above)")
        else:
            gpu_checks(r, e, torch)
        driver_check(r, e)
    r.guard("libcuda for imports", driver_fix(), libcuda_for_imports, r, e)
    for module in e["training_path"]:
        import_check(r, e, module)
    patch_check(r, e)
    return r.results


def config_keys() -> tuple[set[str], set[str]]:
    """(every key of verl's composed PPO config, the keys of its empty maps), composed as
    `python -m verl.trainer.main_ppo` composes it (hydra's compose API, the config its
    @hydra.main names)."""
    import re

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("verl is not installed")
    root = list(spec.submodule_search_locations)[0]
    with open(os.path.join(root, "trainer", "main_ppo.py"), encoding="utf-8") as f:
        found = re.search(r'@hydra\.main\(\s*config_path="([^"]+)",\s*config_name="([^"]+)"', f.read())
    if found is None:
        raise RuntimeError("verl/trainer/main_ppo.py names no @hydra.main config")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    config_dir = os.path.normpath(os.path.join(root, "trainer", found.group(1)))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name=found.group(2))
    keys: set[str] = set()
    open_maps: set[str] = set()

    def walk(node: dict[object, object], prefix: str) -> None:
        for k, v in node.items():
            key = f"{prefix}{k}"
            keys.add(key)
            if isinstance(v, dict):
                if not v:
                    open_maps.add(key)
                walk(v, key + ".")

    tree: object = OmegaConf.to_container(cfg, resolve=False)
    walk(tree if isinstance(tree, dict) else {}, "")
    return keys, open_maps


def parsed_overrides(args: list[str]) -> list[tuple[str, str, object, str]]:
    """[(prefix, key, value, arg)] of the run's overrides as Hydra itself parses them (its own
    override grammar: quotes, numbers, dicts, lists, sweeps), a dict set on a parent key spread
    into its leaves ({param_offload: true} on fsdp_config is fsdp_config.param_offload=True).
    A deletion (~key) is left out; an argument Hydra reads no override in is taken in its
    plain KEY=VALUE form, as text, if it has one (Hydra itself refuses the rest)."""
    import re

    parser: OverridesParser | None
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.core.override_parser.types import Override

        parser = OverridesParser.create()
    except Exception:
        parser = None
    out: list[tuple[str, str, object, str]] = []
    for arg in args:
        o: Override | None = None
        value: object = None
        if parser is not None:
            try:
                (o,) = parser.parse_overrides([arg])
                value = o.value()
            except Exception:
                o = None
        if o is None:  # (no hydra here, or Hydra reads no override in it: the plain form, as text)
            found = re.match(r"^(\+{0,2})([A-Za-z_][A-Za-z0-9_.]*)=(.*)$", arg, re.S)
            if found:
                out.append((found.group(1), found.group(2), found.group(3), arg))
            continue
        if o.is_delete():
            continue
        prefix = "++" if o.is_force_add() else "+" if o.is_add() else ""
        values: list[object]
        values = list(value.list) if o.is_sweep_override() and hasattr(value, "list") else [value]
        for v in values:
            todo: list[tuple[str, object]] = [(str(o.key_or_group), v)]
            while todo:
                key, leaf = todo.pop()
                if isinstance(leaf, dict):
                    spread: dict[object, object] = leaf
                    todo += [(f"{key}.{k}", x) for k, x in spread.items()]
                out.append((prefix, key, leaf, arg))
    return out


def same_value(value: object, ref: str) -> bool:
    """Whether `value` (as Hydra parsed it) is what the refused `ref` value ("true", "false",
    or a word) becomes in verl's config: a bool field takes 1, 'yes', "True" as True, as
    OmegaConf's BooleanNode converts them. An interpolation (${...}) is known only at run
    time, so it counts as the refused value."""
    if isinstance(value, str) and "${" in value:
        return True
    if isinstance(value, (dict, list)):
        return False
    if ref in ("true", "false"):
        try:
            from omegaconf import BooleanNode

            return bool(BooleanNode(value=value)._value() is (ref == "true"))
        except Exception:
            words = {"true", "1", "yes", "on", "y"} if ref == "true" else {"false", "0", "no", "off", "n"}
            return str(value).strip().lower() in words
    return str(value).strip().lower() == ref


def override_problems(e: Expect, args: list[str]) -> list[tuple[str, str]]:
    """[(what, fix)] for the run's extra Hydra overrides."""
    import difflib

    problems: list[tuple[str, str]] = []
    added: list[tuple[str, str, str]] = []
    for prefix, key, value, arg in parsed_overrides(args):
        for ref in e["refused_overrides"]:
            if key == ref["key"] and same_value(value, ref["value"]):
                problems.append((f"{arg}: {ref['why']}", ref["fix"]))
        if prefix and (prefix, key, arg) not in added and not isinstance(value, dict):
            added.append((prefix, key, arg))
    if added:
        try:
            keys, open_maps = config_keys()
        except Exception as exc:
            return problems + [
                (
                    f"verl's config could not be read to check {added[0][2]}: {first_line(exc)}",
                    "check that verl and hydra-core import in this environment (preflight.py lists the imports)",
                )
            ]
        reads = set(e["config_reads"])
        for prefix, key, arg in added:
            if key in keys or key in reads or any(key.startswith(m + ".") for m in open_maps):
                continue
            near = difflib.get_close_matches(key, sorted(keys | reads), n=1, cutoff=0.6)
            problems.append(
                (
                    f"{arg}: verl {e['verl_version']}'s config has no key {key} and its code does not "
                    f"read one; Hydra's {prefix} would add it silently and the run would go on without it",
                    (f"did you mean {near[0]}? " if near else "")
                    + "set a key the config has, without + (`python -m verl.trainer.main_ppo --cfg job` prints them)",
                )
            )
    return problems


def stdout_to_stderr(fn: Callable[[], T]) -> T:
    """fn() with file descriptor 1 pointed at stderr: packages that log to stdout on import
    (vLLM does) must not get into the report or break --json."""
    saved = None
    try:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError, AttributeError):
        saved = None
    try:
        return fn()
    finally:
        if saved is not None:
            try:
                sys.stdout.flush()
            except Exception:
                pass
            os.dup2(saved, 1)
            os.close(saved)


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    overrides = None
    if "--overrides" in argv:
        at = argv.index("--overrides")
        argv, overrides = argv[:at], argv[at + 1 :]
    unknown = [a for a in argv if a not in FLAGS]
    if unknown:
        print(
            f"preflight.py: unknown argument {unknown[0]!r}; use {', '.join(FLAGS)} (--help says what each does)",
            file=sys.stderr,
        )
        return 2
    part = load_data(KEY, SHAPE)
    if part is None:
        return 2
    e = cast(Expect, part)  # (load_data held it to SHAPE, which Expect spells)
    smoke = "--smoke" in argv
    if overrides:
        refused = stdout_to_stderr(lambda: override_problems(e, overrides))
        if refused:
            for what, fix in refused:
                print(f"\u2717 run override {what}\n    fix: {fix}", file=sys.stderr)
            print(f"NOT STARTED: {len(refused)} run override(s) refused", file=sys.stderr)
            return 2
    results = stdout_to_stderr(lambda: checks(e, smoke))
    ready = all(r["ok"] for r in results)
    try:  # (a non-UTF-8 terminal gets '?')
        found: object = getattr(sys.stdout, "reconfigure", None)
        if callable(found):
            reconfigure: Callable[..., object] = found
            reconfigure(errors="replace")
    except Exception:
        pass
    if "--json" in argv:
        report = {
            "profile": e["profile"],
            "ready": ready,
            "mode": "smoke" if smoke else "full",
            "checks": results,
        }
        print(json.dumps(report, indent=2))
    elif not ("--quiet" in argv and ready):
        for r in results:
            mark = "\u2713" if r["ok"] else "\u2717"
            print(f"{mark} {r['check']}: {r['detail']}" + (f"\n    fix: {r['fix']}" if r["fix"] else ""))
        if smoke:
            n = len(e["training_path"])
            print(
                ("smoke ok" if ready else "smoke FAILED")
                + f": {e['profile']} (torch build and {n} modules of the training path; no GPU checks)"
            )
        else:
            print(("READY" if ready else "NOT READY") + f": profile {e['profile']} on this machine")
    return 0 if ready else 1


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except KeyboardInterrupt:
        code = 130
    except BaseException as exc:  # the last guard: a report that cannot be printed is still an answer
        try:
            print(f"\u2717 preflight itself failed: {first_line(exc)}", file=sys.stderr)
        except BaseException:
            pass
        code = 1
    sys.exit(code)
