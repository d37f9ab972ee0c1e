"""`envbuild build` as a library: which environment to build (a profile, or the envbuild.json of
the rendered folder it runs in), then the one order of a build: the mirror set picked and
probed, the lock and the mirror applied (context.prepare), what the build fetches probed, the
context staged, the credentials handed over as a BuildKit secret only, the build, the smoke
test and the push. Callable without click:

    env = target_env(m, "p40", Overrides(), say=print)
    ref = build_image(m, env, BuildOptions(push_to="local"), say=print)

It lives in machine/, above the engines it drives (engines/docker.py, daemonless.py), beside
the probes it runs first (reach.py) and doctor's profile for this machine (implied_profile).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from envbuilder.errors import ActionError, UserError
from envbuilder.record import Record

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import Overrides, ResolvedEnv
    from envbuilder.machine.doctor import Probes


class BuildOptions(Record):
    """What `envbuild build`'s flags say, each as its option's help describes it."""

    mirror: str | None = None  # a mirror set's name, or "auto"
    push_to: str | None = None  # "local", a configured registry's name, or HOST[:PORT]
    tag: str | None = None  # name:tag (default envbuild/<profile>:<spec hash>)
    ca_cert: Path | None = None
    pip_conf: Path | None = None
    smoke: bool = True
    keep_context: Path | None = None
    verbose: bool = False
    wheelhouse: Path | None = None
    probe: bool = True
    builder: str = "auto"  # auto, docker, podman, buildah (--builder)
    # OCI platforms to build, pushed as one manifest list (--platform); () builds for the engine's own
    platforms: tuple[str, ...] = ()


def target_env(
    m: Matrix,
    profile: str | None,
    overrides: Overrides,
    wheelhouse: Path | None = None,
    probes: Probes | None = None,
    say: Callable[[str], None] = print,
) -> ResolvedEnv:
    """The environment `build` builds: PROFILE resolved; without PROFILE, the envbuild.json of
    the rendered folder it runs in (refused with overrides, or when that folder was rendered
    from a lock), else the profile `envbuild detect` picks (machine.doctor.implied_profile)."""
    from envbuilder.model.resolve import resolve

    here = Path("envbuild.json")
    if profile is not None or not here.is_file():
        if profile is None:
            from envbuilder.machine.doctor import implied_profile

            profile = implied_profile(m, "build", probes, say)
        return resolve(m, profile, overrides)
    from envbuilder.limits import read_text_bounded
    from envbuilder.model.runplan import env_from_json

    if overrides.to_dict():
        raise UserError(
            "This folder's envbuild.json already fixes every choice; overrides "
            "apply to a profile. Run `envbuild build PROFILE --OVERRIDE ...`, or "
            "re-render this folder with them first."
        )
    if wheelhouse is None and (Path("wheelhouse").is_dir() or any(Path(".").glob("locked-*.txt"))):
        raise UserError(
            "This folder was rendered --locked or --wheelhouse: its pins and files "
            "come from the lock, which envbuild.json does not hold, so building it "
            "from envbuild.json would be another, unpinned image. Build the folder "
            "as it is (`docker buildx build --network=host -t TAG .`), or name the "
            "profile and the same flags: `envbuild build PROFILE --wheelhouse DIR`."
        )
    env = env_from_json(read_text_bounded(here, "envbuild.json"), "./envbuild.json")
    say(
        f"build: no PROFILE given: building {env.asked} as ./envbuild.json holds it "
        "(the folder `envbuild render` wrote)"
    )
    return env


def check_platforms(env: ResolvedEnv, platforms: tuple[str, ...], push_to: str | None) -> tuple[str, ...]:
    """--platform's OCI platforms, each the profile's host's (render.pixi.OCI_PLATFORMS): a
    render pins the files of one host (uv's wheel by sha256, the lock's files, the wheels its
    constraints were solved for) and a run script for one GPU, whose systems are of one CPU
    (GH200 and GB200 aarch64, the others x86_64). A list is pushed, so --push is needed."""
    from envbuilder.render.pixi import OCI_PLATFORMS

    if any(not p.strip() for p in platforms):  # (`--platform ""` is no request for the default)
        raise UserError(
            f"--platform {','.join(platforms)!r}: an empty platform name (the flag given blank, or "
            "a ',' with nothing beside it). Name each OCI platform (linux/amd64, linux/arm64, "
            "comma-separated), or leave --platform out to build for the engine's own."
        )
    wanted = tuple(dict.fromkeys(p.strip() for p in platforms))
    if not wanted:
        return ()
    known = {v: k for k, v in OCI_PLATFORMS.items()}
    bad = [p for p in wanted if p not in known]
    if bad:
        raise UserError(
            f"--platform {', '.join(map(repr, bad))}: envbuild builds for "
            f"{' and '.join(sorted(known))} (OCI platform names, comma-separated)."
        )
    own = OCI_PLATFORMS[env.gpu.machine]
    other = [p for p in wanted if p != own]
    if other:
        raise UserError(
            f"--platform {','.join(wanted)}: {env.asked} is for the {env.gpu.name}, an "
            f"{env.gpu.machine} system, so its image is {own} only: the render pins the "
            f"{env.gpu.machine} files (uv's wheel by sha256, the lock's wheels) and a run "
            f"script sized for that GPU, which would be wrong in an {', '.join(other)} image. "
            f"Build {own} here (`--platform {own}`, cross-built under QEMU on another CPU), and "
            "build a profile of the other host for the other platform."
        )
    if not push_to:
        raise UserError(
            f"--platform {','.join(wanted)} builds a manifest list, which is pushed (the "
            "engine's image store holds no list to load): add --push REGISTRY."
        )
    return wanted


def full_tag(env: ResolvedEnv, tag: str | None) -> str:
    """--tag as the image is named: default envbuild/<profile>:<hash of the upstream spec> (the
    same image whichever mirror built it); a tag without one gets :latest."""
    if not tag:
        from envbuilder.render.image import default_tag

        tag = default_tag(env)
    return tag if ":" in tag.rsplit("/", 1)[-1] else tag + ":latest"


def build_image(m: Matrix, env: ResolvedEnv, opts: BuildOptions, say: Callable[[str], None] = print) -> str:
    """Build `env` as `opts` say; returns what `build` prints: the pushed REGISTRY/NAME@DIGEST,
    or the local image."""
    from envbuilder.model.config import local_registry, registry_for
    from envbuilder.engines import daemonless as E
    from envbuilder.engines import docker as B
    from envbuilder.machine import reach
    from envbuilder.model import mirrors as M
    from envbuilder.render.files import render_files, smoke_command, write_dir
    from envbuilder.context.prepare import prepare

    # the endpoints' user:password@ (an overlay's index, say) reach the RUN steps only as the
    # `endpoints` secret; the image's name, its files and its labels name them without
    probe_env = env
    env, _, own_credentials = M.split_credentials(env)
    secrets = B.secret_files(opts.ca_cert, opts.pip_conf)
    tag = full_tag(env, opts.tag)
    platforms = check_platforms(env, opts.platforms, opts.push_to)
    for note in env.notes:  # before anything starts: a source build of flash-attn takes long
        say(f"plan: {note}")
    engine = E.choose(opts.builder, opts.smoke, say)
    name = B.auto_mirror(m, say) if opts.mirror == "auto" else opts.mirror
    choice, endpoints = B.mirror_choice(m, name, env, own_credentials, say)
    # credentials reach the RUN steps as a secret only (a wheelhouse build uses its own files,
    # never an index)
    credentials = M.endpoints_secret(endpoints, B.NETWORK_ARGS if opts.wheelhouse else ())
    ctx = prepare(env, wheelhouse=opts.wheelhouse, mirror=choice)
    env = ctx.env
    files = render_files(ctx)
    links = ctx.links
    registry = registry_for(opts.push_to, local_registry(m), "--push") if opts.push_to else None
    eng = E.make(engine)  # docker: the daemon must answer before anything is built
    # what the build fetches and where it pushes, probed before any step: the indexes the
    # Dockerfile names (a mirror set's, or the profile's own where the set has none of that kind,
    # probed with their credentials and named without), GitHub, the push target; with a mirror
    # set its registries were picked above, upstream the base images' registries are probed
    missing = (
        reach.check(
            env if name else probe_env,
            opts.wheelhouse is not None,
            registry,
            upstream=not name,
            ca_cert=opts.ca_cert,
            credentials=endpoints,
        )
        if opts.probe
        else []
    )
    if missing:
        raise ActionError(M.redacted(reach.message(missing)))
    if opts.keep_context is None:
        context = B.stage_context(files, dict(links) if links is not None else None)
    else:
        write_dir(opts.keep_context, files, links)
        context = opts.keep_context
    secret_dir = None
    if credentials:  # a private file for the one build (BuildKit mounts it on tmpfs per step)
        import tempfile

        secret_dir = Path(tempfile.mkdtemp(prefix="envbuild-secret-"))
        (secret_dir / "endpoints").write_text(credentials)
        (secret_dir / "endpoints").chmod(0o600)
        secrets = dict(secrets, endpoints=secret_dir / "endpoints")
    echo = B.default_echo(opts.verbose, eng.step_header)
    try:
        # no build args: the rendered files already name every endpoint (credentials: a secret)
        if platforms:
            assert registry is not None  # (check_platforms asked for --push)
            digest = eng.platforms(context, registry, tag, platforms, {}, secrets, echo, say)
            say(
                f"pushed {', '.join(platforms)} as one manifest list; not smoke-tested here "
                f"(`envbuild verify {env.asked}` checks the installs, the smoke test runs on the host)"
            )
            return f"{registry}/{tag.rsplit(':', 1)[0]}@{digest}"
        result = eng.build(context, tag, {}, secrets, echo, say)
    finally:
        if opts.keep_context is None:
            shutil.rmtree(context.parent, ignore_errors=True)
        if secret_dir is not None:
            shutil.rmtree(secret_dir, ignore_errors=True)
    say(f"built {result.image}")
    if opts.smoke:
        say(eng.smoke(result.image, smoke_command()).strip())
    if registry:
        digest = eng.push(result.image, registry, tag, say)
        return f"{registry}/{tag.rsplit(':', 1)[0]}@{digest}"
    image: str = result.image
    return image
