#!/usr/bin/env python3
"""Precision audit for envbuild profile h100 (NVIDIA H100, CC 9.0): run in the image after apply_patches.py.

Scans the installed verl's files that the run loads (the modules of the training path and the
files the recorded patches touch) for what this GPU cannot run: a torch.autocast(...) naming
torch.bfloat16 where the profile does not compute in bf16, a "flash_attention_2" literal where
flash-attn is not used. Each one left fails the build with its file:line, unless the matrix
records it as a reviewed exception (matrices/patches.yaml `reviewed`, with why). A reviewed
line that is no longer there fails too: the release changed and needs a new review.

Exit 0 when nothing is left, 1 when something is (or verl or one of its files is missing).
"""

import importlib.util
import json
import pathlib
import re
import sys

PLAN = json.loads("{\"checks\": [], \"files\": [], \"gpu\": \"NVIDIA H100\", \"modules\": [\"verl\", \"verl.trainer.main_ppo\", \"verl.trainer.ppo.ray_trainer\", \"verl.trainer.ppo.v1.trainer_sync\", \"verl.trainer.ppo.v1.agent_loop_tq\", \"verl.workers.engine_workers\", \"verl.workers.engine.fsdp.transformer_impl\", \"verl.workers.config.model\", \"verl.workers.utils.losses\", \"verl.utils.dataset.rl_dataset\", \"verl.experimental.reward_loop\", \"verl.experimental.reward_loop.reward_manager.naive\", \"verl.utils.reward_score.gsm8k\", \"verl.experimental.agent_loop\", \"verl.experimental.agent_loop.single_turn_agent_loop\", \"verl.checkpoint_engine\", \"verl.workers.rollout.replica\", \"verl.workers.rollout.llm_server\", \"verl.workers.rollout.vllm_rollout.vllm_async_server\"], \"profile\": \"h100\", \"reasons\": {\"autocast_bf16\": \"the profile computes in bf16\", \"flash_attention_2\": \"the attention is flash_attention_2, not flash-attn\"}, \"reviewed\": [], \"verl\": \"0.9.1\"}")
WHAT = {
    "autocast_bf16": "torch.autocast(..., dtype=torch.bfloat16)",
    "flash_attention_2": 'a "flash_attention_2" literal',
}
AUTOCAST = re.compile(r"\b(?:torch\.(?:cuda\.amp\.|amp\.)?)?autocast\s*\(")
BF16 = re.compile(r"\btorch\.bfloat16\b|[\"'](?:bfloat16|bf16)[\"']")
FA2 = re.compile(r"[\"']flash_attention_2[\"']")


def code_part(line):
    """The line up to a comment (a # outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


def call_args(text, start):
    """The text from `start` (just after an opening parenthesis) to its closing one."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return text[start:]


def findings(text, checks):
    """(line number, check, stripped line) of every hit of `checks` in a file's text."""
    lines = text.splitlines()
    out = []
    if "autocast_bf16" in checks:
        for m in AUTOCAST.finditer(text):
            n = text.count("\n", 0, m.start())
            line = lines[n]
            column = m.start() - (text.rfind("\n", 0, m.start()) + 1)
            if column >= len(code_part(line)):
                continue  # in a comment
            if BF16.search(call_args(text, m.end())):
                out.append((n + 1, "autocast_bf16", line.strip()))
    if "flash_attention_2" in checks:
        for n, line in enumerate(lines):
            if FA2.search(code_part(line)):
                out.append((n + 1, "flash_attention_2", line.strip()))
    return sorted(out)


def verl_root():
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0]).parent


def module_file(root, module):
    base = root.joinpath(*module.split("."))
    for path in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def main():
    checks = PLAN["checks"]
    if not checks:
        print(f"audit_precision: nothing to audit: the {PLAN['gpu']} computes in bf16 with flash-attn")
        return 0
    root = verl_root()
    if root is None:
        print("audit_precision: verl is not installed", file=sys.stderr)
        return 1
    files, problems = [], []
    for module in PLAN["modules"]:
        path = module_file(root, module)
        if path is None:
            problems.append(f"{module}: no file for this module of the training path; is the "
                            f"installed verl the {PLAN['verl']} the matrix records?")
        else:
            files.append(path.relative_to(root).as_posix())
    for rel in PLAN["files"]:
        if not (root / rel).is_file():
            problems.append(f"{rel}: no such file, though a recorded patch names it")
        else:
            files.append(rel)
    files = list(dict.fromkeys(files))
    reviewed = {(r["file"], r["check"], r["line"]): r for r in PLAN["reviewed"]}
    used = set()
    checked = 0
    for rel in files:
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            problems.append(f"{rel}: cannot be read ({e})")
            continue
        checked += 1
        for lineno, check, line in findings(text, checks):
            key = (rel, check, line)
            if key in reviewed:
                used.add(key)
                print(f"audit_precision: {rel}:{lineno}: reviewed ({reviewed[key]['name']}): "
                      f"{reviewed[key]['why']}")
                continue
            problems.append(f"{rel}:{lineno}: {WHAT[check]} left on the run's path ({PLAN['reasons'][check]}): {line}")
    for key, r in reviewed.items():
        if key not in used:
            problems.append(f"{r['file']}: the reviewed line ({r['name']}) is not there any more: "
                            f"{r['line']}; the release changed, review the file again")
    if problems:
        for p in problems:
            print(f"audit_precision: {p}", file=sys.stderr)
        print(f"audit_precision: FAILED for {PLAN['profile']} (verl {PLAN['verl']}): {len(problems)} "
              "finding(s). Record a patch (matrices/patches.yaml) for each line the run executes, or "
              "a reviewed exception, with why, for a line it never reaches.", file=sys.stderr)
        return 1
    print(f"audit_precision: ok: {checked} verl files on the run's path; none of "
          f"{', '.join(WHAT[c] for c in checks)} left ({PLAN['profile']}, verl {PLAN['verl']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
