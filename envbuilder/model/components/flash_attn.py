"""flash-attn as one building block: which flash-attn a profile gets, and how the builder makes it.

Where the wheel comes from, first that applies (`choose`):
  1. index: a wheel index, the one --flash-attn-index names, else a known one
     (matrices/extensions.yaml `wheel_indexes`: verl's wheelhouse, which verl 0.9.1 installs
     flash-attn 2.8.3 for torch 2.11 / cu130 from) that serves this world: the version, torch
     major.minor, its CUDA, the Python, the machine, with a SASS the card runs;
  2. release: the release's prebuilt wheel, where its publish.yml builds one for this torch,
     CUDA and Python (envbuilder/images/flash_attn_wheel.py names and fetches it);
  3. source: the PyPI sdist compiled in the builder stage for the card's one arch
     (FLASH_ATTN_CUDA_ARCHS), objects kept in a BuildKit ccache cache mount, announced with
     its expected time for the build machine's cores.
Below the compute-capability floor there is none: the attention is sdpa and the resolver's
rule says why. In the builder an index or a release that has no wheel falls back to the source
build; an index wheel whose fatbin lacks the card's arch (cuobjdump, as verl's wheelhouse checks
its wheels before upload) stops the build.

Also here, once: flash-attn's rules (`problems`: its torch range, its CC floor, a card no
setup.py arch runs), what the resolver records (`record`) and says (`notes`), the source-build
command (`source_build_command`: the Dockerfile, the Apptainer definition, environment.yml,
pixi.toml, requirements.txt and `envbuild install` print it), the builder stage's shell for an
index wheel and a source build, and a known index through a mirror set (`mirrored_index`). The
release wheel's fetch step stays in render/dockerfile.py beside the lock's pins it reads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from envbuilder.errors import UserError
from envbuilder.model import resolved as R
from envbuilder.model.components import Refusal
from envbuilder.model.matrix import at_least, cc_runs
from envbuilder.model.versions import in_range
from envbuilder.record import Record, frozen

if TYPE_CHECKING:
    from envbuilder.model.entries import FlashAttnRelease, FlashAttnSection
    from envbuilder.model.resolved import ResolvedEnv

NAME = "flash-attn"  # as --with/--without take it (registry.py)
INDEX, RELEASE, SOURCE = "index", "release", "source"
CCACHE_DIR = "/root/.ccache"  # the builder's BuildKit cache mount for compiled objects
DOWNLOAD_DIR = "/tmp/flash-attn"  # where the builder puts an index's wheel before its check


class Choice(Record):
    """Where the builder takes flash-attn from first, and why (one line, for the notes)."""

    how: str
    index: str | None
    arch: str | None
    reason: str
    index_name: str | None = None  # a known index's name (extensions.yaml wheel_indexes)
    index_path: str | None = None  # its world tree under the index's root (cu130/torch2.11/simple/)


# ---- facts and selection --------------------------------------------------------------------


def wheel_gap(rec: FlashAttnRelease, torch_v: str, torch_cuda: str, python: str) -> str | None:
    """What the flash-attn release's published wheels lack for this torch, its CUDA and the
    Python (extensions.yaml, from the tag's publish.yml), or None when a wheel exists."""
    gaps = []
    if rec.get("wheel_torch") and not in_range(torch_v, rec["wheel_torch"]):
        gaps.append(f"torch {torch_v} (its wheels: torch{rec['wheel_torch']})")
    major = str(torch_cuda).split(".")[0]
    if major not in (rec.get("wheel_cuda") or {}):
        built = ", ".join(f"CUDA {k}" for k in sorted(rec.get("wheel_cuda") or {})) or "none"
        gaps.append(f"CUDA {torch_cuda} (its wheels: {built})")
    if rec.get("wheel_python") and python not in rec["wheel_python"]:
        gaps.append(f"Python {python} (its wheels: {', '.join(rec['wheel_python'])})")
    return "; ".join(gaps) or None


def build_arch(cc: str, archs: Sequence[str]) -> str | None:
    """The FLASH_ATTN_CUDA_ARCHS value that builds for a card of `cc`: of the archs flash-attn's
    setup.py has a -gencode for ("80", "90", "100", "120"), the highest the card runs (an RTX
    4090, 8.9, runs sm_80); None when it runs none of them."""
    fits = [a for a in archs if cc_runs(cc, [f"{int(a) // 10}.{int(a) % 10}"])]
    return max(fits, key=int) if fits else None


def _sdist_archs(fa_data: FlashAttnSection) -> list[str]:
    """The archs flash-attn's setup.py builds for (extensions.yaml sdist_build), [] if none listed."""
    sdist = fa_data.get("sdist_build")
    return (sdist.get("archs") if sdist else None) or []


def _world(torch_v: str, torch_cuda: str) -> tuple[str, str]:
    """(torch major.minor, CUDA tag) as a wheel index's world names them: ("2.11", "130")."""
    return ".".join(torch_v.split("+")[0].split(".")[:2]), torch_cuda.replace(".", "")


def known_index(
    fa_data: FlashAttnSection,
    version: str,
    torch_v: str,
    torch_cuda: str,
    python: str,
    machine: str,
    cc: str,
) -> tuple[str, str, str] | None:
    """(name, URL, the world's path under the index's root) of the first known wheel index (by
    name) that serves flash-attn `version` for this torch, CUDA, Python and machine with SASS
    the card runs; None when none does. A mirror set serves that path under its own prefix."""
    torch, cuda = _world(torch_v, torch_cuda)
    for name, idx in sorted((fa_data.get("wheel_indexes") or {}).items()):
        if not cc_runs(cc, list(idx["archs"].get(machine) or ())):
            continue
        for w in idx["worlds"]:
            if (
                (w["torch"], w["cuda"]) == (torch, cuda)
                and python in w["python"]
                and version in w["versions"]
            ):
                url = idx["url"].format(cuda=cuda, torch=torch)
                root = idx["url"].split("{", 1)[0].rsplit("/", 1)[0] + "/"
                return name, url, url[len(root) :]
    return None


def choose(
    fa_data: FlashAttnSection,
    version: str,
    *,
    cc: str,
    torch_v: str,
    torch_cuda: str,
    python: str,
    machine: str,
    index: str | None = None,
) -> Choice:
    """Where the builder takes flash-attn `version` from first (the module's order)."""
    rec = fa_data["versions"][version]
    archs = _sdist_archs(fa_data)
    arch = build_arch(cc, archs) if archs else cc.replace(".", "")  # (no list: the card's own)
    if index:
        return Choice(INDEX, index, arch, f"its wheel from the index --flash-attn-index names ({index})")
    known = known_index(fa_data, version, torch_v, torch_cuda, python, machine, cc)
    torch, cuda = _world(torch_v, torch_cuda)
    if known:
        name, url, path = known
        return Choice(
            INDEX,
            url,
            arch,
            f"its wheel from {name} ({url}), which builds it for torch {torch} / cu{cuda} / Python "
            f"{python} / {machine}",
            name,
            path,
        )
    gap = wheel_gap(rec, torch_v, torch_cuda, python)
    if gap is None:
        return Choice(RELEASE, None, arch, "the release's prebuilt wheel for this torch, CUDA and Python")
    return Choice(SOURCE, None, arch, f"no prebuilt flash-attn {version} wheel for {gap}")


def problems(
    fa_data: FlashAttnSection, version: str, *, torch_v: str, cc: str, gpu: str, choice: Choice
) -> list[Refusal]:
    """flash-attn's rules: its torch range, its compute-capability floor (below it the attention
    is sdpa: a warning that --allow-unsupported keeps), and a card no arch of setup.py runs."""
    rec, floor = fa_data["versions"][version], fa_data["min_compute_capability"]
    out: list[Refusal] = []
    if not in_range(torch_v, rec["torch"]):
        out.append(
            Refusal(
                "flash-attn-torch",
                f"flash-attn {version} does not support torch {torch_v}",
                f"it supports torch{rec['torch']}",
                "pick another flash-attn version in the profile, or --without flash-attn",
                hard=True,
            )
        )
    if not at_least(cc, floor):
        out.append(
            Refusal(
                "flash-attn-cc",
                f"flash-attn on the {gpu} (CC {cc})",
                f"FlashAttention-2 only supports Ampere GPUs or newer (CC >= {floor})",
                "use --without flash-attn (attention falls back to sdpa)",
            )
        )
    elif choice.arch is None:
        archs = ", ".join(_sdist_archs(fa_data))
        out.append(
            Refusal(
                "flash-attn-arch",
                f"flash-attn's setup.py builds no kernel the {gpu} (CC {cc}) runs",
                f"FLASH_ATTN_CUDA_ARCHS takes {archs}",
                "use --without flash-attn (attention falls back to sdpa)",
                hard=True,
            )
        )
    return out


def record(fa_data: FlashAttnSection, version: str, choice: Choice) -> R.FlashAttn:
    """The flash-attn part of a ResolvedEnv: the version, the modules the run imports of it,
    where its release wheel is, and what `choice` decided."""
    rel, sdist = fa_data["release_wheels"], fa_data.get("sdist_build")
    tags = dict(sorted((fa_data["versions"][version].get("wheel_cuda") or {}).items()))
    return R.FlashAttn(
        version=version,
        modules=tuple(fa_data["training_path"]["modules"]),
        release=rel["url"].format(version=version),
        wheel=rel["filename"],
        cuda_tags=frozen(tags),
        how=choice.how,
        index=choice.index,
        index_name=choice.index_name,
        index_path=choice.index_path,
        # (below every arch, a card that --allow-unsupported lets through: the lowest, which it cannot run)
        arch=choice.arch or next(iter(_sdist_archs(fa_data)), None),
        core_minutes=int((sdist.get("core_minutes_per_arch") if sdist else None) or 0),
    )


def mirrored_index(fa: R.FlashAttn, prefixes: Mapping[str, str] | None) -> str | None:
    """The index's URL through a mirror set's prefix for that known index (mirrors.yaml
    `wheel_indexes`): its world tree under the prefix; the index itself where the set has none
    (or the user named the index)."""
    prefix = (prefixes or {}).get(fa.index_name or "")
    if fa.index and prefix and fa.index_path:
        return prefix.rstrip("/") + "/" + fa.index_path
    return fa.index


def estimate(fa: R.FlashAttn) -> str:
    """A source build's expected time, as the notes say it (the builder says it for its cores)."""
    m = fa.core_minutes
    if not m:
        return ""
    return (
        f"about {m} core-minutes for sm_{fa.arch} alone: ~{math.ceil(m / 4)} min at the builder's "
        f"MAX_JOBS=4, ~{math.ceil(m / 64)} min with 64 cores and --build-arg MAX_JOBS=64"
    )


def notes(fa: R.FlashAttn, reason: str, fa_data: FlashAttnSection) -> list[str]:
    """What the resolver says of the choice (rendered into the files' notes)."""
    if fa.how == SOURCE:
        sdist = fa_data.get("sdist_build")
        readme = (sdist["estimate"] if sdist else None) or "hours without many cores"
        return [
            f"flash-attn {fa.version}: {reason}: the builder stage compiles it from the sdist for "
            f"sm_{fa.arch} only ({estimate(fa) or readme}); a torch, Python or CUDA its release "
            "builds, or --flash-attn-index URL, avoids that"
        ]
    if fa.how == INDEX:
        return [
            f"flash-attn {fa.version}: {reason}; its fatbin is checked for sm_{fa.arch} with cuobjdump, "
            f"and the builder compiles it for sm_{fa.arch} where the index has no such wheel"
        ]
    return []


def announcements(env: ResolvedEnv) -> list[str]:
    """The notes `render` says on the terminal before a build: where flash-attn comes from and,
    for a source build, how long it takes."""
    fa = env.flash_attn
    return [n for n in env.notes if fa and n.startswith(f"flash-attn {fa.version}: ")]


_CREDENTIALS = re.compile(r"^[a-z]+://[^/@]*@", re.I)


def check_index_url(url: str) -> str:
    """--flash-attn-index's value, refused (exit 2) unless an http(s) URL of characters that
    no shell or Dockerfile reads specially, without credentials (which a build arg would show
    in `docker history`)."""
    from envbuilder.model import schema as S
    from envbuilder.text import printable

    try:
        S.URL.check(url, "--flash-attn-index")
    except S.SchemaError as e:
        raise UserError(
            f"{e}. It is the PEP 503 index the builder downloads flash-attn's wheel from: give "
            "its /simple/ URL, e.g. --flash-attn-index https://verl-project.github.io/"
            "verl-wheelhouse/cu130/torch2.11/simple/"
        ) from None
    if _CREDENTIALS.match(url):
        raise UserError(
            f"--flash-attn-index {printable(url.split('@', 1)[1])!r} carries user:password@, which a "
            "build arg would keep in the image's history: serve the index without credentials, or "
            "pass them as pip.conf through the build's pip_conf secret."
        )
    return url


# ---- the builder: one source-build command and each way's shell ------------------------------


# setup.py downloads a prebuilt wheel (whatever the arch list) unless told to build
FORCE_BUILD = "FLASH_ATTENTION_FORCE_BUILD=TRUE"


def source_build_env(env: ResolvedEnv) -> list[str]:
    """The variables of flash-attn's source build for the card: its one arch, and a build even
    where setup.py would download a prebuilt wheel."""
    fa = env.flash_attn
    assert fa is not None  # (called only for a profile with flash-attn)
    return [
        f"TORCH_CUDA_ARCH_LIST={env.gpu.compute_capability}",
        FORCE_BUILD,
        f"FLASH_ATTN_CUDA_ARCHS={fa.arch or env.gpu.sm}",
    ]


def source_build_argv(env: ResolvedEnv, pip: list[str]) -> list[str]:
    """THE command that compiles flash-attn for the card, as words: its variables, `pip` (the
    words that run pip install or pip wheel), and torch from the environment (no isolation)."""
    fa = env.flash_attn
    assert fa is not None  # (called only for a profile with flash-attn)
    return [*source_build_env(env), *pip, "--no-build-isolation", f"flash-attn=={fa.version}"]


def source_build_command(env: ResolvedEnv, pip: str = "pip install") -> str:
    """source_build_argv as one line (by hand into an environment, the Apptainer definition, the
    builder stage with `pip wheel ...`); "" without flash-attn."""
    return " ".join(source_build_argv(env, [pip])) if env.flash_attn else ""


def source_build_shell(env: ResolvedEnv, wheels: str, indent: str = "    ") -> list[str]:
    """The builder's lines that compile flash-attn into `wheels`: the time it expects for this
    machine's cores (min(nproc, MAX_JOBS) jobs), ccache for nvcc and c++ where the image has it
    or apt installs it (Debian's and Ubuntu's package, with its /usr/lib/ccache folder; its
    objects stay in the CCACHE_DIR cache mount between builds)."""
    fa = env.flash_attn
    assert fa is not None  # (called only for a profile with flash-attn)
    m = fa.core_minutes or 64
    command = source_build_command(env, f"pip wheel -v --no-deps -w {wheels}")
    return [
        f'{indent}jobs="$(nproc)"; [ "$jobs" -gt "${{MAX_JOBS:-$jobs}}" ] && jobs="$MAX_JOBS";',
        f'{indent}echo "envbuild: flash-attn: compiling {fa.version} from its PyPI sdist for sm_{fa.arch} only '
        f"with $jobs jobs ($(nproc) cores, MAX_JOBS=${{MAX_JOBS}}): expect about $(( ({m} + jobs - 1) / jobs )) "
        f'min ({m} core-minutes)";',
        f'{indent}command -v ccache >/dev/null || timeout 300 sh -c "apt-get $APT_CA_OPT update -qq && '
        'apt-get $APT_CA_OPT install -y -qq --no-install-recommends ccache" >/dev/null 2>&1 || true;',
        # c++ through ccache's masquerade folder (torch's compiler check resolves CXX on PATH,
        # so "ccache c++" there would fail it); nvcc through PYTORCH_NVCC, which torch writes
        # into build.ninja as is
        f"{indent}if command -v ccache >/dev/null; then export CCACHE_DIR={CCACHE_DIR} "
        'PATH="/usr/lib/ccache:$PATH" PYTORCH_NVCC="ccache ${CUDA_HOME:-/usr/local/cuda}/bin/nvcc";',
        f'{indent}else echo "envbuild: flash-attn: no ccache here: compiled without an object cache"; fi;',
        f"{indent}{command}",
    ]


def index_shell(env: ResolvedEnv, wheels: str, check: str) -> list[str]:
    """The builder's lines for `how: index`: the wheel from ${FLASH_ATTN_INDEX} (binary only, no
    dependencies), its fatbin checked for the card (`check`: the command that runs
    flash_attn_wheel.py), else the source build."""
    fa = env.flash_attn
    assert fa is not None and fa.how == INDEX
    cc = env.gpu.compute_capability
    lines = [
        f"rm -rf {DOWNLOAD_DIR} && if pip download --no-deps --only-binary=:all: "
        f'--index-url "${{FLASH_ATTN_INDEX}}" -d {DOWNLOAD_DIR} flash-attn=={fa.version}; then',
        f"      {check} check-archs --cc {cc} {DOWNLOAD_DIR}/*.whl && mkdir -p {wheels} && mv {DOWNLOAD_DIR}/*.whl {wheels}/;",
        "    else",
        f'      echo "envbuild: flash-attn: the index has no {fa.version} wheel for this Python and machine '
        '(or does not answer): compiling it instead";',
        *source_build_shell(env, wheels, "      "),
        "    fi",
    ]
    return [*lines[:-2], lines[-2] + ";", lines[-1]]


def release_shell(
    env: ResolvedEnv,
    *,
    script: str,
    wheels: str,
    cuda_tags: str,
    pins: str | None,
    quote: Callable[[str], str],
) -> list[str]:
    """The builder's lines for `how: release`: envbuilder/images/flash_attn_wheel.py (`script`, the
    command that runs it) fetches the release's wheel for the installed torch; unlocked, no such
    wheel (exit 3) falls back to the source build, locked (`pins`: {file: sha256} as JSON) only
    a pinned file installs. `cuda_tags`: the CUDA tags as JSON; `quote`: the shell's quoting."""
    fa = env.flash_attn
    assert fa is not None
    shell = [
        f'{{ {script} --version {quote(fa.version)} --release "${{FLASH_ATTN_RELEASE}}"',
        f"      --filename {quote(fa.wheel)} --cuda-tags {quote(cuda_tags)}",
    ]
    if pins:
        shell.append(f"      --pins {quote(pins)}")
    shell[-1] += f" --dest {wheels}"
    if pins:
        shell[-1] += "; }"
        return shell
    shell += [
        '    || { rc=$?; [ "$rc" -eq 3 ] || exit "$rc";',
        f'         echo "envbuild: flash-attn: building {fa.version} from its PyPI sdist instead (slow)";',
        *source_build_shell(env, wheels, "         "),
    ]
    shell[-1] += "; }; }"
    return shell


def release_comments(env: ResolvedEnv, locked: bool) -> list[str]:
    """The comment lines above the release wheel's step."""
    fa = env.flash_attn
    assert fa is not None
    out = [
        f"flash-attn {fa.version}: the release's prebuilt wheel for the torch installed above, named "
        "as flash-attn's",
        "setup.py names it (torch major.minor, its CUDA, its C++ ABI, this Python), fetched through "
        "the GitHub mirror.",
    ]
    if locked:
        return [
            *out,
            "Locked: only a wheel the lock pins by sha256 installs; nothing is compiled, nothing else is fetched.",
        ]
    return [
        *out,
        "Checked against its own RECORD (integrity, not a pin); no such wheel or no answer: "
        "compiled from the PyPI",
        f"sdist instead (hours without many cores), sm_{fa.arch or env.gpu.sm} only.",
    ]


def comments(env: ResolvedEnv) -> list[str]:
    """The comment lines above the builder's flash-attn step."""
    fa = env.flash_attn
    assert fa is not None
    if fa.how == INDEX:
        return [
            f"flash-attn {fa.version}: its wheel from the index FLASH_ATTN_INDEX names (binary only), its fatbin",
            f"checked with cuobjdump for sm_{env.gpu.sm} before use; no such wheel: compiled for sm_{fa.arch},",
            f"{estimate(fa)}.",
        ]
    return [
        f"flash-attn {fa.version}: no prebuilt wheel for this torch, CUDA and Python: compiled from the PyPI "
        f"sdist for sm_{fa.arch} only,",
        f"{estimate(fa)}; objects kept in a BuildKit cache mount (ccache).",
    ]
