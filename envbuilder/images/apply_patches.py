#!/usr/bin/env python3
"""verl's recorded source patches for the profile's GPU, applied to the installed release.

The patches (each file, each find/replace) are read from envbuild-scripts.json beside this file,
as `envbuild render` wrote it for the profile (matrices/patches.yaml). Each replacement must
match at least once: a patch that no longer fits its release stops the build instead of leaving
the hard-coded behaviour in place.

Exit 0 when every patch is in place, 1 when one does not fit (or verl is missing), 2 when the
sidecar is missing or is not one.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys
from typing import Any

Data = dict[str, Any]

SIDECAR = "envbuild-scripts.json"  # written beside this file by `envbuild render`
KEY = "apply_patches"  # this script's part of it
REQUIRED = ("profile", "gpu", "verl", "patches")


def load_data(key: str, required: tuple[str, ...]) -> Data | None:
    """This script's part (`key`) of the sidecar beside it, or None, said on stderr, when the
    file is missing, is no JSON object or lacks a `required` field."""
    path = pathlib.Path(__file__).resolve().with_name(SIDECAR)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        why = f"cannot be read ({type(e).__name__}: {e})"
    else:
        part = data.get(key) if isinstance(data, dict) else None
        missing = [k for k in required if k not in part] if isinstance(part, dict) else []
        if isinstance(part, dict) and not missing:
            return part
        why = f"has no {missing[0]!r} in its {key!r} part" if missing else f"holds no {key!r} object"
    print(
        f"{key}: {path} {why}. This script reads the profile's data from the {SIDECAR} that "
        f"`envbuild render` writes beside it: render the profile again and keep the two together.",
        file=sys.stderr,
    )
    return None


def main() -> int:
    data = load_data(KEY, REQUIRED)
    if data is None:
        return 2
    patches = data["patches"]
    names = ", ".join(str(p["name"]) for p in patches)
    print(f"apply_patches: {data['profile']} ({data['gpu']}), verl {data['verl']}: {names}")
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        print("apply_patches: verl is not installed", file=sys.stderr)
        return 1
    root = pathlib.Path(list(spec.submodule_search_locations)[0]).parent
    for patch in patches:
        for rel in patch["files"]:
            path = root / rel
            if not path.is_file():
                print(
                    f"apply_patches: {rel} does not exist; this verl release does not match the recorded patch",
                    file=sys.stderr,
                )
                return 1
            text = path.read_text()
            for find, new in patch["replace"]:
                count = text.count(find)
                if count == 0 and new in text:
                    print(f"apply_patches: {rel}: already patched")
                    continue
                if count == 0:
                    print(
                        f"apply_patches: {rel}: {find!r} not found; this verl release does not "
                        "match the recorded patch",
                        file=sys.stderr,
                    )
                    return 1
                text = text.replace(find, new)
                print(f"apply_patches: {rel}: {find.strip()!r} replaced ({count}x)")
            path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
