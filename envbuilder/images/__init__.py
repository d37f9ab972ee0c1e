"""The scripts that run inside an image (or a prefix `envbuild install` made), with its Python.

Static files, copied byte for byte into every rendered folder (render/files.py): `preflight.py`,
`apply_patches.py`, `audit_precision.py`, `prepare_gsm8k.py`; and `flash_attn_wheel.py`, which
the builder stage runs (with arguments, no sidecar) to fetch flash-attn's release wheel and to
check a wheel's fatbin with cuobjdump, and whose wheel-name rule `envbuild lock` imports. Each reads what is the profile's,
as data, from one JSON file the render writes beside them (SIDECAR: one key per script, each
script's own part). They import nothing of envbuild and only the standard library at their top
(torch, hydra, pyarrow only inside the functions that check them), and run on the profile's
Python (3.10 and later), so this package ranks lowest and imports nothing (bench/structure.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

SIDECAR = "envbuild-scripts.json"  # each script spells it too (SIDECAR), held equal by a test
# file name -> its key in the sidecar
SCRIPTS = {
    "preflight.py": "preflight",
    "apply_patches.py": "apply_patches",
    "audit_precision.py": "audit_precision",
    "prepare_gsm8k.py": "prepare_gsm8k",
}
HERE = Path(__file__).resolve().parent


def script_text(name: str) -> str:
    """The script `name` (a key of SCRIPTS) as shipped, the bytes every render copies."""
    if name not in SCRIPTS:
        raise KeyError(name)
    return (HERE / name).read_text(encoding="utf-8")


def patch_command(python: Path, script: Path, environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that run apply_patches.py (`script`) on the environment of `python`,
    as every route runs it: `-I` and no PYTHON* variable, so the verl patched is the one in that
    Python's own site-packages, never a checkout on PYTHONPATH or a prefix PYTHONHOME names. The
    script does the same when run by hand (it runs itself again so) and never writes through a
    link; the helper makes the rule visible where envbuild starts it."""
    env = {k: v for k, v in environ.items() if not k.startswith("PYTHON")}
    return [str(python), "-I", str(script)], env
