"""Mirror sets: which endpoint stands in for which upstream; what to probe of them (oci/probe.py probes).

A mirror set is data (matrices/mirrors.yaml plus the user's config). Choosing endpoints makes a
`MirrorChoice` (one endpoint per kind); applying a choice to a resolved environment
(`apply_to_env`) gives the mirrored environment that render, lock and build use: its image
references, indexes, channels and download URLs point at the mirror, without any credentials.
`build` picks each registry endpoint that serves the base images before it builds, and hands the
endpoints that carry credentials to the RUN steps as a BuildKit secret (never a build arg, which
`docker history` shows, nor a file the image carries).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from envbuilder.errors import UserError
from envbuilder.model.components.flash_attn import mirrored_index
from envbuilder.record import Record
from envbuilder.text import USERINFO, redact, without_credentials  # noqa: F401 (re-exported)
from envbuilder.oci.registry import DOCKER_HUB, endpoint_url, parse_image, registry_host

if TYPE_CHECKING:
    from envbuilder.oci.probe import Probe, ProbeJob
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import ResolvedEnv

GITHUB = "https://github.com"  # what a mirror set's `github` prefix replaces (apex, flash-attn)


class MirrorChoice(Record):
    """One endpoint per kind (None: leave that kind as upstream)."""

    name: str
    registries: dict[str, str | None]  # upstream registry -> endpoint host[/prefix]
    pypi: str | None = None
    pytorch: str | None = None
    conda: dict[str, str | None] | None = None
    huggingface: str | None = None
    apt: str | None = None
    github: str | None = None
    # a known flash-attn wheel index (extensions.yaml wheel_indexes) by name -> the prefix its
    # mirror serves the same world tree under (cu130/torch2.11/simple/)
    wheel_indexes: dict[str, str] | None = None

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

    def endpoints(self, env: ResolvedEnv) -> dict[str, str]:
        """The endpoints a build's RUN steps use, by the variable the Dockerfile reads them
        from, as the set names them (credentials included)."""
        out: dict[str, str] = {}
        if self.pypi:
            out["PIP_INDEX_URL"] = self.pypi
        if self.pytorch and env.indexes.torch:
            out["TORCH_INDEX_URL"] = self.pytorch.format(variant=env.torch.variant)
        if self.apt:
            out["APT_MIRROR"] = self.apt
        if self.github and env.apex:
            out["APEX_URL"] = github_url(env.apex.url, self.github)
        if self.github and env.flash_attn:
            out["FLASH_ATTN_RELEASE"] = github_url(env.flash_attn.release, self.github)
        if env.flash_attn and env.flash_attn.index:
            mirrored = mirrored_index(env.flash_attn, self.wheel_indexes)
            if mirrored and mirrored != env.flash_attn.index:
                out["FLASH_ATTN_INDEX"] = mirrored
        return out

    def credentials_env(self, env: ResolvedEnv, skip: tuple[str, ...] = ()) -> str:
        """The endpoints that carry user:password@, as a shell file the image's RUN steps
        source from a BuildKit secret (id=endpoints): the rendered files and the image name
        them without the credentials, and no build arg (which `docker history` shows) holds them."""
        return endpoints_secret(self.endpoints(env), skip)


def redacted(endpoint: str) -> str:
    """An endpoint (or a message naming endpoints) as printed: user:password@ shown as ***@."""
    return redact(endpoint)


# -- credentials from any source -----------------------------------------------------------------
# A URL's user:password@ is a secret wherever it comes from: a mirror set (apply_to_env strips
# it), and as much an overlay's or the config's defaults (pypi_index, huggingface, index_url), a
# `render --from` file, or a hand-edited envbuild.json. No rendered file, envbuild.json, label,
# bake file or definition names it (render.render_files strips every URL of the environment it
# renders, through split_credentials); `envbuild build` hands the ones a RUN step reads to the
# build as the `endpoints` BuildKit secret (endpoints_secret), which envbuild-secrets.sh sources.


def env_endpoints(env: ResolvedEnv) -> dict[str, str]:
    """The URLs of a resolved environment that the rendered files read into a variable, by that
    variable (what the `endpoints` secret may replace for one RUN step)."""
    out = {"PIP_INDEX_URL": env.indexes.pypi, "HF_ENDPOINT": env.huggingface}
    if env.indexes.torch:
        out["TORCH_INDEX_URL"] = env.indexes.torch
    if env.mirror and env.mirror.apt:
        out["APT_MIRROR"] = env.mirror.apt
    if env.apex:
        out["APEX_URL"] = env.apex.url
    if env.flash_attn:
        out["FLASH_ATTN_RELEASE"] = env.flash_attn.release
    if env.flash_attn and env.flash_attn.index:
        out["FLASH_ATTN_INDEX"] = env.flash_attn.index
    return out


def split_credentials(
    env: ResolvedEnv, d: dict[str, Any] | None = None
) -> tuple[ResolvedEnv, dict[str, Any], dict[str, str]]:
    """(the environment with no URL's user:password@ anywhere in it, its to_dict(), and
    {variable: URL with its credentials} of env_endpoints): what the files may name, and what
    only the `endpoints` secret may carry. `d`: env.to_dict(), if at hand."""
    plain: dict[str, object] = env.to_dict() if d is None else d
    bare = {k: _without_userinfo(v) for k, v in plain.items()}
    if bare == plain:
        return env, plain, {}
    secret = {var: url for var, url in env_endpoints(env).items() if url and url != without_credentials(url)}
    return type(env).from_plain(bare), bare, secret


def _without_userinfo(node: object) -> object:
    if isinstance(node, str):
        return without_credentials(node) if "@" in node else node
    if isinstance(node, dict):
        entries: dict[object, object] = node
        return {k: _without_userinfo(v) for k, v in entries.items()}
    if isinstance(node, (list, tuple)):
        items: list[object] | tuple[object, ...] = node
        return [_without_userinfo(v) for v in items]
    return node


def endpoints_secret(endpoints: dict[str, str], skip: tuple[str, ...] = ()) -> str:
    """The `endpoints` secret's text: an `export VAR='URL'` line for each endpoint that carries
    user:password@ (the others are the rendered files' own defaults), `skip` left out."""
    import shlex

    return "".join(
        f"export {var}={shlex.quote(url)}\n"
        for var, url in sorted(endpoints.items())
        if var not in skip and url and url != without_credentials(url)
    )


def github_url(url: str, prefix: str | None) -> str:
    """`url` (https://github.com/...) through a GitHub mirror prefix; unchanged without one."""
    return url.replace(GITHUB, prefix.rstrip("/"), 1) if prefix else url


def apply_to_env(env: ResolvedEnv, mirror: MirrorChoice) -> ResolvedEnv:
    """The resolved environment with every upstream endpoint replaced by the mirror's: base
    images, the PyPI and PyTorch indexes, the Hugging Face endpoint, the conda channels, the apex
    source URL, flash-attn's release folder and an apt mirror. Rendering it gives files whose
    defaults already point at the mirror (build args can still override them)."""
    from envbuilder.model.resolved import Mirror

    # every endpoint without its credentials: what the files (and the image's envbuild.json)
    # name; `envbuild build` hands the credentials to RUN steps as a secret (credentials_env)
    bare = without_credentials
    images = MappingProxyType({role: mirror.image(ref) for role, ref in env.cuda.images.items()})
    indexes, torch = env.indexes, env.torch
    if mirror.pypi:
        indexes = indexes._replace(pypi=bare(mirror.pypi))
    if mirror.pytorch and indexes.torch:
        url = bare(mirror.pytorch.format(variant=torch.variant))
        indexes, torch = indexes._replace(torch=url), torch._replace(index_url=url)
    conda = {ch: bare(url) for ch, url in (mirror.conda or {}).items() if url}
    apex, fa = env.apex, env.flash_attn
    if apex and mirror.github:
        apex = apex._replace(url=bare(github_url(apex.url, mirror.github)))
    if fa and mirror.github:
        fa = fa._replace(release=bare(github_url(fa.release, mirror.github)))
    if fa and fa.index and mirror.wheel_indexes:
        fa = fa._replace(index=bare(mirrored_index(fa, mirror.wheel_indexes) or fa.index))
    return env._replace(
        cuda=env.cuda._replace(images=images),
        indexes=indexes,
        torch=torch,
        huggingface=bare(mirror.huggingface) if mirror.huggingface else env.huggingface,
        conda_channels=tuple(conda.get(ch) or ch for ch in env.conda_channels),
        apex=apex,
        flash_attn=fa,
        mirror=Mirror(
            name=mirror.name,
            apt=bare(mirror.apt) if mirror.apt else mirror.apt,
            conda_nvidia=conda.get("nvidia"),
        ),
    )


def mirror_sets(m: Matrix) -> dict[str, dict[str, Any]]:
    """The mirror sets by name (matrix_schema.MIRROR each): the user's config's, then the
    matrix's. (Typed Any for callers that read a set's lists as the schema checked them.)"""
    from envbuilder.model.config import user_config

    sets = dict(user_config().get("mirrors") or {})
    matrix_sets: Mapping[str, dict[str, object]] = m.mirrors or {}
    for name, body in matrix_sets.items():
        sets.setdefault(name, body)
    return sets


def get_set(m: Matrix, name: str) -> dict[str, Any]:
    sets = mirror_sets(m)
    if name not in sets:
        from envbuilder.model.names import suggest

        raise UserError(
            f"Unknown mirror set {name!r}; {suggest(name, list(sets))}known: "
            f"{', '.join(sets)}. `envbuild mirrors list` shows them; add your own in "
            "your config file."
        )
    return sets[name]


# A mirror set's body as the schema checked it (matrix_schema.MIRROR): a kind's endpoints, a
# list of strings; the registries, conda channels and wheel indexes, such lists by name.
def endpoints_of(body: Mapping[str, object], kind: str) -> list[str]:
    """The endpoints a set lists for `kind` (pypi, pytorch, huggingface, apt, github)."""
    listed = body.get(kind) or []
    return [e for e in listed if isinstance(e, str)] if isinstance(listed, list) else []


def endpoints_by_name(body: Mapping[str, object], kind: str) -> dict[str, list[str]]:
    """The endpoints a set lists by name for `kind` (registries, conda, wheel_indexes)."""
    named = body.get(kind) or {}
    if not isinstance(named, dict):
        return {}
    lists: dict[str, object] = named
    return {k: endpoints_of(lists, k) for k in lists}


def choice(
    name: str, body: Mapping[str, object], healthy: Mapping[str, tuple[bool, float]] | None = None
) -> MirrorChoice:
    """The first endpoint of every kind (answering ones first when `healthy` is given)."""

    def pick(endpoints: list[str]) -> str | None:
        if not endpoints:
            return None
        return (order_by_health(endpoints, healthy) if healthy is not None else list(endpoints))[0]

    registries = {reg: pick(eps) for reg, eps in endpoints_by_name(body, "registries").items()}
    conda = {ch: pick(eps) for ch, eps in endpoints_by_name(body, "conda").items()}
    indexes = endpoints_by_name(body, "wheel_indexes")
    return MirrorChoice(
        name,
        registries,
        pick(endpoints_of(body, "pypi")),
        pick(endpoints_of(body, "pytorch")),
        conda or None,
        pick(endpoints_of(body, "huggingface")),
        pick(endpoints_of(body, "apt")),
        pick(endpoints_of(body, "github")),
        {name: p for name, eps in indexes.items() if (p := pick(eps))} or None,
    )


def order_by_health(endpoints: list[str], healthy: Mapping[str, tuple[bool, float]]) -> list[str]:
    """Healthy endpoints first, then the rest; each group in its listed order."""
    up = [e for e in endpoints if healthy.get(e, (False, 0))[0]]
    return up + [e for e in endpoints if e not in up]


# -- probing: which endpoints to probe and how an answer counts (data); oci/probe.py sends them --


def probe_jobs(body: Mapping[str, object], kinds: tuple[str, ...] | None = None) -> list[ProbeJob]:
    """Every endpoint of a mirror set as a probe (oci/probe.run sends them): a registry's /v2/
    (200, or 401 asking for credentials, is alive), an index, channel or download prefix's own
    URL (any 2xx or 3xx); `kinds`: only these kinds."""
    from envbuilder.oci.probe import ProbeJob

    listed = []
    for reg, eps in endpoints_by_name(body, "registries").items():
        listed += [("registry", reg, e) for e in eps]
    for kind in ("pypi", "pytorch", "huggingface", "apt", "github"):
        listed += [(kind, kind, e) for e in endpoints_of(body, kind)]
    for ch, eps in endpoints_by_name(body, "conda").items():
        listed += [("conda", ch, e) for e in eps]
    jobs = []
    for kind, target, endpoint in listed:
        if kinds and kind not in kinds:
            continue
        if kind == "registry":
            parts = endpoint_url(endpoint).split("/", 3)
            jobs.append(ProbeJob(kind, target, endpoint, "/".join(parts[:3]) + "/v2/", (200, 401)))
        else:
            url = endpoint.format(variant="cu118") if "{variant}" in endpoint else endpoint
            jobs.append(ProbeJob(kind, target, endpoint, url.rstrip("/") + "/", tuple(range(200, 400))))
    return jobs


def health(probes: list[Probe]) -> dict[str, tuple[bool, float]]:
    return {p.endpoint: (p.ok, p.latency_ms) for p in probes}


def redacted_sets(sets: Mapping[str, Mapping[str, object]]) -> dict[str, dict[str, object]]:
    """Mirror sets (as mirror_sets gives them) with every endpoint's user:password@ as ***@,
    as `mirrors list` shows them, in text and in JSON."""
    import json

    out: dict[str, dict[str, object]] = json.loads(redacted(json.dumps(sets)))  # (sets, redacted)
    return out


def sets_lines(sets: Mapping[str, Mapping[str, object]]) -> list[str]:
    """`envbuild mirrors list`'s text: each set, what it rewrites and to which endpoints
    (`sets` as mirror_sets gives them; a credential is shown as ***@, as every log shows it)."""
    out = []
    for name, body in redacted_sets(sets).items():
        out.append(f"{name}: {body.get('description', '')}")
        for reg, eps in sorted(endpoints_by_name(body, "registries").items()):
            out.append(f"  {reg:<22} -> {', '.join(eps)}")
        for kind in ("pypi", "pytorch", "huggingface", "apt", "github"):
            if body.get(kind):
                out.append(f"  {kind:<22} -> {', '.join(endpoints_of(body, kind))}")
        for ch, eps in sorted(endpoints_by_name(body, "conda").items()):
            out.append(f"  conda:{ch:<16} -> {', '.join(eps)}")
        for idx, eps in sorted(endpoints_by_name(body, "wheel_indexes").items()):
            out.append(f"  index:{idx:<16} -> {', '.join(eps)}")
    return out


def probe_table(probes: list[Probe]) -> list[str]:
    """`envbuild mirrors probe`'s table: kind, what for, the endpoint (credentials as ***@),
    ok or DOWN with why, and the latency, in aligned columns."""
    rows = [("KIND", "FOR", "ENDPOINT", "STATUS", "MS")]
    rows += [
        (
            p.kind,
            p.target,
            redacted(p.endpoint),
            ("ok " if p.ok else "DOWN ") + p.status,
            f"{p.latency_ms:.0f}",
        )
        for p in probes
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
