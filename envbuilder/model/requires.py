"""Requirement strings as packages declare them (PEP 508 `Requires-Dist`, read with `packaging`):
which of a package's requirements apply on a target platform, Python and extras. Shared by
`refresh` (PyPI's metadata) and `diagnose` (an installed environment's dist-info METADATA)."""

from __future__ import annotations

import re
from typing import Any

from envbuilder.text import canonical_name

# the platform the rendered images run on: what requirement markers are evaluated against
TARGET = {
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}

_EXTRA = re.compile(r"\bextra\s*==\s*['\"]([^'\"]+)['\"]")


def requirements(
    requires_dist: list[str], python: str, extras: tuple[str, ...] = (), machine: str = "x86_64"
) -> list[dict[str, Any]]:
    """The requirements that apply on the target platform with this Python and these extras:
    [{"name", "extras", "spec", "text"}]. Lines `packaging` can't read are skipped."""
    from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
    from packaging.requirements import InvalidRequirement, Requirement

    wanted = {canonical_name(e) for e in extras}
    env = dict(TARGET, platform_machine=machine, python_version=python, python_full_version=f"{python}.0")
    out = []
    for text in requires_dist or []:
        # (most lines of a large METADATA belong to an extra not asked for: not parsed)
        marker = text.partition(";")[2]
        names: list[str] = _EXTRA.findall(marker)
        if names and " or " not in marker and not wanted & {canonical_name(n) for n in names}:
            continue
        try:
            req = Requirement(text)
            applies = req.marker is None or any(
                req.marker.evaluate(dict(env, extra=e)) for e in ("", *extras)
            )
        except (InvalidRequirement, InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
            continue
        if applies:
            out.append(
                {
                    "name": canonical_name(req.name),
                    "extras": tuple(sorted(req.extras)),
                    "spec": str(req.specifier),
                    "text": text.split(";")[0].strip(),
                }
            )
    return out
