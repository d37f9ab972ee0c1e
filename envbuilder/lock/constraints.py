"""The constraints a render takes from a lock: the first lock (the user's ./lockfiles, then
the shipped one, or the one `--locked` / `--wheelhouse` names) whose pip part was solved for
this environment's pip inputs (lockfile.solver_inputs, as lock.json records their digests), read
only when its requirements.lock hashes to what lock.json says. render/ reads no lock: it prints
the pins context.prepare takes from here into its BuildContext. Nothing here writes into the
resolved environment.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from envbuilder.record import frozen
from envbuilder.model.resolved import Constraints, ResolvedEnv
from envbuilder.lock.pins import constraint_layers


def lock_candidates(profile: str) -> list[tuple[str, Path]]:
    """Where a render looks for a lock of `profile`: the user's ./lockfiles, then the shipped."""
    from envbuilder.paths import LOCK_ROOT, data_dir

    out = [(f"{LOCK_ROOT}/{profile}", LOCK_ROOT / profile)]
    try:
        out.append((f"envbuild's shipped lockfiles/{profile}", data_dir("lockfiles") / profile))
    except FileNotFoundError:
        pass
    return out


def find_constraints(env: ResolvedEnv, only: tuple[str, Path] | None = None) -> Constraints | None:
    """The constraints of the first lock solved for this environment's pip inputs, read only when its
    requirements.lock hashes to what lock.json records; None when no lock fits. `only`: (what to
    call it, where it is) of the lock a `--locked DIR` or `--wheelhouse` render named, the one
    lock it may take pins from, named in the files by that and its input_sha256 (its
    Dockerfile's layers and SBOM pin that lock's versions: requirements.txt, environment.yml,
    pixi.toml and constraints/ must pin the same)."""
    from envbuilder.errors import UserError
    from envbuilder.limits import MAX_INPUT_BYTES, read_limited
    from envbuilder.lock.lockfile import REQUIREMENTS, pip_sha256, read_meta, recorded_pip_sha256

    want = pip_sha256(env)
    candidates = [only] if only is not None else lock_candidates(env.name)
    for label, lock_dir in candidates:
        if "/" in env.name or env.name in ("", ".", ".."):
            return None  # a profile name never leaves lockfiles/
        try:
            meta = read_meta(lock_dir)  # (the one reader of lock.json: bounded, shape-checked)
            if meta is None or recorded_pip_sha256(meta) != want:  # (no lock, or not this plan's)
                continue
            recorded = meta.files.get(REQUIREMENTS)
            if recorded is None:
                continue
            # (decoded only to be parsed; never waited on: a FIFO is NotRegularFile, a ValueError)
            data = read_limited(lock_dir / REQUIREMENTS, MAX_INPUT_BYTES)
        except (OSError, ValueError, UserError):
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != recorded:
            continue
        swapped = meta.torch_swapped
        if only is not None:  # (no path: it moves)
            label = f"{label} (input_sha256 {meta.input_sha256[:16]})"
        try:
            layers_ = constraint_layers(env, data, bool(swapped), digest)
        except UnicodeDecodeError:
            continue
        return Constraints(from_=label, torch_swapped=swapped, plan_sha256=want, layers=frozen(layers_))
    return None
