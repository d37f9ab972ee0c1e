"""What NVIDIA GPUs this machine has, and which profile fits them.

The GPUs are read through NVML (nvidia-ml-py) or, failing that, `nvidia-smi`; `probe_nvml`,
`probe_smi` and `detect` are the only functions that touch the machine, and they take the NVML
module and the command runner as arguments so tests feed recorded values. Matching names to the
matrix's GPU models and choosing a profile are pure, and every rule comes from the matrix and the
resolver: no GPU name appears here.
"""

from __future__ import annotations

import re
import subprocess
from typing import Callable, Protocol, Sequence

from envbuilder.model.matrix import Matrix, cc_tuple
from envbuilder.model.names import match_gpu, nearest_profile
from envbuilder.model.resolve import ResolveError, picked_for_driver, resolve
from envbuilder.model.matrix import cc_runs
from envbuilder.model.resolved import Overrides, ResolvedEnv
from envbuilder.model.versions import is_driver_version
from envbuilder.record import Record
from envbuilder.text import printable

QUERY = (
    "nvidia-smi",
    "--query-gpu=index,name,compute_cap,memory.total,driver_version",
    "--format=csv,noheader,nounits",
)
# Older drivers' nvidia-smi has no compute_cap field; the matrix then gives the CC by name.
QUERY_NO_CC = (
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
)
NO_GPU_FIX = (
    "install the NVIDIA driver (nvidia-smi must list the GPU); inside a container, start it with --gpus all"
)


class Gpu(Record):
    index: int
    name: str
    compute_capability: str | None
    vram_mib: int
    model: str | None = None  # the matrix's gpus key, when a `match` pattern names it

    @property
    def vram_gb(self) -> float:
        return self.vram_mib / 1024

    def label(self) -> str:
        cc = self.compute_capability or "?"
        return f"GPU {self.index} {self.name} (CC {cc}, {self.vram_gb:.0f} GB)"


class Machine(Record):
    gpus: tuple[Gpu, ...]
    driver: str | None
    cuda: str | None  # the newest CUDA the driver supports
    via: str  # "nvml" or "nvidia-smi"; "" when no GPU was found
    problem: str | None = None  # why no GPU was found


class NoGpu(Exception):
    """One probe's reason for finding no GPU."""


class NvmlMemory(Protocol):
    @property
    def total(self) -> int: ...  # bytes


class Nvml(Protocol):
    """What detect reads of a pynvml-like module (nvidia-ml-py; tests pass recorded answers).
    nvmlSystemGetCudaDriverVersion(_v2), which older modules lack, is looked up by name."""

    @property
    def NVMLError(self) -> type[Exception]: ...
    def nvmlInit(self) -> object: ...
    def nvmlShutdown(self) -> object: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: object, /) -> tuple[int, int]: ...
    def nvmlDeviceGetName(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object, /) -> NvmlMemory: ...


# argv -> a CompletedProcess (or one alike); FileNotFoundError where the program is missing
Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


# -- reading the machine ---------------------------------------------------------------------


def _text(value: object) -> str:
    """A value NVML or nvidia-smi reported, as envbuild may print it: its control characters
    (a terminal's escapes) shown as text, bytes that are no UTF-8 as \ufffd."""
    return printable(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))


def cuda_from_int(version: int) -> str:
    """NVML's CUDA driver version: 12020 -> '12.2', 13000 -> '13.0'."""
    return f"{version // 1000}.{version % 1000 // 10}"


def probe_nvml(nvml: Nvml) -> Machine:
    """Read the GPUs through a pynvml-like module; raises NoGpu with NVML's reason."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        raise NoGpu(f"NVML: {e}") from None
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = None
        for fn in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
            if hasattr(nvml, fn):
                try:
                    version: Callable[[], int] = getattr(nvml, fn)
                    cuda = cuda_from_int(version())
                    break
                except nvml.NVMLError:
                    continue
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(
                Gpu(
                    i,
                    _text(nvml.nvmlDeviceGetName(handle)),
                    f"{major}.{minor}",
                    nvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
                )
            )
    except nvml.NVMLError as e:
        raise NoGpu(f"NVML: {e}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return Machine(tuple(gpus), driver, cuda, "nvml")


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


def _first_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = [l.strip() for l in (out.stdout + "\n" + out.stderr).splitlines() if l.strip()]
    return printable(lines[0]) if lines else f"exit status {out.returncode}"


def _unreadable(line: str) -> NoGpu:
    shown = ascii(line[:200]) + (f" ({len(line)} characters)" if len(line) > 200 else "")
    return NoGpu(
        f"nvidia-smi printed a line envbuild cannot read: {shown} (its numbers must "
        "be written with the digits 0-9; a driver or a wrapper that prints others is "
        "not one envbuild trusts). Check `nvidia-smi --query-gpu=index,name,memory.total "
        "--format=csv` and the nvidia-smi first on PATH"
    )


def parse_query(text: str, with_cc: bool = True) -> tuple[list[Gpu], str | None]:
    """The GPUs and driver from `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`.
    Numbers are read from the digits 0-9 only: a GPU row with any other digit (Python's int()
    takes '٣' and str.isdigit() '²') raises NoGpu naming the line."""
    gpus, driver = [], None
    for line in filter(None, (l.strip() for l in text.splitlines())):
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != (5 if with_cc else 4) or not fields[0].isdigit():
            continue  # not a GPU row (a warning nvidia-smi printed)
        if any(c.isdigit() and c not in "0123456789" for c in line):
            raise _unreadable(line)
        if with_cc:
            index, name, cc, mem, driver = fields
        else:
            (index, name, mem, driver), cc = fields, None
        if not re.fullmatch(r"[0-9]{1,4}", index):
            raise _unreadable(line)
        cc = cc if cc and re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,2}", cc) else None
        gpus.append(
            Gpu(int(index), _text(name), cc, int(mem) if re.fullmatch(r"[0-9]{1,9}", mem) else 0)
        )  # ([N/A]: 0)
    return gpus, driver


def parse_cuda_version(table: str) -> str | None:
    """'CUDA Version: 12.2' from the header of plain `nvidia-smi` (digits 0-9 only)."""
    m = re.search(r"CUDA Version:\s*([0-9]{1,3}\.[0-9]{1,3})(?![0-9])", table)
    return m.group(1) if m else None


def probe_smi(run: Runner) -> Machine:
    """Read the GPUs through nvidia-smi; raises NoGpu with its reason."""
    try:
        out = run(QUERY)
        with_cc = True
        if out.returncode != 0 and "compute_cap" in out.stdout + out.stderr:
            out, with_cc = run(QUERY_NO_CC), False
    except FileNotFoundError:
        raise NoGpu("nvidia-smi: not found on PATH") from None
    except subprocess.TimeoutExpired as e:  # a wedged GPU can hang the driver's tools
        raise NoGpu(f"nvidia-smi: no answer within {e.timeout:g} s") from None
    if out.returncode != 0:
        raise NoGpu(f"nvidia-smi: {_first_line(out)}")
    gpus, driver = parse_query(out.stdout, with_cc)
    table = run(("nvidia-smi",))
    cuda = parse_cuda_version(table.stdout) if table.returncode == 0 else None
    return Machine(tuple(gpus), driver, cuda, "nvidia-smi")


def detect(m: Matrix, nvml: Nvml | None = None, run: Runner | None = None) -> Machine:
    """The machine's GPUs, named by the matrix; NVML first, then nvidia-smi. Never raises for a
    missing GPU or driver: the Machine's `problem` says why none was found."""
    reasons = []
    machine = None
    if nvml is None:
        try:
            import pynvml

            nvml = pynvml
        except ImportError:
            reasons.append("NVML: nvidia-ml-py is not installed")
    if nvml is not None:
        try:
            machine = probe_nvml(nvml)
        except NoGpu as e:
            reasons.append(str(e))
    if machine is None:
        try:
            machine = probe_smi(run or run_command)
        except NoGpu as e:
            reasons.append(str(e))
    if machine is None:
        return Machine((), None, None, "", "; ".join(reasons))
    if machine.driver and not (machine.driver.isascii() and is_driver_version(machine.driver)):
        machine = machine._replace(driver=None)  # e.g. 'N/A' from a half-working driver: unknown
    if not machine.gpus:
        return machine._replace(problem=f"the driver ({machine.via}) lists no GPU")
    return identify(m, machine)


# -- naming and choosing (pure) --------------------------------------------------------------


def match_model(m: Matrix, name: str) -> str | None:
    """The first matrix GPU model whose `match` pattern finds the reported name."""
    return match_gpu(m, name)


def identify(m: Matrix, machine: Machine) -> Machine:
    """Each GPU with its matrix model; the CC from the matrix where the driver gave none."""
    gpus = []
    for g in machine.gpus:
        model = match_model(m, g.name)
        cc = g.compute_capability or (m.gpus[model]["compute_capability"] if model else None)
        gpus.append(g._replace(model=model, compute_capability=cc))
    return machine._replace(gpus=tuple(gpus))


def weakest(gpus: tuple[Gpu, ...]) -> Gpu:
    """The GPU a profile must fit: lowest CC, then least memory."""
    return min(gpus, key=lambda g: (cc_tuple(g.compute_capability or "0.0"), g.vram_mib, g.index))


class Reason(Record):
    ok: bool | None  # None: information, not a check
    text: str

    def line(self) -> str:
        return self.text + {True: " \u2713", False: " \u2717", None: ""}[self.ok]


class Fit(Record):
    profile: str
    ok: bool
    reasons: tuple[Reason, ...]
    fixes: tuple[str, ...]
    flags: str = ""  # what `render NAME` needs on this machine (" --gpu-memory 40960")
    name: str = ""  # what to render: the profile, or the card's own key where it takes this profile's stack


class Recommendation(Record):
    gpu: Gpu | None  # the GPU the profile was chosen for
    profile: str | None
    fits: tuple[Fit, ...]  # every candidate checked, best first
    notes: tuple[str, ...]


def runnable_archs(cc: str, archs: Sequence[str]) -> list[str]:
    """The archs of a build whose code runs on `cc`, by the resolver's rule."""
    return [a for a in archs if cc_runs(cc, [a])]


def fit_profile(
    m: Matrix, name: str, gpu: Gpu, driver: str | None, cuda: str | None, count: int | None = None
) -> Fit:
    """Does profile `name` fit this GPU and driver (and `count` of them, when the machine has
    fewer than the profile trains on)? Each reason says what was compared."""
    p = m.profiles[name]
    pgpu = m.gpus[p["gpu"]]
    reasons: list[Reason] = []
    fixes: list[str] = []
    if gpu.model == p["gpu"]:
        reasons.append(Reason(True, f"{gpu.name} is the matrix's {p['gpu']}, the GPU of profile {name}"))
    else:
        known = f"the matrix's {gpu.model}" if gpu.model else "not in the matrix"
        reasons.append(
            Reason(
                True,
                f"{gpu.name} (CC {gpu.compute_capability}) is {known}; profile "
                f"{name} is built for the {pgpu['name']} (CC {pgpu['compute_capability']}), "
                f"whose code runs on CC {gpu.compute_capability}",
            )
        )
    # a card of the matrix that takes this profile's stack is resolved by its own name (its
    # identity and its recorded memory); the plan counts on the memory this card reports
    asked = (
        gpu.model if gpu.model and gpu.model != p["gpu"] and nearest_profile(m, gpu.model) == name else name
    )
    measured = gpu.vram_mib or None
    planned = planned_mib(m, gpu.model if asked != name and gpu.model else p["gpu"])
    resized = bool(measured and measured != planned)
    flags = f" --gpu-memory {measured}" if resized else ""
    fewer = count if count and count < p["train"]["n_gpus"] else None  # (planned for the GPUs it has)
    flags += f" --gpus-per-node {fewer}" if fewer else ""
    ov = Overrides(driver=driver, gpu_memory=measured if resized else None, gpus_per_node=fewer)
    try:
        env, changed = resolve_or_fix(m, asked, ov)
    except ResolveError as e:
        for v in e.violations:
            reasons.append(Reason(False, f"{v.what}: {v.why}"))
            fixes.append(v.fix)
        return Fit(name, False, tuple(reasons), tuple(fixes), flags, asked)
    picked = picked_for_driver(env, ov)
    if picked:  # (render takes the same stack from the driver, and says why)
        flags += f" --driver {driver}"
        reasons.append(Reason(True, picked))
    if changed:
        flags += f" {changed}"
        reasons.append(
            Reason(True, f"profile {name} as shipped does not fit this machine; with {changed} it does")
        )
    drv = env.driver
    need = f"profile {name} needs CUDA {drv.for_cuda} (>= {drv.min_driver})"
    if driver is None:
        reasons.append(Reason(None, f"driver unknown; {need}"))
    elif drv.mode == "native":
        reasons.append(Reason(True, f"driver {driver} supports CUDA {cuda or '?'}; {need}"))
    else:
        reasons.append(
            Reason(
                True,
                f"driver {driver} supports CUDA {cuda or '?'}; {need}, and runs it "
                f"under minor-version compatibility (>= {drv.compat_driver}, "
                "no PTX JIT)",
            )
        )
    if driver is not None and not picked:
        reasons.append(Reason(None, upgrade_path(m, name, env, driver)))
    t = env.torch
    assert gpu.compute_capability is not None  # (recommend fits only a GPU whose CC it knows)
    runs = runnable_archs(gpu.compute_capability, t.archs)
    build = f"torch {t.version}+{t.variant}"
    if runs:
        best = max(runs, key=cc_tuple)
        reasons.append(
            Reason(True, f"{build} has sm_{best.replace('.', '')} which runs on CC {gpu.compute_capability}")
        )
    else:
        reasons.append(
            Reason(
                False,
                f"{build} has no kernels for CC {gpu.compute_capability} "
                f"(its arch list is {';'.join(t.archs)})",
            )
        )
        fixes.append("render with a --torch/--cuda whose build lists this CC (envbuild show)")
    # (the resolver's memory plan refused what does not fit; this says what it planned)
    peak, usable = env.memory.peak, env.memory.usable_gib
    reasons.append(
        Reason(
            True,
            f"{env.train.model} peaks at {peak.gib:.1f} GiB ({peak.phase}) of {usable:.1f} GiB usable",
        )
    )
    if resized:
        reasons.append(
            Reason(
                None,
                f"memory planned for the {measured} MiB this card reports ("
                + (f"the {m.gpus[asked]['name']}" if asked != name else f"profile {name}'s {pgpu['name']}")
                + f" is recorded at {planned} MiB)",
            )
        )
    ok = all(r.ok is not False for r in reasons)
    return Fit(name, ok, tuple(reasons), tuple(fixes), flags, asked)


def upgrade_path(m: Matrix, name: str, env: ResolvedEnv, driver: str) -> str:
    """What a newer driver would add to a profile whose stack this driver already runs: its
    CUDA natively where it now runs under minor-version compatibility, and the newest stack
    newer than its own that resolves on this card."""
    from envbuilder.model.components.cuda import stacks_for_driver
    from envbuilder.model.versions import version_key

    drv, parts = env.driver, []
    if drv.mode == "minor-version-compatibility":
        parts.append(f"with driver >= {drv.min_driver}: CUDA {drv.for_cuda} natively (the same stack)")
    runs_here = {v for v, _ in stacks_for_driver(m, driver)}
    stacks: list[str] = sorted(m.sections.get("stacks") or {}, key=version_key, reverse=True)
    for v in (v for v in stacks if version_key(v) > version_key(env.verl.version)):
        try:
            newer = resolve(m, name, env.overrides._replace(verl=v, driver=None), check_fixes=False)
        except ResolveError:
            continue
        what = f"verl {v}" + (f", vLLM {newer.vllm.version}" if newer.vllm else "")
        parts.append(
            f"{what} runs on this driver too (--verl {v})"
            if v in runs_here
            else f"with driver >= {newer.driver.min_driver}: {what} (--verl {v})"
        )
        break
    return "; ".join(parts) or "a newer driver adds nothing: no newer stack resolves on this card"


# what the machine decides: a fix that changes one is no fix for this machine
MACHINE_FLAGS = frozenset({"driver", "ecc", "gpu-memory"})  # (as a fix names them: concrete()'s keys)


def resolve_or_fix(m: Matrix, name: str, ov: Overrides) -> tuple[ResolvedEnv, str]:
    """The profile on this machine, and the flags it needs beyond the machine's own: where it
    is refused, the first of the refusal's fixes (each checked to resolve) that changes neither
    the driver nor the card: "--algo grpo" for a model with a critic that does not fit."""
    try:
        return resolve(m, name, ov), ""
    except ResolveError as e:
        refused = e
    from envbuilder.model.fixes import alternatives, applied, concrete, render_flags

    for v in refused.violations:
        for alt in alternatives(v.fix):
            flags = concrete(m, alt)
            if not flags or set(flags) & (MACHINE_FLAGS | ({"gpus-per-node"} if ov.gpus_per_node else set())):
                continue
            try:
                return resolve(m, name, applied(ov, flags)), render_flags(flags)
            except ResolveError:
                continue
    raise refused


def planned_mib(m: Matrix, gpu_key: str) -> int:
    """The memory a profile's plan counts on for its GPU without --gpu-memory: memory.yaml's
    nvidia-smi size, else the nominal size."""
    total = m.memory["total_mib"].get(gpu_key)
    return int(total["mib"]) if total else int(m.gpus[gpu_key]["vram_gb"] * 1024)


def candidates(m: Matrix, gpu: Gpu) -> list[str]:
    """Profiles for this GPU's model; else those whose GPU's code runs on its CC, closest first."""
    exact = [n for n, p in m.profiles.items() if gpu.model and p["gpu"] == gpu.model]
    if exact or not gpu.compute_capability:
        return exact
    family = [
        n
        for n, p in m.profiles.items()
        if cc_runs(gpu.compute_capability, [m.gpus[p["gpu"]]["compute_capability"]])
    ]
    return sorted(
        family, key=lambda n: cc_tuple(m.gpus[m.profiles[n]["gpu"]]["compute_capability"]), reverse=True
    )


def recommend(m: Matrix, machine: Machine) -> Recommendation:
    if not machine.gpus:
        return Recommendation(None, None, (), (f"no NVIDIA GPU found: {machine.problem}",))
    gpu = weakest(machine.gpus)
    notes = []
    kinds = {(g.name, g.compute_capability, g.vram_mib) for g in machine.gpus}
    if len(kinds) > 1:
        notes.append(f"{len(kinds)} kinds of GPU: the profile must fit the weakest, {gpu.label()}")
    if not gpu.compute_capability:
        notes.append(
            f"the compute capability of {gpu.name} is unknown (the driver does not report "
            "it and the matrix has no such GPU): add it to gpus in a --matrix-dir overlay"
        )
        return Recommendation(gpu, None, (), tuple(notes))
    count = len(machine.gpus)
    fits = [fit_profile(m, n, gpu, machine.driver, machine.cuda, count) for n in candidates(m, gpu)]
    fits.sort(key=lambda f: not f.ok)  # stable: the closest fitting profile first
    best = fits[0].profile if fits and fits[0].ok else None
    if not fits:
        notes.append(
            f"no profile in the matrix runs on {gpu.name} (CC {gpu.compute_capability}); "
            "add one in a --matrix-dir overlay, starting from `envbuild show <profile>` "
            "of the nearest GPU"
        )
    if best:
        n_gpus = m.profiles[best]["train"]["n_gpus"]
        if count < n_gpus:  # (the fit planned for `count`: its flags say so, and resolve)
            notes.append(
                f"profile {best} trains on {n_gpus} GPUs and this machine has {count}: "
                f"planned for {count} (`envbuild check {fits[0].name or best}{fits[0].flags}`)"
            )
    return Recommendation(gpu, best, tuple(fits), tuple(notes))


def machine_json(machine: Machine) -> dict[str, object]:
    return {
        "gpus": [dict(g._asdict(), vram_gb=round(g.vram_gb, 1)) for g in machine.gpus],
        "driver": machine.driver,
        "cuda": machine.cuda,
        "via": machine.via or None,
        "problem": machine.problem,
    }


def recommendation_json(rec: Recommendation) -> dict[str, object]:
    return {
        "for_gpu": rec.gpu.index if rec.gpu else None,
        "profile": rec.profile,
        "candidates": [
            {
                "profile": f.profile,
                **({"as": f.name} if f.name and f.name != f.profile else {}),
                "fits": f.ok,
                "reasons": [{"ok": r.ok, "text": r.text} for r in f.reasons],
                "fixes": list(f.fixes),
                **({"flags": f.flags.split()} if f.flags else {}),
            }
            for f in rec.fits
        ],
        "notes": list(rec.notes),
    }


def report_lines(machine: Machine, rec: Recommendation) -> list[str]:
    """`envbuild detect`'s report, a line each: the GPUs, the driver and its CUDA, the profile
    that fits best with why (and the others that fit), or why none fits and each one's fix."""
    if not machine.gpus:
        return [f"no NVIDIA GPU found: {machine.problem}", f"  fix: {NO_GPU_FIX}"]
    out = []
    for g in machine.gpus:
        model = f"matrix model {g.model}" if g.model else "not in the matrix"
        out.append(
            f"GPU {g.index}  {g.name}  CC {g.compute_capability or '?'}  {g.vram_gb:.0f} GB  ({model})"
        )
    out.append(
        f"driver {machine.driver}, supports CUDA up to {machine.cuda or '?'} (read through {machine.via})"
    )
    out += [f"note: {note}" for note in rec.notes]
    if rec.profile:
        best = next(f for f in rec.fits if f.profile == rec.profile)
        what = best.name or rec.profile
        out.append(
            f"profile: {rec.profile}"
            + (f", as {what} (this card by its own name)" if what != rec.profile else "")
        )
        out += [f"  {r.line()}" for r in best.reasons]
        others = [f.profile for f in rec.fits if f.ok and f.profile != rec.profile]
        if others:
            out.append(f"  also fits: {', '.join(others)}")
        flags = best.flags
        out.append(f"next: envbuild doctor {what}{flags}; envbuild render {what}{flags}")
    elif rec.fits and rec.gpu is not None:  # (a GPU was found whenever a profile was tried)
        out.append(f"no profile fits {rec.gpu.label()}:")
        for f in rec.fits:
            out.append(f"  {f.profile}:")
            out += [f"    {r.line()}" for r in f.reasons]
            out += [f"    fix: {fix}" for fix in f.fixes]
    return out
