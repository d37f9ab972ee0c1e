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

from envbuilder.machine.compose import compose_run_config, main_ppo_config  # noqa: F401  (re-exported)

# the shell variables a rendered run script reads, with values for composing
SCRIPT_ENV = {"MODEL": "Qwen/Qwen2.5-0.5B-Instruct", "DATA_DIR": "/data/gsm8k", "N_GPUS": "1"}


_ARGS = re.compile(r"^args=\(\n.*?^\)\n", re.S | re.M)


def run_script_overrides(script: str, env: dict[str, str] | None = None) -> list[str]:
    """The overrides in a rendered run script's `args=( ... )` array, as its bash expands them
    (quotes, "$MODEL" and the like) with SCRIPT_ENV and `env` for the variables. The tests read
    the script itself this way; envbuilder reads the run plan (envbuilder/model/runplan.py), and
    tests/test_runplan.py holds the two equal."""
    found = _ARGS.search(script)
    if found is None:
        raise ValueError("no `args=(` ... `)` array in the run script")
    variables = dict(SCRIPT_ENV, **(env or {}))
    program = (
        "set -eu\n"
        + "".join(f"{k}={shlex.quote(v)}\n" for k, v in variables.items())
        + found.group(0)
        + 'printf "%s\\0" "${args[@]}"\n'
    )
    r = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", program],
        capture_output=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        timeout=60,
    )
    if r.returncode != 0:
        raise ValueError(f"bash could not expand the args array: {r.stderr.decode()[-1000:]}")
    return r.stdout.decode().split("\0")[:-1]


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
