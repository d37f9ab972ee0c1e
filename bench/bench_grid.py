#!/usr/bin/env python3
"""Grid speed: whole-process `envbuild grid --html` against `envbuild render --all -o DIR` (the
same matrix, every profile), interleaved, medians. The grid resolves every GPU's profile under
every choice (and the overrides that lift a refusal): aim under 2 s on its own.

Usage: python bench/bench_grid.py [--runs 9]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_render import envbuild_cmd, timed  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="envbuild-bench-grid-"))
    cases = {
        "envbuild render --all -o tmp": envbuild_cmd() + ["render", "--all", "-o", str(work / "tmp")],
        "envbuild grid --html": envbuild_cmd() + ["grid", "--html", str(work / "grid.html")],
        "envbuild grid (terminal)": envbuild_cmd() + ["grid"],
    }
    for cmd in cases.values():  # warm the OS file cache, .pyc files and jinja's bytecode cache
        timed(cmd, work)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, cmd in cases.items():
            samples[name].append(timed(cmd, work))
    shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(samples["envbuild render --all -o tmp"])
    print(f"{'case':32} {'median ms':>10} {'ratio':>7}")
    for name, values in samples.items():
        med = statistics.median(values)
        print(f"{name:32} {med * 1000:10.1f} {med / base:6.2f}x")
    grid = statistics.median(samples["envbuild grid --html"])
    print(f"\n{args.runs} runs each, interleaved; aim: grid --html under 2 s ({grid:.2f} s here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
