"""`envbuild verify PROFILE --platform linux/arm64 --rootfs DIR`: the aarch64 wheels of a Grace
profile's compiled core, installed within its lock's pins and imported on an aarch64 CPU that
QEMU emulates (Debian's qemu-user-static through binfmt_misc), from an x86_64 machine.

DIR is a Debian arm64 root with python3 (`debootstrap --arch=arm64`). uv, on this machine,
resolves SUBSET within the lock's pins for DIR's Python and glibc and installs the aarch64
wheels into a folder inside DIR; DIR's own python3 then imports each module under `chroot`
(root only) and computes a little with it. What this proves and what not: the locked versions
publish aarch64 wheels that load and run on aarch64 (for DIR's Python, which may not be the
profile's: Debian bookworm's is 3.11, the Grace profiles' 3.12); not torch, vLLM or a GPU (their
CUDA wheels are gigabytes and need a driver: the co-resolution tier and the host cover them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envbuilder.model.resolved import ResolvedEnv

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from envbuilder.secret import SecretUrl
from envbuilder.errors import ActionError, UserError
from envbuilder.text import redact

# the training path's compiled dependencies that are light enough to fetch and emulate:
# distribution -> the module imported (each a C or Rust extension with its own aarch64 wheel)
SUBSET = {
    "numpy": "numpy",
    "pyarrow": "pyarrow",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "pydantic-core": "pydantic_core",
    "orjson": "orjson",
    "regex": "regex",
    "msgpack": "msgpack",
    "psutil": "psutil",
    "pyyaml": "yaml",
    "xxhash": "xxhash",
}
EM_AARCH64 = 0xB7  # ELF e_machine of AArch64
BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")

# run by DIR's python3 under QEMU: the machine it sees, then each module imported and used
CHECK = """\
import importlib, json, platform, sys
sys.path.insert(0, sys.argv[1])
out = {"machine": platform.machine(), "python": platform.python_version(), "modules": {}}
for name in sys.argv[2:]:
    m = importlib.import_module(name)
    out["modules"][name] = m.__file__
import numpy, pyarrow, tokenizers, orjson, regex, msgpack, xxhash, yaml
a = numpy.arange(6.0).reshape(2, 3)
out["numpy"] = (a @ a.T).tolist()
out["pyarrow"] = pyarrow.array([1, 2, 3]).sum().as_py()
out["orjson"] = orjson.loads(orjson.dumps({"a": 1}))["a"]
out["regex"] = regex.sub(r"\\p{L}+", "w", "ab 12")
out["msgpack"] = msgpack.unpackb(msgpack.packb([1, 2]))
out["xxhash"] = xxhash.xxh64(b"envbuild").hexdigest()
out["yaml"] = yaml.safe_load("a: 1")["a"]
out["tokenizers"] = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0}, unk_token="a")).get_vocab_size()
print(json.dumps(out))
"""


def elf_machine(path: Path) -> int | None:
    """The e_machine of an ELF file, or None: a regular file only (a FIFO would wait for a
    writer for good), not through a link (in_root resolves those inside the root)."""
    from envbuilder.limits import open_regular

    try:
        with open_regular(path, follow=False) as f:
            head = f.read(20)
    except (OSError, ValueError):  # (NotRegularFile is a ValueError)
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def in_root(rootfs: Path, path: str) -> Path | None:
    """`path` as chroot into `rootfs` finds it: every link on the way read inside the root (an
    absolute target from its top, `..` never above it), never followed out; None after 40 links."""
    todo = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            done = done[:-1]
            continue
        here = rootfs.joinpath(*done, part)  # (done holds no link: lstat looks at `part` only)
        if not here.is_symlink():
            done.append(part)
            continue
        links += 1
        if links > 40:
            return None
        link = os.readlink(here)
        done = [] if link.startswith("/") else done
        todo = [p for p in link.split("/") if p not in ("", ".")] + todo
    return rootfs.joinpath(*done)


def check_inputs(env: ResolvedEnv, platform: str, rootfs: Path) -> None:
    """Exit 2 unless `env` is an aarch64 profile asked for linux/arm64, and `rootfs` holds an
    aarch64 python3; exit 1 when this machine cannot emulate it (no binfmt handler, not root)."""
    from envbuilder.render.pixi import OCI_PLATFORMS

    if platform != "linux/arm64" or OCI_PLATFORMS[env.gpu.machine] != platform:
        raise UserError(
            f"--platform {platform}: the emulated verify is for linux/arm64, the Grace profiles "
            f"(gh200, gb200); {env.name} is {OCI_PLATFORMS[env.gpu.machine]}, which plain "
            f"`envbuild verify {env.name}` checks natively."
        )
    python = rootfs / "usr" / "bin" / "python3"
    target = in_root(rootfs, "usr/bin/python3")
    if target is None or elf_machine(target) != EM_AARCH64:
        raise UserError(
            f"--rootfs {rootfs}: no aarch64 python3 at {python}. Make one with `debootstrap "
            "--arch=arm64 --variant=minbase --include=python3 bookworm DIR` (QEMU runs its "
            "second stage), or `--foreign` and `dpkg-deb -x` of its downloaded .debs."
        )
    if not BINFMT.exists() or "enabled" not in BINFMT.read_text():
        raise ActionError(
            "No enabled qemu-aarch64 binfmt handler on this machine, so aarch64 programs do not "
            "run here. Install Debian's qemu-user-static and binfmt-support (apt-get install), "
            "with binfmt_misc mounted (mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc)."
        )
    if os.geteuid() != 0:
        raise ActionError("The emulated verify runs DIR's python3 with chroot, which needs root.")


def verify_emulated(
    env: ResolvedEnv,
    rootfs: Path,
    say: Callable[[str], None] = print,
    index_url: SecretUrl | None = None,
) -> dict[str, object]:
    """Install SUBSET within the profile's lock for `rootfs`'s Python and glibc and import it
    there under QEMU; the report ({ok, machine, python, packages, modules, seconds, ...}), or
    ActionError naming the step that failed."""
    from envbuilder.lock.locate import find_lock
    from envbuilder.lock.pins import parse
    from envbuilder.tools.run import run
    from envbuilder.tools.uv import index_env, uv_bin, uv_env

    rootfs = rootfs.resolve()
    lock = find_lock(env.name)
    pins = parse((lock / "requirements.lock").read_text(encoding="utf-8"), with_hashes=False)
    missing = [d for d in SUBSET if d not in pins]
    if missing:
        raise UserError(f"The lock {lock} pins no {', '.join(missing)}: re-lock {env.name}.")
    probe: subprocess.CompletedProcess[str] = run(
        [
            "chroot",
            str(rootfs),
            "/usr/bin/python3",
            "-c",
            "import platform; print(platform.python_version(), platform.libc_ver()[1], platform.machine())",
        ],
        timeout=300,
    )
    words = probe.stdout.split()
    if probe.returncode != 0 or len(words) != 3 or words[2] != "aarch64":
        raise ActionError(
            f"{rootfs}'s python3 did not run under QEMU: {(probe.stderr or probe.stdout)[-500:]}"
        )
    python, glibc = ".".join(words[0].split(".")[:2]), words[1]
    say(f"{env.name}: Python {words[0]} on aarch64 (glibc {glibc}) in {rootfs}, under QEMU")
    report: dict[str, object] = {
        "profile": env.name,
        "machine": "aarch64",
        "python": words[0],
        "lock": str(lock),
    }
    site = Path(tempfile.mkdtemp(prefix="envbuild-verify-", dir=rootfs / "tmp"))
    try:
        with tempfile.TemporaryDirectory(prefix="envbuild-verify-") as tmp:
            constraints = Path(tmp) / "constraints.txt"
            constraints.write_text("".join(f"{n}=={p.version}\n" for n, p in sorted(pins.items())))
            t0 = time.monotonic()
            installed: subprocess.CompletedProcess[str] = run(
                [
                    uv_bin("verify"),
                    "pip",
                    "install",
                    "--no-config",
                    "--target",
                    str(site),
                    "--python-version",
                    python,
                    "--python-platform",
                    f"aarch64-manylinux_{glibc.replace('.', '_')}",
                    "--only-binary",
                    ":all:",
                    "-c",
                    str(constraints),
                    *SUBSET,
                ],
                env={
                    **uv_env(),
                    **index_env(index_url or SecretUrl(env.indexes.pypi)),
                },  # (no password in argv)
                timeout=1800,
            )
            if installed.returncode != 0:
                raise ActionError(
                    redact(f"uv could not install the aarch64 wheels:\n{installed.stderr[-2000:]}")
                )
        report["install_s"] = round(time.monotonic() - t0, 1)
        # every compiled file installed is an aarch64 one (uv picked the target's wheels)
        machines = {elf_machine(f) for f in site.rglob("*.so*") if f.is_file()} - {None}
        report["extensions_aarch64"] = all_aarch64 = machines == {EM_AARCH64}
        report["packages"] = packages = sorted(p.name.split("-")[0].lower() for p in site.glob("*.dist-info"))
        t0 = time.monotonic()
        inner = "/" + str(site.relative_to(rootfs))
        ran: subprocess.CompletedProcess[str] = run(
            ["chroot", str(rootfs), "/usr/bin/python3", "-c", CHECK, inner, *SUBSET.values()], timeout=1800
        )
        report["import_s"] = round(time.monotonic() - t0, 1)
        if ran.returncode != 0:
            raise ActionError(f"Importing the aarch64 wheels under QEMU failed:\n{ran.stderr[-2000:]}")
        import json

        printed: object = json.loads(ran.stdout.strip().splitlines()[-1])
        result: dict[str, object] = printed if isinstance(printed, dict) else {}
        modules = result.get("modules")
        if not isinstance(modules, dict):
            raise ActionError(f"The check under QEMU printed no report of its imports: {ran.stdout[-500:]}")
        report.update(result)
        imported = len(modules)
        report["ok"] = result["machine"] == "aarch64" and imported == len(SUBSET) and all_aarch64
        say(
            f"{env.name}: {len(packages)} aarch64 distributions installed in {report['install_s']} s "
            f"(uv), {imported} modules imported and used under QEMU in {report['import_s']} s"
        )
        return report
    finally:
        shutil.rmtree(site, ignore_errors=True)
