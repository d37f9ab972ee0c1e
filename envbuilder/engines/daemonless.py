"""The engines `envbuild build` builds with: docker (BuildKit through the docker client and
daemon), or daemonless podman / buildah, from the same rendered Dockerfile.

Each is an `Engine`: build (the context into a tagged local image), smoke (run a command in it),
push (to a registry, returning the pushed digest). podman and buildah share containers-storage,
so an image podman built is visible to buildah: both engines smoke-test with `buildah from` +
`buildah run` (`podman run` cannot set rlimits in some sandboxes, `buildah run` does not ask).
Both pull and push with `--tls-verify=false` only for loopback registries (plain HTTP there, as
the docker daemon allows for 127.0.0.0/8 by default).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable

from envbuilder.errors import ActionError, UserError
from envbuilder.record import Record
from envbuilder.oci.registry import is_loopback

if TYPE_CHECKING:
    from envbuilder.engines.docker import BuildResult

NAMES = ("docker", "podman", "buildah")
INSTALL = {
    "docker": "Debian/Ubuntu: apt-get install docker.io, which brings BuildKit",
    "podman": "Debian/Ubuntu: apt-get install podman buildah; envbuild smoke-tests podman's "
    "images in a buildah container",
    "buildah": "Debian/Ubuntu: apt-get install buildah",
}
# a build step's header: "STEP 3/12: RUN ..." (multi-stage builds prefix "[1/2] ")
STEP = re.compile(r"^(?:\[\d+/\d+\] )?STEP (\d+/\d+): (.+)$", re.M)
# what podman/buildah print when the FROM image cannot be pulled
PULL_FAILED = re.compile(
    r"creating build container|initializing source|pinging container "
    r"registry|server gave HTTP response to HTTPS client|reading manifest|"
    r"short-name .* did not resolve",
    re.I,
)


class Engine(Record):
    name: str
    build: Callable[..., BuildResult]  # (context, tag, build_args, secrets, echo, say) -> build.BuildResult
    smoke: Callable[..., str]  # (image, command) -> its output; ActionError when it fails
    push: Callable[..., str]  # (image, registry, repo_tag, say) -> the pushed digest
    # (context, registry, repo_tag, platforms, build_args, secrets, echo, say) -> the digest of
    # the manifest list it pushed: one image a platform (--platform)
    platforms: Callable[..., str]
    step_header: str  # the regex of a build step's first line (progress without -v)


# -- which engine -------------------------------------------------------------------------------


def docker_usable() -> tuple[bool, str]:
    """(True, what builds) when a BuildKit-capable docker client exists and the daemon answers."""
    from envbuilder.engines import docker as B

    try:
        client = B.find_buildkit()
    except B.NoBuildKit as e:
        return False, e.detail
    try:
        docker = B.sdk()
    except ImportError:
        return False, "the docker Python SDK is not installed (pip install 'envbuild[actions]')"
    try:
        docker.from_env(timeout=5).ping()
    except Exception as e:  # noqa: BLE001 - the daemon down or unreachable: not usable
        return False, f"the Docker daemon does not answer ({B.first_line(e)})"
    return True, client.description


def auto(docker: Callable[[], tuple[bool, str]] | None = None) -> tuple[str, str]:
    """(engine, why) for `--builder auto`: docker when it can build (a BuildKit-capable client and
    a daemon that answers), else podman, else buildah. DOCKER_HOST set means docker (its error
    then says what is wrong with that daemon); with none of the three, docker, for the same."""
    if os.environ.get("DOCKER_HOST"):
        return "docker", "DOCKER_HOST is set"
    ok, why = (docker or docker_usable)()
    if ok:
        return "docker", why
    for name in ("podman", "buildah"):
        if shutil.which(name):
            return name, f"docker cannot build here: {why}"
    return "docker", f"no podman or buildah either; docker: {why}"


def choose(requested: str | None, smoke: bool, say: Callable[[str], None]) -> str:
    """The engine to build with; UserError (exit 2) when the one asked for is not installed."""
    if requested in (None, "auto"):
        name, why = auto()
        if name != "docker":  # (docker, as before engines existed, says nothing more)
            say(f"engine: {name} ({why})")
    else:
        name = requested
    if name == "docker":
        return name  # docker's own checks (client, BuildKit, daemon) say what is missing
    need = [name] + (["buildah"] if smoke and name == "podman" else [])
    missing = [n for n in need if not shutil.which(n)]
    if name in missing:
        raise UserError(
            f"--builder {name}: `{name}` is not on PATH. Install it ({INSTALL[name]}), "
            f"or choose another --builder ({', '.join(n for n in NAMES if n != name)})."
        )
    if missing:
        raise UserError(
            "--builder podman smoke-tests the image in a buildah container (`podman "
            "run` cannot start containers where setting rlimits is not allowed), but "
            "`buildah` is not on PATH. Install it (apt-get install buildah), or pass "
            "--no-smoke."
        )
    return name


def make(name: str) -> Engine:
    """The engine `name` (docker: after the daemon answered, as `build` always checked)."""
    from functools import partial

    from envbuilder.engines import docker as B

    if name == "docker":
        client = B.engine()
        return Engine(
            "docker", B.build, partial(B.smoke, client), partial(B.push, client), B.platforms, B.BUILDKIT_STEP
        )
    return Engine(
        name,
        partial(daemonless_build, name),
        buildah_smoke,
        partial(daemonless_push, name),
        partial(daemonless_platforms, name),
        STEP.pattern,
    )


def statuses(
    which: Callable[[str], str | None], run: Callable[[Sequence[str]], subprocess.CompletedProcess[str]]
) -> list[tuple[str, bool, str]]:
    """(engine, usable, detail) for podman and buildah: installed, and their version answers."""
    out = []
    for name in ("podman", "buildah"):
        path = which(name)
        if not path:
            out.append((name, False, f"not installed ({INSTALL[name]})"))
            continue
        try:
            r = run((path, "--version"))
            words = (r.stdout or "").split()
            ok = r.returncode == 0 and len(words) >= 3
            detail = f"{words[2]}" if ok else (r.stdout + r.stderr).strip()[:120]
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, detail = False, f"{path} --version failed ({e})"
        if ok and name == "podman":
            detail += (
                ", smoke test through buildah"
                if which("buildah")
                else ", but its smoke test needs buildah (apt-get install buildah; or --no-smoke)"
            )
        out.append((name, ok, detail))
    return out


# -- podman / buildah -----------------------------------------------------------------------------

_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$", re.I)
_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", re.I)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def base_images(dockerfile: str, build_args: dict[str, str]) -> list[tuple[str | None, str]]:
    """(the ARG a FROM names or None, the image it pulls) for each FROM that is not an earlier
    stage: the global ARGs' defaults, overridden by `build_args`."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    out = []
    seen_from = False
    for line in dockerfile.splitlines():
        if not seen_from and (m := _ARG.match(line)):
            value = (m.group(2) or "").strip().strip('"').strip("'")
            args[m.group(1)] = build_args.get(m.group(1), value)
        elif m := _FROM.match(line):
            seen_from = True
            raw = m.group(1)
            var = _VAR.fullmatch(raw)
            image = _VAR.sub(lambda v: args.get(v.group(1) or v.group(2), ""), raw)
            if image.lower() != "scratch" and image.lower() not in stages:
                out.append(((var.group(1) or var.group(2)) if var else None, image))
            if m.group(2):
                stages.add(m.group(2).lower())
    return out


def qualified(image: str) -> str:
    """A short name (nvidia/cuda:12.4) as docker reads it (docker.io/nvidia/cuda:12.4): podman
    and buildah resolve short names through registries.conf, which may list no registry."""
    from envbuilder.oci.registry import DOCKER_HUB, parse_image

    if parse_image(image).registry == DOCKER_HUB and not image.startswith(DOCKER_HUB + "/"):
        return f"{DOCKER_HUB}/{image}"
    return image


def build_argv(
    name: str,
    context: Path,
    tag: str,
    build_args: dict[str, str],
    secrets: dict[str, Path],
    platforms: tuple[str, ...] = (),
) -> list[str]:
    """`podman build` / `buildah bud` with what `docker build` gets: host network, the build
    args, secrets; docker's image format (OCI images drop SHELL), layers cached; base images
    qualified as docker would; --tls-verify=false when every base image is on loopback. With
    `platforms`, an image for each (a foreign one's RUN steps run under QEMU's binfmt handler)
    gathered in the manifest list `tag` (--manifest), not one tagged image."""
    dockerfile = (context / "Dockerfile").read_text()
    args = dict(build_args)
    bases = base_images(dockerfile, args)
    for var, image in bases:
        if var and qualified(image) != image:
            args[var] = qualified(image)
    argv = [
        name,
        "build" if name == "podman" else "bud",
        "--format",
        "docker",
        "--layers",
        "--force-rm",
        "--network=host",
        *(["--platform", ",".join(platforms), "--manifest", tag] if platforms else ["-t", tag]),
    ]
    if bases and all(is_loopback(qualified(image)) for _, image in bases):
        argv.append("--tls-verify=false")
    for k, v in sorted(args.items()):
        argv += ["--build-arg", f"{k}={v}"]
    for sid, path in sorted(secrets.items()):
        argv += ["--secret", f"id={sid},src={path}"]
    return argv + [str(context)]


def daemonless_build(
    name: str,
    context: Path,
    tag: str,
    build_args: dict[str, str],
    secrets: dict[str, Path],
    echo: Callable[[str], None],
    say: Callable[[str], None],
    platforms: tuple[str, ...] = (),
) -> BuildResult:
    from envbuilder.engines import docker as B

    if platforms:
        # (--manifest adds to the list of that name: one an earlier build left would keep its
        # images beside this build's)
        subprocess.run([name, "manifest", "rm", tag], capture_output=True, timeout=120)
    argv = build_argv(name, context, tag, build_args, secrets, platforms)
    version = _version(name)
    say(f"builder: {name}{' ' + version if version else ''} ({' '.join(argv[1:2])}, daemonless)")
    mixed = [
        img for _, img in base_images((context / "Dockerfile").read_text(), build_args) if is_loopback(img)
    ]
    if mixed and "--tls-verify=false" not in argv:
        say(
            f"note: {', '.join(mixed)} is on a loopback registry but other base images are not: "
            "mark it `insecure = true` in registries.conf if it serves plain HTTP"
        )
    rc, log = _stream(argv, echo)
    if rc == 0:
        return B.BuildResult(tag, log[-2000:])
    steps: list[tuple[str, str]] = STEP.findall(log)  # (its two groups)
    pulled = (PULL_FAILED.search(log) or B.PULL_FAILURE.search(log)) and (
        not steps or steps[-1][1].upper().startswith("FROM ")
    )
    raise B.build_failure(name, tag, log, steps, bool(pulled))


def _version(name: str) -> str:
    try:
        words = subprocess.run([name, "--version"], capture_output=True, text=True, timeout=20).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return words[2] if len(words) >= 3 else ""


def _stream(argv: list[str], echo: Callable[[str], None]) -> tuple[int, str]:
    from envbuilder.engines.docker import redacted

    lines = []
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
    except OSError as e:
        raise ActionError(f"Cannot run {argv[0]} ({e}). Install it ({INSTALL[argv[0]]}).") from None
    assert proc.stdout is not None
    for line in proc.stdout:
        line = redacted(line)
        lines.append(line)
        echo(line.rstrip("\n"))
    return proc.wait(), "".join(lines)


def buildah_smoke(image: str, command: list[str]) -> str:
    """Run `command` in a buildah working container of `image` (host network, as docker's smoke
    test), then remove the container; its output, or ActionError with what failed."""

    def run(argv: list[str], timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)

    made = run(["buildah", "from", "--pull=never", image], 300)
    ctr = made.stdout.strip().splitlines()[-1] if made.returncode == 0 and made.stdout.strip() else ""
    if not ctr:
        raise ActionError(
            f"The smoke test could not start a buildah container of {image}: "
            f"{(made.stderr or made.stdout).strip()[-300:]}. The image built; check "
            "`buildah images` (podman and buildah share containers-storage)."
        )
    try:
        out = run(["buildah", "run", "--network=host", ctr, "--", *command])
    finally:
        run(["buildah", "rm", ctr], 120)
    text = out.stdout + out.stderr
    if out.returncode == 0:
        return text
    lines = text.strip().splitlines()
    failed = [ln for ln in lines if ln.startswith(("\u2717", "    fix:"))] or lines[-5:]
    raise ActionError(
        f"The smoke test failed in {image}:\n" + "\n".join(failed) + "\nThe image "
        "built but a training run would fail there; fix the above and rebuild."
    )


def daemonless_push(
    name: str,
    image: str,
    registry: str,
    repo_tag: str,
    say: Callable[[str], None],
    manifest_list: bool = False,
) -> str:
    """`podman push` / `buildah push` to registry/repo_tag (--tls-verify=false on loopback only),
    or with `manifest_list` `manifest push --all` (the list and every image in it); return the
    pushed digest (the list's) once the registry serves it."""
    from envbuilder.oci.registry import check_registry, check_served

    check_registry(registry, "--push", "nothing was pushed")
    repo, _, tag = repo_tag.rpartition(":")
    target = f"{registry}/{repo}"
    say(f"pushing {target}:{tag}")
    with tempfile.TemporaryDirectory(prefix="envbuild-push-") as tmp:
        digestfile = Path(tmp) / "digest"
        argv = [name, "manifest", "push", "--all"] if manifest_list else [name, "push"]
        argv += ["--tls-verify=false"] if is_loopback(registry) else []
        argv += ["--digestfile", str(digestfile), image, f"docker://{target}:{tag}"]
        rc, log = _stream(argv, lambda line: say(f"  {line}") if line.strip() else None)
        digest = digestfile.read_text().strip() if digestfile.exists() else ""
    if rc != 0:
        last = log.strip().splitlines()[-1] if log.strip() else f"exit status {rc}"
        raise ActionError(
            f"Push of {target}:{tag} failed: {last}. Check the registry's logs and "
            f"your credentials ({name} login); the tag is not there."
        )
    if not digest:
        raise ActionError(
            f"Push of {target}:{tag} reported no digest; the registry may have "
            "rejected it silently. Check the registry's logs."
        )
    check_served(f"{target}:{tag}", digest, "pushing", "push")
    return digest


# QEMU's user-mode handler of each foreign platform, as Debian's qemu-user-static registers it
QEMU_HANDLERS = {"linux/arm64": "qemu-aarch64", "linux/amd64": "qemu-x86_64"}
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")


def foreign_needs_qemu(platforms: tuple[str, ...], binfmt: Path = BINFMT_DIR) -> None:
    """UserError naming the fix when a platform of another CPU than this machine's has no
    enabled binfmt handler here: its RUN steps would fail with `exec format error`."""
    import platform as host

    own = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}.get(host.machine())
    for p in platforms:
        handler = binfmt / QEMU_HANDLERS.get(p, "")
        if p == own or p not in QEMU_HANDLERS:
            continue
        try:
            enabled = handler.read_text().splitlines()[0] == "enabled"
        except (OSError, IndexError):
            enabled = False
        if not enabled:
            raise UserError(
                f"--platform {p}: this machine is {own or host.machine()}, and no {handler.name} "
                f"binfmt handler is enabled ({handler}), so the {p} RUN steps cannot run here. "
                "Install Debian's qemu-user-static and binfmt-support (apt-get install), with "
                "binfmt_misc mounted (mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc)."
            )


def daemonless_platforms(
    name: str,
    context: Path,
    registry: str,
    repo_tag: str,
    platforms: tuple[str, ...],
    build_args: dict[str, str],
    secrets: dict[str, Path],
    echo: Callable[[str], None],
    say: Callable[[str], None],
) -> str:
    """A --platform build: an image for each platform in the local manifest list `repo_tag`,
    then the list and its images pushed to registry/repo_tag; the list's digest."""
    from envbuilder.oci.registry import check_registry

    foreign_needs_qemu(platforms)
    check_registry(registry, "--push", "nothing was built or pushed")
    daemonless_build(name, context, repo_tag, build_args, secrets, echo, say, platforms)
    return daemonless_push(name, repo_tag, registry, repo_tag, say, manifest_list=True)
