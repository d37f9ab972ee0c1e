"""The one registry client: image references by Docker's rules, where a registry endpoint (or a
mirror `[SCHEME://]HOST[:PORT][/PREFIX]`) serves an image, and its manifest's digest through the
v2 API (requests only, no docker daemon), with retries.

Docker Hub and nvcr.io answer 401 with a `WWW-Authenticate: Bearer realm=...` challenge; an
anonymous token from that realm is enough to read public manifests. A HEAD with every manifest
media type in Accept returns the digest of what the tag names, a multi-arch list/index included:
with fewer types a registry answers 400/404, or silently the digest of one platform's child.
`envbuild lock` (images.lock), `build` (which endpoint serves the base images) and `push` (what
the registry now serves) all read manifests here.

Every answer is read through envbuilder/oci/http.py: a manifest body at most net.MANIFEST's cap, a
token answer at most net.TOKEN's and only as a JSON object holding a token, /v2/ by its status
alone, each exchange within its deadline; no message prints a mirror's credentials.
"""

from __future__ import annotations

import hashlib
import re

from collections.abc import Callable
from typing import TYPE_CHECKING

from envbuilder.errors import ActionError
from envbuilder.record import Record

if TYPE_CHECKING:
    import requests

    from envbuilder.oci.http import Answer, Expect

DOCKER_HUB = "docker.io"  # Docker Hub as image references (and mirror sets) name it
DOCKER_HUB_API = "registry-1.docker.io"  # ... and where its v2 API answers
ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
TIMEOUT = 30
_LOOPBACK = re.compile(r"^(localhost|127\.\d+\.\d+\.\d+|\[::1\])(:\d+)?$")


class ImageRef(Record):
    registry: str  # docker.io, nvcr.io, 127.0.0.1:5000 ...
    repository: str  # library/ubuntu, nvidia/cuda
    reference: str  # ":tag" or "@sha256:..."

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}{self.reference}"


class ImageDigest(Record):
    digest: str
    media_type: str


def parse_image(ref: str) -> ImageRef:
    """Docker's reference rules: a first component with '.' or ':' (or localhost) is a registry."""
    name, reference = ref, ":latest"
    if "@" in ref:
        name, digest_ = ref.split("@", 1)
        reference = "@" + digest_
    else:
        last = ref.rsplit("/", 1)[-1]
        if ":" in last:
            name, tag = ref.rsplit(":", 1)
            reference = ":" + tag
    first, _, rest = name.partition("/")
    if rest and is_registry_host(first):
        registry, repository = first, rest
    else:
        registry, repository = DOCKER_HUB, name
    if registry in ("index.docker.io", DOCKER_HUB_API):
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in repository:
        repository = "library/" + repository
    return ImageRef(registry, repository, reference)


def is_registry_host(component: str) -> bool:
    """Docker's rule for a reference's first component (before a '/'): a registry host when it
    holds a '.' or a ':', or is localhost; else part of the repository (on Docker Hub)."""
    return "." in component or ":" in component or component == "localhost"


def is_loopback(endpoint: str) -> bool:
    """Whether a registry endpoint, image reference or URL names a host on this machine (spoken
    to over plain HTTP, as the docker daemon allows for 127.0.0.0/8)."""
    return bool(_LOOPBACK.match(endpoint.split("://", 1)[-1].split("/", 1)[0]))


def endpoint_url(endpoint: str) -> str:
    """The base URL of a registry endpoint: plain http on loopback, https elsewhere."""
    if endpoint.startswith(("http://", "https://")):
        return endpoint.rstrip("/")
    return ("http://" if is_loopback(endpoint) else "https://") + endpoint.rstrip("/")


def registry_host(endpoint: str) -> str:
    return endpoint.split("://", 1)[-1].rstrip("/")


def api_location(ref: ImageRef, mirror: str | None = None) -> tuple[str, str]:
    """(API base URL, repository there) of `ref`, from its own registry or through `mirror`
    `[SCHEME://]HOST[:PORT][/PREFIX]`, which serves every image under PREFIX/<repository>
    (Docker Hub's official images as library/<name>)."""
    if not mirror:
        host = DOCKER_HUB_API if ref.registry == DOCKER_HUB else ref.registry
        return endpoint_url(host), ref.repository
    scheme, sep, rest = mirror.partition("://")
    if not sep:
        scheme, rest = "", mirror
    host, _, prefix = rest.partition("/")
    base = f"{scheme}://{host}" if scheme else endpoint_url(host)
    prefix = prefix.strip("/")
    return base, f"{prefix}/{ref.repository}" if prefix else ref.repository


def session() -> requests.Session:
    """The registry client's session (net.session): retries what a registry or a network hiccup
    answers for a while (connection errors, 429 with Retry-After, 5xx) on HEAD and GET."""
    from envbuilder.oci import http as net

    return net.session()


def _challenge(header: str) -> dict[str, str]:
    scheme, _, params = header.partition(" ")
    pairs: list[tuple[str, str]] = re.findall(r'(\w+)="([^"]*)"', params)  # (its two groups)
    out = {k.lower(): v for k, v in pairs}
    out["scheme"] = scheme.lower()
    return out


_TOKEN = re.compile(r"[\x21-\x7e]{1,16384}")  # what an Authorization header can carry


def _token(s: requests.Session, challenge: dict[str, str], repository: str, where: str) -> str:
    from envbuilder.oci import http as net

    realm = challenge["realm"]
    params = {"scope": challenge.get("scope") or f"repository:{repository}:pull"}
    if challenge.get("service"):
        params["service"] = challenge["service"]
    try:
        r = net.request(s, "GET", realm, net.TOKEN, params=params, timeout=TIMEOUT)
    except net.NetError as e:
        raise ActionError(
            f"Cannot get a token from the token service {net.redact(realm)} of "
            f"{where}: {e.reason}. Use a mirror that answers."
        ) from None
    if r.status != 200:
        raise ActionError(
            f"The token service {net.redact(realm)} refused an anonymous token for "
            f"{repository} (HTTP {r.status}); the image may be private."
        )
    try:
        body = net.json_object(r.body, realm, "a token")
    except net.BadAnswer as e:
        raise ActionError(
            f"The token service {e.url} of {where} {e.detail}. Check the network "
            "(sign in to a captive portal, or set HTTPS_PROXY), the registry or "
            "the mirror."
        ) from None
    token = body.get("token") or body.get("access_token")
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        got = "no token" if not token else f"{net.kind_of(token)} that is no token"
        raise ActionError(
            f"The token service {net.redact(realm)} of {where} answered {got} (a "
            "JSON object with a `token` string is what registries send). Check the "
            "registry or mirror, or use another."
        )
    return token


def digest(ref: str, mirror: str | None = None, s: requests.Session | None = None) -> ImageDigest:
    """The digest `ref`'s tag points at now, read from its registry (or `mirror`). ActionError
    says what the registry answered and what to do."""
    own = s is None
    s = s or session()
    try:
        return _digest(ref, mirror, s)
    finally:
        if own:
            s.close()


def _digest(ref: str, mirror: str | None, s: requests.Session) -> ImageDigest:
    from envbuilder.oci import http as net

    parsed = parse_image(ref)
    base, repository = api_location(parsed, mirror)
    url = f"{base}/v2/{repository}/manifests/{parsed.reference[1:]}"
    what = f"{repository}{parsed.reference}"
    shown = net.redact(base)
    headers = {"Accept": ACCEPT}

    def request(method: str) -> net.Answer:
        try:
            return net.request(s, method, url, net.MANIFEST, headers=headers, timeout=TIMEOUT)
        except net.NetError as e:
            if e.kind == "too-large":
                raise ActionError(
                    f"Reading the manifest of {ref} from the registry {shown}: it "
                    f"{e.reason}. A manifest is a few KB; check the registry or "
                    "mirror."
                ) from None
            raise ActionError(
                f"Cannot reach the registry {shown} for {ref}: {e.reason}. "
                "Check the network, or use a mirror that answers."
            ) from None

    r = request("HEAD")
    if r.status == 401:
        ch = _challenge(r.headers.get("WWW-Authenticate", ""))
        if ch["scheme"] != "bearer" or "realm" not in ch:
            asked = net.redact(r.headers.get("WWW-Authenticate", "no challenge"))[:200]
            raise ActionError(
                f"The registry {shown} wants credentials for {repository} "
                f"({asked}); envbuild reads public images anonymously only. Use a "
                "mirror that serves it."
            )
        headers["Authorization"] = f"Bearer {_token(s, ch, repository, shown)}"
        r = request("HEAD")
    if r.status == 404:
        raise ActionError(
            f"The registry {shown} has no manifest for {what} ({ref}). Check the "
            "tag, or that the mirror carries the image."
        )
    if r.status == 429:
        raise ActionError(
            f"The registry {shown} rate-limits this address (HTTP 429 "
            "toomanyrequests). Wait, or use a mirror."
        )
    if r.status != 200:
        raise ActionError(f"The registry {shown} answered HTTP {r.status} for {what}.")
    found = r.headers.get("Docker-Content-Digest")
    media_type = r.headers.get("Content-Type", "").split(";")[0].strip()
    if not found:  # some registries send the digest only with the body: hash it ourselves
        r = request("GET")
        if r.status != 200:
            raise ActionError(f"The registry {shown} answered HTTP {r.status} for {what}.")
        found = "sha256:" + hashlib.sha256(r.body).hexdigest()
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", found):
        raise ActionError(f"The registry {shown} gave {found[:100]!r} as the digest of {ref}.")
    return ImageDigest(found, media_type[:200])


def check_registry(registry: str, option: str, undone: str) -> None:
    """ActionError (exit 1) unless `registry` answers /v2/ as a container registry (by its
    status: the body is not read). `option`: the flag that named it (--push, --registry);
    `undone`: what therefore did not happen."""
    from envbuilder.oci import http as net

    with net.session(retries=0) as s:
        try:
            r = net.request(s, "GET", endpoint_url(registry) + "/v2/", net.REGISTRY_ROOT, timeout=10)
        except net.NetError as e:
            raise ActionError(
                f"Registry {net.redact(registry)} is unreachable ({e.reason}). "
                f"Start it or fix {option} (`local`, a name from your config's "
                f"`registries:`, or HOST[:PORT]); {undone}."
            ) from None
    if r.status not in (200, 401):
        raise ActionError(
            f"{net.redact(registry)} answered HTTP {r.status} to /v2/: not a "
            f"container registry. Check {option}; {undone}."
        )


def check_served(reference: str, want: str, after: str, what: str) -> None:
    """ActionError (exit 1) unless the registry now serves `reference` with digest `want`.
    `after`/`what`: the action that put it there ("pushing"/"push", "loading"/"import")."""
    try:
        served = digest(reference).digest
    except ActionError as e:
        served = f"nothing: {e}"
    if served != want:
        raise ActionError(
            f"After {after}, {reference} is not served with digest {want} (the "
            f"registry serves {served}). The {what} is not complete; run again."
        )


# -- an image's layers (envbuild diagnose --image) ------------------------------------------------

LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar", "application/vnd.docker.image.rootfs.diff.tar")
MAX_LAYER = 64 << 30  # (a CUDA devel base's largest layer is ~4 GiB)


class Layer(Record):
    digest: str
    size: int
    media_type: str


def _get(
    s: requests.Session,
    url: str,
    expect: Expect,
    headers: dict[str, str],
    repository: str,
    shown: str,
    too_large: str | None = None,
    sink: Callable[[bytes], object] | None = None,
    body_if: Callable[[int], bool] | None = None,
) -> Answer:
    """GET `url`, with an anonymous token where the registry answers 401 with a Bearer challenge.
    `too_large`: the message for a body over `expect`'s cap (else the network's)."""
    from envbuilder.oci import http as net

    try:
        r = net.request(s, "GET", url, expect, headers=headers, timeout=TIMEOUT, sink=sink, body_if=body_if)
        if r.status == 401:
            ch = _challenge(r.headers.get("WWW-Authenticate", ""))
            if ch["scheme"] != "bearer" or "realm" not in ch:
                raise ActionError(
                    f"The registry {shown} wants credentials for {repository}; envbuild reads "
                    "public images anonymously only. Use a mirror that serves it."
                )
            headers["Authorization"] = f"Bearer {_token(s, ch, repository, shown)}"
            r = net.request(
                s, "GET", url, expect, headers=headers, timeout=TIMEOUT, sink=sink, body_if=body_if
            )
    except net.NetError as e:
        if too_large is not None and e.kind == "too-large":
            raise ActionError(too_large) from None
        raise ActionError(f"Cannot read {url} from the registry {shown}: {e.reason}.") from None
    return r


def _objects(value: object) -> list[dict[str, object]]:
    """The JSON objects of a manifest's list (`value or []`: what is no object is passed over)."""
    items: list[object] = value if isinstance(value, list) else []
    return [item for item in items if isinstance(item, dict)]


def _field(doc: dict[str, object], key: str, inner: str) -> object:
    """doc[key][inner] of a JSON object; None where doc[key] is no object or has no `inner`."""
    part = doc.get(key)
    fields: dict[object, object] = part if isinstance(part, dict) else {}
    return fields.get(inner)


def image_layers(ref: str, s: requests.Session, platform: str = "linux/amd64") -> tuple[str, list[Layer]]:
    """The manifest digest of `ref` for `platform` (an index's child) and its layers in order."""
    from envbuilder.oci import http as net

    parsed = parse_image(ref)
    base, repository = api_location(parsed)
    shown = net.redact(base)
    headers = {"Accept": ACCEPT}
    reference = parsed.reference[1:]
    for _ in range(2):  # (an index, then the platform's manifest)
        url = f"{base}/v2/{repository}/manifests/{reference}"
        r = _get(s, url, net.MANIFEST, headers, repository, shown)
        if r.status != 200:
            raise ActionError(
                f"The registry {shown} answered HTTP {r.status} for {repository}:{reference} ({ref})."
            )
        try:
            doc = net.json_object(r.body, url, "a manifest")
        except net.BadAnswer as e:
            raise ActionError(f"The manifest of {ref} at {e.url} {e.detail}.") from None
        found = "sha256:" + hashlib.sha256(r.body).hexdigest()
        if "manifests" in doc:
            os_, _, arch = platform.partition("/")
            child = next(
                (
                    c
                    for c in _objects(doc.get("manifests"))
                    if (_field(c, "platform", "os"), _field(c, "platform", "architecture")) == (os_, arch)
                ),
                None,
            )
            if child is None or not re.fullmatch(r"sha256:[0-9a-f]{64}", str(child.get("digest"))):
                raise ActionError(f"{ref} has no {platform} image in its index.")
            reference = str(child["digest"])
            continue
        layers = []
        for entry in _objects(doc.get("layers")):
            digest_, size, media = entry.get("digest"), entry.get("size"), str(entry.get("mediaType", ""))
            if not isinstance(digest_, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest_):
                raise ActionError(
                    f"The manifest of {ref} names a layer {str(digest_)[:80]!r} that is no sha256 digest."
                )
            if not isinstance(size, int) or not 0 <= size <= MAX_LAYER or not media.startswith(LAYER_TYPES):
                raise ActionError(
                    f"The manifest of {ref} declares layer {digest_} as {str(media)[:80]!r} of "
                    f"{str(size)[:20]} bytes: envbuild reads tar layers up to {MAX_LAYER >> 30} GiB."
                )
            layers.append(Layer(digest_, size, media))
        return found, layers
    raise ActionError(f"{ref}: an index inside an index; envbuild reads one level.")


def fetch_layer(ref: str, layer: Layer, s: requests.Session, sink: Callable[[bytes], object]) -> None:
    """Stream `layer`'s blob into `sink`, at most its declared size, and check that its bytes
    are that size and hash to its digest: ActionError naming the layer where they do not (a
    registry serving a damaged or replaced blob, a manifest that declares another size)."""
    from envbuilder.oci import http as net

    parsed = parse_image(ref)
    base, repository = api_location(parsed)
    shown = net.redact(base)
    h = hashlib.sha256()
    served = [0]

    def take(chunk: bytes) -> None:
        h.update(chunk)
        served[0] += len(chunk)
        sink(chunk)

    def mismatch(size: str) -> str:
        return (
            f"Layer {layer.digest} of {ref}, as the registry {shown} serves it, is {size} its manifest "
            "declares: the manifest and the layer do not match (an engine's pull refuses it too). "
            "Nothing of the image was judged. Push the image again (or pull it from a registry "
            "that serves it whole)."
        )

    expect = net.Expect(f"layer {layer.digest}", max(layer.size, 1), 3600.0)
    url = f"{base}/v2/{repository}/blobs/{layer.digest}"
    r = _get(
        s,
        url,
        expect,
        {},
        repository,
        shown,
        too_large=mismatch(f"more than the {layer.size} bytes"),
        sink=take,
        body_if=lambda status: status == 200,
    )
    if r.status != 200:
        raise ActionError(f"The registry {shown} answered HTTP {r.status} for layer {layer.digest} of {ref}.")
    if served[0] != layer.size:
        raise ActionError(mismatch(f"{served[0]} bytes, not the {layer.size}"))
    got = "sha256:" + h.hexdigest()
    if got != layer.digest:
        raise ActionError(
            f"Layer {layer.digest} of {ref}, as the registry {shown} serves it, hashes to {got}: its "
            "bytes are not the layer the manifest names (a damaged or replaced blob). Nothing of the "
            "image was judged. Push the image again (or pull it from a registry that serves it whole)."
        )
