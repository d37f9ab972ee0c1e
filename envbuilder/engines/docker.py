"""Build, smoke-test and push a rendered profile with BuildKit, through mirrors.

The engine API (ping, inspect, tag, push, pull, run) goes through the docker SDK; the build
itself goes through a BuildKit-capable docker client, because secret and cache mounts need
BuildKit: `docker buildx build` where the plugin exists, else `DOCKER_BUILDKIT=1 docker build`
with a client old enough (< 23) to have BuildKit built in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Callable,
    Iterable,
    Iterator,
    Protocol,
    TextIO,
    TypedDict,
    cast,
)

from envbuilder.errors import ActionError, UserError
from envbuilder.model.components import registry as COMPONENTS
from envbuilder.record import Record

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.mirrors import MirrorChoice
    from envbuilder.model.resolved import ResolvedEnv
    from envbuilder.render.outdir import Checked

# Build output that means the base image could not be pulled (the endpoint served its manifest
# a moment ago, so this is rare: a blob the mirror lacks, a dropped connection).
PULL_FAILURE = re.compile(
    r"toomanyrequests|unauthorized|authentication required|pull access denied|"
    r"failed to resolve source metadata|failed to copy|failed to fetch|"
    r"manifest unknown|not found: manifest",
    re.I | re.M,
)
_FAILED_STEP = re.compile(r"^\s*> \[([^\]]+)\] (.+)$", re.M)


class NoBuildKit(ActionError):
    """No docker client can run BuildKit builds: `detail` says what was found, `fix` what to do."""

    def __init__(self, detail: str, fix: str):
        super().__init__(f"{detail}. {fix[:1].upper()}{fix[1:]}.")
        self.detail, self.fix = detail, fix


class BuildKitClient(Record):
    argv: tuple[str, ...]  # ("docker", "buildx", "build") or ("docker", "build")
    env: dict[str, str]
    description: str


# -- what envbuild calls of the docker SDK (untyped): each call's result is read as the SDK
# documents it (an Image, the command's output); what the engine streams is read as `object`
class DockerImage(Protocol):
    @property
    def id(self) -> str: ...
    def tag(self, repository: str, tag: str | None = None) -> bool: ...
    def save(self, *, named: bool = False) -> Iterator[bytes]: ...


class DockerImages(Protocol):
    def get(self, name: str) -> DockerImage: ...
    def push(self, repository: str, tag: str, *, stream: bool, decode: bool) -> Iterable[object]: ...


class DockerContainers(Protocol):
    def run(
        self, image: str, command: list[str], *, remove: bool, network_mode: str, stdout: bool, stderr: bool
    ) -> bytes: ...


class DockerClient(Protocol):
    @property
    def images(self) -> DockerImages: ...
    @property
    def containers(self) -> DockerContainers: ...
    def ping(self) -> bool: ...


class _DockerErrors(Protocol):
    ImageNotFound: type[Exception]


class _DockerSDK(Protocol):
    errors: _DockerErrors

    def from_env(self, *, timeout: int) -> DockerClient: ...


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=20)


def which_all(name: str) -> list[str]:
    """Every `name` executable on PATH, in PATH order (a plugin-less new client may shadow an
    old one); one entry per real file."""
    found: list[str] = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        p = os.path.join(d, name)
        if (
            d
            and os.path.isfile(p)
            and os.access(p, os.X_OK)
            and os.path.realpath(p) not in map(os.path.realpath, found)
        ):
            found.append(p)
    return found


def docker_clients(
    which: Callable[[str], list[str]] = which_all, exists: Callable[[str], bool] = os.path.exists
) -> list[str]:
    """The docker clients to try, in order: $ENVBUILD_DOCKER, every `docker` on PATH, then the
    usual places."""
    chosen = os.environ.get("ENVBUILD_DOCKER")
    out = ([chosen] if chosen and exists(chosen) else []) + list(which("docker"))
    out += [c for c in ("/usr/bin/docker", "/usr/local/bin/docker") if exists(c)]
    return list(dict.fromkeys(out))


def client_version(
    run: Callable[[Sequence[str]], subprocess.CompletedProcess[str]], docker: str
) -> str | None:
    """A docker client's own version (it prints it even when the daemon is unreachable)."""
    try:
        out = run((docker, "version", "--format", "{{.Client.Version}}"))
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    return first if first[:1].isdigit() else None


def find_buildkit(
    run: Callable[[Sequence[str]], subprocess.CompletedProcess[str]] = _run, clients: list[str] | None = None
) -> BuildKitClient:
    """The first docker client that can run BuildKit builds: one with the buildx plugin, or one
    older than 23 (BuildKit built in, DOCKER_BUILDKIT=1). `build` and `doctor` both ask here."""
    from envbuilder.model.versions import version_key

    clients = docker_clients() if clients is None else clients
    if not clients:
        raise NoBuildKit(
            "No docker client found on PATH",
            "install Docker (Debian/Ubuntu: "
            "apt-get install docker.io, which also brings BuildKit) and run again",
        )
    tried = []
    for docker in clients:
        try:
            bx = run((docker, "buildx", "version"))
        except (OSError, subprocess.TimeoutExpired):
            bx = None
        if bx is not None and bx.returncode == 0:
            words = bx.stdout.split()
            return BuildKitClient(
                (docker, "buildx", "build", "--load"),
                {},
                f"{docker} buildx ({words[1] if len(words) > 1 else 'buildx'})",
            )
        version = client_version(run, docker)
        try:
            old = version is not None and version_key(version) < version_key("23")
        except ValueError:
            old = False
        if old:
            return BuildKitClient(
                (docker, "build"),
                {"DOCKER_BUILDKIT": "1"},
                f"DOCKER_BUILDKIT=1 with {docker} (client {version}, BuildKit built in)",
            )
        tried.append(f"{docker} {version or '(version unknown)'}")
    raise NoBuildKit(
        f"no buildx plugin, and {', '.join(tried)} refuse"
        f"{'s' if len(tried) == 1 else ''} DOCKER_BUILDKIT=1 builds without it "
        "('buildx component is missing')",
        "install the buildx plugin (docker-buildx-plugin or docker-buildx), or point "
        "ENVBUILD_DOCKER at a docker client older than 23 (e.g. Debian's docker.io "
        "20.10)",
    )


DOCKER_TIMEOUT = 600  # seconds the docker SDK waits for one answer of the engine
MAX_DOCKER_TIMEOUT = 7 * 24 * 3600


def docker_timeout() -> int:
    """ENVBUILD_DOCKER_TIMEOUT (seconds, 1 to a week; ASCII digits only), DOCKER_TIMEOUT when
    unset; UserError (exit 2) naming the variable for anything else (a typo is not a daemon
    that does not answer)."""
    value = os.environ.get("ENVBUILD_DOCKER_TIMEOUT")
    if value is None:
        return DOCKER_TIMEOUT
    if not (re.fullmatch(r"[0-9]{1,7}", value) and 0 < int(value) <= MAX_DOCKER_TIMEOUT):
        from envbuilder.text import shorten

        raise UserError(
            f"ENVBUILD_DOCKER_TIMEOUT is {shorten(ascii(value), 60)}: it takes a whole "
            f"number of seconds from 1 to {MAX_DOCKER_TIMEOUT} (a week), written with "
            f"the digits 0-9, e.g. {DOCKER_TIMEOUT} (the default). Fix it or unset it."
        )
    return int(value)


def sdk() -> _DockerSDK:
    """The docker SDK (ImportError without it), as envbuild calls it."""
    import importlib

    importlib.import_module("docker.errors")
    return cast(_DockerSDK, importlib.import_module("docker"))


def engine() -> DockerClient:
    """A docker SDK client that answers, or ActionError naming the fix."""
    try:
        docker = sdk()
    except ImportError:
        raise ActionError("The docker Python SDK is missing: pip install 'envbuild[actions]'.") from None
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    timeout = docker_timeout()  # (before the try: a bad value is the user's, not the engine's)
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except Exception as e:  # the SDK raises DockerException, requests' and socket errors alike
        raise ActionError(
            f"Cannot reach the Docker engine at {host} ({first_line(e)}). Start it "
            "(systemctl start docker, or dockerd as root), check DOCKER_HOST, and "
            "make sure your user may use the socket (the docker group)."
        ) from None


def engine_image(image: str) -> tuple[DockerImage | None, str | None]:
    """(the Docker engine's image by that name or ID, None), (None, None) when the engine has none
    by that name, or (None, why) when no engine answers. ActionError for an engine that errors."""
    try:
        client = engine()
    except ActionError as e:
        return None, str(e)
    not_found = sdk().errors.ImageNotFound

    try:
        return client.images.get(image), None
    except not_found:
        return None, None
    except Exception as e:  # noqa: BLE001 - an engine that errors is reported as such
        from envbuilder.text import shorten

        raise ActionError(
            f"The Docker engine could not look up {shorten(image, 120)} ({first_line(e)}). Check the "
            "engine and run again."
        ) from None


def first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


# the first line of a BuildKit build step ("#7 [runtime 3/9] RUN ..."): progress without -v
BUILDKIT_STEP = r"^#\d+ \["


class BuildResult(Record):
    image: str
    log_tail: str


def redacted(text: str) -> str:
    """`text` with every user:password@ of a URL shown as ***@ (a mirror's credentials in a
    build arg appear in BuildKit's step titles)."""
    from envbuilder.text import redact

    return redact(text)


def run_build(
    client: BuildKitClient,
    context: Path,
    tag: str,
    build_args: dict[str, str],
    secrets: dict[str, Path],
    echo: Callable[[str], None],
) -> tuple[int, str]:
    """One `docker build`; streams progress lines through `echo`, returns (rc, full log)."""
    argv = list(client.argv) + ["--network=host", "--progress=plain", "-t", tag]
    for k, v in sorted(build_args.items()):
        argv += ["--build-arg", f"{k}={v}"]
    for sid, path in sorted(secrets.items()):
        argv += ["--secret", f"id={sid},src={path}"]
    argv.append(str(context))
    env = dict(os.environ, **client.env)
    lines = []
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, errors="replace"
    )
    assert proc.stdout is not None
    done = threading.Event()
    tick: object = getattr(echo, "tick", None)  # (StepLog's: its heartbeat, and its close)
    close: object = getattr(echo, "close", None)
    if callable(tick):  # the step log's heartbeat while a step runs quietly
        ticking: Callable[[], object] = tick

        def beat() -> None:
            while not done.wait(1.0):
                ticking()

        threading.Thread(target=beat, daemon=True).start()
    try:
        for line in proc.stdout:  # BuildKit titles RUN steps with the build args they use
            line = redacted(line)
            lines.append(line)
            echo(line.rstrip("\n"))
        rc = proc.wait()
    finally:
        done.set()
    if callable(close):
        closing: Callable[[int], object] = close
        closing(rc)
    return rc, "".join(lines)


# Build args that point package steps at an index or a download; an offline build (from a
# wheelhouse in the context) keeps its own file:// defaults instead.
NETWORK_ARGS = ("PIP_INDEX_URL", "TORCH_INDEX_URL", "APEX_URL", "FLASH_ATTN_RELEASE")


def _endpoints(body: Mapping[str, object], registry: str) -> list[str]:
    """A mirror set's endpoints for `registry` (its `registries:`, as the matrix schema checked it)."""
    registries = body.get("registries")
    by_name: Mapping[object, object] = registries if isinstance(registries, dict) else {}
    found = by_name.get(registry)
    listed: list[object] = found if isinstance(found, list) else []
    return [e for e in listed if isinstance(e, str)]


def pick_registries(
    set_name: str,
    body: Mapping[str, object],
    refs: list[str],
    healthy: dict[str, tuple[bool, float]] | None,
    say: Callable[[str], None],
) -> dict[str, str | None]:
    """For each registry the base images come from, the first endpoint of the mirror set
    (answering ones first) that serves every one of its images: a manifest HEAD through the v2
    API, before anything is built. A registry the set does not cover stays upstream (None).
    ActionError when no endpoint of a covered registry serves them, with what each answered."""
    from envbuilder.model import mirrors as M
    from envbuilder.oci import registry as R

    by_registry: dict[str, list[str]] = {}
    for ref in sorted(set(refs)):
        by_registry.setdefault(R.parse_image(ref).registry, []).append(ref)
    picks: dict[str, str | None] = {}
    with R.session() as s:
        for reg, images in sorted(by_registry.items()):
            endpoints = _endpoints(body, reg)
            if not endpoints:
                picks[reg] = None
                continue
            tried = []
            for ep in M.order_by_health(endpoints, healthy or {}):
                try:
                    for ref in images:
                        R.digest(ref, ep, s)
                except ActionError as e:
                    tried.append(f"{M.redacted(ep)}: {e}")
                    say(f"registry {reg}: {M.redacted(ep)} does not serve {', '.join(images)} ({e})")
                    continue
                picks[reg] = ep
                say(f"registry {reg}: {M.redacted(ep)} serves {', '.join(images)}")
                break
            else:
                raise ActionError(
                    f"No endpoint of mirror set {set_name!r} serves "
                    f"{', '.join(images)}:\n  " + "\n  ".join(tried) + "\nTry "
                    "another --mirror (`envbuild mirrors probe --mirror NAME` shows "
                    "which answer), or add an endpoint that carries the image."
                )
    return picks


def build(
    context: Path,
    tag: str,
    build_args: dict[str, str],
    secrets: dict[str, Path],
    echo: Callable[[str], None],
    say: Callable[[str], None],
) -> BuildResult:
    """Build the rendered `context` once (its base images already name the registry endpoint
    that serves them); a failure is reported as the step that failed."""
    client = find_buildkit()
    say(f"builder: {client.description}")
    rc, log = run_build(client, context, tag, build_args, secrets, echo)
    if rc == 0:
        return BuildResult(tag, log[-2000:])
    steps: list[tuple[str, str]] = _FAILED_STEP.findall(log)  # (its two groups)
    raise build_failure("docker", tag, log, steps, PULL_FAILURE.search(log) is not None and not steps)


def platforms_client(client: BuildKitClient, platforms: tuple[str, ...], metadata: Path) -> BuildKitClient:
    """The buildx command of a --platform build: every platform at once, pushed as one manifest
    list (BuildKit writes its digest, `containerimage.digest`, to `metadata`); UserError where the
    client has no buildx: the daemon's built-in BuildKit builds one platform into the engine's
    image store, which holds no manifest list and so cannot push one."""
    if client.argv[1:2] != ("buildx",):
        raise UserError(
            f"--platform {','.join(platforms)}: the docker client here builds with the daemon's "
            f"built-in BuildKit ({client.description}), which builds into the engine's own image "
            "store: one platform a tag, no manifest list to push. Install the buildx plugin "
            "(docker-buildx-plugin or docker-buildx) and create a builder that can "
            "(`docker buildx create --use`, with QEMU's binfmt handlers for a foreign platform), "
            "or build with --builder buildah or podman (with Debian's qemu-user-static for a "
            "foreign platform)."
        )
    argv = (client.argv[0], "buildx", "build", "--platform", ",".join(platforms), "--push")
    return BuildKitClient(argv + ("--metadata-file", str(metadata)), dict(client.env), client.description)


def platforms(
    context: Path,
    registry: str,
    repo_tag: str,
    platforms: tuple[str, ...],
    build_args: dict[str, str],
    secrets: dict[str, Path],
    echo: Callable[[str], None],
    say: Callable[[str], None],
) -> str:
    """A --platform build with buildx: an image for each platform, pushed to registry/repo_tag
    as one manifest list; its digest, once the registry serves it."""
    from envbuilder.oci.registry import check_registry, check_served

    with tempfile.TemporaryDirectory(prefix="envbuild-platforms-") as tmp:
        client = platforms_client(find_buildkit(), platforms, Path(tmp) / "metadata.json")
        check_registry(registry, "--push", "nothing was built or pushed")
        target = f"{registry}/{repo_tag}"
        say(f"builder: {client.description}, {', '.join(platforms)} pushed to {target}")
        rc, log = run_build(client, context, target, build_args, secrets, echo)
        if rc != 0:
            steps: list[tuple[str, str]] = _FAILED_STEP.findall(log)  # (its two groups)
            raise build_failure(
                "docker", target, log, steps, PULL_FAILURE.search(log) is not None and not steps
            )
        from envbuilder.limits import read_text_bounded

        try:
            meta: object = json.loads(
                read_text_bounded(Path(tmp) / "metadata.json", "buildx's metadata file")
            )
        except (OSError, ValueError, UserError):
            meta = None
        found = _field(meta, "containerimage.digest", "")
        digest = found if isinstance(found, str) else ""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ActionError(
            f"buildx pushed {target} but wrote no manifest-list digest in its metadata file; "
            "check the builder (`docker buildx ls`) and the registry's logs."
        )
    check_served(target, digest, "pushing", "push")
    return digest


def build_failure(
    engine: str, tag: str, log: str, steps: list[tuple[str, str]], pull_failed: bool
) -> ActionError:
    """A failed build, reported as what it is: the base image's pull, or the step (the last of
    `steps`, (number, instruction) as the engine titles them) whose own output says why."""
    tail = "\n".join(log.strip().splitlines()[-15:])
    if pull_failed:
        return ActionError(
            f"{engine} build of {tag} could not pull its base image, although the "
            f"registry endpoint served its manifest:\n{tail}\nRun again, or try "
            "another --mirror."
        )
    where = f" at [{steps[-1][0]}] {step_title(steps[-1][1])}" if steps else ""
    if steps:
        # the engine repeats the step's command in its own report (the step's header, the
        # `> [n/m] RUN` block, the Dockerfile excerpt, "process ... did not complete"): the
        # title says it once, the tail keeps the step's own output
        tail, code = _without_the_command(tail, steps[-1][1])
        where += f" (exit code {code})" if code else ""
    kind, fix = classify(log)
    return ActionError(
        f"{engine} build of {tag} failed{where}.\n{tail}\n"
        + (
            f"{kind}. Fix: {fix}."
            if kind
            else "The step's own output above says why; fix that, then run again."
        )
    )


# A failed build, classified by what fixes it: (kind, the patterns of its log, the fix). The
# first kind whose pattern the log's last lines hold is the one reported.
FAILURES = (
    (
        "TLS verification failed (a TLS-intercepting proxy?)",
        r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|x509: certificate signed by unknown",
        "pass the network's CA bundle with --ca-cert FILE (a BuildKit secret, never in a layer)",
    ),
    (
        "A host name does not resolve from the build's network (DNS)",
        r"Temporary failure in name resolution|Name or service not known|Could not resolve host|"
        r"NameResolutionError|no such host|Failed to resolve '",
        "build through a mirror you can reach (--mirror NAME; `envbuild mirrors list`), or from a "
        "wheelhouse (--wheelhouse DIR)",
    ),
    (
        "The registry or index asked for credentials, or refused them",
        r"401 Unauthorized|403 Forbidden|authentication required|unauthorized: |"
        r"requested access to the resource is denied",
        "give the endpoint its credentials (in the mirror set's URL, or `docker login HOST`)",
    ),
    (
        "A pull or download was rate limited",
        r"429 Too Many Requests|toomanyrequests|rate limit",
        "pull through a mirror (--mirror NAME or --mirror auto), or `docker login` to raise Docker "
        "Hub's limit",
    ),
    (
        "The disk is full",
        r"No space left on device|no space left on device",
        "free space (`docker builder prune`, `docker system prune`) or move Docker's data-root to a "
        "bigger disk",
    ),
    (
        "pip cannot install these pins from this index (resolution impossible)",
        r"ResolutionImpossible|No matching distribution found|No solution found when resolving|"
        r"we can conclude that",
        "the index lacks a pinned version or file: check it answers and is not behind (a stale "
        "mirror), that the PyTorch index (or its mirror) answers for a +cuXXX torch, or build from "
        "a wheelhouse",
    ),
    (
        "A compile step failed",
        r"nvcc fatal|fatal error: |error: command '[^']*' failed|"
        r"subprocess-exited-with-error|Failed to build ",
        "check that nvcc's CUDA is torch's (envbuild check PROFILE), the arch list of the GPU; or "
        f"leave the compiled part out ({' / '.join(f'--without {n}' for n in COMPONENTS.names())})",
    ),
)


def classify(log: str) -> tuple[str | None, str | None]:
    """(what kind of failure, its one fix) from a failed build's last lines; (None, None) when
    none is recognised."""
    tail = "\n".join(log.strip().splitlines()[-60:])
    for kind, pattern, fix in FAILURES:
        if re.search(pattern, tail):
            return kind, fix
    return None, None


def _without_the_command(tail: str, instruction: str) -> tuple[str, str | None]:
    """The log's tail less the lines that only repeat the step's command, and the exit code
    the engine reported for it (None when it says none)."""
    body = re.sub(r"--(mount|network|security)=\S+\s*", "", instruction).strip()
    body = re.sub(r"^RUN\s+", "", re.sub(r"\s+", " ", body))
    probe = body[:40]
    code = None
    kept = []
    for line in tail.splitlines():
        flat = re.sub(r"\s+", " ", line)
        if probe and probe in flat:
            found = re.search(r"exit code: (\d+)", flat)
            code = code or (found[1] if found else None)
            continue
        kept.append(line)
    return "\n".join(kept), code


def step_title(instruction: str, limit: int = 120) -> str:
    """A build step as a person reads it: RUN's --mount/--network options left out (they are
    the same on every step), and shortened at a word, never mid-word."""
    text = re.sub(r"--(mount|network|security)=\S+\s*", "", instruction).strip()
    text = re.sub(r"\s+", " ", text)
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut + " ..."


def smoke(client: DockerClient, image: str, command: list[str]) -> str:
    """Run `command` in the image (no GPU needed); returns its output or raises ActionError."""
    try:
        out = client.containers.run(
            image, command, remove=True, network_mode="host", stdout=True, stderr=True
        )
    except Exception as e:
        report = getattr(e, "stderr", None)  # docker's ContainerError: the command's stderr
        lines = report.decode(errors="replace").strip().splitlines() if isinstance(report, bytes) else []
        failed = [ln for ln in lines if ln.startswith(("\u2717", "    fix:"))] or lines[-5:]
        if failed:
            raise ActionError(
                f"The smoke test failed in {image}:\n" + "\n".join(failed) + "\nThe "
                "image built but a training run would fail there; fix the above and "
                "rebuild."
            ) from None
        raise ActionError(
            f"The smoke test failed in {image}: {first_line(e)}. The image built "
            "but does not work; see the build log above."
        ) from None
    return out.decode(errors="replace")


def _field(event: object, key: str, default: object = None) -> object:
    """event[key] of a JSON object the engine sent (`default` without one)."""
    if not isinstance(event, dict):
        return default
    fields: dict[object, object] = event
    return fields.get(key, default)


def _text(event: object, key: str) -> str:
    value = _field(event, key, "")
    return value if isinstance(value, str) else ""


def push(client: DockerClient, image: str, registry: str, repo_tag: str, say: Callable[[str], None]) -> str:
    """Tag `image` as registry/repo_tag, push it with progress, return the pushed digest."""
    from envbuilder.oci.registry import check_registry, check_served

    check_registry(registry, "--push", "nothing was pushed")
    repo, _, tag = repo_tag.rpartition(":")
    target = f"{registry}/{repo}"
    client.images.get(image).tag(target, tag)
    say(f"pushing {target}:{tag}")
    digest: str | None = None
    shown: set[tuple[str, str]] = set()
    for event in client.images.push(target, tag, stream=True, decode=True):  # (decoded JSON objects)
        if isinstance(event, dict) and ("error" in event or "errorDetail" in event):
            detail = _field(event, "error") or _field(_field(event, "errorDetail"), "message")
            raise ActionError(
                f"Push of {target}:{tag} failed: {detail}. Check the registry's "
                "logs and your credentials (docker login); the tag is not there."
            )
        status, layer = _text(event, "status"), _text(event, "id")
        if status and (layer, status) not in shown and status != "Pushing":
            shown.add((layer, status))
            say(f"  {layer + ': ' if layer else ''}{status}")
        pushed = _field(_field(event, "aux"), "Digest", digest)
        digest = pushed if pushed is None or isinstance(pushed, str) else digest
    if not digest:
        raise ActionError(
            f"Push of {target}:{tag} reported no digest; the registry may have "
            "rejected it silently. Check the registry's logs."
        )
    check_served(f"{target}:{tag}", digest, "pushing", "push")
    return digest


def secret_files(ca_cert: Path | None, pip_conf: Path | None) -> dict[str, Path]:
    out = {}
    for sid, path in (("ca_cert", ca_cert), ("pip_conf", pip_conf)):
        if path is None:
            continue
        p = Path(path)
        if not p.is_file():
            what = "is a directory" if p.is_dir() else "does not exist"
            raise UserError(
                f"--{sid.replace('_', '-')} {p} {what}. Pass a readable file (it "
                "reaches RUN steps as a BuildKit secret only)."
            )
        out[sid] = p.resolve()
    return out


def stage_context(files: dict[str, str], links: Mapping[str, Checked] | None = None) -> Path:
    """A private build context made from rendered files (removed by the caller); `links`
    (a wheelhouse's files, outdir.Checked) are placed as the bytes their manifest names."""
    from envbuilder.render.files import write_dir

    root = Path(tempfile.mkdtemp(prefix="envbuild-ctx-"))
    write_dir(root / "ctx", files, links)
    return root / "ctx"


class _Step(TypedDict):
    label: str
    title: str
    started: float
    last: str


class StepLog:
    """BuildKit's --progress=plain, parsed into steps (the progress a person reads while a build
    runs): each step when it ends, CACHED or with its time; cached steps in the Dockerfile's
    order (BuildKit reports them in any order); while a step runs, a line every `beat` seconds
    with its elapsed time and its last output (so a CI log shows life during the torch step),
    and the total at the end. On a terminal the running step's line is rewritten in place
    instead; elsewhere nothing is ever rewritten (no carriage returns)."""

    START = re.compile(r"^#(\d+) \[([^\]]+)\] (.*)$")
    STATE = re.compile(r"^#(\d+) (CACHED|DONE ([\d.]+)s|ERROR\b.*|CANCELED)\s*$")
    OUTPUT = re.compile(r"^#(\d+) \d+\.\d+ (.*)$")

    def __init__(
        self,
        out: TextIO | None = None,
        tty: bool | None = None,
        beat: float = 12.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.out = out or sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self.beat, self.clock = beat, clock
        self.start = clock()
        self.steps: dict[str, _Step] = {}  # id -> {label, title, started, last}
        self.stages: list[str] = []
        self.cached: list[_Step] = []  # waiting to be printed in the Dockerfile's order
        self.counts = {"cached": 0, "run": 0}
        self.running: str | None = None
        self.last_beat = self.start
        self.status = False  # a status line is on the terminal
        import threading

        self.lock = threading.Lock()

    def _print(self, text: str) -> None:
        if self.status:
            self.out.write("\r\x1b[K")
            self.status = False
        self.out.write(text + "\n")
        self.out.flush()

    @staticmethod
    def _clock_text(seconds: float) -> str:
        from envbuilder.progress import clock_text

        return clock_text(seconds)

    def _order(self, step: _Step) -> tuple[int, int]:
        stage, _, pos = step["label"].partition(" ")
        k = pos.split("/")[0]
        return (self.stages.index(stage) if stage in self.stages else 99, int(k) if k.isdigit() else 0)

    def _flush_cached(self) -> None:
        for step in sorted(self.cached, key=self._order):
            self._print(f"  [{step['label']}] {step['title']}  CACHED")
        self.cached = []

    def __call__(self, line: str) -> None:
        with self.lock:
            self._line(line)

    def _line(self, line: str) -> None:
        m = self.START.match(line)
        if m:
            sid, label, instr = m.groups()
            if label == "internal" or label.startswith("internal]"):
                return
            stage = label.split(" ", 1)[0]
            if stage not in self.stages:
                self.stages.append(stage)
            if sid not in self.steps:  # (BuildKit prints a step's header again when outputs interleave)
                self.steps[sid] = {
                    "label": label,
                    "title": step_title(instr, 90),
                    "started": self.clock(),
                    "last": "",
                }
            return
        m = self.OUTPUT.match(line)
        if m and m.group(1) in self.steps:
            self.steps[m.group(1)]["last"] = m.group(2).strip()[:80]
            self.running = m.group(1)
            return
        m = self.STATE.match(line)
        if not m or m.group(1) not in self.steps:
            return
        step = self.steps.pop(m.group(1))
        if step["title"].startswith("FROM "):
            return
        if m.group(2) == "CACHED":
            self.counts["cached"] += 1
            self.cached.append(step)
            return
        self._flush_cached()
        if m.group(3):
            self.counts["run"] += 1
            self._print(f"  [{step['label']}] {step['title']}  done in {self._clock_text(float(m.group(3)))}")
        else:
            self._print(f"  [{step['label']}] {step['title']}  {m.group(2).split(':')[0]}")
        if self.running == m.group(1):
            self.running = None

    def tick(self) -> None:
        """A heartbeat (a timer calls it every second): the running step and its time."""
        with self.lock:
            now = self.clock()
            if self.running not in self.steps:
                running = [s for s in self.steps.values() if not s["title"].startswith("FROM ")]
                if not running:
                    return
                step = max(running, key=lambda s: s["started"])
            else:
                step = self.steps[self.running]
            text = (
                f"  ... [{step['label']}] {step['title']}  running "
                f"{self._clock_text(now - step['started'])}" + (f" ({step['last']})" if step["last"] else "")
            )
            if self.tty:
                self.out.write("\r\x1b[K" + text[:200])
                self.out.flush()
                self.status = True
            elif now - self.last_beat >= self.beat:
                self._print(text)
                self.last_beat = now

    def close(self, rc: int) -> None:
        with self.lock:
            self._flush_cached()
            total = self.counts["cached"] + self.counts["run"]
            self._print(
                f"build {'done' if rc == 0 else 'failed'} in "
                f"{self._clock_text(self.clock() - self.start)}: {total} step"
                f"{'s' if total != 1 else ''}, {self.counts['cached']} cached, "
                f"{self.counts['run']} run"
            )


def default_echo(verbose: bool, header: str = BUILDKIT_STEP) -> Callable[[str], None]:
    if verbose:
        return lambda line: print(line, file=sys.stderr, flush=True)
    if header == BUILDKIT_STEP:
        return StepLog()
    step = re.compile(header)

    def echo(line: str) -> None:  # the build's step headers (BuildKit's by default): one a step
        if step.match(line):
            print(line, file=sys.stderr, flush=True)

    return echo


def auto_mirror(m: Matrix, say: Callable[[str], None]) -> str:
    """`--mirror auto`: the configured mirror set, else the first whose registry answers."""
    from envbuilder.model.config import config_path, user_config
    from envbuilder.model import mirrors as M
    from envbuilder.oci.probe import run

    config: Mapping[str, object] = user_config()
    name = config.get("mirror")  # (a NAME: the config's schema checked it)
    candidates = [name] if isinstance(name, str) and name else list(M.mirror_sets(m))
    for cand in candidates:
        if any(p.ok for p in run(M.probe_jobs(M.get_set(m, cand), kinds=("registry",)))):
            say(f"--mirror auto chose {cand!r}")
            return cand
    raise ActionError(
        "--mirror auto: no mirror set has a registry endpoint that answers "
        f"(tried {', '.join(candidates)}). Check your network, or add a "
        f"mirror set under `mirrors:` in {config_path()} (envbuild's "
        "config; ENVBUILD_CONFIG names another) with a registry you reach."
    )


def mirror_choice(
    m: Matrix, name: str | None, env: ResolvedEnv, own_credentials: dict[str, str], say: Callable[[str], None]
) -> tuple[MirrorChoice | None, dict[str, str]]:
    """(the mirror choice, the endpoints the build's RUN steps read) for mirror set `name`:
    its endpoints probed, the base images' registries picked before building (the
    environment's own image references name them), its endpoints replacing the profile's own,
    credentials and all. (None, the profile's own) without a mirror set."""
    from envbuilder.model import mirrors as M

    endpoints = dict(own_credentials)
    if not name:
        return None, endpoints
    body = M.get_set(m, name)
    from envbuilder.oci.probe import run

    healthy: dict[str, tuple[bool, float]] = M.health(run(M.probe_jobs(body)))
    for e, (ok, ms) in sorted(healthy.items()):
        say(f"  probe {M.redacted(e)}: {'ok' if ok else 'DOWN'} ({ms:.0f} ms)")
    picks = pick_registries(name, body, list(env.base_images), healthy, say)
    choice = M.choice(name, body, healthy)._replace(registries=picks)
    endpoints.update(choice.endpoints(env))
    return choice, endpoints
