"""Mirror sets: rewrite image references, index URLs and endpoints; probe endpoint health.

A Mirror is data (matrices/mirrors.yaml plus the user's config). Choosing an endpoint makes a
`MirrorChoice` (one endpoint per kind); applying a choice rewrites a rendered Dockerfile's image
references and yields the build args (indexes, HF endpoint, apex URL, apt mirror).
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from .errors import UserError

DOCKER_HUB = "docker.io"
GITHUB = "https://github.com"  # what a mirror set's `github` prefix replaces (apex, flash-attn)
_LOOPBACK = re.compile(r"^(localhost|127\.\d+\.\d+\.\d+|\[::1\])(:\d+)?$")


class ImageRef(NamedTuple):
    registry: str  # docker.io, nvcr.io, 127.0.0.1:5000 ...
    repository: str  # library/ubuntu, nvidia/cuda
    reference: str  # ":tag" or "@sha256:..."

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}{self.reference}"


def parse_image(ref: str) -> ImageRef:
    """Docker's reference rules: a first component with '.' or ':' (or localhost) is a registry."""
    name, reference = ref, ":latest"
    if "@" in ref:
        name, digest = ref.split("@", 1)
        reference = "@" + digest
    else:
        last = ref.rsplit("/", 1)[-1]
        if ":" in last:
            name, tag = ref.rsplit(":", 1)
            reference = ":" + tag
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = DOCKER_HUB, name
    if registry in ("index.docker.io", "registry-1.docker.io"):
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in repository:
        repository = "library/" + repository
    return ImageRef(registry, repository, reference)


def endpoint_url(endpoint: str) -> str:
    """The base URL of a registry endpoint: plain http on loopback, https elsewhere."""
    if endpoint.startswith(("http://", "https://")):
        return endpoint.rstrip("/")
    host = endpoint.split("/", 1)[0]
    return ("http://" if _LOOPBACK.match(host) else "https://") + endpoint.rstrip("/")


def registry_host(endpoint: str) -> str:
    return endpoint.split("://", 1)[-1].rstrip("/")


class MirrorChoice(NamedTuple):
    """One endpoint per kind (None: leave that kind as upstream)."""

    name: str
    registries: dict  # upstream registry -> endpoint host[/prefix]
    pypi: str | None = None
    pytorch: str | None = None
    conda: dict | None = None
    huggingface: str | None = None
    apt: str | None = None
    github: str | None = None

    def image(self, ref: str) -> str:
        parsed = parse_image(ref)
        target = self.registries.get(parsed.registry)
        if not target:
            return ref
        host = registry_host(target)
        repository = parsed.repository
        if host.split("/")[0] in ("registry-1.docker.io",) and parsed.registry == DOCKER_HUB:
            return ref
        return f"{host}/{repository}{parsed.reference}"

    def build_args(self, d: dict) -> dict[str, str]:
        """Build args that point the rendered Dockerfile at this choice's endpoints."""
        args = {}
        if self.pypi:
            args["PIP_INDEX_URL"] = self.pypi
        if self.pytorch and d["indexes"].get("torch"):
            args["TORCH_INDEX_URL"] = self.pytorch.format(variant=d["torch"]["variant"])
        if self.huggingface:
            args["HF_ENDPOINT"] = self.huggingface
        if self.apt:
            args["APT_MIRROR"] = self.apt
        if self.github and d.get("apex"):
            args["APEX_URL"] = github_url(d["apex"]["url"], self.github)
        if self.github and d.get("flash_attn"):  # an ARG of the builder stage only: not in history
            args["FLASH_ATTN_RELEASE"] = github_url(d["flash_attn"]["release"], self.github)
        return args


USERINFO = re.compile(r"(://)[^/@\s]*@")  # user:password@ in a URL


def redacted(endpoint: str) -> str:
    """An endpoint as printed: user:password@ (a mirror's credentials) shown as ***@."""
    return USERINFO.sub(r"\1***@", endpoint)


def github_url(url: str, prefix: str | None) -> str:
    """`url` (https://github.com/...) through a GitHub mirror prefix; unchanged without one."""
    return url.replace(GITHUB, prefix.rstrip("/"), 1) if prefix else url


def apply_to_env(env, mirror: MirrorChoice):
    """The resolved environment with every upstream endpoint replaced by the mirror's: base
    images, the PyPI and PyTorch indexes, the Hugging Face endpoint, the conda channels, the apex
    source URL, flash-attn's release folder and an apt mirror. Rendering it gives files whose defaults already point at the
    mirror (build args can still override them)."""
    import copy

    from .resolve import ResolvedEnv

    d = copy.deepcopy(env.data)
    d["cuda"]["images"] = {role: mirror.image(ref) for role, ref in d["cuda"]["images"].items()}
    if mirror.pypi:
        d["indexes"]["pypi"] = mirror.pypi
    if mirror.pytorch and d["indexes"]["torch"]:
        d["indexes"]["torch"] = d["torch"]["index_url"] = mirror.pytorch.format(variant=d["torch"]["variant"])
    if mirror.huggingface:
        d["huggingface"] = mirror.huggingface
    conda = mirror.conda or {}
    d["conda_channels"] = [conda.get(ch) or ch for ch in d["conda_channels"]]
    if d.get("apex") and mirror.github:
        d["apex"]["url"] = github_url(d["apex"]["url"], mirror.github)
    if d.get("flash_attn") and mirror.github:
        d["flash_attn"]["release"] = github_url(d["flash_attn"]["release"], mirror.github)
    d["mirror"] = {"name": mirror.name, "apt": mirror.apt, "conda_nvidia": conda.get("nvidia")}
    return ResolvedEnv(d)


def mirror_sets(m) -> dict[str, dict]:
    from .config import user_config

    sets = dict(user_config().get("mirrors") or {})
    for name, body in (m.mirrors or {}).items():
        sets.setdefault(name, body)
    return sets


def get_set(m, name: str) -> dict:
    sets = mirror_sets(m)
    if name not in sets:
        from .resolve import suggest

        raise UserError(f"Unknown mirror set {name!r}; {suggest(name, list(sets))}known: "
                        f"{', '.join(sets)}. `envbuild mirrors list` shows them; add your own in "
                        "your config file.")
    return sets[name]


def choice(name: str, body: dict, index: int = 0, healthy: dict | None = None) -> MirrorChoice:
    """The `index`-th endpoint of every registry (healthy ones first when `healthy` is given)."""

    def pick(endpoints):
        if not endpoints:
            return None
        ordered = order_by_health(endpoints, healthy) if healthy is not None else list(endpoints)
        return ordered[min(index, len(ordered) - 1)]

    registries = {reg: pick(eps) for reg, eps in (body.get("registries") or {}).items()}
    conda = {ch: pick(eps) for ch, eps in (body.get("conda") or {}).items()}
    return MirrorChoice(name, registries, pick(body.get("pypi")), pick(body.get("pytorch")),
                        conda or None, pick(body.get("huggingface")), pick(body.get("apt")),
                        pick(body.get("github")))


def order_by_health(endpoints: list[str], healthy: dict) -> list[str]:
    """Healthy endpoints first, then the rest; each group in its listed order."""
    up = [e for e in endpoints if healthy.get(e, (False, 0))[0]]
    return up + [e for e in endpoints if e not in up]


def registry_attempts(body: dict) -> int:
    """How many endpoints a build may try: the longest registry list of the set."""
    return max([len(v) for v in (body.get("registries") or {}).values()] or [1])


# -- rewriting a Dockerfile -------------------------------------------------------------------

_FROM = re.compile(r"^(\s*FROM\s+(?:--platform=\S+\s+)?)(\S+)(.*)$", re.I)
_ARG = re.compile(r"^(\s*ARG\s+)(BASE_\w+|\w+_IMAGE)=(\S+)\s*$", re.I)
_FROM_FLAG = re.compile(r"((?:COPY|--mount=\S*?)[ ,]?--?from=|,from=)([^\s,]+)", re.I)


def rewrite_dockerfile(text: str, mirror: MirrorChoice) -> str:
    """Point every image reference (FROM, image ARG defaults, COPY --from, mount from=) at the
    mirror; stage names and ${VAR} references stay as they are."""
    stages = {m.group(1).lower() for m in re.finditer(r"^\s*FROM\s+\S+\s+AS\s+(\S+)", text, re.I | re.M)}

    def image(ref: str) -> str:
        if "$" in ref or ref.lower() in stages or ref == "scratch":
            return ref
        return mirror.image(ref)

    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        nl = line[len(body):]
        m = _FROM.match(body)
        if m:
            body = m.group(1) + image(m.group(2)) + m.group(3)
        else:
            m = _ARG.match(body)
            if m:
                body = f"{m.group(1)}{m.group(2)}={image(m.group(3))}"
            else:
                body = _FROM_FLAG.sub(lambda mm: mm.group(1) + image(mm.group(2)), body)
        out.append(body + nl)
    return "".join(out)


# -- probing ------------------------------------------------------------------------------------

class Probe(NamedTuple):
    kind: str
    target: str  # what it stands in for (docker.io, pypi, ...)
    endpoint: str
    ok: bool
    status: str
    latency_ms: float


def _probe_one(kind: str, target: str, endpoint: str, timeout: float) -> Probe:
    import requests

    if kind == "registry":
        url = endpoint_url(endpoint).split("/", 3)
        url = "/".join(url[:3]) + "/v2/"
        alive = (200, 401)
    else:
        url = endpoint.format(variant="cu118") if "{variant}" in endpoint else endpoint
        url = url.rstrip("/") + "/"
        alive = tuple(range(200, 400))
    start = time.perf_counter()
    try:
        r = requests.get(url, timeout=timeout, allow_redirects=True, stream=True)
        r.close()
        ms = (time.perf_counter() - start) * 1000
        return Probe(kind, target, endpoint, r.status_code in alive, f"HTTP {r.status_code}", ms)
    except requests.RequestException as e:
        ms = (time.perf_counter() - start) * 1000
        reason = type(e).__name__
        if isinstance(e, requests.ConnectionError):
            reason = "connection refused/unreachable"
        elif isinstance(e, requests.Timeout):
            reason = f"timeout after {timeout:g}s"
        return Probe(kind, target, endpoint, False, reason, ms)


def probe(body: dict, timeout: float = 5.0, kinds: tuple[str, ...] | None = None) -> list[Probe]:
    """Every endpoint of a mirror set, in parallel."""
    jobs = []
    for reg, eps in (body.get("registries") or {}).items():
        jobs += [("registry", reg, e) for e in eps]
    for kind in ("pypi", "pytorch", "huggingface", "apt", "github"):
        jobs += [(kind, kind, e) for e in body.get(kind) or []]
    for ch, eps in (body.get("conda") or {}).items():
        jobs += [("conda", ch, e) for e in eps]
    if kinds:
        jobs = [j for j in jobs if j[0] in kinds]
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(jobs))) as pool:
        return list(pool.map(lambda j: _probe_one(*j, timeout), jobs))


def health(probes: list[Probe]) -> dict:
    return {p.endpoint: (p.ok, p.latency_ms) for p in probes}
