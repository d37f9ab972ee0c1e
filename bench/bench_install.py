#!/usr/bin/env python3
"""pip vs uv installing a profile's real pinned set, the Dockerfile's way: step by step, each
within the rendered constraints, into a fresh venv of the profile's Python, from PyPI, with an
empty cache (a first build) and then again with the cache warm (what the Dockerfile's cache
mounts give a rebuild). Measured side by side in one run.

uv compiles bytecode at install time, as pip does and as the Dockerfile's runtime stage asks
(UV_COMPILE_BYTECODE=1); --no-compile-bytecode measures uv without it.

Usage: python bench/bench_install.py [--profile 4090] [--no-compile-bytecode]
Needs PyPI and several GB of disk and downloads per run (two cold installs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="4090")
    ap.add_argument(
        "--no-compile-bytecode",
        action="store_true",
        help="uv without --compile-bytecode (how the first numbers were measured; "
        "the Dockerfile compiles, as pip does)",
    )
    args = ap.parse_args()
    compile_bytecode = not args.no_compile_bytecode

    from envbuilder.model import matrix
    from envbuilder.lock.pip import uv_bin
    from envbuilder.context.prepare import prepare
    from envbuilder.render.files import render_files
    from envbuilder.model.resolve import resolve
    from envbuilder.machine.verify import find_python

    ctx = prepare(resolve(matrix.load(), args.profile))
    env = ctx.env
    plan = ctx.plan
    if plan.torch_index:
        print(
            f"{args.profile} needs the PyTorch index ({plan.torch_index}); pick a profile whose "
            "torch PyPI serves (4090, t4, v100, 3090, a100, h100, h200)",
            file=sys.stderr,
        )
        return 2
    python = find_python(env.python).path
    uv = uv_bin()
    work = Path(tempfile.mkdtemp(prefix="envbuild-bench-install-"))
    files = render_files(ctx)
    for name, text in files.items():
        if name.startswith("constraints/"):
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(text)
    # neither tool reads the host's settings (pip.conf find-links, PIP_*/UV_* variables)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    clean["PIP_CONFIG_FILE"] = os.devnull

    def install(tool: str, cache: Path) -> float:
        venv = work / f"venv-{tool}"
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        if tool == "pip":  # a current pip (untimed): the fairer opponent for uv
            subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True, env=clean)
        start = time.perf_counter()
        for layer in plan.layers:
            cons = [
                a
                for lay in plan.upto(layer.name)
                if lay.pins
                for a in ("-c", str(work / lay.constraints_file))
            ]
            if tool == "pip":
                cmd = [
                    py,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--cache-dir",
                    str(cache),
                    "--index-url",
                    plan.pypi,
                    *cons,
                    *layer.requirements,
                ]
            else:
                # as the Dockerfile runs it (UV_LINK_MODE=copy, UV_COMPILE_BYTECODE=1): uv
                # compiles bytecode at install time only when asked, pip always does
                cmd = [
                    uv,
                    "pip",
                    "install",
                    "-q",
                    "--no-config",
                    "--python",
                    py,
                    "--cache-dir",
                    str(cache),
                    "--index-url",
                    plan.pypi,
                    "--link-mode",
                    "copy",
                    *(["--compile-bytecode"] if compile_bytecode else []),
                    *cons,
                    *layer.requirements,
                ]
            subprocess.run(cmd, check=True, env=clean)
        return time.perf_counter() - start

    try:
        rows = []
        for tool in ("pip", "uv"):
            cache = work / f"cache-{tool}"
            cold = install(tool, cache)
            warm = install(tool, cache)
            rows.append((tool, cold, warm))
            print(f"{tool}: cold {cold:.0f}s, warm cache {warm:.0f}s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (_, pc, pw), (_, uc, uw) = rows
    print(f"\n{'case':44} {'pip s':>8} {'uv s':>8} {'pip/uv':>8}")
    print(f"{args.profile + ': empty cache (a first build)':44} {pc:8.0f} {uc:8.0f} {pc / uc:8.2f}")
    print(f"{args.profile + ': warm cache (a rebuild)':44} {pw:8.0f} {uw:8.0f} {pw / uw:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
