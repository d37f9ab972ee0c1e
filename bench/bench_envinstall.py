#!/usr/bin/env python3
"""`envbuild install PROFILE` against the build's install steps, side by side in one run.

The build's install steps: a venv of the profile's Python and the Dockerfile's pip steps with
uv, each within the rendered constraints (what the image's RUN lines do, without Docker).
`envbuild install` does the same installs and then what makes the environment usable: pip
check after each step, verl's recorded patches, the precision audit, the rendered folder and
preflight's smoke test (the training path imported). Both from the same index with the same
(warm) uv cache, one after the other, repeated --rounds times; the ratio is install / steps.

Usage: python bench/bench_envinstall.py [--profile 4090] [--rounds 1]
Needs PyPI (or a warm uv cache) and a few GB of disk.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def steps(profile: str, work: Path) -> float:
    """The Dockerfile's pip steps with uv into a fresh venv: seconds."""
    from envbuilder.lock.pip import layer_roots
    from envbuilder.machine.verify import find_python
    from envbuilder.model import matrix
    from envbuilder.model.resolve import resolve
    from envbuilder.render.files import render_files, write_dir
    from envbuilder.context.prepare import prepare
    from envbuilder.tools.uv import uv_bin

    ctx = prepare(resolve(matrix.load(), profile))
    env = ctx.env
    files = render_files(ctx)
    write_dir(work / "render", files)
    constraints = work / "constraints.txt"
    constraints.write_text(
        "".join(
            ln + "\n"
            for name in sorted(files)
            if name.startswith("constraints/")
            for ln in files[name].splitlines()
            if ln.strip() and not ln.startswith("#")
        )
    )
    interp = find_python(env.python)
    assert interp is not None, f"no Python {env.python}"
    start = time.monotonic()
    subprocess.run([interp.path, "-m", "venv", str(work / "venv")], check=True)
    py = work / "venv" / "bin" / "python"
    index = ["--index-url", env.indexes.pypi]
    if env.indexes.torch:
        index += ["--extra-index-url", env.indexes.torch, "--index-strategy", "unsafe-best-match"]
    for roots in layer_roots(env).values():
        if roots:
            subprocess.run(
                [
                    uv_bin(),
                    "pip",
                    "install",
                    "--no-config",
                    "--python",
                    str(py),
                    *index,
                    "-c",
                    str(constraints),
                    *roots,
                ],
                check=True,
                capture_output=True,
            )
    return time.monotonic() - start


def install(profile: str, work: Path) -> float:
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "envbuilder", "install", profile, "--prefix", str(work / "env")],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-2000:] + r.stderr[-2000:])
        raise SystemExit("envbuild install failed")
    return time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="4090")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    rows = []
    for i in range(a.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-envinstall-") as tmp:
            work = Path(tmp)
            s = steps(a.profile, work / "s")
            shutil.rmtree(work / "s", ignore_errors=True)
            t = install(a.profile, work / "i")
        rows.append((s, t))
        print(
            f"round {i + 1}: build's install steps {s:.1f} s, envbuild install {t:.1f} s, ratio {t / s:.2f}x"
        )
    ratios = sorted(t / s for s, t in rows)
    print(
        f"{a.profile}: envbuild install / the build's install steps = {ratios[len(ratios) // 2]:.2f}x (median)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
