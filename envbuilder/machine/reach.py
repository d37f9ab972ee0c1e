"""What a profile's build fetches over the network, probed in parallel before any build step, so a
build that cannot work fails in seconds, naming what does not answer and the way around it,
rather than minutes in with "Fix the error above".

The endpoints are those of the rendered files: the base images' registries, the Python index, the
PyTorch index where the profile installs a +cuXXX torch, GitHub where the builder fetches apex's or
flash-attn's release files, and the registry a build pushes to. A wheelhouse build needs no index
and no GitHub."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envbuilder.model.resolved import ResolvedEnv
    from envbuilder.oci.probe import Probe

from typing import Any, Callable, Mapping

from envbuilder.oci.registry import DOCKER_HUB, DOCKER_HUB_API, parse_image
from envbuilder.record import Record


class Finding(Record):
    what: str  # the endpoint, and what the build needs it for
    why: str  # what the probe met
    fix: str


def needs(
    env: ResolvedEnv,
    wheelhouse: bool = False,
    push: str | None = None,
    upstream: bool = True,
    credentials: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The endpoints the build of `env` fetches from (and pushes to), in the shape of a mirror set
    (oci/probe.run of mirrors.probe_jobs): the indexes and GitHub as `env`'s files name them (with
    a mirror set applied, its endpoints, and the upstream ones for what the set has none of).
    Not `upstream`: the base images' registries are left out (a mirror set's were picked by
    probing them). `credentials`: {variable: URL with user:password@} (the build's endpoints
    secret), probed with them where `env` names the URL without."""
    from envbuilder.model.mirrors import GITHUB
    from envbuilder.text import without_credentials

    own = {without_credentials(url): url for url in (credentials or {}).values()}
    registries: dict[str, list[str]] = {}
    for ref in sorted(set(env.cuda.images.values())) if upstream else ():
        host = parse_image(ref).registry
        registries.setdefault(host, [DOCKER_HUB_API if host == DOCKER_HUB else host])
    if push:
        registries.setdefault(f"push {push}", [push])
    body: dict[str, Any] = {"registries": registries}
    if not wheelhouse:
        body["pypi"] = [own.get(env.indexes.pypi, env.indexes.pypi)]
        if env.indexes.torch:
            body["pytorch"] = [own.get(env.indexes.torch, env.indexes.torch)]
        fetched = [env.apex.url if env.apex else "", env.flash_attn.release if env.flash_attn else ""]
        # (a mirror set's GitHub prefix was probed with the set)
        if env.needs_builder and any(url.startswith(GITHUB + "/") for url in fetched):
            body["github"] = [GITHUB]
    return body


def _fix(kind: str, target: str, status: str, env: ResolvedEnv, auto: bool = True) -> str:
    """What to do about a target that does not answer; `auto`: the command takes --mirror
    auto (build does; doctor and render take a set's name only)."""
    if status.startswith("TLS"):
        return (
            "this network intercepts TLS: pass its CA bundle with --ca-cert FILE (a BuildKit "
            "secret: it reaches the build's steps, never a layer), or --no-probe if only the "
            "engine trusts it"
        )
    if kind == "registry" and target.startswith("push "):
        return "check the --push registry (a name from your config's `registries:`, or HOST:PORT)"
    if kind == "registry":
        return (
            "pull the base images through a mirror: --mirror NAME (`envbuild mirrors list`)"
            + (" or --mirror auto" if auto else "")
            + f", whose registries stand in for {target}"
        )
    if kind == "pypi":
        return (
            "--mirror NAME with a PyPI endpoint, or build from a wheelhouse (--wheelhouse DIR, "
            "exported by `envbuild wheelhouse` where PyPI answers)"
        )
    if kind == "pytorch":
        return (
            f"--mirror NAME with a PyTorch endpoint, or a wheelhouse; a lock made with "
            f"--torch-from-pypi takes PyPI's build of torch {env.torch.version} instead (PyPI's "
            "CUDA, not the profile's)"
        )
    from envbuilder.model.components.registry import built

    parts = " or ".join(c.name for c in built(env))
    return f"--mirror NAME with a GitHub endpoint, or a wheelhouse (it carries {parts}'s files)" + (
        ", or --without apex" if env.apex else ""
    )


def findings(env: ResolvedEnv, probes: list[Probe], auto: bool = True) -> list[Finding]:
    """Each needed target with no endpoint that answers, with its fix."""
    by_target: dict[tuple[str, str], list[Probe]] = {}
    for p in probes:
        by_target.setdefault((p.kind, p.target), []).append(p)
    out = []
    for (kind, target), ps in sorted(by_target.items()):
        if any(p.ok for p in ps):
            continue
        p = ps[0]
        need = {
            "registry": "the base images" if not target.startswith("push ") else "the push",
            "pypi": "the Python packages",
            "pytorch": f"torch {env.torch.version}+{env.torch.variant}",
            "github": "the builder's source files",
        }.get(kind, kind)
        out.append(Finding(f"{p.endpoint} ({need})", p.status, _fix(kind, target, p.status, env, auto)))
    return out


def check(
    env: ResolvedEnv,
    wheelhouse: bool,
    push: str | None,
    upstream: bool = True,
    probe: Callable[[dict[str, Any]], list[Probe]] | None = None,
    ca_cert: str | os.PathLike[str] | None = None,
    auto: bool = True,
    credentials: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Probe what the build of `env` needs (oci/probe.run: in parallel, 5 s each), trusting
    `ca_cert` (the build's --ca-cert) beside the system's CAs; `auto`: whether the fixes may
    name --mirror auto (only build takes it)."""
    if probe is None:
        from envbuilder.model.mirrors import probe_jobs
        from envbuilder.oci.probe import run

        def probe(body: dict[str, Any]) -> list[Probe]:
            return run(probe_jobs(body), ca_cert=None if ca_cert is None else os.fspath(ca_cert))

    return findings(env, probe(needs(env, wheelhouse, push, upstream, credentials)), auto)


def message(findings_: list[Finding]) -> str:
    lines = [
        "The build would fail: what it fetches does not answer from here (probed before any build step):"
    ]
    for f in findings_:
        lines.append(f"  - {f.what}: {f.why}. Fix: {f.fix}.")
    return "\n".join(lines)
