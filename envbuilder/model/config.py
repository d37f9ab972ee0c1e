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
import re
from functools import lru_cache
from pathlib import Path

from typing import TYPE_CHECKING, TypedDict, cast

from envbuilder.errors import UserError

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix


class UserConfig(TypedDict, total=False):
    """The config file, as _load checks it: registry names -> endpoints, the mirror set to
    use, and the user's own mirror sets (matrix_schema.MIRROR each)."""

    registries: dict[str, str]
    mirror: str
    mirrors: dict[str, dict[str, object]]


def config_path() -> Path:
    env = os.environ.get("ENVBUILD_CONFIG")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "envbuild" / "config.yaml"


@lru_cache(maxsize=None)
def _load(path: str) -> UserConfig:
    from envbuilder.model import schema as S
    from envbuilder.limits import load_yaml, read_text_bounded
    from envbuilder.model.matrix_schema import MIRROR

    p = Path(path)
    if not p.exists():
        if os.environ.get("ENVBUILD_CONFIG"):
            raise UserError(
                f"ENVBUILD_CONFIG points at {p}, which does not exist. Create it or unset the variable."
            )
        return {}
    doc: object = load_yaml(read_text_bounded(p, "envbuild config"), str(p)) or {}
    # every value is checked for what it is (a registry endpoint, a name, a mirror set's URLs):
    # they reach image references, build args and rendered files
    spec = {
        "registries?": S.MapOf(S.REGISTRY, key=S.NAME),
        "mirror?": S.NAME,
        "mirrors?": S.MapOf(MIRROR, key=S.NAME),
    }
    try:
        S.check(doc, spec, str(p))
    except S.SchemaError as e:
        raise UserError(f"{e}. Fix the config file.") from None
    return cast(UserConfig, doc)  # (the shape S.check just checked)


def user_config() -> UserConfig:
    return _load(str(config_path()))


# Where images are pushed and bake keeps its cache: HOST[:PORT][/PATH], nothing else. It
# becomes part of image references and of bake's `cache-to = ["type=registry,ref=..."]`, where
# a ',' or '=' would add settings (a local cache exported anywhere), so the grammar is strict:
# DNS labels, an IPv4 or [IPv6] address; a port of 1-5 ASCII digits up to 65535; lower-case
# path components as Docker's reference grammar has them.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
PUSH_REGISTRY = re.compile(
    rf"(?P<host>{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]{{2,45}}\])"
    rf"(?::(?P<port>[0-9]{{1,5}}))?(?:/{_COMPONENT})*"
)


def check_registry(value: str, where: str) -> str:
    """`value` when it is HOST[:PORT][/PATH] (PUSH_REGISTRY), else UserError (exit 2) naming
    `where` it came from."""
    from envbuilder.text import shorten

    m = PUSH_REGISTRY.fullmatch(value) if isinstance(value, str) and len(value) <= 255 else None
    if m is None or (m["port"] is not None and not 0 < int(m["port"]) < 65536):
        raise UserError(
            f"{where} is {shorten(ascii(value) if isinstance(value, str) else value, 100)}, "
            "which is not a registry: give HOST[:PORT][/PATH] (e.g. localhost:5000 or "
            "registry.example.com/team: letters, digits, '.', '-' in the host, a port "
            "up to 65535, lower-case path parts; no scheme, spaces or commas). Nothing "
            "was written or pushed."
        )
    return value


DEFAULT_LOCAL_REGISTRY = "localhost:5000"


def local_registry(m: Matrix) -> str:
    """The registry `local` names when nothing else does: the matrix's `registry_local`."""
    return str((m.defaults or {}).get("registry_local", DEFAULT_LOCAL_REGISTRY))


def registry_for(name: str, default_local: str, option: str = "--registry") -> str:
    """`local` -> the configured local registry; a configured name -> its host; else `name` as a
    host. Whichever it is, it must be HOST[:PORT][/PATH] (check_registry), named by where it came
    from (`option`, ENVBUILD_REGISTRY_LOCAL, the config, the matrix's registry_local)."""
    from envbuilder.text import shorten

    regs = dict(user_config().get("registries") or {})
    sources = {n: f"the config's registries.{n} ({config_path()})" for n in regs}
    if "local" not in regs:
        if "ENVBUILD_REGISTRY_LOCAL" in os.environ:
            regs["local"] = os.environ["ENVBUILD_REGISTRY_LOCAL"]
            sources["local"] = f"ENVBUILD_REGISTRY_LOCAL (what {option} local names)"
        else:
            regs["local"] = default_local
            sources["local"] = "the matrix's defaults.registry_local"
    if name in regs:
        return check_registry(regs[name], sources[name])
    host = name.split("/", 1)[0]
    if "." in host or ":" in host or host == "localhost":
        return check_registry(name, option)
    raise UserError(
        f"No registry named {shorten(name, 60)!r}: your config ({config_path()}) names "
        f"{', '.join(sorted(regs))}. Use one of those, or HOST[:PORT]; nothing was "
        "pushed."
    )
