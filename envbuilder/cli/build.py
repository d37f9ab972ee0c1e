"""`envbuild build`: render a profile, build it with BuildKit or podman/buildah (through a
mirror), smoke-test and push it (docker and requests load lazily)."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from envbuilder.cli import complete

from envbuilder.cli.options import load_matrix, override_options
from envbuilder.errors import UserError

from envbuilder.render.files import PREFLIGHT, smoke_command  # noqa: F401  (re-exported)


@click.command()
@click.argument("profile", required=False, shell_complete=complete.profiles)
@click.option(
    "--mirror",
    shell_complete=complete.mirror_sets_or_auto,
    help="Mirror set (or `auto`: the configured/first set whose registry answers).",
)
@click.option("--push", "push_to", metavar="REGISTRY", help="`local`, a configured name, or HOST[:PORT].")
@click.option("--tag", help="Image name:tag (default envbuild/<profile>:<spec hash>).")
@click.option(
    "--ca-cert",
    type=click.Path(path_type=Path),
    help="CA bundle for TLS-intercepting networks (BuildKit secret).",
)
@click.option(
    "--pip-conf",
    type=click.Path(path_type=Path),
    help="pip.conf for the build's pip "
    "steps (BuildKit secret): the builder stage and uv's own install; the runtime "
    "stage's uv steps take their indexes from --mirror.",
)
@click.option("--smoke/--no-smoke", default=True, show_default=True, help="Run imports in the built image.")
@click.option(
    "--context", "keep_context", type=click.Path(path_type=Path), help="Keep the build context here."
)
@click.option("-v", "--verbose", is_flag=True, help="Show the whole build log.")
@click.option(
    "--wheelhouse",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="pip installs only from this wheelhouse (envbuild wheelhouse): no index at all.",
)
@click.option(
    "--no-probe",
    is_flag=True,
    help="Do not probe the registries, indexes and GitHub "
    "before building (base images only the engine has, a network only the engine's "
    "proxy reaches).",
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "docker", "podman", "buildah"]),
    default="auto",
    envvar="ENVBUILD_ENGINE",
    show_default=True,
    help="What builds: docker (BuildKit), or daemonless podman or buildah. auto: docker "
    "when its client has BuildKit and the daemon answers, else podman, else buildah.",
)
@override_options
def build(
    profile,
    mirror,
    push_to,
    tag,
    ca_cert,
    pip_conf,
    smoke,
    keep_context,
    verbose,
    wheelhouse,
    no_probe,
    engine,
    overrides,
    matrix_dirs,
):
    """Render PROFILE, build it with BuildKit or podman/buildah (through a mirror), smoke-test
    and push it.

    Without PROFILE: inside a rendered folder, the environment its envbuild.json holds (as
    `docker build .` takes the folder); elsewhere the profile `envbuild detect` picks for this
    machine."""
    from envbuilder.errors import need_extra

    need_extra("build", "actions")
    from envbuilder.engines import docker as B
    from envbuilder.engines import daemonless as E
    from envbuilder.model import mirrors as M
    from envbuilder.config import local_registry, registry_for
    from envbuilder.render.files import render_files
    from envbuilder.model.resolve import resolve

    m = load_matrix(matrix_dirs)
    here = Path("envbuild.json")
    if profile is None and here.is_file():
        from envbuilder.limits import read_text_bounded
        from envbuilder.model.resolved import ResolvedEnv

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
        env = ResolvedEnv.from_json(read_text_bounded(here, "envbuild.json"), "./envbuild.json")
        click.echo(
            f"build: no PROFILE given: building {env.name} as ./envbuild.json holds it "
            "(the folder `envbuild render` wrote)",
            err=True,
        )
    else:
        if profile is None:
            from envbuilder.cli.options import implied_profile

            profile = implied_profile(m, "build", click.get_current_context().obj)
        env = resolve(m, profile, overrides)
    # the endpoints' user:password@ (an overlay's index, say) reach the RUN steps only as the
    # `endpoints` secret; the image's name, its files and its labels name them without
    probe_env = env
    env, _, own_credentials = M.split_credentials(env)
    secrets = B.secret_files(ca_cert, pip_conf)
    if not tag:  # named after the upstream spec: the same image whichever mirror built it
        from envbuilder.engines.bake import default_tag

        tag = default_tag(env)
    if ":" not in tag.rsplit("/", 1)[-1]:
        tag += ":latest"

    def say(msg):
        click.echo(msg, err=True)

    for note in env.notes:  # before anything starts: a source build of flash-attn takes long
        say(f"plan: {note}")
    engine = E.choose(engine, smoke, say)
    name = B.auto_mirror(m, say) if mirror == "auto" else mirror
    choice, endpoints = B.mirror_choice(m, name, env, own_credentials, say)
    # credentials reach the RUN steps as a secret only (a wheelhouse build uses its own files,
    # never an index)
    credentials = M.endpoints_secret(endpoints, B.NETWORK_ARGS if wheelhouse else ())
    from envbuilder.render.prepare import prepare

    prepared = prepare(env, wheelhouse=wheelhouse, mirror=choice)
    env, locked = prepared.env, prepared.locked
    files = render_files(env, locked)
    links = (locked or {}).get("links")
    registry = registry_for(push_to, local_registry(m), "--push") if push_to else None
    eng = E.make(engine)  # docker: the daemon must answer before anything is built
    from envbuilder.machine import reach

    # what the build fetches and where it pushes, probed before any step (with a mirror set, its
    # endpoints were probed above and its registries picked: the push target remains)
    # (upstream, the profile's own endpoints are probed with their credentials, and named
    # without them)
    missing = (
        []
        if no_probe
        else reach.check(
            env if name else probe_env, wheelhouse is not None, registry, upstream=not name, ca_cert=ca_cert
        )
    )
    if missing:
        raise B.ActionError(M.redacted(reach.message(missing)))
    context = B.stage_context(files, links) if keep_context is None else None
    if keep_context is not None:
        from envbuilder.render.files import write_dir

        write_dir(keep_context, files, links)
        context = keep_context
    secret_dir = None
    if credentials:  # a private file for the one build (BuildKit mounts it on tmpfs per step)
        import tempfile

        secret_dir = Path(tempfile.mkdtemp(prefix="envbuild-secret-"))
        (secret_dir / "endpoints").write_text(credentials)
        (secret_dir / "endpoints").chmod(0o600)
        secrets = dict(secrets, endpoints=secret_dir / "endpoints")
    try:
        # no build args: the rendered files already name every endpoint (credentials: a secret)
        result = eng.build(context, tag, {}, secrets, B.default_echo(verbose, eng.step_header), say)
    finally:
        if keep_context is None:
            shutil.rmtree(context.parent, ignore_errors=True)
        if secret_dir is not None:
            shutil.rmtree(secret_dir, ignore_errors=True)
    say(f"built {result.image}")
    if smoke:
        say(eng.smoke(result.image, smoke_command()).strip())
    if registry:
        digest = eng.push(result.image, registry, tag, say)
        click.echo(f"{registry}/{tag.rsplit(':', 1)[0]}@{digest}")
    else:
        click.echo(result.image)
