"""Base image digests from a registry's v2 API (requests only, no docker daemon).

Docker Hub and nvcr.io answer 401 with a `WWW-Authenticate: Bearer realm=...` challenge; an
anonymous token from that realm is enough to read public manifests. A HEAD with every manifest
media type in Accept returns the digest of what the tag names, a multi-arch list/index included:
with fewer types a registry answers 400/404, or silently the digest of one platform's child.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

from ..errors import ActionError, UserError

DOCKER_HUB = "registry-1.docker.io"
ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
TIMEOUT = 30


class ImageRef(NamedTuple):
    registry: str  # host[:port] as the API is reached
    repository: str
    tag: str


class ImageDigest(NamedTuple):
    digest: str
    media_type: str


def parse_ref(ref: str) -> ImageRef:
    """`nvidia/cuda:12.4.1-…` -> Docker Hub's nvidia/cuda; `nvcr.io/nvidia/pytorch:24.01-py3`.
    Docker's reference rules are mirrors.parse_image's; here Docker Hub is the API's host."""
    from ..mirrors import DOCKER_HUB as HUB_NAME, parse_image

    p = parse_image(ref)
    return ImageRef(DOCKER_HUB if p.registry == HUB_NAME else p.registry, p.repository,
                    p.reference[1:])


def _base_url(host: str) -> str:
    from ..mirrors import endpoint_url

    return endpoint_url(host)


def endpoint(ref: ImageRef, mirror: str | None) -> tuple[str, str]:
    """(API base URL, repository there). A mirror `[SCHEME://]HOST[:PORT][/PREFIX]` serves every
    image under PREFIX/<repository> (Docker Hub's official images as library/<name>)."""
    if not mirror:
        return _base_url(ref.registry), ref.repository
    scheme, sep, rest = mirror.partition("://")
    if not sep:
        scheme, rest = "", mirror
    host, _, prefix = rest.partition("/")
    base = f"{scheme}://{host}" if scheme else _base_url(host)
    prefix = prefix.strip("/")
    return base, f"{prefix}/{ref.repository}" if prefix else ref.repository


def _challenge(header: str) -> dict[str, str]:
    scheme, _, params = header.partition(" ")
    out = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', params)}
    out["scheme"] = scheme.lower()
    return out


def _token(session, challenge: dict[str, str], repository: str, where: str) -> str:
    params = {"scope": challenge.get("scope") or f"repository:{repository}:pull"}
    if challenge.get("service"):
        params["service"] = challenge["service"]
    try:
        r = session.get(challenge["realm"], params=params, timeout=TIMEOUT)
    except Exception as e:
        raise ActionError(f"Cannot reach the token service {challenge['realm']} of {where}: "
                          f"{type(e).__name__}. Pass --registry-mirror a registry that answers.") from None
    if r.status_code != 200:
        raise ActionError(f"The token service {challenge['realm']} refused an anonymous token for "
                          f"{repository} (HTTP {r.status_code}); the image may be private.")
    body = r.json()
    token = body.get("token") or body.get("access_token")
    if not token:
        raise ActionError(f"The token service {challenge['realm']} answered without a token.")
    return token


def digest(ref: str, mirror: str | None = None, session=None) -> ImageDigest:
    """The digest `ref`'s tag points at now, read from its registry (or `mirror`)."""
    import requests

    session = session or requests.Session()
    parsed = parse_ref(ref)
    base, repository = endpoint(parsed, mirror)
    url = f"{base}/v2/{repository}/manifests/{parsed.tag}"
    headers = {"Accept": ACCEPT}

    def request(method: str):
        try:
            return session.request(method, url, headers=headers, timeout=TIMEOUT)
        except requests.RequestException as e:
            raise ActionError(f"Cannot reach the registry {base} for {ref}: {type(e).__name__}. "
                              "Check the network, or pass --registry-mirror HOST[/PREFIX] a "
                              "mirror that answers.") from None

    r = request("HEAD")
    if r.status_code == 401:
        ch = _challenge(r.headers.get("WWW-Authenticate", ""))
        if ch["scheme"] != "bearer" or "realm" not in ch:
            raise ActionError(f"The registry {base} wants credentials for {repository} "
                              f"({r.headers.get('WWW-Authenticate', 'no challenge')}); envbuild "
                              "reads public images anonymously only. Use a mirror that serves it.")
        headers["Authorization"] = f"Bearer {_token(session, ch, repository, base)}"
        r = request("HEAD")
    if r.status_code == 404:
        raise ActionError(f"The registry {base} has no manifest for {repository}:{parsed.tag} "
                          f"({ref}). Check the tag, or that the mirror carries the image.")
    if r.status_code == 429:
        raise ActionError(f"The registry {base} rate-limits this address (HTTP 429 "
                          "toomanyrequests). Wait, or pass --registry-mirror.")
    if r.status_code != 200:
        raise ActionError(f"The registry {base} answered HTTP {r.status_code} for "
                          f"{repository}:{parsed.tag}.")
    found = r.headers.get("Docker-Content-Digest")
    media_type = r.headers.get("Content-Type", "").split(";")[0].strip()
    if not found:  # some registries send the digest only with the body: hash it ourselves
        r = request("GET")
        if r.status_code != 200:
            raise ActionError(f"The registry {base} answered HTTP {r.status_code} for "
                              f"{repository}:{parsed.tag}.")
        found = "sha256:" + hashlib.sha256(r.content).hexdigest()
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", found):
        raise ActionError(f"The registry {base} gave {found!r} as the digest of {ref}.")
    return ImageDigest(found, media_type)


def mirror_for(ref: str, mirror: str | dict | None) -> str | None:
    """The registry to read `ref` from: one mirror for all, or a mirror set's entry for the
    image's registry (keyed docker.io for Docker Hub, as in matrices/mirrors.yaml)."""
    if not isinstance(mirror, dict):
        return mirror
    registry = parse_ref(ref).registry
    return mirror.get("docker.io" if registry == DOCKER_HUB else registry)


def lock_images(refs: list[str], mirror: str | dict | None = None) -> dict[str, dict[str, str]]:
    import requests

    if isinstance(mirror, str) and not mirror.strip():
        raise UserError("--registry-mirror needs HOST[:PORT][/PREFIX].")
    with requests.Session() as session:
        return {ref: digest(ref, mirror_for(ref, mirror), session)._asdict()
                for ref in sorted(set(refs))}
