"""Recorded source patches for verl 0.9.1 on Tesla T4; rendered by envbuild.

Each replacement must match at least once: a patch that no longer fits its release stops the
build instead of leaving the hard-coded behaviour in place.
"""

import importlib.util
import pathlib
import sys

PATCHES = [
    # verl-valuehead-fa2: verl 0.7.x-0.9.x load the critic (load_valuehead_model, both its token-classification and its value-head path) with attn_implementation="flash_attention_2" hard-coded, whatever critic.model.override_config says; that needs CC >= 8.0 and the flash-attn package
    (["verl/utils/model.py"], [("attn_implementation=\"flash_attention_2\"", "attn_implementation=\"sdpa\"")]),
]


def main() -> int:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        print("apply_patches: verl is not installed", file=sys.stderr)
        return 1
    root = pathlib.Path(list(spec.submodule_search_locations)[0]).parent
    for files, replacements in PATCHES:
        for rel in files:
            path = root / rel
            if not path.is_file():
                print(f"apply_patches: {rel} does not exist; this verl release does not match the "
                      "recorded patch", file=sys.stderr)
                return 1
            text = path.read_text()
            for find, new in replacements:
                count = text.count(find)
                if count == 0 and new in text:
                    print(f"apply_patches: {rel}: already patched")
                    continue
                if count == 0:
                    print(f"apply_patches: {rel}: {find!r} not found; this verl release does not "
                          "match the recorded patch", file=sys.stderr)
                    return 1
                text = text.replace(find, new)
                print(f"apply_patches: {rel}: {find.strip()!r} replaced ({count}x)")
            path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
