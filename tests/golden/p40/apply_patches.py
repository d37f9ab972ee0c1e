"""Recorded source patches for verl 0.4.1 on Tesla P40; rendered by envbuild.

Each replacement must match at least once: a patch that no longer fits its release stops the
build instead of leaving the hard-coded behaviour in place.
"""

import importlib.util
import pathlib
import sys

PATCHES = [
    # verl-hardcoded-fa2: verl loads the actor/critic/reward models with attn_implementation="flash_attention_2" hard-coded (0.4.x-0.5.x everywhere; 0.6.x still in load_valuehead_model and the reward model), which needs CC >= 8.0 and the flash-attn package
    (["verl/workers/fsdp_workers.py", "verl/utils/model.py"], [("attn_implementation=\"flash_attention_2\"", "attn_implementation=\"eager\"")]),
    # verl-optional-flash-attn-import: verl 0.4.x-0.5.x imports flash_attn.bert_padding at module level in the actor and critic, although it is only used with use_remove_padding (off below CC 8.0)
    (["verl/workers/actor/dp_actor.py", "verl/workers/critic/dp_critic.py"], [("if is_cuda_available:\n    from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input\n", "if is_cuda_available:\n    try:  # envbuild: no flash-attn below CC 8.0; unpadding stays off\n        from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input\n    except ImportError:\n        pass\n")]),
    # verl-hf-rollout-autocast: the HF rollout generates under torch.autocast(dtype=torch.bfloat16), hard-coded, which GPUs below CC 8.0 cannot run natively
    (["verl/workers/rollout/hf_rollout.py"], [("torch.autocast(device_type=get_device_name(), dtype=torch.bfloat16)", "torch.autocast(device_type=get_device_name(), dtype=torch.float32, enabled=False)")]),
    # verl-actor-autocast: verl 0.4.x-0.5.x run the actor's forward (old log-probs and the PPO update; the reference model's log-probs go through the same class) under torch.autocast(dtype=torch.bfloat16), hard-coded in dp_actor.py. 0.6.x takes the dtype from actor.fsdp_config.dtype instead, which the run script sets (verl.yaml autocast_keys). The reference model shares the line, so it takes the actor's dtype here; it still computes in its FSDP param dtype (ref.fsdp_config.mixed_precision.param_dtype), which the run script sets to the inference dtype
    (["verl/workers/actor/dp_actor.py"], [("torch.autocast(device_type=self.device_name, dtype=torch.bfloat16)", "torch.autocast(device_type=self.device_name, dtype=torch.float32, enabled=False)")]),
    # verl-critic-autocast: the critic's forward (values and the value update) runs under torch.autocast(dtype=torch.bfloat16), hard-coded in dp_critic.py from 0.4.x through 0.7.x (0.6.x and 0.7.x have critic.model.fsdp_config.dtype but dp_critic.py does not read it)
    (["verl/workers/critic/dp_critic.py"], [("torch.autocast(device_type=self.device_name, dtype=torch.bfloat16)", "torch.autocast(device_type=self.device_name, dtype=torch.float32, enabled=False)")]),
    # verl-hf-sharding-manager-timing: verl 0.4.1's generate_sequences reads self.rollout_sharding_manager.timing after every generation (fsdp_workers.py line 671), and the HF rollout's BaseShardingManager has no such attribute, so every HF generation ends in an AttributeError ('BaseShardingManager' object has no attribute 'timing') (found by the GPU tier, tests/fixtures/gpu/step). verl 0.5.0 gives BaseShardingManager a timing dict; the patch does the same
    (["verl/workers/sharding_manager/base.py"], [("class BaseShardingManager:\n    def __enter__(self):", "class BaseShardingManager:\n    timing = {}  # envbuild: verl 0.5.0 sets self.timing = {}; 0.4.1's generate_sequences reads it\n\n    def __enter__(self):")]),
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
