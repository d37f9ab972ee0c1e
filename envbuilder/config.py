"""The user's config file: their own mirror sets and registry names.

Precedence everywhere: CLI flag > ENVBUILD_* environment > this file > shipped defaults.
The file is $ENVBUILD_CONFIG, else $XDG_CONFIG_HOME/envbuild/config.yaml (~/.config/...).

    registries:
      local: 127.0.0.1:5000
      corp: registry.corp.example:5000
    mirror: cn            # the default for --mirror
    mirrors:
      corp: {description: ..., registries: {docker.io: [registry.corp.example/dockerhub]}, ...}
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from .errors import UserError


def config_path() -> Path:
    env = os.environ.get("ENVBUILD_CONFIG")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "envbuild" / "config.yaml"


@lru_cache(maxsize=None)
def _load(path: str) -> dict:
    from . import schema as S
    from .limits import load_yaml, read_text_bounded
    from .matrix_schema import MIRROR

    p = Path(path)
    if not p.exists():
        if os.environ.get("ENVBUILD_CONFIG"):
            raise UserError(f"ENVBUILD_CONFIG points at {p}, which does not exist. Create it or "
                            "unset the variable.")
        return {}
    doc = load_yaml(read_text_bounded(p, "envbuild config"), str(p)) or {}
    # every value is checked for what it is (a registry endpoint, a name, a mirror set's URLs):
    # they reach image references, build args and rendered files
    spec = {"registries?": S.MapOf(S.REGISTRY, key=S.NAME), "mirror?": S.NAME,
            "mirrors?": S.MapOf(MIRROR, key=S.NAME)}
    try:
        S.check(doc, spec, str(p))
    except S.SchemaError as e:
        raise UserError(f"{e}. Fix the config file.") from None
    return doc


def user_config() -> dict:
    return _load(str(config_path()))


def registry_for(name: str, default_local: str) -> str:
    """`local` -> the configured local registry; a configured name -> its host; else `name` as a host."""
    from .outdir import shorten

    regs = dict(user_config().get("registries") or {})
    regs.setdefault("local", os.environ.get("ENVBUILD_REGISTRY_LOCAL", default_local))
    if name in regs:
        return regs[name]
    host = name.split("/", 1)[0]
    if "." in host or ":" in host or host == "localhost":
        return name
    raise UserError(f"No registry named {shorten(name, 60)!r}: your config ({config_path()}) names "
                      f"{', '.join(sorted(regs))}. Use one of those, or HOST[:PORT]; nothing was "
                      "pushed.")
