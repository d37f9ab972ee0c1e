"""Recorded source patches for verl 0.4.1 on NVIDIA GeForce RTX 4090; rendered by envbuild.

Each replacement must match at least once: a patch that no longer fits its release stops the
build instead of leaving the hard-coded behaviour in place.
"""

import importlib.util
import pathlib
import sys

PATCHES = [
    # verl-hardcoded-fa2: verl loads the actor/critic/reward models with attn_implementation="flash_attention_2" hard-coded (0.4.x-0.5.x everywhere; 0.6.x still in load_valuehead_model and the reward model), which needs CC >= 8.0 and the flash-attn package
    (["verl/workers/fsdp_workers.py", "verl/utils/model.py"], [("attn_implementation=\"flash_attention_2\"", "attn_implementation=\"sdpa\"")]),
    # verl-optional-flash-attn-import: verl 0.4.x-0.5.x imports flash_attn.bert_padding at module level in the actor and critic, although it is only used with use_remove_padding (off below CC 8.0)
    (["verl/workers/actor/dp_actor.py", "verl/workers/critic/dp_critic.py"], [("if is_cuda_available:\n    from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input\n", "if is_cuda_available:\n    try:  # envbuild: no flash-attn below CC 8.0; unpadding stays off\n        from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input\n    except ImportError:\n        pass\n")]),
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
