#!/usr/bin/env python3
"""Build the wheel bundle that bench/gpu_ppo.py `setup` installs on the GPU machine.

  python bench/gpu_bundle.py --profile h200 --out .gpu [--cache DIR ...] [--part-mib 46] [--glibc N]

Reads lockfiles/PROFILE/pylock.toml (one [[packages]] table per pin: name, version, an optional
marker, `wheels` and/or `sdist`, each file with its url and sha256), leaves out what EXCLUDE names,
and picks each remaining pin's best wheel for CPython 3.12 on manylinux_2_N x86_64 (N from
lock.json's target, in pip's own tag order). The wheel comes from OUT/dl, a --cache folder (same
file name, the lock's sha256) or `pip download` (hash-checked against the lock); sdist-only pins
are built with `pip wheel`; TRIM's wheels are trimmed. Writes OUT/wheels/, OUT/SHA256SUMS,
OUT/MANIFEST.txt, OUT/parts/part-NN (a tar of wheels/ + SHA256SUMS, split) and OUT/PARTS.SHA256,
and prints the device calls. Rerunning skips every wheel already in place with the right hash
(OUT/derived.json records the trimmed and built ones). Exit 2: bad input; exit 1: a download,
hash or build failed. Standard library only (Python >= 3.11); pip runs as a subprocess.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import hashlib
import json
import operator
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import benchsafe  # noqa: E402  (bench/benchsafe.py: the folders it may delete, stdlib only)

SCRIPT = "gpu_bundle.py"  # (its folders' marker names it)
TARGET = {  # marker values on the GPU machine (shared/gpu/carry.md): CPython 3.12.3, Linux x86_64
    "python_full_version": "3.12.3",
    "python_version": "3.12",
    "sys_platform": "linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
OPS = {op: getattr(operator, f) for op, f in zip("== != >= <= > <".split(), "eq ne ge le gt lt".split())}

# (pattern on the normalized name, why it stays out). The device supplies torch 2.11.0+cu130,
# triton 3.6.0, the nvidia-*-cu13 libraries, numpy 2.5.2 and numba 0.68.0 (carry.md); the rest is
# pinned but not imported on the Qwen2 training path, or is only a dependency of what is left out.
EXCLUDE = (
    ("torch", "the device has torch 2.11.0+cu130"),
    ("triton", "the device has triton 3.6.0"),
    ("nvidia-*", "CUDA libraries (device has nvidia-*-cu13); nvcc/nvvm/cudnn-frontend/cutlass-dsl unused"),
    ("cuda-toolkit", "torch's CUDA meta-package; the device has its libraries"),
    ("numpy", "the device has numpy 2.5.2"),
    ("numba", "the device has numba 0.68.0"),
    ("llvmlite", "numba's; the device has it"),
    ("sympy", "torch's own dependency; the device has it"),
    ("mpmath", "sympy's; the device has it"),
    ("networkx", "torch's own dependency; the device has it"),
    ("flashinfer-*", "not imported on the Qwen2 path (flashinfer-cubin: 427 MB of cubins)"),
    ("cuda-tile", "flashinfer-python's"),
    ("tilelang", "not imported on the Qwen2 path"),
    ("ml-dtypes", "tilelang's"),
    ("z3-solver", "tilelang's"),
    ("cuda-python", "nvidia-cutlass-dsl-libs-*'s"),
    ("cuda-core", "cuda-python's"),
    ("tokenspeed-triton", "tokenspeed-mla's triton fork; not imported on the Qwen2 path"),
    ("opencv-python-headless", "vllm imports cv2 only behind a PlaceholderModule guard (video); 55 MB"),
    ("wandb", "verl imports it only for trainer.logger=wandb (the render logs to console); 19 MB"),
    ("tensorboard", "verl imports it only for the tensorboard logger"),
    ("tensorboard-data-server", "tensorboard's"),
    ("torchvision", "multimodal processors only; would have to match the device's torch build"),
    ("torchaudio", "audio models only"),
)
KEEP = {"nvidia-ml-py": "pynvml (vllm, ray): pure Python, not a CUDA library"}
# wheel name -> path prefixes dropped from the wheel (and from its RECORD), why
TRIM = {
    "ray": (
        ("ray/jars/",),
        "32 MB of Java; ray/dashboard/client/build/ is kept: the dashboard "
        "head raises FrontendNotFoundError without it",
    ),
}


def fail(msg, code=2):
    print(f"gpu_bundle: {msg}", file=sys.stderr)
    sys.exit(code)


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def marker_ok(marker):
    """The lock's markers: `var op 'value'` clauses joined by `and`/`or`, no parentheses."""
    if "(" in marker:
        fail(f"marker too complex for this script: {marker!r}")
    for alternative in marker.split(" or "):
        for clause in alternative.split(" and "):
            m = re.fullmatch(r"\s*(\w+)\s*(==|!=|>=|<=|<|>)\s*'([^']*)'\s*", clause)
            if not m or m[1] not in TARGET:
                fail(f"cannot evaluate marker clause {clause!r}")
            left, right = TARGET[m[1]], m[3]
            if m[1].startswith("python"):
                left, right = (tuple(int(x) for x in v.split(".")) for v in (left, right))
            if not OPS[m[2]](left, right):
                break
        else:
            return True
    return False


def tag_ranks(glibc):
    """packaging.tags' order for cp312 on manylinux_2_{glibc} x86_64 (lower is better), platforms."""
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    plats = []
    for minor in range(glibc, 4, -1):
        plats += [f"manylinux_2_{minor}_x86_64"] + ([f"{legacy[minor]}_x86_64"] if minor in legacy else [])
    pys = ["py312", "py3"] + [f"py3{m}" for m in range(11, -1, -1)]
    tags = [("cp312", abi, p) for abi in ("cp312", "abi3", "none") for p in plats]
    tags += [(f"cp3{m}", "abi3", p) for m in range(11, 1, -1) for p in plats]
    tags += [(i, "none", p) for i in pys for p in plats]
    tags += [("cp312", "none", "any")] + [(i, "none", "any") for i in pys]
    return {t: n for n, t in enumerate(tags)}, plats


def wheel_rank(filename, ranks):
    py, abi, plat = filename.removesuffix(".whl").split("-")[-3:]
    found = [ranks.get((i, a, p)) for i in py.split(".") for a in abi.split(".") for p in plat.split(".")]
    return min((r for r in found if r is not None), default=None)


def lock_target(lock):
    """N of the lock's manylinux_2_N target (lock.json); refuses a lock not made for cp312 x86_64."""
    try:
        target = json.loads(lock.with_name("lock.json").read_text())["target"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"cannot read the target from {lock.with_name('lock.json')}: {e!r}")
    m = re.fullmatch(r"x86_64-manylinux_2_(\d+)", str(target.get("python_platform")))
    if target.get("python") != "3.12" or not m:
        where = f"{target.get('python')} on {target.get('python_platform')}"
        fail(f"{lock.parent.name} targets Python {where}; the device runs CPython 3.12 on x86_64")
    return int(m[1])


def load_plan(lock, ranks):
    """[(pkg, wheel file entry or None for an sdist build)], [(pkg, why left out)]."""
    try:
        data = tomllib.loads(lock.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        fail(f"cannot read {lock}: {e}")
    if data.get("lock-version") != "1.0" or not isinstance(data.get("packages"), list):
        fail(f"{lock}: not a pylock.toml (lock-version 1.0 with [[packages]])")
    plan, out = [], []
    for p in data["packages"]:
        if not isinstance(p, dict) or not {"name", "version"} <= p.keys():
            fail(f"{lock}: package entry without name/version: {p!r}"[:300])
        name = norm(p["name"])
        if "marker" in p and not marker_ok(p["marker"]):
            out.append((p, f"marker {p['marker']!r} is false on the device"))
            continue
        why = [r for pat, r in EXCLUDE if fnmatch.fnmatchcase(name, pat)]
        if why and name not in KEEP:
            out.append((p, why[0]))
            continue
        files = []
        for w in p.get("wheels", []):
            if not w.get("url", "").endswith(".whl") or not w.get("hashes", {}).get("sha256"):
                fail(f"{lock}: {name}: wheel entry without url or sha256")
            w["filename"] = w["url"].rsplit("/", 1)[1]
            if (rank := wheel_rank(w["filename"], ranks)) is not None:
                files.append((rank, w))
        if files:
            plan.append((p, min(files, key=lambda f: f[0])[1]))
        elif p.get("sdist", {}).get("hashes", {}).get("sha256"):
            plan.append((p, None))
        else:
            fail(f"{name} {p['version']}: no wheel for cp312 manylinux x86_64 and no sdist in the lock")
    return plan, out


def pip(args, env=None):
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "pip", *args], env=env).returncode


def fetch(todo, dl, caches, platforms, req):
    """Put each wheel's lock-hashed original in dl/: from dl/ itself, a --cache folder or pip."""
    missing = []
    for p, w in todo:
        for folder in [dl, *caches]:
            src = folder / w["filename"]
            if src.is_file() and sha256(src) == w["hashes"]["sha256"]:
                if folder != dl:
                    shutil.copy2(src, dl / w["filename"])
                break
        else:
            missing.append(f"{p['name']}=={p['version']} --hash=sha256:{w['hashes']['sha256']}\n")
    if missing:
        print(f"pip download: {len(missing)} wheels")
        req.write_text("".join(missing))
        plats = [a for plat in platforms for a in ("--platform", plat)]
        opts = "--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --progress-bar off"
        if pip(["download", *opts.split(), *plats, "-d", str(dl), "-r", str(req)]):
            fail("pip download failed (rerun resumes)", 1)
    for _, w in todo:
        if sha256(dl / w["filename"]) != w["hashes"]["sha256"]:
            fail(f"{dl / w['filename']}: its sha256 is not the lock's", 1)


def build_sdist(p, build, ranks):
    """pip wheel from the lock's hash-checked sdist, no wheel cache, timestamps fixed."""
    sd = p["sdist"]
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    (build / "req.txt").write_text(f"{p['name']}=={p['version']} --hash=sha256:{sd['hashes']['sha256']}\n")
    stamp = sd.get("upload-time")
    epoch = int(stamp.timestamp()) if isinstance(stamp, dt.datetime) else 315532800
    args = ["wheel", "--no-deps", "--no-cache-dir", "--no-binary", p["name"], "-w", str(build)]
    if pip([*args, "-r", str(build / "req.txt")], env={"SOURCE_DATE_EPOCH": str(epoch)}):
        fail(f"pip wheel {p['name']} failed", 1)
    built = list(build.glob("*.whl"))
    if len(built) != 1 or wheel_rank(built[0].name, ranks) is None:
        fail(f"pip wheel {p['name']}: expected one compatible wheel, got {built}", 1)
    return built[0]


def trim(src, dst, prefixes):
    """Copy the wheel without the entries under `prefixes`, their RECORD lines dropped too."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zo:
        if not any(i.filename.startswith(prefixes) for i in zi.infolist()):
            fail(f"{src.name}: nothing under {prefixes} to trim (TRIM is out of date)", 1)
        for info in zi.infolist():
            if info.filename.startswith(prefixes):
                continue
            data = zi.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = [ln for ln in data.decode().splitlines() if not ln.startswith(prefixes)]
                data = ("\n".join(lines) + "\n").encode()
            zo.writestr(info, data, compress_type=info.compress_type)


def write_parts(out, final, part_bytes):
    """tar of wheels/ + SHA256SUMS (sorted, no owners or times), split; PARTS.SHA256."""
    parts_dir = out / "parts"
    for old in parts_dir.glob("part-*"):
        old.unlink()
    tar_path = out / "build" / "bundle.tar"

    def plain(info):
        info.uid = info.gid = info.mtime = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(out / "wheels", "wheels", recursive=False, filter=plain)
        for n in sorted(final):
            tar.add(out / "wheels" / n, f"wheels/{n}", filter=plain)
        tar.add(out / "SHA256SUMS", "SHA256SUMS", filter=plain)
    count = -(-tar_path.stat().st_size // part_bytes)
    parts = [parts_dir / f"part-{i:0{max(2, len(str(count - 1)))}d}" for i in range(count)]
    with open(tar_path, "rb") as fh:
        for part in parts:
            part.write_bytes(fh.read(part_bytes))
    tar_path.unlink()
    (out / "PARTS.SHA256").write_text("".join(f"{sha256(x)}  parts/{x.name}\n" for x in parts))
    return parts


def write_manifest(out, args, lock, plan, left_out, final, parts):
    pins = {norm(p["name"]): p["version"] for p, _ in plan}
    key = ", ".join(
        f"{n} {pins[n]}" for n in ("verl", "vllm", "ray", "transformers", "tokenizers") if n in pins
    )
    sizes = {n: (out / "wheels" / n).stat().st_size for n in final}
    lines = [
        f"# envbuild GPU bundle for the {args.profile} profile ({key})",
        f"# made {dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ} by bench/gpu_bundle.py from "
        f"lockfiles/{args.profile}/pylock.toml (sha256 {sha256(lock)})",
        f"# cp312 manylinux_2_{args.glibc} x86_64; every downloaded wheel's sha256 is the lock's. The device "
        "supplies torch, triton, nvidia-*-cu13, numpy, numba, torch's own deps and pip",
        f"# parts: tar of wheels/ + SHA256SUMS split into {args.part_mib} MiB parts; "
        "reassembled by bench/gpu_ppo.py setup",
        "",
        "## changed or built here",
    ]
    for p, w in plan:
        if w is None:
            lines.append(f"  {p['name']} {p['version']}: sdist only, built with pip wheel --no-deps")
        elif norm(p["name"]) in TRIM:
            prefixes, why = TRIM[norm(p["name"])]
            lines.append(f"  {w['filename']}: {', '.join(prefixes)} removed, RECORD rewritten ({why})")
    lines += ["", "## left out (pin: why)"]
    lines += [
        f"  {p['name']} {p['version']}: {why}" for p, why in sorted(left_out, key=lambda x: x[0]["name"])
    ]
    used = {pat for pat, _ in EXCLUDE for p, _ in left_out if fnmatch.fnmatchcase(norm(p["name"]), pat)}
    if unused := [pat for pat, _ in EXCLUDE if pat not in used]:
        lines.append(f"  (rules that matched no pin: {', '.join(unused)})")
    lines += ["", "## wheels (bytes  file)", *(f"{sizes[n]:>10}  {n}" for n in sorted(final))]
    lines += [f"{len(final)} wheels, {sum(sizes.values())} bytes", "", "## parts"]
    lines += [f"{x.stat().st_size:>10}  {x.name}" for x in parts]
    (out / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    return sum(sizes.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--cache", action="append", type=Path, default=[], help="wheels to reuse if lock-hashed")
    ap.add_argument("--part-mib", type=int, default=46)
    ap.add_argument("--glibc", type=int, help="manylinux_2_N cap (default: lock.json's target)")
    args = ap.parse_args()
    lock = ROOT / "lockfiles" / args.profile / "pylock.toml"
    if not re.fullmatch(r"[\w.-]+", args.profile) or not lock.is_file():
        fail(f"no lock for profile {args.profile!r} ({lock})")
    if not 1 <= args.part_mib <= 60:
        fail("--part-mib must be 1..60 (a device call carries at most 64 MiB)")
    if bad := [c for c in args.cache if not c.is_dir()] + ([args.out] if args.out.is_file() else []):
        fail(f"not a folder: {', '.join(map(str, bad))}")
    glibc = lock_target(lock)
    args.glibc = glibc if args.glibc is None else args.glibc
    if not 5 <= args.glibc <= 99:
        fail(f"--glibc {args.glibc}: expected the N of manylinux_2_N (5..99)")
    ranks, platforms = tag_ranks(args.glibc)
    plan, left_out = load_plan(lock, ranks)
    out, dl, wheels_dir = args.out, args.out / "dl", args.out / "wheels"
    try:  # it deletes in each of these (stray wheels, old parts): only folders it made
        for d in (out, wheels_dir, dl, out / "parts", out / "build"):
            benchsafe.claim(str(d), SCRIPT)
    except benchsafe.Refused as e:
        fail(str(e))
    state_path = out / "derived.json"  # trimmed/built wheels: {file: {"source": sha256, "sha256": sha256}}
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):
        state = {}

    def target(p, w):  # (file name, the sha256 it must have), or (None, None): not derived yet
        if w is not None and norm(p["name"]) not in TRIM:
            return w["filename"], w["hashes"]["sha256"]
        source = (w or p["sdist"])["hashes"]["sha256"]
        name = next((k for k, v in state.items() if v["source"] == source), None)
        return (name, state[name]["sha256"]) if name else (None, None)

    def done(p, w):
        name, want = target(p, w)
        return bool(name) and (wheels_dir / name).is_file() and sha256(wheels_dir / name) == want

    todo = [(p, w) for p, w in plan if not done(p, w)]
    print(f"{len(plan)} wheels planned ({len(left_out)} pins left out), {len(plan) - len(todo)} in place")
    fetch([(p, w) for p, w in todo if w], dl, args.cache, platforms, out / "build" / "download.txt")
    for p, w in todo:
        if w is None:
            src = build_sdist(p, out / "build" / norm(p["name"]), ranks)
            source, name = p["sdist"]["hashes"]["sha256"], src.name
            state = {k: v for k, v in state.items() if v["source"] != source}
            shutil.move(src, wheels_dir / name)
        elif norm(p["name"]) in TRIM:
            source, name = w["hashes"]["sha256"], w["filename"]
            trim(dl / name, wheels_dir / name, TRIM[norm(p["name"])][0])
        else:
            shutil.copy2(dl / w["filename"], wheels_dir / w["filename"])
            continue
        state[name] = {"source": source, "sha256": sha256(wheels_dir / name)}
        state_path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")

    final = dict(target(p, w) for p, w in plan)
    for stray in sorted(set(os.listdir(wheels_dir)) - set(final) - {benchsafe.MARK}):
        print(f"removing {wheels_dir / stray} (not in the plan)")
        benchsafe.remove_in(str(wheels_dir), stray)
    if not all(done(p, w) for p, w in plan):
        fail("a wheel is missing or changed after the build", 1)
    (out / "SHA256SUMS").write_text("".join(f"{final[n]}  {n}\n" for n in sorted(final)))
    parts = write_parts(out, final, args.part_mib << 20)
    total = write_manifest(out, args, lock, plan, left_out, final, parts)

    print(f"{len(final)} wheels, {total / 1e6:.0f} MB -> {len(parts)} parts in {out / 'parts'}")
    rel = os.path.relpath((out / "parts").resolve(), ROOT)
    if rel.startswith(".."):
        print(f"note: {out} is outside the repository; the device calls below cannot carry its parts")
    print("device calls, back to back in one lease (each carries its own part):")
    for i, x in enumerate(parts):
        cmd = f"mkdir -p /root/stash && cp {rel}/{x.name} /root/stash/"
        if i == len(parts) - 1:
            cmd += " && python3 bench/gpu_ppo.py setup --parts /root/stash --site /root/stash/site"
        print(f"  carry=['{rel}/{x.name}']  command: {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
