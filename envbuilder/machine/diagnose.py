"""`envbuild diagnose`: an environment envbuild did not build (or did), read without running its
code (machine/target.py), judged with the matrix on this machine (detect's GPU and driver, the
host's glibc and libstdc++): each finding says what is wrong, why, and the fix; and the profile
that resolves with the fewest changes to what is installed (the fix search `check` uses,
model/fixes.py), as the commands that make it.

The checks, each from one source of facts:
  driver     torch's CUDA build (torch/version.py) and vLLM's wheel CUDA against the driver
             (cuda.yaml's floors, minor-version compatibility's included: model/components/cuda)
  torch-arch torch's build has no kernels for the card (torch.yaml's arch lists)
  attention  flash-attn installed for a card below its compute capability floor (extensions.yaml)
  gpu-code   an extension's fat binaries hold neither SASS that runs on the card nor PTX the
             driver could compile for it (machine/elf.py)
  abi        an extension needs C++ symbols of c10/at/torch that the torch beside it does not
             export: it was built against another torch
  libc       an extension needs a GLIBC / GLIBCXX version newer than the host's (or the
             prefix's own libstdc++) provides
  requires   a distribution's Requires-Dist that the installed versions break, or that is missing
  verl       verl's ranges that its METADATA does not declare (verl.yaml: vLLM, torch)
  vllm-card  vLLM on a card below its compute capability floor (vllm.yaml)
  patch      verl's recorded patches for this card (patches.yaml, through the resolved profile)
             not applied to the installed verl
  twice      a distribution installed twice (two dist-info folders)
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from envbuilder.model.components.flash_attn import FORCE_BUILD as FA_FORCE_BUILD
from envbuilder.machine.detect import Gpu, Machine, candidates, weakest
from envbuilder.machine.elf import read_elf
from envbuilder.machine.target import Extension, Target, torch_exports
from envbuilder.model.components.cuda import driver_info
from envbuilder.model.matrix import Matrix, at_least, cc_runs, cc_tuple
from envbuilder.model.requires import requirements
from envbuilder.model.resolve import ResolveError, resolve
from envbuilder.model.resolved import Overrides, ResolvedEnv
from envbuilder.model.runplan import env_from_json
from envbuilder.model.versions import satisfies, version_key
from envbuilder.record import Record
from envbuilder.text import printable

LIBSTDCXX_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib",
)
# the stack flags the installed versions give the fix search, and what each is in a resolved env
STACK = ("python", "cuda", "torch", "vllm", "verl")
MAX_RECORD = 16 << 20
VERSIONS = re.compile(rb"GLIBC")  # (of libc and libstdc++: only the version names of their .dynstr)


class Finding(Record):
    rule: str
    what: str
    why: str
    fix: str

    def lines(self) -> list[str]:
        return [f"\u2717 [{self.rule}] {self.what}: {self.why}", f"    fix: {self.fix}"]


class Host(Record):
    glibc: str | None  # "2.36"
    libstdcxx: str | None  # the libstdc++.so.6 the environment loads
    glibcxx: str | None  # the newest GLIBCXX_ version it provides: "3.4.30"


class Nearest(Record):
    """The profile that resolves with the fewest changes to what is installed."""

    profile: str
    flags: tuple[str, ...]  # the override flags, as typed
    changes: tuple[tuple[str, str | None, str], ...]  # (package, installed or None, the profile's)
    same: tuple[str, ...]  # packages installed at the profile's version
    env: ResolvedEnv

    @property
    def command_flags(self) -> str:
        return "".join(f" {shlex.quote(w)}" for w in self.flags)

    def commands(self) -> list[str]:
        p = shlex.quote(self.profile) + self.command_flags
        return [
            f"envbuild install {p} --prefix NEW_PREFIX",
            f"envbuild build {p}  # (the image route: render, build, smoke-test)",
        ]


class Diagnosis(Record):
    target: Target
    machine: Machine
    card: Gpu | None
    host: Host
    findings: tuple[Finding, ...]
    nearest: Nearest | None
    notes: tuple[str, ...]


# -- the host ----------------------------------------------------------------------------------


# The GCC release whose libstdc++ first provides each GLIBCXX symbol version (GCC's libstdc++ ABI
# policy: https://gcc.gnu.org/onlinedocs/libstdc++/manual/abi.html, "GLIBCXX_3.4.x"); conda-forge's
# libstdcxx-ng is versioned as GCC is.
_GCC_OF_GLIBCXX = {
    "3.4.21": "5.1",
    "3.4.22": "6.1",
    "3.4.23": "7.1",
    "3.4.24": "7.2",
    "3.4.25": "8.1",
    "3.4.26": "9.1",
    "3.4.27": "9.2",
    "3.4.28": "9.3",
    "3.4.29": "11.1",
    "3.4.30": "12.1",
    "3.4.31": "13.1",
    "3.4.32": "13.2",
    "3.4.33": "14.1",
}


def _newest(versions: Iterable[str], prefix: str) -> str | None:
    found = [v[len(prefix) :] for v in versions if v.startswith(prefix)]
    return max(found, key=version_key) if found else None


def read_host(prefix: Path, root: Path | None = None) -> Host:
    """glibc and the libstdc++ the environment loads: the prefix's own (a conda prefix ships one),
    else the system's. The system is this machine's (glibc: the C library this process runs on,
    as the environment's Python does), or an unpacked image's at `root`."""
    dirs = [Path(d) if root is None else root / d.lstrip("/") for d in LIBSTDCXX_DIRS]
    if root is None:
        try:
            libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
        except (ValueError, OSError):
            libc = ""
        glibc = libc.split()[-1] if libc.startswith("glibc ") else None
    else:
        found = next((d / "libc.so.6" for d in dirs if (d / "libc.so.6").exists()), None)
        elf = read_elf(found, symbols=VERSIONS, gpu=False) if found else None
        glibc = _newest(elf.versions, "GLIBC_") if elf else None
    for d in (prefix / "lib", *dirs):
        so = d / "libstdc++.so.6"
        if so.exists():
            elf = read_elf(so, symbols=VERSIONS, gpu=False)
            if elf is not None:
                shown = "/" + str(so.relative_to(root)) if root and root in so.parents else str(so)
                return Host(glibc, shown, _newest(elf.versions, "GLIBCXX_"))
    return Host(glibc, None, None)


# -- the nearest profile -----------------------------------------------------------------------


def base_version(v: str) -> str:
    return v.split("+")[0]


def installed_overrides(m: Matrix, t: Target, driver: str | None) -> Overrides:
    """The stack flags that say what is installed (where the matrix knows the release)."""

    def known(name: str, table: Mapping[str, object]) -> str | None:
        d = t.dists.get(name)
        return base_version(d.version) if d and base_version(d.version) in table else None

    torch = known("torch", m.torch)
    cuda = t.torch_cuda if torch and t.torch_cuda in m.cuda else None
    return Overrides(
        python=t.python,
        torch=torch,
        cuda=cuda,
        verl=known("verl", m.verl),
        vllm=known("vllm", m.vllm),
        driver=driver,
    )


def planned_pins(env: ResolvedEnv) -> dict[str, str]:
    """Every package the profile's install plan pins (the lock's too, where one fits)."""
    from envbuilder.context.prepare import prepare
    from envbuilder.render.plan import REQ, normalize

    out = {}
    for layer in prepare(env).plan.layers:
        for pin in layer.pins:
            m = REQ.match(pin)
            if m:
                out[normalize(m[1])] = m[2]
    return out


def _key(env: ResolvedEnv) -> tuple[str | None, ...]:
    return (
        env.python,
        env.torch.version,
        env.torch.variant,
        env.verl.version,
        env.vllm.version if env.vllm else None,
    )


def _fewest_flags(m: Matrix, profile: str, ov: Overrides, env: ResolvedEnv) -> tuple[Overrides, ResolvedEnv]:
    """`ov` without the flags that change nothing of `env`'s stack (what the command prints)."""
    for field in (*STACK, "driver"):
        if getattr(ov, field) is None:
            continue
        trial = ov._replace(**{field: None})
        try:
            other = resolve(m, profile, trial, check_fixes=False)
        except ResolveError:
            continue
        if _key(other) == _key(env):
            ov, env = trial, other
    return ov, env


def nearest_profile(
    m: Matrix,
    t: Target,
    machine: Machine,
    card: Gpu | None,
    asked: str | None,
    installed: ResolvedEnv | None,
) -> Nearest | None:
    """The profile (asked; else the one envbuild installed here; else this card's) and the
    flags under which it resolves with the fewest changes to the installed packages. Without a
    card (and no profile asked), only the profiles that resolve as installed are compared: the
    fix search is for a machine whose card is known."""
    from envbuilder.model.fixes import applied, smallest_change

    driver = machine.driver
    search = True
    on_card = candidates(m, card) if card is not None and card.compute_capability else []
    if asked:
        names = [asked]
    elif installed is not None and (not on_card or installed.profile in on_card):
        names = [installed.profile]  # (its own profile, where this card is one it runs on)
    elif on_card:
        names = on_card
    else:
        names, search = list(m.profiles), False
    best: tuple[int, str, Overrides, ResolvedEnv, dict[str, str]] | None = None
    for name in names:
        mine = installed is not None and name == installed.profile
        base = (
            installed.overrides._replace(driver=driver)
            if mine and installed
            else installed_overrides(m, t, driver)
        )
        ov, env = base, _resolved(m, name, base)
        if env is None and search:

            def run(o: Overrides, name: str = name) -> object:
                try:
                    return resolve(m, name, o, check_fixes=False)
                except ResolveError as e:
                    return {v.rule for v in e.violations}

            change = smallest_change(m, name, base, run)
            if change is not None:
                ov = applied(base, change)
                env = _resolved(m, name, ov)
        if env is None:
            continue
        pins = planned_pins(env)
        changed = sum(1 for pkg, want in pins.items() if not _same(t, pkg, want))
        if best is None or changed < best[0]:
            best = (changed, name, ov, env, pins)
    if best is None:
        return None
    _, name, ov, env, _pins = best
    ov, env = _fewest_flags(m, name, ov, env)
    changes, same = [], []
    for pkg, want in sorted(planned_pins(env).items()):
        if _same(t, pkg, want):
            same.append(pkg)
        else:
            have = t.dists.get(pkg)
            changes.append((pkg, have.version if have else None, want))
    from envbuilder.model.flags import words

    return Nearest(name, tuple(words(ov)), tuple(changes), tuple(same), env)


def _same(t: Target, pkg: str, want: str) -> bool:
    have = t.dists.get(pkg)
    return have is not None and base_version(have.version) == base_version(want)


def _resolved(m: Matrix, name: str, ov: Overrides) -> ResolvedEnv | None:
    try:
        return resolve(m, name, ov, check_fixes=False)
    except ResolveError:
        return None


# -- the checks --------------------------------------------------------------------------------


class _Checks:
    """The findings of one diagnosis, each check a method (module docstring)."""

    def __init__(
        self, m: Matrix, t: Target, machine: Machine, card: Gpu | None, host: Host, near: Nearest | None
    ):
        self.m, self.t, self.machine, self.card, self.host, self.near = m, t, machine, card, host, near
        self.found: list[Finding] = []
        self.notes: list[str] = []
        self.python = shlex.quote(str(Path(t.where) / "bin" / "python"))
        self._owners: dict[str, str] | None = None
        self.cannot_run: set[str] = set()  # distributions no build of runs on this card
        if t.unread:  # (what no check saw: never a silent CLEAN)
            shown = ", ".join(t.unread[:5]) + (f" and {len(t.unread) - 5} more" if len(t.unread) > 5 else "")
            self.notes.append(f"not read (no ELF file this reads), so not checked: {shown}")

    def add(self, rule: str, what: str, why: str, fix: str) -> None:
        self.found.append(Finding(rule, printable(what), printable(why), printable(fix)))

    def layer(self, name: str) -> str:
        """ ", from layer 2/3 sha256:..." for a package an image's layer installed."""
        d = self.t.dists.get(name)
        origin = self.t.origins.get(d.folder) if d else None
        return f", installed by {origin}" if origin else ""

    def version(self, name: str) -> str | None:
        d = self.t.dists.get(name)
        return d.version if d else None

    def profile_fix(self, what: str = "an environment of profile") -> str:
        if self.near is None:
            return "no profile of the matrix resolves for this machine: `envbuild detect` says why"
        return f"{what} {self.near.profile}{self.near.command_flags}: `{self.near.commands()[0]}`"

    def pin(self, name: str) -> str | None:
        if self.near is None:
            return None
        return planned_pins(self.near.env).get(name)

    # ---- the checks

    def driver(self) -> None:
        cuda, driver = self.t.torch_cuda, self.machine.driver
        if not cuda or not driver or cuda not in self.m.cuda:
            # (never passed over in silence: the report says what it could not judge)
            if cuda and driver:
                self.notes.append(
                    f"torch's CUDA {cuda} is one the matrix does not know: the driver {driver} was not "
                    "checked against it"
                )
            return
        vllm = self.m.vllm.get(base_version(self.version("vllm") or ""))
        extra = [vllm["wheel_cuda"]] if vllm and vllm.get("wheel_cuda") in self.m.cuda else []
        info = driver_info(self.m, cuda, self.m.cuda[cuda], extra, driver)
        if info.mode != "too-old":
            if info.mode == "minor-version-compatibility":
                self.notes.append(
                    f"driver {driver} runs CUDA {info.for_cuda} under minor-version compatibility "
                    f"(>= {info.compat_driver}): no PTX JIT"
                )
            return
        built = f"torch {self.t.torch_version} is built for CUDA {cuda}" + (
            f" and vLLM's wheel for CUDA {info.for_cuda}" if info.for_cuda != cuda else ""
        )
        self.add(
            "driver",
            built,
            f"driver {driver} is too old for CUDA {info.for_cuda}, which needs >= {info.min_driver} "
            f"(or >= {info.compat_driver} under minor-version compatibility); torch fails with "
            "'The NVIDIA driver on your system is too old'",
            f"upgrade the driver to >= {info.min_driver}, or install a stack this driver runs, "
            + self.profile_fix("as the nearest profile"),
        )

    def torch_arch(self) -> None:
        t, card = self.t, self.card
        if not t.torch_version or not t.torch_cuda or card is None or not card.compute_capability:
            return
        rec = self.m.torch.get(base_version(t.torch_version))
        local = t.torch_version.partition("+")[2]
        variant = local if local.startswith("cu") else "cu" + t.torch_cuda.replace(".", "")
        build = (rec or {}).get("builds", {}).get(variant)
        if not build:
            return
        if cc_runs(card.compute_capability, list(build["archs"])):
            return
        self.add(
            "torch-arch",
            f"torch {t.torch_version} ({variant}) has no kernels for the {card.name} (CC {card.compute_capability})",
            f"its arch list is {';'.join(build['archs'])}; CUDA calls fail with 'no kernel image is available'",
            self.profile_fix("install a torch built for this card, as in"),
        )

    def attention(self) -> None:
        v, card = self.version("flash-attn"), self.card
        floor = (self.m.flash_attn or {}).get("min_compute_capability")
        if not v or not floor or card is None or not card.compute_capability:
            return
        if at_least(card.compute_capability, str(floor)):
            return
        self.cannot_run.add("flash-attn")
        run = (
            f"; runs use attention {self.near.env.attention}, as profile {self.near.profile}'s run "
            f"script does (`envbuild render {self.near.profile}{self.near.command_flags}`)"
            if self.near
            else ""
        )
        self.add(
            "attention",
            f"flash-attn {v} cannot run on the {card.name} (CC {card.compute_capability})",
            f"FlashAttention-2 only supports Ampere GPUs or newer (CC >= {floor}): no build of it has "
            "kernels for this card, and a run that asks for flash_attention_2 or remove-padding fails",
            f"`{self.python} -m pip uninstall -y flash-attn`{run}",
        )

    def gpu_code(self) -> None:
        card = self.card
        if card is None or not card.compute_capability:
            return
        cc = card.compute_capability
        no_jit = (
            self.machine.driver is not None
            and self.t.torch_cuda in self.m.cuda
            and (
                driver_info(
                    self.m, self.t.torch_cuda, self.m.cuda[self.t.torch_cuda], [], self.machine.driver
                ).mode
                == "minor-version-compatibility"
            )
        )
        for ext in self.t.extensions:
            if not ext.elf.gpu:
                continue
            sass = [c.cc for c in ext.elf.gpu if c.kind == "sass"]
            ptx = [c.cc for c in ext.elf.gpu if c.kind == "ptx" and cc_tuple(c.cc) <= cc_tuple(cc)]
            if cc_runs(cc, sass) or (ptx and not no_jit):
                continue
            dist = self.owner(ext)
            if dist in self.cannot_run:
                continue  # (the rule that found it says no rebuild runs here)
            has = ", ".join(c.label() for c in ext.elf.gpu)
            self.add(
                "gpu-code",
                f"{ext.path} ({dist}) has no GPU code for the {card.name} (CC {cc})",
                f"its fat binary holds {has}: SASS runs only on its own major with a minor <= the "
                "card's, PTX only on a card at or above it"
                + (" and never under minor-version compatibility (no PTX JIT)" if ptx and no_jit else "")
                + "; its kernels fail with 'no kernel image is available'",
                f"rebuild {dist} for this card: `TORCH_CUDA_ARCH_LIST={cc} "
                # (flash-attn's setup.py fetches its prebuilt wheel, whatever the arch list, unless
                # told to build: the same variable its source build in the image sets)
                + (f"{FA_FORCE_BUILD} " if dist == "flash-attn" else "")
                + f"{self.rebuild(dist)}`"
                + (f", or {self.profile_fix()}" if self.near else ""),
            )

    def abi(self) -> None:
        needing = [(ext, set(ext.elf.undefined)) for ext in self.t.extensions if ext.elf.undefined]
        if not needing:
            return
        exports = torch_exports(Path(self.t.site))
        torch = self.t.torch_version
        for ext, syms in needing:
            missing = sorted(syms - exports)
            if not missing:
                continue
            dist = self.owner(ext)
            beside = f"the torch beside it ({torch})" if torch else "no torch (none is installed)"
            self.add(
                "abi",
                f"{ext.path} ({dist}) was built against another torch",
                f"it needs {len(missing)} C++ symbol(s) of torch that {beside} does not export, "
                f"e.g. {missing[0][:200]}; importing it fails with 'undefined symbol'",
                f"reinstall {dist} built against torch {torch}: `{self.rebuild(dist)}`, or install the "
                "torch it was built for",
            )

    def libc(self) -> None:
        host = self.host
        for ext in self.t.extensions:
            for prefix, have, what in (
                ("GLIBCXX_", host.glibcxx, f"libstdc++ ({host.libstdcxx})"),
                ("GLIBC_", host.glibc, "the host's glibc"),
            ):
                need = _newest(ext.elf.versions, prefix)
                if not need or not have or version_key(need) <= version_key(have):
                    continue
                dist = self.owner(ext)
                image = f"`{self.near.commands()[1].split('  #')[0]}`" if self.near else "`envbuild detect`"
                if prefix == "GLIBC_":  # (no package manager replaces the host's C library)
                    fix = (
                        f"build {dist} on this host (its glibc {have}), or take the image route, which "
                        f"brings its own glibc: {image}"
                    )
                else:
                    gcc = _GCC_OF_GLIBCXX.get(need)
                    fix = (
                        "install a newer libstdc++ into the prefix ("
                        + (
                            f"`conda install -c conda-forge 'libstdcxx-ng>={gcc}'` in a conda prefix, GCC "
                            f"{gcc}'s"
                            if gcc
                            else f"one whose libstdc++ provides GLIBCXX_{need}"
                        )
                        + f"), or build {dist} on this host; the image route brings its own: {image}"
                    )
                self.add(
                    "libc",
                    f"{ext.path} ({dist}) needs {prefix}{need}",
                    f"{what} provides up to {prefix}{have}; importing it fails with "
                    f"'version `{prefix}{need}' not found'",
                    fix,
                )

    def requires(self) -> None:
        python = self.t.python or "3.12"
        machine = "x86_64" if self.t.image else os.uname().machine  # (an image is read as linux/amd64)
        for dist in self.t.dists.values():
            for r in requirements(list(dist.requires), python, machine=machine):
                name: str = r["name"]
                spec: str = r["spec"]
                text: str = r["text"]
                have = self.version(name)
                if have is None:
                    self.add(
                        "requires",
                        f"{dist.name} {dist.version} requires {text}, which is not installed",
                        f"its METADATA says Requires-Dist: {text}; importing {dist.name} can fail",
                        self._pip(name, spec),
                    )
                elif spec and not satisfies(have, spec):
                    self.add(
                        "requires",
                        f"{name} {have} is outside {dist.name} {dist.version}'s range {spec}{self.layer(name)}",
                        f"{dist.name}'s METADATA says Requires-Dist: {text}",
                        self._pip(name, spec),
                    )

    def rebuild(self, dist: str) -> str:
        """pip building `dist` from source against what is installed: no build isolation (the
        build sees this torch), no cache (pip would reuse the wheel it built before, against the
        old torch or for the old archs), no dependencies (--force-reinstall would reinstall torch
        too, perhaps another build of it)."""
        return (
            f"{self.python} -m pip install --no-build-isolation --no-cache-dir --no-deps --no-binary "
            f"{shlex.quote(dist)} --force-reinstall {shlex.quote(dist)}=={self.version(dist) or ''}"
        )

    def _pip(self, name: str, spec: str) -> str:
        pin = self.pin(name)
        if pin and (not spec or satisfies(pin, spec)):
            want, why = f"{name}=={pin}", f" (profile {self.near.profile}'s pin)" if self.near else ""
        else:
            want, why = f"{name}{spec}", ""
        return f"`{self.python} -m pip install {shlex.quote(want)}`{why}"

    def verl(self) -> None:
        v = self.version("verl")
        rec = self.m.verl.get(base_version(v or ""))
        if not v or not rec:
            return
        for name, key in (("vllm", "vllm"), ("torch", "torch")):
            have, spec = self.version(name), rec.get(key)
            if not have or not isinstance(spec, str) or satisfies(base_version(have), spec):
                continue
            why = rec.get(f"{key}_why") or f"verl {v}'s range for {name}, which its METADATA does not declare"
            self.add(
                "verl",
                f"{name} {have} is outside verl {v}'s range {spec}{self.layer(name)}",
                why,
                self._pip(name, spec),
            )

    def vllm_card(self) -> None:
        v, card = self.version("vllm"), self.card
        if not v or card is None or not card.compute_capability:
            return
        rec = self.m.vllm.get(base_version(v)) or {}
        floor: object = rec.get("min_compute_capability") or self.m.sections.get("vllm", {}).get(
            "min_compute_capability"
        )
        if not floor or cc_tuple(card.compute_capability) >= cc_tuple(str(floor)):
            return
        self.add(
            "vllm-card",
            f"vLLM {v} cannot run on the {card.name} (CC {card.compute_capability})",
            f"vLLM {v} needs compute capability >= {floor}",
            self.profile_fix("use the rollout this card runs, as in"),
        )

    def patches(self) -> None:
        if self.near is None or "verl" not in self.t.dists:
            return
        env, site = self.near.env, Path(self.t.site)
        missing = []
        for patch in env.patches:
            for f in patch.files:
                data = _read_text(site / f)
                if data is None:
                    self.notes.append(f"verl's {f} is not there: patch {patch.name} not checked")
                    continue
                if any(r["find"] in data and r["with"] not in data for r in patch.replace):
                    missing.append(patch)
                    break
        for patch in missing:
            self.add(
                "patch",
                f"verl {self.version('verl')} is not patched for the {env.gpu.name} ({patch.name})",
                patch.why,
                f"apply profile {self.near.profile}'s patches: `envbuild render {self.near.profile}"
                f"{self.near.command_flags} -o out && {self.python} "
                f"out/{self.near.profile}/apply_patches.py --site {shlex.quote(self.t.site_shown)}`",
            )

    def twice(self) -> None:
        for name, versions in self.t.duplicates:
            self.add(
                "twice",
                f"{name} is installed {len(versions)} times ({', '.join(versions)})",
                "two dist-info folders: an install over another that did not remove the first; "
                "which files are which is undefined",
                f"`{self.python} -m pip install --force-reinstall --no-deps {shlex.quote(name)}=="
                f"{self.pin(name) or versions[-1]}`",
            )

    def owner(self, ext: Extension) -> str:
        """The distribution whose RECORD lists the extension's file (read only when needed)."""
        if self._owners is None:
            self._owners = {}
            site = Path(self.t.site)
            wanted = {e.path for e in self.t.extensions}
            for dist in self.t.dists.values():
                text = _read_text(site / dist.folder / "RECORD", MAX_RECORD) or ""
                for line in text.splitlines():
                    path = line.split(",", 1)[0]
                    if path in wanted:
                        self._owners.setdefault(path, dist.name)
        return self._owners.get(ext.path) or ext.path.split("/")[0]


def _read_text(path: Path, limit: int = 8 << 20) -> str | None:
    from envbuilder.limits import NotRegularFile, TooLarge, read_limited

    try:
        return read_limited(path, limit, follow=False).decode("utf-8", "replace")
    except (OSError, NotRegularFile, TooLarge):
        return None


CHECKS: tuple[Callable[[_Checks], None], ...] = (
    _Checks.driver,
    _Checks.torch_arch,
    _Checks.attention,
    _Checks.gpu_code,
    _Checks.abi,
    _Checks.libc,
    _Checks.requires,
    _Checks.verl,
    _Checks.vllm_card,
    _Checks.patches,
    _Checks.twice,
)


def diagnose(
    m: Matrix, t: Target, machine: Machine, profile: str | None = None, host: Host | None = None
) -> Diagnosis:
    """Judge the environment `t` on `machine` (module docstring)."""
    card = weakest(machine.gpus) if machine.gpus else None
    host = host or read_host(Path(t.where))
    installed = _installed_env(t)
    near = nearest_profile(m, t, machine, card, profile, installed)
    checks = _Checks(m, t, machine, card, host, near)
    for check in CHECKS:
        check(checks)
    notes = list(checks.notes)
    if card is None:
        notes.append(f"no GPU found ({machine.problem or 'none listed'}): the card's checks were skipped")
    return Diagnosis(t, machine, card, host, tuple(checks.found), near, tuple(dict.fromkeys(notes)))


def _installed_env(t: Target) -> ResolvedEnv | None:
    """What envbuild installed here (PREFIX/envbuild/envbuild.json), when it can be read."""
    if not t.installed_json:
        return None
    from envbuilder.errors import UserError

    try:
        return env_from_json(t.installed_json, origin=str(Path(t.where) / "envbuild" / "envbuild.json"))
    except (UserError, ValueError):
        return None


# -- the report --------------------------------------------------------------------------------


def report_json(d: Diagnosis) -> dict[str, object]:
    t, near = d.target, d.nearest
    return {
        "clean": not d.findings,
        "environment": {
            "image": t.image,
            "prefix": t.where,
            "site_packages": t.site_shown,
            "python": t.python,
            "distributions": len(t.dists),
            "torch": t.torch_version,
            "torch_cuda": t.torch_cuda,
            "extensions": [
                {"path": e.path, "gpu_code": [c.label() for c in e.elf.gpu]}
                for e in t.extensions
                if e.elf.has_fatbin
            ],
        },
        "machine": {
            "driver": d.machine.driver,
            "gpu": d.card.name if d.card else None,
            "compute_capability": d.card.compute_capability if d.card else None,
            "glibc": d.host.glibc,
            "libstdcxx": d.host.libstdcxx,
            "glibcxx": d.host.glibcxx,
        },
        "findings": [f.to_dict() for f in d.findings],
        "nearest": None
        if near is None
        else {
            "profile": near.profile,
            "flags": list(near.flags),
            "commands": near.commands(),
            "changes": [{"package": p, "installed": have, "profile": want} for p, have, want in near.changes],
            "same": list(near.same),
        },
        "notes": list(d.notes),
    }


def report_lines(d: Diagnosis) -> list[str]:
    t, near = d.target, d.nearest
    torch = f"torch {t.torch_version} (CUDA {t.torch_cuda or 'none'})" if t.torch_version else "no torch"
    gpu_ext = sum(1 for e in t.extensions if e.elf.has_fatbin)
    out = [
        f"environment: {t.where} (Python {t.python}, {len(t.dists)} distributions, {torch}, "
        f"{len(t.extensions)} compiled extensions, {gpu_ext} with GPU code)",
        "machine: "
        + (f"{d.card.name} (CC {d.card.compute_capability})" if d.card else "no GPU")
        + f", driver {d.machine.driver or 'unknown'}; glibc {d.host.glibc or '?'}, "
        f"libstdc++ GLIBCXX_{d.host.glibcxx or '?'}",
    ]
    for f in d.findings:
        out += f.lines()
    out += [f"note: {n}" for n in d.notes]
    if near is not None:
        changed = ", ".join(f"{p} {have or '(missing)'} -> {want}" for p, have, want in near.changes[:8])
        more = f" and {len(near.changes) - 8} more" if len(near.changes) > 8 else ""
        out.append(
            f"nearest profile: {near.profile}{near.command_flags} ("
            + (f"changes {len(near.changes)}: {changed}{more}; " if near.changes else "no package changes; ")
            + f"{len(near.same)} of its {len(near.same) + len(near.changes)} pinned packages installed as it pins them)"
        )
        out += [f"  {c}" for c in near.commands()]
    out.append(
        "CLEAN: nothing wrong found"
        if not d.findings
        else f"{len(d.findings)} finding(s): see the fixes above"
    )
    return [printable(line) for line in out]
