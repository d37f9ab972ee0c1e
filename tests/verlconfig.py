"""A rendered run script's Hydra overrides, composed with verl's own config at a release.

No torch and no verl import: hydra-core's compose API on the config directory of an unpacked
verl wheel (the `verl_trees` fixture), which is what `python -m verl.trainer.main_ppo` composes
before it starts Ray. What the composed config says is what verl's workers read.

    overrides = run_script_overrides(files["run_ppo_gsm8k.sh"])
    cfg = compose_run_config(verl_trees["0.6.1"], overrides)
    OmegaConf.select(cfg, "actor_rollout_ref.actor.fsdp_config.dtype")
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

# the shell variables a rendered run script reads, with values for composing
SCRIPT_ENV = {"MODEL": "Qwen/Qwen2.5-0.5B-Instruct", "DATA_DIR": "/data/gsm8k", "N_GPUS": "1"}
_HYDRA_MAIN = re.compile(r"@hydra\.main\(\s*config_path=\"([^\"]+)\",\s*config_name=\"([^\"]+)\"")


def run_script_overrides(script: str, env: dict[str, str] | None = None) -> list[str]:
    """The overrides in a rendered run script's `args=( ... )` array, as its bash expands them
    (quotes, "$MODEL" and the like) with SCRIPT_ENV and `env` for the variables."""
    from envbuilder.gpu_tier import run_script_overrides as expand

    return expand(script, dict(SCRIPT_ENV, **(env or {})))


def main_ppo_config(verl_root: Path) -> tuple[Path, str]:
    """(config directory, config name) from the release's own `@hydra.main(...)` in
    verl/trainer/main_ppo.py."""
    main = Path(verl_root) / "verl" / "trainer" / "main_ppo.py"
    found = _HYDRA_MAIN.search(main.read_text(encoding="utf-8"))
    if found is None:
        raise ValueError(f"{main} has no @hydra.main(config_path=..., config_name=...)")
    return (main.parent / found.group(1)).resolve(), found.group(2)


def compose_run_config(verl_root: Path, overrides: list[str]):
    """verl's PPO trainer config at the release unpacked under `verl_root`, with `overrides`
    applied as `python -m verl.trainer.main_ppo OVERRIDES` applies them (an override of a key
    the release does not have fails here as it fails there)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir, name = main_ppo_config(verl_root)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return compose(config_name=name, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def keys_ending(cfg, roots: tuple[str, ...], suffix: str) -> dict[str, object]:
    """Every key under `roots` (dotted) whose last part ends with `suffix`, resolved:
    {"actor_rollout_ref.rollout.dtype": "float16", ...}."""
    from omegaconf import OmegaConf

    out = {}

    def walk(node, path):
        for key in node.keys():
            value = node[key]
            where = f"{path}.{key}"
            if OmegaConf.is_dict(value):
                walk(value, where)
            elif str(key).endswith(suffix):
                out[where] = value

    for root in roots:
        node = OmegaConf.select(cfg, root)
        if node is not None:
            walk(node, root)
    return out
