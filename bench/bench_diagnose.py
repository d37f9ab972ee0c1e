#!/usr/bin/env python3
"""Diagnose speed (issue 47): whole-process `envbuild diagnose --prefix` on an environment
envbuild installed for a profile (each planned package's dist-info as pip leaves it, torch's
version.py, PREFIX/envbuild/envbuild.json: ~250 distributions for h200), and on this checkout's
own virtualenv (real packages, real compiled extensions), best of --runs.

Usage: python bench/bench_diagnose.py [--runs 5] [--profile h200] [--venv PATH]
Aim: under 5 s for a 200-package environment, and clean (exit 0) on the envbuild-installed one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AIM_S = 5.0


def envbuild_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "envbuild"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "envbuilder"]


def installed_like(prefix: Path, profile: str) -> int:
    """What `envbuild install PROFILE --prefix PREFIX` leaves, as diagnose reads it; the number
    of distributions."""
    sys.path.insert(0, str(ROOT))
    from envbuilder.machine.diagnose import planned_pins
    from envbuilder.model import matrix
    from envbuilder.model.resolve import resolve

    env = resolve(matrix.load(()), profile)
    site = prefix / "lib" / f"python{env.python}" / "site-packages"
    site.mkdir(parents=True)
    (prefix / "bin").mkdir()
    pins = planned_pins(env)
    for name, version in pins.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
        (info / "RECORD").write_text(f"{info.name}/METADATA,,\n")
    (site / "torch").mkdir(exist_ok=True)
    (site / "torch" / "version.py").write_text(
        f"__version__ = '{env.torch.version}+{env.torch.variant}'\ncuda = '{env.torch.cuda}'\n"
    )
    (prefix / "envbuild").mkdir()
    (prefix / "envbuild" / "envbuild.json").write_text(env.to_json())
    return len(pins)


def timed(args: list[str]) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVBUILD_")}
    env["PYTHONPATH"] = str(ROOT)
    start = time.perf_counter()
    r = subprocess.run(envbuild_cmd() + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start, r.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--venv", type=Path, default=Path(sys.prefix))
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="envbuild-bench-diagnose-"))
    count = installed_like(work / "env", args.profile)
    worst = 0.0
    for name, prefix in (
        (f"envbuild-installed {args.profile} ({count} packages)", work / "env"),
        (f"{args.venv}", args.venv),
    ):
        times, codes = [], set()
        for _ in range(args.runs):
            seconds, code = timed(["diagnose", "--prefix", str(prefix)])
            times.append(seconds)
            codes.add(code)
        worst = max(worst, min(times))
        print(f"{name}: best {min(times):.2f} s, worst {max(times):.2f} s, exit {sorted(codes)}")
        if prefix == work / "env" and codes != {0}:
            print(f"  FAIL: the envbuild-installed environment is not clean (exit {sorted(codes)})")
            return 1
    ok = worst < AIM_S
    print(("OK" if ok else "FAIL") + f": best run under {AIM_S:g} s for each")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
