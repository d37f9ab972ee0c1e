"""The profile matrix as one `docker-bake.hcl`: BuildKit's own way to build many images at once,
on any builder (local, a Kubernetes or cloud builder), with a registry cache.

`envbuild bake` renders each profile's build context into DIR/<profile>/ (the same files
`envbuild build` builds) and writes DIR/docker-bake.hcl: a target per profile (its context,
build args, tags, registry cache-from/cache-to, labels), a `default` group of them all, and
variables a team overrides on the command line (`REGISTRY=... docker buildx bake`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypedDict

from envbuilder.record import Record
from envbuilder.render.image import LABEL
from envbuilder.render.image import default_tag  # (a target is tagged as `envbuild build` tags)

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import Overrides, ResolvedEnv

BAKE_FILE = "docker-bake.hcl"


class Target(TypedDict):
    """One profile's target in the bake file (bake_target)."""

    name: str
    context: str
    platforms: list[str]
    args: dict[str, str]
    tags: list[str]
    cache_ref: str
    labels: dict[str, str]


def hcl_string(value: str) -> str:
    """A value as an HCL string literal. JSON's escapes are HCL's; `${` and `%{` start
    templates in HCL, so they are doubled to stay literal."""
    return json.dumps(str(value)).replace("${", "$${").replace("%{", "%%{")


def target_args(env: ResolvedEnv) -> dict[str, str]:
    """Build args of a profile's target: where its steps fetch from (what the rendered
    Dockerfile's ARGs default to, mirror applied), and the compile parallelism."""
    args = {
        "PIP_INDEX_URL": "${PIP_INDEX_URL}",
        "HF_ENDPOINT": "${HF_ENDPOINT}",
        "APT_MIRROR": "${APT_MIRROR}",
    }
    if env.needs_builder:  # (a builder stage compiles them)
        args["MAX_JOBS"] = "${MAX_JOBS}"
    if env.indexes.torch:
        args["TORCH_INDEX_URL"] = env.indexes.torch  # per profile: its CUDA variant's index
    return args


def bake_file(targets: list[Target], variables: dict[str, str]) -> str:
    """docker-bake.hcl for `targets` ({name, context, platforms, args, tags, cache_ref, labels})."""
    lines = [
        "# envbuild bake: one target per profile. Build them all on any BuildKit builder:",
        "#   docker buildx bake -f docker-bake.hcl [--push] [TARGET...]",
        "# Override a variable from the environment, e.g. REGISTRY=registry.corp:5000.",
        "",
    ]
    for name, default in variables.items():
        lines += [f"variable {hcl_string(name)} {{", f"  default = {hcl_string(default)}", "}", ""]
    lines += [
        'group "default" {',
        "  targets = [" + ", ".join(hcl_string(t["name"]) for t in targets) + "]",
        "}",
        "",
    ]
    for t in targets:

        def value(v: str) -> str:  # a ${VARIABLE} reference stays an HCL template
            return json.dumps(v) if v.startswith("${") and v.endswith("}") else hcl_string(v)

        lines += [
            f"target {hcl_string(t['name'])} {{",
            f"  context = {hcl_string(t['context'])}",
            '  dockerfile = "Dockerfile"',
            "  platforms = [" + ", ".join(json.dumps(p) for p in t["platforms"]) + "]",
            "  args = {",
        ]
        lines += [f"    {k} = {value(v)}" for k, v in sorted(t["args"].items())]
        lines += [
            "  }",
            "  tags = [" + ", ".join(json.dumps(tag) for tag in t["tags"]) + "]",
            f'  cache-from = ["type=registry,ref={t["cache_ref"]}"]',
            f'  cache-to = ["type=registry,ref={t["cache_ref"]},mode=max"]',
            "  labels = {",
        ]
        lines += [f"    {hcl_string(k)} = {hcl_string(v)}" for k, v in sorted(t["labels"].items())]
        lines += ["  }", "}", ""]
    return "\n".join(lines)


def bake_target(env: ResolvedEnv, tag: str) -> Target:
    """The target of one (mirrored, constrained) resolved environment; `tag` is its upstream
    name envbuild/<profile>:<hash>, pushed under ${REGISTRY}/; built for its host's platform
    (linux/arm64 for a Grace system: buildx cross-builds it under QEMU elsewhere)."""
    from envbuilder.render.pixi import OCI_PLATFORMS

    repo, version = tag.rsplit(":", 1)
    return {
        "name": env.name,
        "context": env.name,
        "platforms": [OCI_PLATFORMS[env.gpu.machine]],
        "args": target_args(env),
        "tags": [f"${{REGISTRY}}/{repo}:{version}", f"${{REGISTRY}}/{repo}:latest"],
        "cache_ref": f"${{REGISTRY}}/{repo}:buildcache",
        "labels": {LABEL + "profile": env.name, LABEL + "tag": tag},
    }


def variables(env: ResolvedEnv, registry: str) -> dict[str, str]:
    """The variables every target shares: the registry it pushes to and caches in, and the
    endpoints (the first profile's, mirror applied; they are the same for every profile)."""
    from envbuilder.model.config import check_registry

    apt = env.mirror.apt if env.mirror else None
    # (config.registry_for checked it where it came from; it lands in cache-to, where a ',' adds
    # settings: a second wall)
    return {
        "REGISTRY": check_registry(registry, "The bake file's registry"),
        "PIP_INDEX_URL": env.indexes.pypi,
        "HF_ENDPOINT": env.huggingface,
        "APT_MIRROR": apt or "",
        "MAX_JOBS": "4",
    }


class Baked(Record):
    """What `bake` wrote: the bake file, its targets (one per profile, a build context each in
    the folder of its name) and the endpoint variables whose user:password@ the contexts name
    without (they go to the build as the `endpoints` secret)."""

    bake_file: Path
    targets: tuple[str, ...]
    stripped: tuple[str, ...]


def bake(
    m: Matrix,
    names: list[str],
    overrides: Overrides,
    out: Path,
    *,
    mirror: str | None = None,
    registry: str = "local",
    force: bool = False,
    say: Callable[[str], None] = print,
) -> Baked:
    """`envbuild bake` as a library: every named profile resolved first (each failure said, as
    render --all does; one that fails writes nothing), each one's build context rendered
    (mirror applied, no credentials), and OUT/docker-bake.hcl with a target per profile whose
    registry is `registry` (`local`, a configured name, or HOST[:PORT])."""
    from envbuilder.model.config import local_registry, registry_for
    from envbuilder.model import mirrors as M
    from envbuilder.model.profiles import resolve_all
    from envbuilder.render.files import EXECUTABLE, render_files
    from envbuilder.render.outdir import write_dir
    from envbuilder.context.prepare import prepare
    from envbuilder.render.outdir import folder_name

    host = registry_for(registry, local_registry(m))
    choice = M.choice(mirror, M.get_set(m, mirror)) if mirror else None
    envs = resolve_all(m, names, overrides, "nothing was baked", say=say)
    contexts: dict[str, dict[str, str]] = {}
    targets: list[Target] = []
    shared: dict[str, str] | None = None
    stripped: set[str] = set()
    for env in envs:
        # no user:password@ in the bake file or the contexts: bake has no secret to carry it
        env, _, secret = M.split_credentials(env)
        stripped |= set(secret)
        tag = default_tag(env)  # (the upstream spec: the same tag `envbuild build` gives it)
        ctx = prepare(env, mirror=choice)
        env = ctx.env
        contexts[folder_name(env.name, "a profile")] = render_files(ctx)
        targets.append(bake_target(env, tag))
        shared = shared or variables(env, host)
    files = {f"{name}/{path}": text for name, ctx in contexts.items() for path, text in ctx.items()}
    files[BAKE_FILE] = bake_file(targets, shared or {})
    write_dir(Path(out), files, executable={f"{n}/{e}" for n in contexts for e in EXECUTABLE}, force=force)
    return Baked(Path(out) / BAKE_FILE, tuple(contexts), tuple(sorted(stripped)))
