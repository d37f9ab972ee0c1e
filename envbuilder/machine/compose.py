"""verl's own PPO config of a release, composed with a run's overrides as
`python -m verl.trainer.main_ppo OVERRIDES` composes it (Hydra, from the release's files on disk):
what `envbuild verify` checks a rendered run script against, and the tests' real-config tier.
Here, above the model, because it reads a release's tree and imports Hydra."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_HYDRA_MAIN = re.compile(r"@hydra\.main\(\s*config_path=\"([^\"]+)\",\s*config_name=\"([^\"]+)\"")


def main_ppo_config(verl_root: Path) -> tuple[Path, str]:
    """(config directory, config name) from the release's own `@hydra.main(...)` in
    verl/trainer/main_ppo.py, under `verl_root` (the folder holding verl/)."""
    main = Path(verl_root) / "verl" / "trainer" / "main_ppo.py"
    found = _HYDRA_MAIN.search(main.read_text(encoding="utf-8"))
    if found is None:
        raise ValueError(f"{main} has no @hydra.main(config_path=..., config_name=...)")
    return (main.parent / found.group(1)).resolve(), found.group(2)


def compose_run_config(verl_root: Path, overrides: list[str]) -> Any:
    """verl's PPO trainer config at the release under `verl_root`, with `overrides` applied as
    `python -m verl.trainer.main_ppo OVERRIDES` applies them (an override of a key the release
    does not have fails here as it fails there). Needs hydra-core, imported here only."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir, name = main_ppo_config(verl_root)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return compose(config_name=name, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
