"""A model's config.json from a Hugging Face hub or its mirror (HF_ENDPOINT), through the one
HTTP session (oci/http.py): what `--model REPO` reads of a model it does not know. The shape is
read from the bytes by model/architectures.py, which keeps them in envbuild's cache."""

from __future__ import annotations

import os

from envbuilder.errors import ActionError, UserError
from envbuilder.text import redact

HUB_DEADLINE = 60.0  # seconds for the whole exchange: a config.json is a few KB
_REDIRECTS = (301, 302, 303, 307, 308)


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of `url`, the port spelled out where it is the scheme's default."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return u.scheme, (u.hostname or ""), u.port or {"http": 80, "https": 443}.get(u.scheme)


def fetch_config(url: str, shown: str, repo: str, timeout: float, max_bytes: int) -> bytes:
    """config.json's bytes from `url` through the one HTTP session (oci/http.py: proxies, CAs,
    a body cap, a deadline on the whole exchange, HUB_DEADLINE, redirects included). HF_TOKEN
    goes only to the endpoint's own scheme, host and port: a redirect elsewhere (a CDN, or a
    host that should not see it) is followed without it. A user:password@ in HF_ENDPOINT is
    Basic auth to that host alone."""
    import time
    from urllib.parse import urljoin

    from envbuilder.oci import http as H

    token = os.environ.get("HF_TOKEN")
    home = _origin(url)
    expect = H.Expect("a model's config.json", max_bytes, HUB_DEADLINE)
    end = time.monotonic() + HUB_DEADLINE * H.DEADLINE_SCALE
    s = H.session(retries=2, user_agent="envbuild")
    try:
        for _ in range(H.MAX_REDIRECTS + 1):
            headers = {"Authorization": f"Bearer {token}"} if token and _origin(url) == home else {}
            left = (end - time.monotonic()) / H.DEADLINE_SCALE
            if left <= 0:
                raise H.NetError(url, f"no complete answer within {HUB_DEADLINE:g} s", "deadline")
            answer = H.request(
                s,
                "GET",
                url,
                expect,
                headers=headers,
                timeout=timeout,
                deadline=left,
                allow_redirects=False,
                body_if=lambda status: status == 200,
            )
            location = answer.headers.get("Location")
            if answer.status in _REDIRECTS and location:
                url = urljoin(url, location)
                continue
            break
        else:
            raise H.NetError(url, f"more than {H.MAX_REDIRECTS} redirects (a redirect loop?)", "redirects")
    except H.NetError as e:
        if e.kind == "too-large":
            raise ActionError(
                f"{shown} sent more than {max_bytes >> 10} KiB for a "
                "config.json; that is not one. Check HF_ENDPOINT."
            ) from None
        raise ActionError(
            f"Cannot read {repo}'s config.json from {shown}: {redact(e.reason)}. "
            "Where the hub is out of reach, point HF_ENDPOINT at a mirror "
            "(HF_ENDPOINT=https://hf-mirror.com, or --mirror NAME) or pass the folder that "
            "holds the model (--model /path/to/model)."
        ) from None
    finally:
        s.close()
    if answer.status != 200:
        why = {
            401: "it asks for credentials (a gated model: set HF_TOKEN)",
            403: "access is refused (a gated model: accept its licence, set HF_TOKEN)",
            404: "there is no such repo or no config.json in it",
        }.get(answer.status, f"HTTP {answer.status}")
        raise UserError(
            f"Cannot read {repo}'s config.json from {shown}: {why}. Check the repo "
            "id, or pass the folder that holds the model."
        )
    return answer.body
