"""`envbuild build` and `envbuild mirrors`: the image actions (docker, requests load lazily)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

from envbuilder.cli.options import load_matrix, matrix_dir_option, override_options
from envbuilder.errors import UserError

PREFLIGHT = "/opt/envbuild/preflight.py"  # where the Dockerfile puts it


def smoke_command(preflight: str = PREFLIGHT) -> list[str]:
    """The image's own preflight.py in --smoke mode: the torch build and every module of the
    training path (its EXPECTED["training_path"], rendered from the same resolved environment),
    with no GPU needed. Its report goes to stderr, where docker's error carries it on failure."""
    return ["python", "-c", "import runpy, sys; sys.stdout = sys.stderr; path = sys.argv[1]; "
            "sys.argv = [path, '--smoke']; runpy.run_path(path, run_name='__main__')", preflight]


@click.group()
def mirrors():
    """Mirror sets: what each rewrites, and how healthy their endpoints are."""


@mirrors.command("list")
@click.option("--json", "as_json", is_flag=True)
@matrix_dir_option
def mirrors_list(as_json, matrix_dirs):
    """Shipped and configured mirror sets and what each rewrites."""
    from envbuilder.model import mirrors as M
    from envbuilder.config import config_path

    sets = M.mirror_sets(load_matrix(matrix_dirs))
    # a set's endpoints may carry user:password@: shown as ***@, as every log line shows them
    sets = json.loads(M.redacted(json.dumps(sets)))
    if as_json:
        click.echo(json.dumps(sets, indent=2, sort_keys=True))
        return
    for name, body in sets.items():
        click.echo(f"{name}: {body.get('description', '')}")
        for reg, eps in sorted((body.get("registries") or {}).items()):
            click.echo(f"  {reg:<22} -> {', '.join(eps)}")
        for kind in ("pypi", "pytorch", "huggingface", "apt", "github"):
            if body.get(kind):
                click.echo(f"  {kind:<22} -> {', '.join(body[kind])}")
        for ch, eps in sorted((body.get("conda") or {}).items()):
            click.echo(f"  conda:{ch:<16} -> {', '.join(eps)}")
    click.echo(f"(your own sets go in {config_path()} under `mirrors:`)")


@mirrors.command("probe")
@click.option("--mirror", "name", required=True, help="Mirror set to probe.")
@click.option("--timeout", default=5.0, show_default=True, help="Seconds per endpoint.")
@click.option("--json", "as_json", is_flag=True)
@matrix_dir_option
def mirrors_probe(name, timeout, as_json, matrix_dirs):
    """Health and latency of every endpoint of a set, probed in parallel."""
    from envbuilder.model import mirrors as M
    from envbuilder.errors import need_extra

    need_extra("mirrors probe", "actions", ("requests",))

    probes = M.probe(M.get_set(load_matrix(matrix_dirs), name), timeout=timeout)
    if as_json:
        click.echo(M.redacted(json.dumps([p._asdict() for p in probes], indent=2)))
    else:
        rows = [("KIND", "FOR", "ENDPOINT", "STATUS", "MS")]
        rows += [(p.kind, p.target, M.redacted(p.endpoint), ("ok " if p.ok else "DOWN ") + p.status,
                  f"{p.latency_ms:.0f}") for p in probes]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if probes and not any(p.ok for p in probes):
        raise SystemExit(1)


@click.command()
@click.argument("profile", required=False)
@click.option("--mirror", help="Mirror set (or `auto`: the configured/first set whose registry answers).")
@click.option("--push", "push_to", metavar="REGISTRY", help="`local`, a configured name, or HOST[:PORT].")
@click.option("--tag", help="Image name:tag (default envbuild/<profile>:<spec hash>).")
@click.option("--ca-cert", type=click.Path(path_type=Path), help="CA bundle for TLS-intercepting networks (BuildKit secret).")
@click.option("--pip-conf", type=click.Path(path_type=Path), help="pip.conf for the build's pip "
              "steps (BuildKit secret): the builder stage and uv's own install; the runtime "
              "stage's uv steps take their indexes from --mirror.")
@click.option("--smoke/--no-smoke", default=True, show_default=True, help="Run imports in the built image.")
@click.option("--context", "keep_context", type=click.Path(path_type=Path), help="Keep the build context here.")
@click.option("-v", "--verbose", is_flag=True, help="Show the whole build log.")
@click.option("--wheelhouse", type=click.Path(path_type=Path), metavar="DIR",
              help="pip installs only from this wheelhouse (envbuild wheelhouse): no index at all.")
@click.option("--no-probe", is_flag=True, help="Do not probe the registries, indexes and GitHub "
              "before building (base images only the engine has, a network only the engine's "
              "proxy reaches).")
@click.option("--engine", type=click.Choice(["auto", "docker", "podman", "buildah"]), default="auto",
              envvar="ENVBUILD_ENGINE", show_default=True,
              help="What builds: docker (BuildKit), or daemonless podman or buildah. auto: docker "
              "when its client has BuildKit and the daemon answers, else podman, else buildah.")
@override_options
def build(profile, mirror, push_to, tag, ca_cert, pip_conf, smoke, keep_context, verbose,
          wheelhouse, no_probe, engine, overrides, matrix_dirs):
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
    from envbuilder.config import local_registry, registry_for, user_config
    from envbuilder.render.files import render_files
    from envbuilder.model.resolve import resolve

    m = load_matrix(matrix_dirs)
    here = Path("envbuild.json")
    if profile is None and here.is_file():
        from envbuilder.limits import read_text_bounded
        from envbuilder.model.resolved import ResolvedEnv

        if overrides.to_dict():
            raise UserError("This folder's envbuild.json already fixes every choice; overrides "
                            "apply to a profile. Run `envbuild build PROFILE --OVERRIDE ...`, or "
                            "re-render this folder with them first.")
        if wheelhouse is None and (Path("wheelhouse").is_dir() or any(Path(".").glob("locked-*.txt"))):
            raise UserError("This folder was rendered --locked or --wheelhouse: its pins and files "
                            "come from the lock, which envbuild.json does not hold, so building it "
                            "from envbuild.json would be another, unpinned image. Build the folder "
                            "as it is (`docker buildx build --network=host -t TAG .`), or name the "
                            "profile and the same flags: `envbuild build PROFILE --wheelhouse DIR`.")
        env = ResolvedEnv.from_json(read_text_bounded(here, "envbuild.json"), "./envbuild.json")
        click.echo(f"build: no PROFILE given: building {env.name} as ./envbuild.json holds it "
                   "(the folder `envbuild render` wrote)", err=True)
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
    name = mirror
    if mirror == "auto":
        name = user_config().get("mirror")
        candidates = [name] if name else list(M.mirror_sets(m))
        for cand in candidates:
            probes = M.probe(M.get_set(m, cand), kinds=("registry",))
            if any(p.ok for p in probes):
                name = cand
                break
        else:
            from envbuilder.config import config_path

            raise B.ActionError("--mirror auto: no mirror set has a registry endpoint that answers "
                                f"(tried {', '.join(candidates)}). Check your network, or add a "
                                f"mirror set under `mirrors:` in {config_path()} (envbuild's "
                                "config; ENVBUILD_CONFIG names another) with a registry you reach.")
        say(f"--mirror auto chose {name!r}")
    choice, endpoints = None, dict(own_credentials)
    if name:
        body = M.get_set(m, name)
        healthy = M.health(M.probe(body))
        for e, (ok, ms) in sorted(healthy.items()):
            say(f"  probe {M.redacted(e)}: {'ok' if ok else 'DOWN'} ({ms:.0f} ms)")
        # the base images' registry endpoints, picked before building: the environment's own
        # image references name them (render, lock and build read the same mirrored data)
        picks = B.pick_registries(name, body, list(env.cuda.images.values()),
                                  healthy, say)
        choice = M.choice(name, body, healthy)._replace(registries=picks)
        # the rendered files point at the mirror (its endpoints without credentials: the
        # image's envbuild.json and ENV HF_ENDPOINT name the same mirror); its endpoints replace
        # the profile's own, credentials and all
        endpoints.update(choice.endpoints(env))
    # credentials reach the RUN steps as a secret only (a wheelhouse build uses its own files,
    # never an index)
    credentials = M.endpoints_secret(endpoints, B.NETWORK_ARGS if wheelhouse else ())
    from envbuilder.render.prepare import prepare

    prepared = prepare(env, wheelhouse=wheelhouse, mirror=choice)
    env, locked = prepared.env, prepared.locked
    files = render_files(env, locked)
    links = (locked or {}).get("links")
    registry = registry_for(push_to, local_registry(m),
                            "--push") if push_to else None
    eng = E.make(engine)  # docker: the daemon must answer before anything is built
    from envbuilder.machine import reach

    # what the build fetches and where it pushes, probed before any step (with a mirror set, its
    # endpoints were probed above and its registries picked: the push target remains)
    # (upstream, the profile's own endpoints are probed with their credentials, and named
    # without them)
    missing = [] if no_probe else reach.check(env if name else probe_env, wheelhouse is not None,
                                              registry, upstream=not name, ca_cert=ca_cert)
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
        result = eng.build(context, tag, {}, secrets,
                           B.default_echo(verbose, eng.step_header), say)
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


@click.command()
@click.argument("profiles", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every profile.")
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True,
              help="Folder for docker-bake.hcl and a build context per profile.")
@click.option("--mirror", metavar="NAME", help="Point images and indexes at this mirror set's "
              "first endpoints (no probing: bake stays offline, like render --mirror).")
@click.option("--registry", default="local", show_default=True, help="Where the targets push and "
              "keep their registry cache: `local`, a configured name, or HOST[:PORT] (the file's "
              "REGISTRY variable; override it when baking).")
@click.option("--force", is_flag=True, help="Write into a folder envbuild did not write (it still "
              "deletes nothing it did not write).")
@override_options
def bake(profiles, all_, out, mirror, registry, force, overrides, matrix_dirs):
    """Write a docker-bake.hcl with a target per profile (and each one's build context), so
    `docker buildx bake` builds the matrix on any BuildKit builder."""
    from envbuilder.engines import bake as K
    from envbuilder.model import mirrors as M
    from envbuilder.cli.options import plain_name
    from envbuilder.config import local_registry, registry_for
    from envbuilder.errors import UserError
    from envbuilder.render.outdir import write_dir
    from envbuilder.cli.options import resolve_all
    from envbuilder.render.files import EXECUTABLE, render_files
    from envbuilder.render.prepare import prepare

    m = load_matrix(matrix_dirs)
    names = list(m.profiles) if all_ else list(dict.fromkeys(profiles))
    if bool(all_) == bool(profiles):
        raise UserError("Name the profiles to bake, or --all (not both). `envbuild list` shows "
                        "them.")
    host = registry_for(registry, local_registry(m))
    choice = M.choice(mirror, M.get_set(m, mirror)) if mirror else None
    # every profile resolves (each failure printed, as render --all does), or nothing is written
    envs = resolve_all(m, names, overrides, "nothing was baked")
    contexts, targets, shared = {}, [], None
    stripped: set[str] = set()
    for env in envs:
        # no user:password@ in the bake file or the contexts: bake has no secret to carry it
        env, _, secret = M.split_credentials(env)
        stripped |= set(secret)
        tag = K.default_tag(env)  # (the upstream spec: the same tag `envbuild build` gives it)
        env = prepare(env, mirror=choice).env
        contexts[plain_name(env.name, "a profile")] = render_files(env)
        targets.append(K.bake_target(env, tag))
        shared = shared or K.variables(env, host)
    files = {f"{name}/{path}": text for name, ctx in contexts.items() for path, text in ctx.items()}
    files[K.BAKE_FILE] = K.bake_file(targets, shared)
    write_dir(out, files, executable={f"{n}/{e}" for n in contexts for e in EXECUTABLE},
              force=force)
    click.echo(f"wrote {out / K.BAKE_FILE}: {len(targets)} target(s) ({', '.join(contexts)}); "
               f"build them with: docker buildx bake -f {out / K.BAKE_FILE}")
    if stripped:
        click.echo(f"note: {', '.join(sorted(stripped))} carry user:password@, which "
                   f"{K.BAKE_FILE} and the contexts name without; pass them as the endpoints "
                   "secret (--set '*.secrets=id=endpoints,src=FILE', FILE of `export VAR='URL'` "
                   "lines).", err=True)
