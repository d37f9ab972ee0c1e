"""Build, smoke-test and push a rendered profile with BuildKit, through mirrors.

The engine API (ping, inspect, tag, push, pull, run) goes through the docker SDK; the build
itself goes through a BuildKit-capable docker client, because secret and cache mounts need
BuildKit: `docker buildx build` where the plugin exists, else `DOCKER_BUILDKIT=1 docker build`
with a client old enough (< 23) to have BuildKit built in.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple

from .errors import ActionError, UserError

# Build output that means "this registry endpoint would not serve the pull": try the next one.
PULL_FAILURE = re.compile(
    r"toomanyrequests|unauthorized|authentication required|pull access denied|"
    r"connection refused|no such host|i/o timeout|TLS handshake timeout|"
    r"failed to resolve source metadata|failed to do request|"
    r"dial tcp|server misbehaving|manifest unknown|not found: manifest|: not found$", re.I | re.M)


class BuildKitClient(NamedTuple):
    argv: tuple[str, ...]  # ("docker", "buildx", "build") or ("docker", "build")
    env: dict
    description: str


def _client_version(docker: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([docker, "version", "--format", "{{.Client.Version}}"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.match(r"(\d+)\.(\d+)", out.stdout.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_buildkit() -> BuildKitClient:
    """The first docker client that can run BuildKit builds, or a clear error."""
    candidates = []
    for c in (os.environ.get("ENVBUILD_DOCKER"), shutil.which("docker"), "/usr/bin/docker",
              "/usr/local/bin/docker"):
        if c and os.path.exists(c) and c not in candidates:
            candidates.append(c)
    if not candidates:
        raise ActionError("No docker client found on PATH. Install Docker (Debian/Ubuntu: "
                          "apt-get install docker.io, which also brings BuildKit) and run again.")
    tried = []
    for docker in candidates:
        try:
            bx = subprocess.run([docker, "buildx", "version"], capture_output=True, text=True,
                                timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if bx.returncode == 0:
            return BuildKitClient((docker, "buildx", "build", "--load"), {},
                                  f"{docker} buildx ({bx.stdout.split()[1] if bx.stdout.split()[1:] else 'buildx'})")
        version = _client_version(docker)
        if version and version < (23, 0):
            return BuildKitClient((docker, "build"), {"DOCKER_BUILDKIT": "1"},
                                  f"{docker} {'.'.join(map(str, version))} with DOCKER_BUILDKIT=1")
        tried.append(f"{docker} ({'.'.join(map(str, version)) if version else 'unknown version'}, "
                     "no buildx plugin)")
    raise ActionError("No BuildKit-capable docker client: " + "; ".join(tried) + ". A client of "
                      "version 23 or later needs the buildx plugin (apt-get install docker-buildx, "
                      "or the docker-buildx-plugin package); Debian's docker.io 20.10 client has "
                      "BuildKit built in (set ENVBUILD_DOCKER=/usr/bin/docker).")


def engine():
    """A docker SDK client that answers, or ActionError naming the fix."""
    try:
        import docker
    except ImportError:
        raise ActionError("The docker Python SDK is missing: pip install 'envbuild[actions]'.") from None
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.from_env(timeout=int(os.environ.get("ENVBUILD_DOCKER_TIMEOUT", "600")))
        client.ping()
        return client
    except Exception as e:  # the SDK raises DockerException, requests' and socket errors alike
        raise ActionError(f"Cannot reach the Docker engine at {host} ({_first_line(e)}). Start it "
                          "(systemctl start docker, or dockerd as root), check DOCKER_HOST, and "
                          "make sure your user may use the socket (the docker group).") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


class BuildResult(NamedTuple):
    image: str
    endpoint: str | None
    log_tail: str


def run_build(client: BuildKitClient, context: Path, tag: str, build_args: dict[str, str],
              secrets: dict[str, Path], echo: Callable[[str], None]) -> tuple[int, str]:
    """One `docker build`; streams progress lines through `echo`, returns (rc, full log)."""
    argv = list(client.argv) + ["--network=host", "--progress=plain", "-t", tag]
    for k, v in sorted(build_args.items()):
        argv += ["--build-arg", f"{k}={v}"]
    for sid, path in sorted(secrets.items()):
        argv += ["--secret", f"id={sid},src={path}"]
    argv.append(str(context))
    env = dict(os.environ, **client.env)
    lines = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        echo(line.rstrip("\n"))
    return proc.wait(), "".join(lines)


# Build args that point package steps at an index or a download; an offline build (from a
# wheelhouse in the context) keeps its own file:// defaults instead.
NETWORK_ARGS = ("PIP_INDEX_URL", "TORCH_INDEX_URL", "APEX_URL")


def build(context: Path, d: dict, tag: str, mirror_name: str | None, mirror_body: dict | None,
          healthy: dict | None, secrets: dict[str, Path], echo: Callable[[str], None],
          say: Callable[[str], None], offline: bool = False) -> BuildResult:
    """Build the rendered `context`; on a pull failure, retry through the next registry endpoint."""
    from . import mirrors as M

    client = find_buildkit()
    say(f"builder: {client.description}")
    dockerfile = (context / "Dockerfile").read_text(encoding="utf-8")
    attempts = M.registry_attempts(mirror_body) if mirror_body else 1
    last_log = ""
    for i in range(attempts):
        args: dict[str, str] = {}
        endpoint = None
        if mirror_body is not None:
            choice = M.choice(mirror_name or "mirror", mirror_body, i, healthy)
            (context / "Dockerfile").write_text(M.rewrite_dockerfile(dockerfile, choice), encoding="utf-8")
            args = choice.build_args(d)
            if offline:
                args = {k: v for k, v in args.items() if k not in NETWORK_ARGS}
            endpoint = ", ".join(f"{k} -> {v}" for k, v in sorted(choice.registries.items()) if v)
            say(f"mirror {mirror_name}: {endpoint or 'no registry rewrite'}")
        rc, log = run_build(client, context, tag, args, secrets, echo)
        last_log = log
        if rc == 0:
            if mirror_body is not None:
                say(f"served by: {endpoint}")
            return BuildResult(tag, endpoint, log[-2000:])
        m = PULL_FAILURE.search(log)
        if m and i + 1 < attempts:
            say(f"pull failed through {endpoint} ({m.group(0)}); trying the next endpoint")
            continue
        break
    (context / "Dockerfile").write_text(dockerfile, encoding="utf-8")
    tail = "\n".join(last_log.strip().splitlines()[-15:])
    raise ActionError(f"docker build failed for {tag}.\n{tail}\nFix the error above (a pull error "
                      "means the registry or mirror would not serve the base image: try another "
                      "--mirror), then run again.")


def smoke(client, image: str, command: list[str]) -> str:
    """Run `command` in the image (no GPU needed); returns its output or raises ActionError."""
    try:
        out = client.containers.run(image, command, remove=True, network_mode="host",
                                    stdout=True, stderr=True)
    except Exception as e:
        report = getattr(e, "stderr", None)  # docker's ContainerError: the command's stderr
        lines = report.decode(errors="replace").strip().splitlines() if isinstance(report, bytes) else []
        failed = [ln for ln in lines if ln.startswith(("\u2717", "    fix:"))] or lines[-5:]
        if failed:
            raise ActionError(f"The smoke test failed in {image}:\n" + "\n".join(failed) + "\nThe "
                              "image built but a training run would fail there; fix the above and "
                              "rebuild.") from None
        raise ActionError(f"The smoke test failed in {image}: {_first_line(e)}. The image built "
                          "but does not work; see the build log above.") from None
    return out.decode(errors="replace")


def push(client, image: str, registry: str, repo_tag: str, say: Callable[[str], None]) -> str:
    """Tag `image` as registry/repo_tag, push it with progress, return the pushed digest."""
    import requests

    from .mirrors import endpoint_url

    base = endpoint_url(registry)
    try:
        r = requests.get(base + "/v2/", timeout=10)
        if r.status_code not in (200, 401):
            raise ActionError(f"{registry} answered HTTP {r.status_code} to /v2/: not a container "
                              "registry. Check --push.")
    except requests.RequestException as e:
        raise ActionError(f"Registry {registry} is unreachable ({type(e).__name__}). Start it or "
                          "fix --push (a name from your config's `registries:`, or HOST[:PORT]); "
                          "nothing was pushed.") from None
    repo, _, tag = repo_tag.rpartition(":")
    target = f"{registry}/{repo}"
    client.images.get(image).tag(target, tag)
    say(f"pushing {target}:{tag}")
    digest = None
    shown = set()
    for event in client.images.push(target, tag, stream=True, decode=True):
        if "error" in event or "errorDetail" in event:
            detail = event.get("error") or event["errorDetail"].get("message")
            raise ActionError(f"Push of {target}:{tag} failed: {detail}. Check the registry's "
                              "logs and your credentials (docker login); the tag is not there.")
        status, layer = event.get("status", ""), event.get("id", "")
        if status and (layer, status) not in shown and status != "Pushing":
            shown.add((layer, status))
            say(f"  {layer + ': ' if layer else ''}{status}")
        aux = event.get("aux") or {}
        digest = aux.get("Digest", digest)
    if not digest:
        raise ActionError(f"Push of {target}:{tag} reported no digest; the registry may have "
                          "rejected it silently. Check the registry's logs.")
    accept = ", ".join(["application/vnd.docker.distribution.manifest.v2+json",
                        "application/vnd.docker.distribution.manifest.list.v2+json",
                        "application/vnd.oci.image.manifest.v1+json",
                        "application/vnd.oci.image.index.v1+json"])
    head = requests.head(f"{base}/v2/{repo}/manifests/{tag}", headers={"Accept": accept}, timeout=10)
    if head.status_code != 200 or head.headers.get("Docker-Content-Digest") != digest:
        raise ActionError(f"After pushing, {target}:{tag} is not served with digest {digest} "
                          f"(HTTP {head.status_code}). The push is not complete; run again.")
    return digest


def secret_files(ca_cert: Path | None, pip_conf: Path | None) -> dict[str, Path]:
    out = {}
    for sid, path in (("ca_cert", ca_cert), ("pip_conf", pip_conf)):
        if path is None:
            continue
        p = Path(path)
        if not p.is_file():
            what = "is a directory" if p.is_dir() else "does not exist"
            raise UserError(f"--{sid.replace('_', '-')} {p} {what}. Pass a readable file (it "
                            "reaches RUN steps as a BuildKit secret only).")
        out[sid] = p.resolve()
    return out


def stage_context(files: dict[str, str], links: dict[str, Path] | None = None) -> Path:
    """A private build context made from rendered files (removed by the caller); `links`
    (a wheelhouse's files) are hard-linked in."""
    from .render import write_dir

    root = Path(tempfile.mkdtemp(prefix="envbuild-ctx-"))
    write_dir(root / "ctx", files, links)
    return root / "ctx"


def default_echo(verbose: bool) -> Callable[[str], None]:
    if verbose:
        return lambda line: print(line, file=sys.stderr, flush=True)
    step = re.compile(r"^#\d+ \[")

    def echo(line: str) -> None:  # BuildKit's step headers only: one line per step
        if step.match(line):
            print(line, file=sys.stderr, flush=True)
    return echo
