#!/usr/bin/env python3
"""The resolved environment's classes: envbuild's Record (envbuilder/record.py) against
`dataclasses.dataclass(frozen=True, slots=True)` for the same classes and fields, each defined
in a fresh process after the imports a render makes anyway (jinja2, yaml, click), interleaved.

Usage: python bench/bench_records.py [--runs 15]
What it decides: whether the typed environment may be frozen dataclasses without slowing
`envbuild render` (whose whole run is ~0.17 s here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRELUDE = "import time, jinja2, yaml, click\n"


def classes() -> list[tuple[str, tuple[str, ...], dict]]:
    """(name, fields, defaults) of every record of the resolved environment, children first."""
    from envbuilder.model.resolved import ResolvedEnv

    out, seen = [], set()

    def walk(cls) -> None:
        for kind in cls.nested().values():
            walk(kind[0] if isinstance(kind, tuple) else kind)
        if cls.__name__ not in seen:
            seen.add(cls.__name__)
            out.append((cls.__name__, cls._fields, dict(cls._defaults)))

    walk(ResolvedEnv)
    return out


def dataclass_source() -> str:
    lines = [PRELUDE, "t0 = time.perf_counter()", "import dataclasses"]
    for name, fields, defaults in classes():
        lines += ["@dataclasses.dataclass(frozen=True, slots=True)", f"class {name}:"]
        lines += [f"    {f}: object" for f in fields if f not in defaults]
        lines += [f"    {f}: object = {defaults[f]!r}" for f in fields if f in defaults]
    lines += ["print(time.perf_counter() - t0)"]
    return "\n".join(lines) + "\n"


def record_source() -> str:
    # the module as a render imports it (its dependencies are light: errors, record)
    return (
        PRELUDE + "t0 = time.perf_counter()\nimport envbuilder.model.resolved\n"
        "print(time.perf_counter() - t0)\n"
    )


# with Python's bytecode cache, as an installed envbuild runs (bench_render.py says why)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(source: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", source], cwd=ROOT, check=True, capture_output=True, text=True, env=ENV
    ).stdout
    return float(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    cases = {
        "Record classes (envbuilder.model.resolved)": record_source(),
        "frozen slotted dataclasses, same fields": dataclass_source(),
    }
    for source in cases.values():
        timed(source)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, source in cases.items():
            samples[name].append(timed(source))
    base = statistics.median(samples["Record classes (envbuilder.model.resolved)"])
    print(f"{len(classes())} classes, defined after `import jinja2, yaml, click`")
    print(f"{'case':42} {'median ms':>10} {'ratio':>7}")
    for name, values in samples.items():
        med = statistics.median(values)
        print(f"{name:42} {med * 1000:10.2f} {med / base:6.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
