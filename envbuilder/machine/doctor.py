"""Is this machine ready to build and run a profile? Each check says ✓/✗ and, when it fails, the fix.

The GPU checks apply the resolver's rules to what `detect` found; the host checks (Docker engine,
NVIDIA runtime, BuildKit, the build engines usable, disk, conda) read the machine through the probes in `Probes`, which
tests replace with recorded answers.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from envbuilder.errors import UserError
from envbuilder.machine.detect import Machine, NO_GPU_FIX, Nvml, Runner, detect, run_command, runnable_archs
from envbuilder.model.matrix import Matrix, cc_tuple
from envbuilder.model.resolve import ResolveError, picked_for_driver, resolve
from envbuilder.model.resolved import Overrides, ResolvedEnv
from envbuilder.model.matrix import cc_runs
from envbuilder.engines.docker import NoBuildKit, docker_clients, find_buildkit, which_all
from envbuilder.record import Record
from envbuilder.text import sentences

if TYPE_CHECKING:
    from envbuilder.oci.probe import Probe

# a mirror set's (or the build's) endpoints, shaped as model/mirrors.py writes them -> each one probed
MirrorProbe = Callable[[dict[str, object]], "list[Probe]"]

# Rough size of a built image and its build cache, in GB: CUDA runtime + torch + verl, then what
# vLLM and a build stage (devel image, nvcc, apex/flash-attn compiles) add. An estimate, not a fact.
IMAGE_GB = {"base": 15, "vllm": 5, "builder": 5}
CONDA_TOOLS = ("micromamba", "mamba", "conda")


class Check(Record):
    name: str
    status: str  # ok, fail, warn (does not fail the doctor), skip (could not be checked)
    detail: str
    fix: str = ""

    def lines(self) -> list[str]:
        mark = {"ok": "\u2713", "fail": "\u2717", "warn": "!", "skip": "-"}[self.status]
        out = [f"{mark} {self.name}: {self.detail}"]
        if self.fix and self.status != "ok":
            out.append(f"    fix: {self.fix}")
        return out


class Engine(Record):
    reachable: bool
    detail: str  # the server version, or why it could not be reached
    runtimes: tuple[str, ...] = ()
    root_dir: str | None = None


class _DockerClient(Protocol):
    """What the doctor asks of the docker SDK's client."""

    def ping(self) -> object: ...
    def info(self) -> object: ...  # `docker info`'s JSON object


def probe_engine(timeout: int = 5) -> Engine:
    """Ping the Docker engine through the docker SDK and read `docker info`."""
    try:
        import docker
    except ImportError:
        return Engine(False, "the docker Python SDK is not installed")
    try:
        client: _DockerClient = docker.from_env(timeout=timeout)
        client.ping()
        answer = client.info()
    except Exception as e:  # the SDK raises DockerException, requests' and OS errors alike
        return Engine(False, str(e).splitlines()[0] if str(e) else type(e).__name__)
    info: Mapping[str, object] = answer if isinstance(answer, Mapping) else {}
    runtimes, root = info.get("Runtimes") or {}, info.get("DockerRootDir")
    return Engine(
        True,
        f"Docker {info.get('ServerVersion', '?')}",
        tuple(sorted(map(str, runtimes))) if isinstance(runtimes, Mapping) else (),
        root if isinstance(root, str) else None,
    )


def free_bytes(path: str) -> int:
    return shutil.disk_usage(path).free


def probe_mirror(body: dict[str, object]) -> list[Probe]:
    from envbuilder.model.mirrors import probe_jobs
    from envbuilder.oci.probe import run

    return run(probe_jobs(body))


class Probes(Record):
    """How the doctor reads the machine; tests pass recorded answers instead."""

    nvml: Nvml | None = None  # a pynvml-like module; None imports pynvml
    run: Runner = run_command  # argv -> CompletedProcess-like; FileNotFoundError if missing
    engine: Callable[[], Engine] = probe_engine
    which: Callable[[str], str | None] = shutil.which
    which_all: Callable[[str], list[str]] = which_all
    free_bytes: Callable[[str], int] = free_bytes
    exists: Callable[[str], bool] = os.path.exists
    mirror_probe: MirrorProbe = probe_mirror


# -- GPU checks (pure) -----------------------------------------------------------------------


def gpu_checks(
    m: Matrix, profile: str, overrides: Overrides, base: ResolvedEnv, machine: Machine
) -> list[Check]:
    if not machine.gpus and not overrides.driver:
        return [Check("GPU", "fail", f"no NVIDIA GPU found: {machine.problem}", NO_GPU_FIX)]
    checks = [driver_check(m, profile, overrides, base, machine)]
    if not machine.gpus:
        return checks + [Check("GPU", "fail", f"no NVIDIA GPU found: {machine.problem}", NO_GPU_FIX)]
    t, pgpu = base.torch, base.gpu
    build = f"torch {t.version}+{t.variant}"
    for g in sorted(
        {(g.name, g.compute_capability): g for g in machine.gpus}.values(), key=lambda g: g.index
    ):
        if not g.compute_capability:
            checks.append(
                Check(
                    f"GPU {g.index}",
                    "fail",
                    f"{g.name}: compute capability unknown",
                    "add this GPU to gpus in a --matrix-dir overlay",
                )
            )
            continue
        runs = runnable_archs(g.compute_capability, t.archs)
        checks.append(
            Check(
                f"GPU {g.index} arch",
                "ok" if runs else "fail",
                f"{build} has {'sm_' + max(runs, key=cc_tuple).replace('.', '') if runs else 'no kernels'}"
                f" for the {g.name} (CC {g.compute_capability}); its arch list is {';'.join(t.archs)}",
                "render a profile for this GPU (envbuild detect names one), or a --torch/--cuda whose "
                "build lists it",
            )
        )
        same = g.model == base.gpu.key
        compatible = cc_runs(g.compute_capability, [pgpu.compute_capability])
        checks.append(
            Check(
                f"GPU {g.index} profile",
                "ok" if same or compatible else "fail",
                f"{g.name} (CC {g.compute_capability}) "
                + (
                    "is the profile's GPU"
                    if same
                    else f"vs the profile's {pgpu.name} (CC {pgpu.compute_capability}): code built for "
                    f"it {'runs' if compatible else 'does not run'} here"
                ),
                "render the profile for this GPU (envbuild detect names it)",
            )
        )
        need = base.train.model_vram_gb
        checks.append(
            Check(
                f"GPU {g.index} memory",
                "ok" if g.vram_gb >= need else "fail",
                f"{g.vram_gb:.0f} GB for {base.train.model} (about {need:g} GB)",
                "use a smaller model, more offload, or a GPU with more memory",
            )
        )
    return checks


def driver_check(m: Matrix, profile: str, overrides: Overrides, base: ResolvedEnv, machine: Machine) -> Check:
    """The resolver's driver rule with the detected (or --driver) version."""
    driver = overrides.driver or machine.driver
    info = base.driver
    need = f"CUDA {info.for_cuda} needs >= {info.min_driver}"
    source = "" if overrides.driver else f" (supports CUDA {machine.cuda or '?'})"
    if driver is None:  # (a listed GPU whose driver version nvidia-smi reports as N/A)
        return Check(
            "driver",
            "skip",
            f"driver version unknown; {need}",
            "check that `nvidia-smi` reports the driver version, or pass --driver VERSION",
        )
    try:
        env = resolve(m, profile, overrides._replace(driver=driver))
    except ResolveError as e:
        bad = [v for v in e.violations if v.rule == "driver"]
        detail = (
            f"{driver}{source}; {bad[0].why}"
            if bad
            else "; ".join(f"{v.what}: {v.why}" for v in e.violations)
        )
        return Check("driver", "fail", detail, "; ".join(v.fix for v in bad or e.violations))
    picked = picked_for_driver(env, overrides)
    if picked:
        return Check("driver", "ok", f"{driver}{source}; {picked}")
    if env.driver.mode == "native":
        return Check("driver", "ok", f"{driver}{source}; {need}")
    return Check(
        "driver",
        "ok",
        f"{driver}{source}; {need}, runs under minor-version compatibility "
        f"(>= {info.compat_driver}; no PTX JIT)",
    )


# -- host checks -----------------------------------------------------------------------------


def docker_checks(engine: Engine) -> list[Check]:
    if not engine.reachable:
        fix = (
            "pip install docker (or envbuild[actions])"
            if "SDK" in engine.detail
            else "start the Docker engine (e.g. sudo systemctl start docker) or set DOCKER_HOST; "
            "your user needs access to its socket (the docker group)"
        )
        return [
            Check("docker engine", "fail", f"not reachable: {engine.detail}", fix),
            Check("nvidia runtime", "skip", "not checked: the Docker engine is not reachable"),
        ]
    has = "nvidia" in engine.runtimes
    return [
        Check("docker engine", "ok", engine.detail),
        Check(
            "nvidia runtime",
            "ok" if has else "fail",
            f"docker info lists runtimes {', '.join(engine.runtimes) or 'none'}",
            "install the NVIDIA Container Toolkit, then `sudo nvidia-ctk runtime configure "
            "--runtime=docker && sudo systemctl restart docker`",
        ),
    ]


def buildkit_check(
    run: Runner, which_all_: Callable[[str], list[str]], exists: Callable[[str], bool]
) -> Check:
    """What `envbuild build` would build with (build.find_buildkit, ENVBUILD_DOCKER included)."""
    try:
        client = find_buildkit(run, docker_clients(which_all_, exists))
    except NoBuildKit as e:
        return Check("buildkit", "fail", e.detail, e.fix)
    return Check("buildkit", "ok", client.description)


def engines_check(engine: Engine, buildkit: Check, which: Callable[[str], str | None], run: Runner) -> Check:
    """Which engines `envbuild build --builder` can use: docker (its daemon and BuildKit, as the
    checks above found), podman and buildah (installed, and their version answers)."""
    from envbuilder.engines.daemonless import statuses

    docker_ok = engine.reachable and buildkit.status == "ok"
    docker_why = (
        f"{engine.detail}, BuildKit"
        if docker_ok
        else f"daemon {engine.detail}"
        if not engine.reachable
        else buildkit.detail
    )
    rows = [("docker", docker_ok, docker_why)] + statuses(which, run)
    usable = [name for name, ok, _ in rows if ok]
    detail = "; ".join(f"{name}: {'yes' if ok else 'no'} ({why})" for name, ok, why in rows)
    if not usable:
        return Check(
            "engines",
            "fail",
            detail,
            "start Docker (with BuildKit), or install podman "
            "and buildah (apt-get install podman buildah) and build with --builder podman",
        )
    pick = "docker" if docker_ok else usable[0]
    return Check("engines", "ok", f"{detail}; --builder auto builds with {pick}")


def image_gb(env: ResolvedEnv) -> int:
    return (
        IMAGE_GB["base"]
        + (IMAGE_GB["vllm"] if env.vllm else 0)
        + (IMAGE_GB["builder"] if env.needs_builder else 0)
    )


def disk_check(
    env: ResolvedEnv, engine: Engine, free: Callable[[str], int], exists: Callable[[str], bool]
) -> Check:
    root = engine.root_dir or "/var/lib/docker"
    path = root
    while not exists(path) and path != os.path.dirname(path):  # nearest existing parent
        path = os.path.dirname(path)
    need = image_gb(env)
    have = free(path) / 1e9
    where = root if path == root else f"{root} (on {path})"
    return Check(
        "disk",
        "ok" if have >= need else "fail",
        f"{have:.0f} GB free at {where}; the image needs about {need} GB",
        f"free {need - have:.0f} GB there (docker system prune, docker builder prune), or "
        "move Docker's data-root to a larger disk",
    )


def conda_check(which: Callable[[str], str | None], required: bool) -> Check:
    found = [f"{t} ({p})" for t in CONDA_TOOLS if (p := which(t))]
    if found:
        return Check("conda", "ok", ", ".join(found))
    return Check(
        "conda",
        "fail" if required else "warn",
        "no micromamba, mamba or conda on PATH (needed only to install from environment.yml)",
        "install micromamba (https://mamba.readthedocs.io/en/latest/installation/"
        "micromamba-installation.html), or use the image, which needs none",
    )


def mirror_check(m: Matrix, mirror: str | None, probe: MirrorProbe) -> Check:
    """Every target of the set (each registry, the indexes, ...) needs one endpoint that answers."""
    from envbuilder.model import mirrors as M
    from envbuilder.model.config import user_config

    name = mirror or user_config().get("mirror")
    if not name:
        return Check(
            "mirrors", "skip", "no mirror set chosen (pass --mirror NAME, or set `mirror:` in your config)"
        )
    results = probe(M.get_set(m, name))
    targets: dict[tuple[str, str], list[Probe]] = {}
    for p in results:
        targets.setdefault((p.kind, p.target), []).append(p)
    down = [
        f"{kind} {target}" if kind != target else kind
        for (kind, target), ps in sorted(targets.items())
        if not any(p.ok for p in ps)
    ]
    up = sum(1 for p in results if p.ok)
    detail = f"set {name}: {up} of {len(results)} endpoints answer"
    if down:
        return Check(
            "mirrors",
            "fail",
            f"{detail}; nothing answers for {', '.join(down)}",
            f"run `envbuild mirrors probe --mirror {name}` for details, or choose another "
            "set / add an endpoint in your config",
        )
    return Check("mirrors", "ok", detail)


class Report(Record):
    profile: str
    machine: Machine
    checks: tuple[Check, ...]

    @property
    def ready(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)


def doctor(
    m: Matrix,
    profile: str,
    overrides: Overrides = Overrides(),
    probes: Probes = Probes(),
    mirror: str | None = None,
    conda_required: bool = False,
) -> Report:
    """Every check for `profile` on this machine. A profile that cannot resolve at all is bad input
    (UserError/ResolveError, exit 2), not a failed check."""
    machine = detect(m, probes.nvml, probes.run)
    # the stack this machine's driver runs (resolve picks it where the profile's own needs a
    # newer driver and no stack flag was given); the driver check says why when none does
    driver = overrides.driver or machine.driver
    try:
        base = resolve(m, profile, overrides._replace(driver=driver), check_fixes=False)
    except ResolveError:
        base = resolve(m, profile, overrides._replace(driver=None))
    engine = probes.engine()
    checks = gpu_checks(m, profile, overrides, base, machine)
    checks += docker_checks(engine)
    checks.append(buildkit_check(probes.run, probes.which_all, probes.exists))
    checks.append(engines_check(engine, checks[-1], probes.which, probes.run))
    checks.append(disk_check(base, engine, probes.free_bytes, probes.exists))
    checks.append(conda_check(probes.which, conda_required))
    checks.append(mirror_check(m, mirror, probes.mirror_probe))
    checks.append(network_check(base, mirror, probes.mirror_probe))
    return Report(profile, machine, tuple(checks))


def network_check(base: ResolvedEnv, mirror: str | None, probe: MirrorProbe) -> Check:
    """What the profile's build fetches (base images' registry, the indexes, GitHub), probed as
    `envbuild build` probes it before its first step; through a mirror set, mirror_check."""
    from envbuilder.machine import reach
    from envbuilder.model.config import user_config

    if mirror or user_config().get("mirror"):
        return Check("network", "skip", "the build goes through the mirror set (see `mirrors`)")
    try:
        found = reach.check(base, False, None, probe=probe, auto=False)  # (doctor has no --mirror auto)
    except ImportError:  # the probes need requests (the actions extra)
        return Check(
            "network", "skip", "not probed: requests is not installed (pip install 'envbuild[actions]')"
        )
    if found:
        return Check(
            "network",
            "fail",
            "; ".join(f"{f.what}: {f.why}" for f in found),
            sentences(f.fix for f in found),
        )
    body = reach.needs(base)
    registries: dict[str, list[str]] = body["registries"]
    others: list[list[str]] = [body.get(k) or [] for k in ("pypi", "pytorch", "github")]
    n = sum(len(v) for v in registries.values()) + sum(len(v) for v in others)
    return Check("network", "ok", f"all {n} endpoints the build fetches from answer")


def report_json(r: Report) -> dict[str, object]:
    from envbuilder.machine.detect import machine_json

    return {
        "profile": r.profile,
        "ready": r.ready,
        "machine": machine_json(r.machine),
        "checks": [
            {
                "check": c.name,
                "status": c.status,
                "ok": c.status != "fail",
                "detail": c.detail,
                "fix": c.fix if c.status != "ok" else "",
            }
            for c in r.checks
        ],
    }


def implied_profile(
    m: Matrix, command: str, probes: Probes | None = None, say: Callable[[str], None] = print
) -> str:
    """The profile a command without PROFILE takes: the one `envbuild detect` picks for this
    machine's GPUs, said (with why) through `say`; with no GPU a profile fits, a refusal that
    lists the profiles (UserError, exit 2)."""
    from envbuilder.machine.detect import recommend

    probes = probes if probes is not None else Probes()
    machine = detect(m, probes.nvml, probes.run)
    rec = recommend(m, machine)
    if rec.profile and rec.gpu is not None:
        # (a card without a profile of its own: by its own name, on the profile's stack)
        name = next((f.name for f in rec.fits if f.profile == rec.profile and f.name), rec.profile)
        say(
            f"{command}: no PROFILE given: this machine's {rec.gpu.name} (CC "
            f"{rec.gpu.compute_capability}) fits profile {rec.profile} best"
            + (f", as {name} (this card by its own name)" if name != rec.profile else "")
            + " (`envbuild detect` says why); name another to override"
        )
        return name
    why = machine.problem if not machine.gpus else "; ".join(rec.notes) or "no profile fits its GPU"
    raise UserError(
        f"Name a profile: `envbuild {command} PROFILE`"
        + (" (or --all, or --from envbuild.json)" if command == "render" else "")
        + ". None was given, "
        + ("there is no rendered folder here (no envbuild.json), " if command.startswith("build") else "")
        + f"and detect picks none for this machine ({why}). Profiles: "
        f"{', '.join(m.profiles)} (`envbuild list` shows each one's GPU)."
    )
