#!/usr/bin/env python3
"""Render speed: whole-process `envbuild render p40` and `envbuild render --all` against the
floor `python -c "import jinja2, yaml, click"`, in the same environment, interleaved.

Usage: python bench/bench_render.py [--runs 15]
Aims (issue 2): render p40 <= 1.3x the floor, render --all <= 2x the floor. `render --all`
re-renders one output folder (files that already hold their bytes are left alone, as a user's
re-render finds them); the "(new folder)" case writes every file into a folder of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def envbuild_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "envbuild"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "envbuilder.cli"]


# as an installed envbuild runs: with Python's bytecode cache (pip compiles an installed
# package's .pyc; an editable install writes them on the warm-up run). A shell that sets
# PYTHONDONTWRITEBYTECODE would otherwise make every run compile envbuild from source.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="envbuild-bench-"))
    cases = {
        "floor: import jinja2, yaml, click": [sys.executable, "-c", "import jinja2, yaml, click"],
        "envbuild render p40": envbuild_cmd() + ["render", "p40", "-o", str(work / "p40")],
        "envbuild render --all": envbuild_cmd() + ["render", "--all", "-o", str(work / "all")],
        # every file new: nothing to compare, all of it staged, journaled and moved in
        "envbuild render --all (new folder)": envbuild_cmd() + ["render", "--all", "-o"],
    }
    fresh = iter(range(10**6))

    def argv(name: str) -> list[str]:
        cmd = cases[name]
        return cmd + [str(work / f"new-{next(fresh)}")] if cmd[-1] == "-o" else cmd

    for name in cases:  # warm the OS file cache, .pyc files and jinja's bytecode cache
        timed(argv(name), work)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name in cases:
            samples[name].append(timed(argv(name), work))
    shutil.rmtree(work, ignore_errors=True)
    floors = samples["floor: import jinja2, yaml, click"]
    print(f"{'case':40} {'median ms':>10} {'ratio':>7} {'(q1-q3)':>13}")
    for name, values in samples.items():
        # each round's own ratio (its case over its floor, run back to back), then their median:
        # a machine that slows down for a while slows both sides of a round alike
        ratios = sorted(v / f for v, f in zip(values, floors))
        q1, med, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(f"{name:40} {statistics.median(values) * 1000:10.1f} {med:6.2f}x {q1:5.2f}-{q3:.2f}x")
    print(
        f"\n{args.runs} rounds, each case once a round; ratio: the median of each round's case over "
        "its floor.\naims: render p40 <= 1.30x, render --all <= 2.00x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
