"""`envbuild install`: the profile's environment without Docker, finished as the image's build
finishes it (patched for the GPU, audited, smoke-tested).

Two routes, the same steps in the same order as `build`:
  --from-wheelhouse WH   offline: WH/install.sh (the lock's Python checked first; pip
                         --no-index --require-hashes from WH; the conda part with micromamba/
                         mamba/conda where one is on PATH; then apply_patches.py and
                         audit_precision.py); resumable: it installs into an existing
                         environment at the prefix.
  (online)               the install layers in the Dockerfile's order with the lock's
                         constraints, pip check after each, the patches and the audit, through
                         the same code as `envbuild verify` (uv), into a new prefix.
Then the rendered folder is written to PREFIX/envbuild/ (run script, preflight.py, the patch and
audit scripts, envbuild.json) and `preflight.py --smoke` runs with the prefix's Python: the torch
build, every module of the training path, verl patched and audited.

apex and flash-attn (where the profile has them) are compiled into the environment when the
nvcc on PATH is torch's CUDA, as the image's builder stage compiles them; else each is named in
the report's `not_installed` with what is missing and the command that builds it.
TransformerEngine's PyTorch extension (the Megatron engine) compiles with PyPI's CUDA compiler
on both routes: online from the index (verify's executor), from a wheelhouse with the compiler
wheels its lock's sources part pins (compile_te_offline).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from envbuilder.secret import SecretUrl, secret
from envbuilder.errors import ActionError, UserError
from envbuilder.limits import read_text_bounded
from envbuilder.text import printable
from envbuilder.model.resolved import ResolvedEnv
from envbuilder.render import steps as S
from envbuilder.tools.python import Interpreter, isolated_env, own_code_env
from envbuilder.tools.run import stop_group
from envbuilder.machine.verify_report import NotInstalled
from envbuilder.record import Record

if TYPE_CHECKING:
    from typing_extensions import NotRequired

    from envbuilder.render.context import BuildContext

SMOKE_TIMEOUT_S = 1800
# PREFIX/.envbuild-install: the profile an online install is making there; a run that finds it
# (an earlier one stopped) goes on in that environment instead of refusing the prefix
MARKER = ".envbuild-install"
HOME = "envbuild"  # PREFIX/envbuild/: the rendered folder


class InstallStep(TypedDict):
    step: str
    ok: bool
    seconds: NotRequired[float]
    error: NotRequired[str]


class SmokeCheck(TypedDict):
    """One check of `preflight.py --smoke --json`."""

    check: str
    ok: bool
    detail: str
    fix: NotRequired[str]


class InstallReportDict(TypedDict):
    profile: str
    prefix: str
    route: str
    steps: list[InstallStep]
    not_installed: list[NotInstalled]
    smoke: list[SmokeCheck]
    ok: bool
    seconds: float


@dataclass  # not a record: the install fills it in as it goes
class InstallReport:
    profile: str
    prefix: str
    route: str
    steps: list[InstallStep] = field(default_factory=list)
    not_installed: list[NotInstalled] = field(default_factory=list)
    smoke: list[SmokeCheck] = field(default_factory=list)
    ok: bool = False
    seconds: float = 0.0

    def as_dict(self) -> InstallReportDict:
        """The fields in their order (the JSON's keys)."""
        return InstallReportDict(
            profile=self.profile,
            prefix=self.prefix,
            route=self.route,
            steps=self.steps,
            not_installed=self.not_installed,
            smoke=self.smoke,
            ok=self.ok,
            seconds=self.seconds,
        )


def smoke_checks(printed: str) -> list[SmokeCheck]:
    """The checks `preflight.py --smoke --json` printed (ValueError, or KeyError for a missing
    list, where it printed none)."""
    doc: object = json.loads(printed)
    if not isinstance(doc, dict):
        raise ValueError("the smoke test printed no JSON object")
    checks: object = doc["checks"]
    if not isinstance(checks, list) or not all(_is_smoke_check(c) for c in checks):
        raise ValueError("the smoke test printed no list of checks")
    return cast("list[SmokeCheck]", checks)


def _is_smoke_check(c: object) -> bool:
    return (
        isinstance(c, dict)
        and isinstance(c.get("check"), str)
        and isinstance(c.get("ok"), bool)
        and isinstance(c.get("detail"), str)
        and isinstance(c.get("fix", ""), str)
    )


def _python_version(python: Path) -> str | None:
    try:
        p = subprocess.run(
            [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def check_prefix(prefix: Path, python: str, resumable: bool) -> None:
    """Refuse, before touching anything, a prefix that is not a new or empty directory, or (where
    the route installs into an existing environment) an environment of another Python."""
    if prefix.is_symlink() or (prefix.exists() and not prefix.is_dir()):
        raise UserError(f"--prefix {prefix} exists and is not a directory; pass a new path.")
    if not prefix.is_dir() or not any(
        not p.name.startswith((MARKER, f".{MARKER}.")) for p in prefix.iterdir()
    ):
        return
    env_python = prefix / "bin" / "python"
    if not env_python.exists():
        raise UserError(
            f"--prefix {prefix} is not empty and holds no Python environment (no bin/python); "
            "pass a new or empty directory, or an environment made for this profile."
        )
    if not resumable:
        raise UserError(
            f"--prefix {prefix} holds an environment envbuild install did not start; the online "
            "install makes its own. Pass a new path (or install from a wheelhouse, which "
            "installs into it)."
        )
    got = _python_version(env_python)
    if got != python:
        raise UserError(
            f"--prefix {prefix} is a Python {got or '(not runnable)'} environment, and the "
            f"profile's lock is for Python {python}: its wheels would not install there. Pass "
            "a new path, or an environment of that Python."
        )


def marker_profile(prefix: Path) -> str | None:
    """The profile the marker says an earlier online install was making at `prefix` (None: no
    marker), read as every input is (no pipe waited on, bounded); a damaged one is refused with
    the way on: another prefix."""
    marker = prefix / MARKER
    if not os.path.lexists(marker):
        return None
    if marker.is_symlink() or not marker.is_file():
        raise UserError(
            f"{marker} is not a regular file (a link, pipe or folder); envbuild install writes "
            "that file itself. Pass a new --prefix."
        )
    try:
        return read_text_bounded(marker, "The install marker", 4096).strip()
    except UserError as e:
        raise UserError(
            f"{e} It is the marker envbuild install leaves in a prefix it is making, so {prefix} "
            "is not as envbuild left it: pass a new --prefix (or remove the file, if you know "
            "the environment there is the one you want envbuild to go on with)."
        ) from None


@contextmanager
def prefix_lock(prefix: Path) -> Iterator[None]:
    """The prefix, made where missing, held for this install alone (flock on the directory
    itself: nothing is added to it); a prefix that takes no write, or one another install holds,
    is refused (exit 2). A prefix this install made and left empty is removed again."""
    made = not os.path.lexists(prefix)
    try:
        prefix.mkdir(parents=True, exist_ok=True)
        fd = os.open(prefix, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise UserError(
            f"--prefix {prefix} cannot be made or opened ({e.strerror}): the environment goes "
            "there. Pass a path in a folder you can write to, with free space."
        ) from None
    try:
        if not os.access(prefix, os.W_OK | os.X_OK):
            raise UserError(
                f"--prefix {prefix} takes no write (no permission, or a read-only file "
                "system): the environment goes there. Pass a path in a folder you can write "
                "to, with free space."
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise UserError(
                f"Another envbuild install is installing into {prefix} right now (it holds the "
                "prefix). Wait for it to finish and run this again (it goes on from what that "
                "one made), or pass another --prefix."
            ) from None
        yield
    finally:
        if made:
            try:
                prefix.rmdir()  # (only while empty: nothing was installed)
            except OSError:
                pass
        os.close(fd)  # (the lock goes with it)


def _wheelhouse_profile(wh: Path, profile: str) -> dict[str, object]:
    from envbuilder.lock import lockfile as L

    if not (wh / "install.sh").is_file() or not (wh / "manifest.json").is_file():
        raise UserError(
            f"--from-wheelhouse {wh} is not an envbuild wheelhouse (no install.sh and "
            f"manifest.json); make one with `envbuild wheelhouse {profile} -o DIR`."
        )
    doc = L.read_wheelhouse_manifest(wh) or {}  # (None: gone since the check above)
    entry = (doc.get("profiles") or {}).get(profile)
    if not isinstance(entry, dict):
        have = ", ".join(sorted(doc.get("profiles") or {})) or "none"
        raise UserError(
            f"--from-wheelhouse {wh} holds no complete {profile} (it has: {have}); export it "
            f"with `envbuild wheelhouse {profile} -o {wh}`."
        )
    return entry


def _run(
    report: InstallReport, name: str, cmd: list[str], env: dict[str, str], say: Callable[[str], None]
) -> bool:
    """One step, its output passed on line by line (bytes that are no UTF-8 and control
    characters shown as escapes); recorded with its time. The step runs in a session of its own,
    ended with all it started on Ctrl-C or SIGTERM (cli.main raises both here)."""
    say(f"{name}: {' '.join(cmd)}")
    start = time.monotonic()
    tail: list[str] = []
    proc: subprocess.Popen[str] | None = None
    # (one try from the Popen on: a SIGTERM that lands between the child's start and the read
    # loop, which a loaded machine makes wide enough to hit, still ends the child's group)
    try:
        try:
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            report.steps.append({"step": name, "ok": False, "seconds": 0.0, "error": str(e)})
            return False
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = printable(raw.rstrip())
            say(f"  {line}")
            tail = (tail + [line])[-20:]
        rc = proc.wait()
    except BaseException:
        if proc is not None:
            stop_group(proc)
        raise
    entry: InstallStep = {"step": name, "ok": rc == 0, "seconds": round(time.monotonic() - start, 1)}
    if rc:
        entry["error"] = next((t for t in reversed(tail) if t.strip()), f"exit {rc}")
    report.steps.append(entry)
    return rc == 0


def nvcc_version() -> str | None:
    """The CUDA version of the nvcc on PATH (`release 12.1`), None where there is none."""
    import re

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def extension_commands(env: ResolvedEnv, python: Path) -> list[tuple[str, list[str]]]:
    """(component, the command that compiles it into the environment of `python`) for each
    Compile step of the install (render/steps.py), as the image's builder stage compiles it
    (for this GPU's arch only)."""
    return [
        (step.component, S.compile_argv(env, step, [str(python), "-m", "pip", "install"]))
        for step in _compiles(env)
    ]


def _compiles(env: ResolvedEnv) -> list[S.Compile]:
    from envbuilder.render.plan import install_plan

    # (a lock's pins reach only the pip layers, never a Compile step: no pins needed)
    return [s for s in S.install_steps(env, install_plan(env, None)) if isinstance(s, S.Compile)]


def compile_step(
    env: ResolvedEnv,
    step: S.Compile,
    prefix: Path,
    report: InstallReport,
    say: Callable[[str], None],
    index: SecretUrl | None = None,
) -> bool:
    """One Compile step, run where the nvcc on PATH is torch's CUDA (apex's setup.py requires
    it equal); else it is named with what is missing and the command that builds it, and the
    install goes on without it (the run's training path does not import it unless the profile
    uses it: preflight's smoke test then says so). `index`: what pip fetches the build
    dependencies from (default the profile's PyPI index), through its environment."""
    from envbuilder.tools.uv import index_env

    cmd = S.compile_argv(env, step, [str(prefix / "bin" / "python"), "-m", "pip", "install"])
    got = nvcc_version()
    if got != env.cuda.version:
        report.not_installed.append(
            {
                "component": step.component,
                "version": step.version,
                "why": f"needs nvcc {env.cuda.version} on PATH (torch's CUDA) to compile; "
                + (f"nvcc here is {got}" if got else "there is no nvcc here")
                + f". With it: {shlex.join(cmd)}",
            }
        )
        return True
    say(f"{step.component}: compiling for sm_{step.arch} with nvcc {got} (flash-attn's sdist takes hours)")
    child = {**own_code_env(), **index_env(index or SecretUrl(env.indexes.pypi))}  # (pip's index)
    return _run(report, f"build {step.component}", cmd, child, say)


def build_extensions(
    env: ResolvedEnv,
    prefix: Path,
    report: InstallReport,
    say: Callable[[str], None],
    index: SecretUrl | None = None,
) -> bool:
    """Every Compile step of the install in turn (compile_step)."""
    ok = True
    for step in _compiles(env):
        ok = compile_step(env, step, prefix, report, say, index) and ok
    return ok


class WheelhouseToolchain(Record):
    """What a wheelhouse carries for compiling TransformerEngine's PyTorch extension (the
    Megatron engine) with no index: the extension's sdist and PyPI's CUDA compiler and build
    requirements (sources/, each pinned by the lock's sources part), by (file name, sha256)."""

    sdist: tuple[str, str]
    wheels: dict[str, tuple[str, str, str]]  # project -> (version, file name, sha256)


def wheelhouse_toolchain(env: ResolvedEnv, wheelhouse: Path) -> WheelhouseToolchain:
    """The wheelhouse's files for compiling the extension here, as its copy of the lock pins
    them (locks/<profile>/sources.lock) and its manifest lists them for the profile; refused
    (before anything is written) where it has none of the compiler: a wheelhouse exported
    before the lock pinned it carries the sdist alone, which nothing here could compile."""
    from envbuilder.lock import lockfile as L
    from envbuilder.lock.sources import TE_KEY, TOOLCHAIN_KEY
    from envbuilder.model.components import transformer_engine as TE
    from envbuilder.render.plan import override_flags

    mg = env.megatron
    assert mg is not None
    entry = _wheelhouse_profile(wheelhouse, env.profile)
    listed = {str(f) for f in cast("list[object]", entry.get("files") or [])}
    lock = wheelhouse / "locks" / env.profile / L.SOURCES
    try:
        pins = (
            L.sources_of(read_text_bounded(lock, "the wheelhouse's sources.lock"), str(lock))
            if lock.is_file()
            else {}
        )
    except OSError:
        pins = {}
    wanted = (*TE.TOOLCHAIN, *TE.BUILD_REQUIRES)
    missing = [
        name
        for name in (TE_KEY, *(TOOLCHAIN_KEY + t for t in wanted))
        if name not in pins or f"sources/{pins[name].filename}" not in listed
    ]
    if missing:
        flags = override_flags(env.overrides)
        raise UserError(
            f"--from-wheelhouse {wheelhouse} with --engine megatron: install compiles TransformerEngine's "
            f"PyTorch extension (transformer_engine_torch {mg.transformer_engine}, an sdist) here with "
            f"PyPI's CUDA {env.torch.cuda} compiler, and this wheelhouse does not carry "
            f"{', '.join(m.removeprefix(TOOLCHAIN_KEY) for m in missing)} (it was exported before "
            "the lock pinned the compiler). Re-export it on a machine that reaches PyPI: "
            f"`envbuild lock {env.asked}{flags}`, then `envbuild wheelhouse {env.asked}{flags} -o "
            f"{wheelhouse}`; or build the image from it (`envbuild render {env.asked}{flags} "
            "--wheelhouse DIR`) and carry that (`envbuild export-image`), or install online."
        )
    sdist = pins[TE_KEY]
    return WheelhouseToolchain(
        (sdist.filename or "", sdist.sha256),
        {
            t: (
                pins[TOOLCHAIN_KEY + t].ref or "",
                pins[TOOLCHAIN_KEY + t].filename or "",
                pins[TOOLCHAIN_KEY + t].sha256,
            )
            for t in wanted
        },
    )


def _installed(python: Path, names: list[str]) -> set[str]:
    """Which of `names` (distributions) the environment of `python` has installed."""
    probe = (
        "import importlib.metadata as m, sys\n"
        "for n in sys.argv[1:]:\n"
        "    try: m.version(n); print(n)\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    out = subprocess.run(
        [str(python), "-c", probe, *names], capture_output=True, text=True, timeout=120, env=isolated_env()
    ).stdout
    return set(out.split())


def offline_te_commands(
    env: ResolvedEnv, wheelhouse: Path, prefix: Path, tc: WheelhouseToolchain, site: str, skip: set[str]
) -> tuple[list[str], str, list[str], dict[str, str]]:
    """(the toolchain's install argv, its requirements file's text, the extension's build argv,
    the build's variables) for the environment at `prefix` (`site`: its site-packages folder):
    pip --no-index from the wheelhouse's sources/ with the lock's hashes, then the build with
    CUDA_HOME the compiler's wheels make there, their nvcc first on PATH, CPATH the nvidia-*
    wheels' headers, as the online install compiles it (machine/verify.py
    compile_with_pypi_toolchain). `skip`: the build requirements the environment has already."""
    from envbuilder.model.components import transformer_engine as TE

    py = str(prefix / "bin" / "python")
    found = str(wheelhouse / "sources")
    req = "".join(
        f"{name}=={version} --hash=sha256:{sha}\n"
        for name, (version, _, sha) in sorted(tc.wheels.items())
        if name not in skip
    )
    tools = [py, "-m", "pip", "install", "--isolated", "--no-index", "--find-links", found]
    tools += ["--require-hashes", "--no-deps", "--only-binary=:all:", "-r"]
    pip = [py, "-m", "pip", "install", "--isolated", "-v", "--no-index", "--find-links", found]
    build = ["env", *TE.build_argv(env, pip, requirement=str(wheelhouse / "sources" / tc.sdist[0]))]
    home = TE.toolchain_home(env, site)
    jobs = str(os.cpu_count() or 1)
    variables = {
        "CUDA_HOME": home,
        "PATH": os.pathsep.join([f"{home}/bin", str(prefix / "bin"), os.environ.get("PATH", "")]),
        "MAX_JOBS": jobs,
        "CPATH": TE.include_path(site),
    }
    return tools, req, build, variables


def compile_te_offline(
    env: ResolvedEnv,
    wheelhouse: Path,
    prefix: Path,
    tc: WheelhouseToolchain,
    report: InstallReport,
    say: Callable[[str], None],
) -> bool:
    """TransformerEngine's PyTorch extension compiled into the environment at `prefix` from the
    wheelhouse alone: PyPI's CUDA compiler installed there from sources/ (hash-checked, no
    index), as the online install installs it, then the sdist (its sha256 checked) built with
    it. Each part is a step of the report."""
    import hashlib
    import tempfile

    from envbuilder.model.components import transformer_engine as TE

    mg = env.megatron
    assert mg is not None
    py = prefix / "bin" / "python"
    probe = f"import importlib.metadata as m; print(m.version({TE.DIST!r}))"
    had = subprocess.run(
        [str(py), "-c", probe], capture_output=True, text=True, timeout=120, env=isolated_env()
    )
    if had.returncode == 0 and had.stdout.strip() == mg.transformer_engine:
        say(f"transformer-engine: {TE.DIST} {mg.transformer_engine} is compiled into {prefix} already")
        return True  # (a re-run of an install that got this far compiles nothing again)
    sdist = wheelhouse / "sources" / tc.sdist[0]
    h = hashlib.sha256()
    try:
        with open(sdist, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        got = h.hexdigest()
    except OSError as e:
        got = f"nothing readable ({e.strerror})"
    if got != tc.sdist[1]:
        report.steps.append(
            {
                "step": "build transformer-engine",
                "ok": False,
                "seconds": 0.0,
                "error": f"{sdist} hashes to {got}, not the lock's {tc.sdist[1]}: export the wheelhouse again",
            }
        )
        return False
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
        capture_output=True,
        text=True,
        timeout=120,
        env=isolated_env(),
    ).stdout.strip()
    skip = _installed(py, list(TE.BUILD_REQUIRES)) & set(TE.BUILD_REQUIRES)
    tools, req, build, variables = offline_te_commands(env, wheelhouse, prefix, tc, site, skip)
    with tempfile.TemporaryDirectory(prefix="envbuild-toolchain-") as tmp:
        path = Path(tmp) / "toolchain.txt"
        path.write_text(req)
        say(f"transformer-engine: PyPI's CUDA {env.torch.cuda} compiler from the wheelhouse into {prefix}")
        if req and not _run(report, "toolchain", [*tools, str(path)], isolated_env(), say):
            return False
    jobs = int(variables["MAX_JOBS"])
    say(
        f"transformer-engine: compiling {TE.DIST} {mg.transformer_engine} for sm_{mg.te_arch} from the "
        f"wheelhouse's sdist with {variables['CUDA_HOME']}/bin/nvcc and {jobs} jobs (expect about "
        f"{-(-TE.CORE_MINUTES // jobs)} min)"
    )
    return _run(report, "build transformer-engine", build, isolated_env(**variables), say)


def install(
    ctx: BuildContext,
    prefix: Path,
    *,
    wheelhouse: Path | None = None,
    python: str | None = None,
    index_url: SecretUrl | None = None,
    torch_index_url: SecretUrl | None = None,
    force: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> InstallReport:
    """Install a prepared environment (`ctx`, context.prepare) into `prefix` by one of the two
    routes, then write the rendered folder to
    PREFIX/envbuild/ and run its preflight smoke test with the prefix's Python. Everything the
    prefix would refuse is refused before anything is installed; the prefix is held by this
    install alone while it runs (prefix_lock). `force`: replace files in PREFIX/envbuild/ that
    envbuild did not write (or that were edited since)."""
    from envbuilder.render.files import render_files, write_dir

    env = ctx.env  # (within the lock's pins: the ones context.prepare found, or --locked's)
    # (the wheelhouse's compiler for TransformerEngine's extension; one without it is refused now)
    toolchain = wheelhouse_toolchain(env, wheelhouse) if wheelhouse and env.megatron else None
    prefix = prefix.absolute()
    start = time.monotonic()
    route = "wheelhouse" if wheelhouse else "online"
    report = InstallReport(env.profile, str(prefix), route)
    home = prefix / HOME
    files = render_files(ctx)
    # the wheelhouse's lock names its Python (an environment there of another is refused)
    want = str(_wheelhouse_profile(wheelhouse, env.profile).get("python") or env.python) if wheelhouse else ""

    def check() -> None:  # (before anything is made, and again once the prefix is held)
        if wheelhouse:
            check_prefix(prefix, want, resumable=True)
        else:
            check_prefix(prefix, env.python, resumable=marker_profile(prefix) == env.profile)
        # the rendered folder goes there at the end: a user's own file in it stops us now
        write_dir(home, files, force=force, check_only=True, option="--prefix")

    check()
    if wheelhouse:
        python = _wheelhouse_python(env.profile, wheelhouse, prefix, want, python)
    else:
        interp = _interpreter(env.profile, env.python, python)
        _probe_indexes(ctx, prefix, index_url, torch_index_url, say)
    with prefix_lock(prefix):
        check()  # (another install may have made or finished something here meanwhile)
        if wheelhouse:
            ok = _from_wheelhouse(env, wheelhouse, prefix, python, report, say)
            if ok and toolchain is not None:
                ok = compile_te_offline(env, wheelhouse, prefix, toolchain, report, say)
        else:
            ok = _online(ctx, prefix, interp, index_url, torch_index_url, report, say)
        if not ok:
            report.seconds = round(time.monotonic() - start, 1)
            return report
        # the rendered folder beside the environment, and the smoke test of the image's build
        write_dir(home, files, force=force, option="--prefix")
        say(f"rendered {env.profile} into {home}")
        proc = subprocess.run(
            [str(prefix / "bin" / "python"), str(home / "preflight.py"), "--smoke", "--json"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=SMOKE_TIMEOUT_S,
            env=own_code_env(),
            cwd=home,
        )
    try:
        report.smoke = smoke_checks(proc.stdout)
    except (ValueError, KeyError):
        report.smoke = [{"check": "preflight", "ok": False, "detail": proc.stderr.strip()[-500:], "fix": ""}]
    report.steps.append({"step": "preflight --smoke", "ok": proc.returncode == 0})
    report.ok = all(s.get("ok") for s in report.steps)
    report.seconds = round(time.monotonic() - start, 1)
    return report


def _probe_indexes(
    ctx: BuildContext,
    prefix: Path,
    index_url: SecretUrl | None,
    torch_index_url: SecretUrl | None,
    say: Callable[[str], None],
) -> None:
    """The probe `build` makes before its first step: the index every step installs from
    answers, and so does the PyTorch index where the torch pinned is a build only it has
    (verify would swap in PyPI's torch of another CUDA, a 3 GB install that ends NOT READY);
    or nothing is made (ActionError, exit 1)."""
    from envbuilder.machine.verify import PROBE_TIMEOUT_S, index_answers, local_pins

    env = ctx.env
    pypi = index_url or SecretUrl(env.indexes.pypi)
    say(f"probe {pypi} ({PROBE_TIMEOUT_S:.0f} s at most)")
    if not index_answers(pypi):
        raise ActionError(
            f"The package index {pypi} does not answer from here, so nothing was "
            "installed. Use a mirror (--mirror NAME, `envbuild mirrors list`), --index-url "
            f"URL, or a wheelhouse made where it answers (--from-wheelhouse)."
        )
    locked = ctx.constraints  # (the lock's pins, as verify's)
    pins = [*env.torch.packages, *(p for layer in (locked.layers.values() if locked else ()) for p in layer)]
    local = local_pins(pins)
    torch_index = torch_index_url or secret(env.indexes.torch)
    if not (local or env.indexes.torch):
        return  # (PyPI's own torch build: no PyTorch index to ask)
    say(f"probe {torch_index} ({PROBE_TIMEOUT_S:.0f} s at most)")
    if torch_index is None or not index_answers(torch_index):
        pin = local.get("torch", next(iter(local.values()), ("", "")))[0] or env.torch.version
        p = env.profile
        raise ActionError(
            f"The PyTorch index {torch_index or '(none given)'} does not answer from here, and "
            f"{p}'s torch {pin} (for CUDA {env.torch.cuda}) is a build only "
            "it has (PyPI's is of another CUDA), so nothing was installed. Pass "
            "--torch-index-url URL (a mirror of that index), or make a wheelhouse on a machine "
            f"where it answers (`envbuild wheelhouse {p} -o wh/{p}`) and install from it here "
            f"(`envbuild install {p} --prefix {shlex.quote(str(prefix))} --from-wheelhouse wh/{p}`)."
        )


def _interpreter(profile: str, version: str, python: str | None) -> Interpreter:
    """The Python either route makes its venv from (`version`: the profile's, or the
    wheelhouse lock's): --interpreter, checked, or the search (tools/python.py)."""
    from envbuilder.machine.verify import find_python
    from envbuilder.tools.python import probe

    if python:  # (the one Python discovery's check: CPython of that version, with venv)
        interp = probe(python, version, need_venv=True)
        if interp is None:
            got = _python_version(Path(python))
            raise UserError(
                f"--interpreter {python} is not a CPython {version} with venv (it is Python "
                f"{got or '(not runnable)'}); {profile} needs Python {version}."
            )
        return interp
    found = find_python(version)
    if found is None:
        raise UserError(
            f"No Python {version} here for {profile}'s pins. Install it (e.g. "
            f"apt-get install python{version} python{version}-venv, or uv python install "
            f"{version}) or pass --interpreter PATH."
        )
    return found


def _wheelhouse_python(
    profile: str, wheelhouse: Path, prefix: Path, want: str, python: str | None
) -> str | None:
    """The Python install.sh makes its venv from (its PYTHON): found as the online route finds
    one, since install.sh alone looks only for python3.X and python3 on PATH. None where it
    makes none: the prefix holds an environment already (check_prefix checked its Python), or
    the wheelhouse's conda part and a conda tool make it."""
    if (prefix / "bin" / "python").exists():
        return python
    if (wheelhouse / "conda" / f"{profile}.txt").is_file() and any(
        shutil.which(t) for t in ("micromamba", "mamba", "conda")
    ):
        return python
    return _interpreter(profile, want, python).path


def _from_wheelhouse(
    env: ResolvedEnv,
    wheelhouse: Path,
    prefix: Path,
    python: str | None,
    report: InstallReport,
    say: Callable[[str], None],
) -> bool:
    """The offline route: the wheelhouse's install.sh, with nothing of the caller's Python
    settings (a checkout on PYTHONPATH is not what it patches)."""
    from envbuilder.machine.verify import unshare_files

    # an environment made by uv shares its files with uv's cache (hard links), and pip leaves a
    # verl that is there alone ("already satisfied"): the patches get files of their own first
    unshare_files(prefix, [f for p in env.patches for f in p.files])
    run_env = isolated_env(**({"PYTHON": python} if python else {}))
    cmd = ["bash", str(wheelhouse / "install.sh"), env.profile, "--prefix", str(prefix)]
    return _run(report, "install.sh", cmd, run_env, say)


def _online(
    ctx: BuildContext,
    prefix: Path,
    interp: Interpreter,
    index_url: SecretUrl | None,
    torch_index_url: SecretUrl | None,
    report: InstallReport,
    say: Callable[[str], None],
) -> bool:
    """The online route: the install's steps through verify's executor, with uv into a venv at
    the prefix, which the marker names as this profile's (an interrupted run goes on from there);
    its Compile steps are compiled here (compile_step)."""
    from envbuilder.machine.verify import Options, verify
    from envbuilder.render.outdir import write_text_atomic

    env = ctx.env

    try:
        write_text_atomic(prefix / MARKER, env.profile + "\n")  # (a new file renamed over it)
    except OSError as e:
        raise UserError(
            f"--prefix {prefix} takes no write ({e.strerror}): the environment goes there. Pass "
            "a path in a folder you can write to, with free space."
        ) from None
    built = InstallReport(env.profile, str(prefix), "online")  # (the Compile steps' entries)
    r = verify(
        ctx,
        interp,
        Options(
            resume=True,
            index_url=index_url,
            torch_index_url=torch_index_url,
            keep=prefix,
            skip_compose=True,
            imports=False,  # (preflight --smoke imports the training path below)
            command="install",
            say=say,
            compile=lambda step: compile_step(env, step, prefix, built, say, index_url),
        ),
    )
    for layer in r.layers:
        if layer.get("empty"):
            continue  # a layer this profile does not have (p40's vllm: its rollout is HF)
        step: InstallStep = {
            "step": f"layer {layer['layer']}",
            "ok": layer["ok"],
            "seconds": layer["seconds"],
        }
        error = layer.get("error")
        if error:
            step["error"] = error
        report.steps.append(step)
    report.steps += built.steps
    report.not_installed += built.not_installed
    for name, part in (("patches", r.patches), ("audit", r.audit)):
        if part is not None:
            report.steps.append({"step": name, "ok": bool(part.get("ok"))})
    ok = not r.failures
    if r.failures:
        report.steps.append({"step": "install", "ok": False, "error": "; ".join(r.failures[:3])})
    return ok


def summary(report: InstallReport) -> str:
    """The report as lines: each step with its time, the smoke test's failures with their fixes."""
    out = [f"envbuild install {report.profile} into {report.prefix} ({report.route})"]
    for s in report.steps:
        mark = "\u2713" if s.get("ok") else "\u2717"
        seconds = s.get("seconds")
        secs = f" ({seconds:.0f} s)" if isinstance(seconds, (int, float)) else ""
        out.append(f"{mark} {s['step']}{secs}" + (f": {s['error']}" if s.get("error") else ""))
    for c in report.smoke:
        if not c.get("ok"):
            out.append(
                f"  \u2717 {c['check']}: {c['detail']}" + (f"\n      fix: {c['fix']}" if c.get("fix") else "")
            )
    for n in report.not_installed:
        out.append(f"  not installed: {n['component']} {n['version']}: {n['why']}")
    out.append(
        ("READY" if report.ok else "NOT READY")
        + f": {report.profile} in {report.prefix} ({report.seconds:.0f} s); train with "
        + f"`{train_command(Path(report.prefix))}`"
    )
    return "\n".join(out)


def train_command(prefix: Path) -> str:
    """The shell line that trains in the environment at `prefix`: activated (a conda one made by
    micromamba has no bin/activate: its bin/ first on PATH), and ENVBUILD_HOME at the rendered
    folder, where the run script finds preflight.py and prepare_gsm8k.py (outside an image)."""
    from envbuilder.render.image import RUN_SCRIPT

    q = shlex.quote
    home = prefix / HOME
    activate = prefix / "bin" / "activate"
    enter = f". {q(str(activate))} &&" if activate.is_file() else f'PATH={q(str(prefix / "bin"))}:"$PATH"'
    return f"{enter} ENVBUILD_HOME={q(str(home))} {q(str(home / RUN_SCRIPT))}"
