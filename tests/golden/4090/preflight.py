#!/usr/bin/env python3
"""Preflight for envbuild profile 4090 (NVIDIA GeForce RTX 4090, CC 8.9): run inside the image.

The same rules envbuild's resolver applied when it rendered this image, checked against the real
GPU: its arch against torch.cuda.get_arch_list(), the dtype it supports, the driver, and the key
imports. Exit 0 when ready, 1 when a check fails. --json for scripts.
"""

import importlib
import json
import sys

EXPECTED = json.loads("{\"compat_driver\": \"525.60.13\", \"compute_capability\": \"8.9\", \"driver_cuda\": \"12.1\", \"dtype\": \"bf16\", \"gpu\": \"NVIDIA GeForce RTX 4090\", \"imports\": [\"torch\", \"transformers\", \"verl\"], \"min_driver\": \"530.30.02\", \"model_vram_gb\": 14, \"profile\": \"4090\", \"torch_compile\": true, \"torch_cuda\": \"12.1\", \"torch_dtype\": \"bfloat16\"}")


def cc_tuple(text):
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def version_tuple(text):
    return tuple(int(p) for p in str(text).split(".") if p.isdigit())


def arch_runs(cc, arch_list):
    """A cubin sm_XY runs on CC X.Z when Z >= Y; compute_XY (PTX) JIT-compiles for later GPUs."""
    major, minor = cc
    for arch in arch_list:
        kind, _, num = arch.partition("_")
        if not num.isdigit():
            continue
        a_major, a_minor = int(num[:-1]), int(num[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= cc:
            return True
    return False


def checks():
    results = []

    def add(name, ok, detail, fix=""):
        results.append({"check": name, "ok": bool(ok), "detail": detail, "fix": "" if ok else fix})

    try:
        import torch
    except Exception as e:  # a broken install is an answer, not a crash
        add("import torch", False, repr(e), "rebuild the image; torch did not import")
        return results
    add("torch build", str(torch.version.cuda) == EXPECTED["torch_cuda"],
        f"torch {torch.__version__}, CUDA {torch.version.cuda} (expected {EXPECTED['torch_cuda']})",
        "the image holds another torch than the one rendered; rebuild it")
    if not torch.cuda.is_available():
        add("GPU visible", False, "torch.cuda.is_available() is False",
            "run the container with --gpus all (NVIDIA Container Toolkit) and check nvidia-smi")
        return results
    count = torch.cuda.device_count()
    add("GPU visible", True, f"{count} device(s)")
    arch_list = torch.cuda.get_arch_list()
    for i in range(count):
        name = torch.cuda.get_device_name(i)
        cc = torch.cuda.get_device_capability(i)
        cc_text = f"{cc[0]}.{cc[1]}"
        add(f"GPU {i} arch", arch_runs(cc, arch_list),
            f"{name}: CC {cc_text}; torch kernels: {' '.join(arch_list)}",
            f"this torch build has no kernels for sm_{cc[0]}{cc[1]} ('no kernel image is available'); "
            f"render a profile for this GPU (envbuild detect)")
        if cc_tuple(cc_text) != cc_tuple(EXPECTED["compute_capability"]):
            add(f"GPU {i} profile", cc_tuple(cc_text) >= cc_tuple(EXPECTED["compute_capability"])
                and arch_runs(cc, arch_list),
                f"image rendered for CC {EXPECTED['compute_capability']} ({EXPECTED['gpu']}), running on CC {cc_text}",
                "render the profile that matches this GPU (envbuild detect)")
        props = torch.cuda.get_device_properties(i)
        vram = props.total_memory / 2**30
        add(f"GPU {i} memory", vram + 1 >= EXPECTED["model_vram_gb"],
            f"{vram:.0f} GiB for a model needing about {EXPECTED['model_vram_gb']} GiB",
            "use a smaller MODEL, more offload, or more GPUs")
        if EXPECTED["dtype"] == "bf16":
            add(f"GPU {i} bf16", torch.cuda.is_bf16_supported(),
                "bf16 supported" if torch.cuda.is_bf16_supported() else "no native bf16",
                "this GPU needs an fp16/fp32 profile")
        if EXPECTED["torch_compile"]:
            add(f"GPU {i} triton", cc_tuple(cc_text) >= (7, 0), f"CC {cc_text} (Triton needs 7.0)",
                "set TORCHDYNAMO_DISABLE=1")
    try:
        t = torch.ones(4, device="cuda", dtype=getattr(torch, EXPECTED["torch_dtype"]))
        ok = float((t * 2).sum().item()) == 8.0
        add("CUDA kernel runs", ok, f"elementwise {EXPECTED['torch_dtype']} on device 0")
    except Exception as e:
        add("CUDA kernel runs", False, str(e).splitlines()[0],
            "the driver or torch build does not fit this GPU; see the checks above")
    driver = None
    try:
        import pynvml  # optional: nvidia-ml-py
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    except Exception:
        import shutil
        import subprocess
        if shutil.which("nvidia-smi"):
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True)
            driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    if driver:
        native = version_tuple(driver) >= version_tuple(EXPECTED["min_driver"])
        compat = version_tuple(driver) >= version_tuple(EXPECTED["compat_driver"])
        add("driver", compat, f"{driver} (CUDA {EXPECTED['driver_cuda']} needs >= {EXPECTED['min_driver']}"
            + ("" if native else f"; running under minor-version compatibility, >= {EXPECTED['compat_driver']}") + ")",
            f"upgrade the NVIDIA driver to >= {EXPECTED['min_driver']}")
    for module in EXPECTED["imports"]:
        try:
            importlib.import_module(module)
            add(f"import {module}", True, "ok")
        except ModuleNotFoundError as e:
            add(f"import {module}", False, f"{type(e).__name__}: {e}".splitlines()[0],
                f"{module} is not installed here: run this inside the envbuild image, or install "
                "the profile's requirements.txt")
        except Exception as e:
            add(f"import {module}", False, f"{type(e).__name__}: {e}".splitlines()[0],
                f"the image's {module} is broken; rebuild it")
    return results


def main(argv):
    results = checks()
    ready = all(r["ok"] for r in results)
    if "--json" in argv:
        print(json.dumps({"profile": EXPECTED["profile"], "ready": ready, "checks": results}, indent=2))
    elif not ("--quiet" in argv and ready):
        for r in results:
            mark = "\u2713" if r["ok"] else "\u2717"
            print(f"{mark} {r['check']}: {r['detail']}" + (f"\n    fix: {r['fix']}" if r["fix"] else ""))
        print(("READY" if ready else "NOT READY") + f": profile {EXPECTED['profile']} on this machine")
    return 0 if ready else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
