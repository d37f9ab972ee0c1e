"""Source archives a lock pins by sha256: apex, which the builder stage compiles from GitHub's
release archive (through a mirror prefix where GitHub is slow or blocked)."""

from __future__ import annotations

import hashlib

from ..errors import ActionError
from ..resolve import ResolvedEnv

GITHUB = "https://github.com"


def lock_sources(env: ResolvedEnv, github: str | None = None) -> dict:
    """{"apex": {url, filename, sha256, size}}: the archive downloaded once and hashed."""
    import requests

    apex = env.data["apex"]
    url = apex["url"]
    fetch = url.replace(GITHUB, github.rstrip("/"), 1) if github else url
    h, size = hashlib.sha256(), 0
    try:
        with requests.get(fetch, stream=True, timeout=60) as r:
            r.raise_for_status()
            for chunk in r.iter_content(1 << 20):
                h.update(chunk)
                size += len(chunk)
    except requests.RequestException as e:
        raise ActionError(f"Cannot download the apex source {fetch} to pin its sha256 "
                          f"({type(e).__name__}: {str(e)[:200]}). Pass --github-url (a GitHub "
                          "mirror prefix) or --mirror with a `github` endpoint, or lock on a "
                          "machine that reaches GitHub.") from None
    ref = apex["ref"]
    return {"apex": {"url": url, "filename": f"apex-{ref}.tar.gz", "sha256": h.hexdigest(),
                     "size": size, "ref": ref}}
