"""images.lock: the digest of every base image, read through the registry client
(envbuilder/oci/registry.py: Docker's reference rules, anonymous tokens, every manifest media type
in Accept, retries); from each image's own registry, one mirror for all, or a mirror set's
endpoint per registry.
"""

from __future__ import annotations

from typing import Any

from envbuilder.errors import UserError
from envbuilder.oci.registry import digest, parse_image, session


def mirror_for(ref: str, mirror: str | dict[str, Any] | None) -> str | None:
    """The registry to read `ref` from: one mirror for all, or a mirror set's entry for the
    image's registry (keyed docker.io for Docker Hub, as in matrices/mirrors.yaml)."""
    if not isinstance(mirror, dict):
        return mirror
    return mirror.get(parse_image(ref).registry)


def lock_images(refs: list[str], mirror: str | dict[str, Any] | None = None) -> dict[str, dict[str, str]]:
    if isinstance(mirror, str) and not mirror.strip():
        raise UserError("--registry-mirror needs HOST[:PORT][/PREFIX].")
    with session() as s:
        return {ref: digest(ref, mirror_for(ref, mirror), s)._asdict() for ref in sorted(set(refs))}
