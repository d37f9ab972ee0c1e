"""`envbuild refresh`, the pure part: the matrix against what PyPI's JSON API says of torch,
vllm, verl, flash-attn, transformers and ray, as drift records; the report text and the overlay.

Nothing here touches the network (cli_refresh.py fetches). In: the merged Matrix, each
package's project JSON (`/pypi/<name>/json`: releases, per-file `yanked` and `requires_python`,
wheel file names) and the metadata of the releases that matter (`/pypi/<name>/<version>/json`:
`info.requires_python`, `info.requires_dist`). Out: records of four kinds, each naming the
matrix key it is about:
  new           final releases newer than the newest the matrix records or pins
  prerelease    pre-releases newer than that, whose final release is not out
  changed       a recorded fact PyPI's metadata now says otherwise (vllm's torch pin, verl's vllm
                range, torch's Python wheels and PyPI CUDA, a `requires` range)
  contradicted  the matrix names a release PyPI doesn't have or has yanked, a Python choice a
                requires_python refuses, or a pin a co-installed release's requires_dist refuses
  unrecorded    two co-installed releases need disjoint ranges of one dependency and
                dependencies.yaml (`requires`) doesn't record it, so the resolver can't refuse it

Requirement strings are PyPI's (PEP 508), read with `packaging`; their version ranges are judged
by model/versions.py, the engine that judges the matrix's (one engine, held to pip's rules by
tests/test_versions.py); the matrix's own versions and
ranges keep envbuild's grammar (versions.py), as the resolver reads them.
"""

from __future__ import annotations

import copy
import json
import os
import re
from typing import TYPE_CHECKING, Callable, Mapping, TypedDict, cast

from envbuilder.model import requires
from envbuilder.record import Record

from envbuilder.render import quoting
from envbuilder.model.versions import VERSION_PATTERN, ranges_overlap, same_range, satisfies, version_key

if TYPE_CHECKING:
    from typing_extensions import NotRequired

    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import ResolvedEnv
    from envbuilder.upstream.pypi import Project, PyPIFile, ReleaseMeta

# what a combination installs, by canonical name: (version, extras, where the matrix pins it, the
# name as pinned)
_Install = tuple[str, tuple[str, ...], str, str]
# (package, version) -> its release's metadata (pypi.PyPIJson.metadata), None where not read
_Meta = Callable[[str, str], "ReleaseMeta | None"]
# a matrix section or record as refresh reads it: schema-checked, its keys text
_Rec = Mapping[str, object]


class Requirement(TypedDict):
    """One requirement of a release's requires_dist, as model.requires.requirements reads it."""

    name: str  # canonical
    extras: tuple[str, ...]
    spec: str  # its specifier ("" for any version)
    text: str  # the line without its marker


class ReleaseState(TypedDict):
    """One release's files on PyPI (release_state)."""

    files: int
    yanked: bool
    some_yanked: bool
    reason: str | None
    requires_python: str | None
    pythons: list[str]


class Fix(TypedDict):
    path: list[str]  # the matrix key: section, record key, field ...
    value: object  # the value PyPI's metadata gives it (text, or a list of text)


class DriftRecord(TypedDict):
    """One drift record of the report (its keys in this order in the JSON)."""

    kind: str
    package: str
    version: str | None
    fact: str
    matrix: object
    pypi: object
    where: list[str]
    message: str
    fix: NotRequired[Fix]
    versions: NotRequired[list[str]]
    details: NotRequired[dict[str, dict[str, object]]]
    combinations: NotRequired[list[str]]


class PackageSummary(TypedDict):
    latest: str | None
    newest_in_matrix: str | None
    releases: int
    metadata_read: int


class Comparison(TypedDict):
    """compare's answer: per package, the drift records and the notes."""

    packages: dict[str, PackageSummary]
    drift: list[DriftRecord]
    notes: list[str]


class Report(TypedDict):
    """The refresh report (commands.refresh_report): the index (without its credentials), the
    comparison, and the overlay file where one was written."""

    index: str
    packages: dict[str, PackageSummary]
    drift: list[DriftRecord]
    notes: list[str]
    overlay: NotRequired[str]


def requirements(requires_dist: list[str], python: str, extras: tuple[str, ...] = ()) -> list[Requirement]:
    """model.requires.requirements (its dicts: name, extras, spec, text), typed."""
    return cast("list[Requirement]", requires.requirements(requires_dist, python, extras))


def _rec(value: object) -> _Rec:
    """A matrix section or record (a mapping with text keys, as the schema checked it); {} for
    an absent one."""
    return cast(_Rec, value) if isinstance(value, dict) else {}


def _records(value: object) -> dict[str, _Rec]:
    """A section of records (torch, vllm, verl, profiles, ...): key -> record."""
    return {k: _rec(v) for k, v in _rec(value).items()}


def _str(rec: _Rec, key: str) -> str:
    """A field the schema holds to text (a version, a range)."""
    value = rec[key]
    return value if isinstance(value, str) else str(value)


def _strs(value: object) -> list[str]:
    """A list of text the schema checked (a record's `python`), [] for none."""
    items = cast("list[object]", value) if isinstance(value, list) else []
    return [v if isinstance(v, str) else str(v) for v in items]


PACKAGES = ("torch", "vllm", "verl", "flash-attn", "transformers", "ray")
# the packages whose releases the matrix records one by one (section path); the others it pins
CATALOG = {
    "torch": ("torch",),
    "vllm": ("vllm",),
    "verl": ("verl",),
    "flash-attn": ("flash_attn", "versions"),
}
KINDS = ("new", "prerelease", "changed", "contradicted", "unrecorded")


def project_url(package: str, version: str | None = None) -> str:
    """The page a derived fact cites as its source."""
    return f"https://pypi.org/project/{package}/" + (f"{version}/" if version else "")


# -- versions and requirements ----------------------------------------------------------------


def _key(version: str) -> tuple[object, ...] | None:
    try:
        return version_key(version)
    except ValueError:
        return None  # a legacy version PyPI still lists (envbuild never records one)


def _is_pre(version: str) -> bool:
    m = re.fullmatch(VERSION_PATTERN, version)
    return bool(m and (m.group(2) or m.group(5) is not None))


def _release_part(version: str) -> str:
    m = re.fullmatch(VERSION_PATTERN, version)
    return m.group(1) if m else version


def canon(name: str) -> str:  # (PEP 503: text.canonical_name)
    """PEP 503's normalized name, without extras: `Ray[default]` -> `ray`."""
    from envbuilder.text import canonical_name

    return canonical_name(name)


def extras_of(spec: str) -> tuple[str, ...]:
    m = re.search(r"\[([^\]]*)\]", spec)
    return tuple(sorted(e.strip() for e in m.group(1).split(",") if e.strip())) if m else ()


def plain_range(spec: str) -> str | None:
    """A PEP 440 specifier in the grammar versions.ranges_overlap reads (`!=` dropped: it
    excludes single versions; `~=` and `==X.*` as the interval they mean); None if it can't."""
    out = []
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.fullmatch(r"(~=|===|==|!=|>=|<=|>|<)\s*(\S+)", clause)
        if not m:
            return None
        op, v = m.groups()
        if op == "!=":
            continue
        if op == "~=" or v.endswith(".*"):
            parts = v[:-2].split(".") if v.endswith(".*") else v.split(".")[:-1]
            if not parts or not all(p.isdigit() for p in parts):
                return None
            upper = parts[:-1] + [str(int(parts[-1]) + 1)]
            out += [f">={v[:-2] if v.endswith('.*') else v}", f"<{'.'.join(upper)}"]
            continue
        out.append(f"{'==' if op == '===' else op}{v}")
    try:
        ranges_overlap(",".join(out), "")
    except ValueError:
        return None
    return ",".join(out)


def disjoint(a: str, b: str) -> bool:
    pa, pb = plain_range(a), plain_range(b)
    return pa is not None and pb is not None and not ranges_overlap(pa, pb)


def pythons_allowed(requires_python: str | None, universe: list[str]) -> list[str]:
    return [p for p in universe if not requires_python or satisfies(p, requires_python)]


def default_cuda(reqs: list[Requirement]) -> str | None:
    """torch's PyPI build: the CUDA runtime its Linux wheel pins (nvidia-cuda-runtime-cu12==12.4.127
    -> cu124; cuda-toolkit[...]==13.0.2 -> cu130)."""
    for r in reqs:
        if re.fullmatch(r"nvidia-cuda-runtime(-cu\d+)?|cuda-toolkit", r["name"]):
            m = re.fullmatch(r"===?(\d+)\.(\d+)(\.[\w.]+)?", r["spec"])
            if m:
                return f"cu{m.group(1)}{m.group(2)}"
    return None


# -- the project JSON --------------------------------------------------------------------------


def release_state(files: list[PyPIFile]) -> ReleaseState:
    """One release's files: yanked (all files), reason, requires_python, and the CPython
    versions of its Linux x86_64 wheels (none for abi3/pure wheels: Python is requires_python's)."""
    yanked = [f for f in files if f.get("yanked")]
    rp = next((f["requires_python"] for f in files if f.get("requires_python")), None)
    tags = set()
    for f in files:
        name = f.get("filename") or ""
        parts = name[:-4].split("-") if name.endswith(".whl") else []
        if len(parts) >= 5 and "x86_64" in parts[-1] and "linux" in parts[-1]:
            m = re.fullmatch(r"cp(\d)(\d+)", parts[-3])
            if m and parts[-2] != "abi3":
                tags.add(f"{m.group(1)}.{m.group(2)}")
    return {
        "files": len(files),
        "yanked": bool(files) and len(yanked) == len(files),
        "some_yanked": bool(yanked) and len(yanked) < len(files),
        "reason": next((f.get("yanked_reason") for f in yanked if f.get("yanked_reason")), None),
        "requires_python": rp,
        "pythons": sorted(tags, key=lambda p: tuple(map(int, p.split(".")))),
    }


def releases(project: Project) -> dict[str, ReleaseState]:
    return {v: release_state(files or []) for v, files in (project.get("releases") or {}).items()}


# -- what the matrix names -----------------------------------------------------------------------


def named_versions(sections: _Rec) -> dict[str, dict[str, list[str]]]:
    """package -> version -> the matrix keys that name it (torch.2.6.0, profiles.t4.torch,
    verl.0.4.1.pins.transformers, requires.ray[default].2.49.2)."""
    out: dict[str, dict[str, list[str]]] = {p: {} for p in PACKAGES}

    def add(package: str, version: object, where: str) -> None:
        name = canon(package)
        if name in out and version is not None:
            out[name].setdefault(str(version), []).append(where)

    def pins(mapping: object, where: str) -> None:
        for pkg, v in _rec(mapping).items():
            add(pkg, v, f"{where}.pins.{pkg}")

    for v in _rec(sections.get("torch")):
        add("torch", v, f"torch.{v}")
    for v, r in _records(sections.get("vllm")).items():
        add("vllm", v, f"vllm.{v}")
        add("torch", r["torch"], f"vllm.{v}.torch")
        pins(r.get("pins"), f"vllm.{v}")
    for v, r in _records(sections.get("verl")).items():
        add("verl", v, f"verl.{v}")
        pins(r.get("pins"), f"verl.{v}")
    for v in _rec(_rec(sections.get("flash_attn")).get("versions")):
        add("flash-attn", v, f"flash_attn.versions.{v}")
    for name, p in _records(sections.get("profiles")).items():
        for field in ("torch", "verl", "vllm"):
            add(field, p.get(field), f"profiles.{name}.{field}")
        for field in ("components", "optional_components"):
            for comp, cv in _rec(p.get(field)).items():
                add(comp, cv, f"profiles.{name}.{field}.{comp}")
        pins(p.get("pins"), f"profiles.{name}")
    for pkg, by_version in _rec(sections.get("requires")).items():
        for v in _rec(by_version):
            add(pkg, v, f"requires.{pkg}.{v}")
    return out


def newest_named(package: str, sections: _Rec, named: dict[str, list[str]]) -> str | None:
    """The newest release the matrix records (catalog packages) or pins (the others)."""
    if package in CATALOG:
        node = sections
        for part in CATALOG[package]:
            node = _rec(node.get(part))
        candidates = list(node)
    else:
        candidates = list(named)
    keyed = [(k, v) for v in candidates if (k := _key(v)) is not None]
    return max(keyed)[1] if keyed else None


def new_versions(newest: str | None, rels: Mapping[str, ReleaseState]) -> tuple[list[str], list[str]]:
    """(final releases newer than `newest`, pre-releases newer than it whose final is not out),
    oldest first; yanked ones left out."""
    floor = _key(newest) if newest else None
    finals: list[str] = []
    pres: list[str] = []
    for v, st in rels.items():
        k = _key(v)
        if k is None or st["yanked"] or not st["files"] or (floor is not None and k <= floor):
            continue
        (pres if _is_pre(v) else finals).append(v)
    out_finals = {_release_part(v) for v in finals} | {
        _release_part(v) for v, st in rels.items() if not _is_pre(v) and _key(v)
    }
    pres = [v for v in pres if _release_part(v) not in out_finals]
    return sorted(finals, key=lambda v: _key(v) or ()), sorted(pres, key=lambda v: _key(v) or ())


def wanted_metadata(m: Matrix, projects: Mapping[str, Project], newest: int = 3) -> dict[str, list[str]]:
    """The releases whose metadata the comparison reads: every release the matrix names that
    PyPI has, and the `newest` newest final releases past the matrix's (catalog packages)."""
    named = named_versions(m.sections)
    out = {}
    for pkg in PACKAGES:
        rels = releases(projects.get(pkg) or {})
        want = [v for v in named[pkg] if v in rels and rels[v]["files"]]
        if pkg in CATALOG and newest > 0:
            finals, _ = new_versions(newest_named(pkg, m.sections, named[pkg]), rels)
            want += finals[-newest:]
        out[pkg] = sorted(set(want), key=lambda v: _key(v) or ())
    return out


# -- the comparison ------------------------------------------------------------------------------


class _Drift:
    def __init__(self, m: Matrix, where: Callable[[str, str], str] | None):
        self.m = m
        self.records: list[DriftRecord] = []
        self.notes: list[str] = []
        self._where = where or (lambda section, key: "matrices")

    def where(self, path: str) -> str:
        section, _, rest = path.partition(".")
        key = rest
        if section in ("torch", "vllm", "verl", "profiles"):
            key = _record_key(section, rest, self.m.sections)
        elif section == "requires":
            key = next((p for p in _rec(self.m.sections.get("requires")) if rest.startswith(p + ".")), rest)
        return f"{self._where(section, key)}: {path}"

    def add(
        self,
        kind: str,
        package: str,
        version: str | None,
        fact: str,
        message: str,
        where: list[str],
        matrix: object = None,
        pypi: object = None,
        fix: Fix | None = None,
        *,
        versions: list[str] | None = None,
        details: dict[str, dict[str, object]] | None = None,
        combinations: list[str] | None = None,
    ) -> None:
        rec: DriftRecord = {
            "kind": kind,
            "package": package,
            "version": version,
            "fact": fact,
            "matrix": matrix,
            "pypi": pypi,
            "where": [self.where(w) for w in where],
            "message": message,
        }
        if fix:
            rec["fix"] = fix
        if versions is not None:
            rec["versions"] = versions
        if details is not None:
            rec["details"] = details
        if combinations is not None:
            rec["combinations"] = combinations
        self.records.append(rec)


def _record_key(section: str, rest: str, sections: _Rec) -> str:
    """The record key a dotted path starts with (versions hold dots: vllm.0.8.5.post1.torch)."""
    keys = sorted(_rec(sections.get(section)), key=len, reverse=True)
    return next((k for k in keys if rest == k or rest.startswith(k + ".")), rest)


def compare(
    m: Matrix,
    projects: Mapping[str, Project],
    metadata: Mapping[str, Mapping[str, ReleaseMeta]],
    where: Callable[[str, str], str] | None = None,
) -> Comparison:
    """The drift between the matrix `m` and PyPI: {"packages": {...}, "drift": [...],
    "notes": [...]}. `metadata[pkg][version]` is {"requires_python", "requires_dist"}, or
    {"error": why} where it could not be read."""
    d = _Drift(m, where)
    sections = m.sections
    named = named_versions(sections)
    rels = {pkg: releases(projects.get(pkg) or {}) for pkg in PACKAGES}
    universe = sorted(
        {
            p
            for sec in ("torch", "vllm")
            for r in _records(sections.get(sec)).values()
            for p in _strs(r.get("python"))
        }
        | {_str(r, "python") for r in _records(sections.get("cuda")).values()},
        key=lambda p: tuple(map(int, p.split("."))),
    )

    def meta(pkg: str, version: str) -> ReleaseMeta | None:
        got = (metadata.get(pkg) or {}).get(version)
        return got if got and "error" not in got else None

    summary: dict[str, PackageSummary] = {}
    for pkg in PACKAGES:
        project = projects.get(pkg) or {}
        newest = newest_named(pkg, sections, named[pkg])
        summary[pkg] = {
            "latest": (project.get("info") or {}).get("version"),
            "newest_in_matrix": newest,
            "releases": len(rels[pkg]),
            "metadata_read": sum(1 for v in (metadata.get(pkg) or {}) if meta(pkg, v)),
        }
        failed: dict[str, list[str]] = {}
        for version, got in (metadata.get(pkg) or {}).items():
            if got and "error" in got:
                failed.setdefault(got["error"], []).append(version)
        for why, versions in failed.items():
            d.notes.append(
                f"{pkg} {', '.join(sorted(versions, key=lambda v: _key(v) or ()))}: "
                f"requires_dist not read, its checks skipped: {why}"
            )
        _existence(d, pkg, named[pkg], rels[pkg])
        _new(d, pkg, newest, rels[pkg], meta, universe)
    via_wheel = sum(
        1
        for by_v in metadata.values()
        for got in by_v.values()
        if got and "METADATA" in str(got.get("from", ""))
    )
    if via_wheel:
        d.notes.append(
            f"this index serves no per-release JSON (/pypi/<name>/<version>/json "
            f"answered 404): the metadata of {via_wheel} releases was read from their "
            "wheels' METADATA instead"
        )
    _torch_records(d, sections, rels["torch"], meta)
    _vllm_records(d, sections, rels["vllm"], meta)
    _verl_records(d, sections, meta, universe)
    _requires_records(d, sections, meta, universe)
    _combinations(d, m, rels, meta)
    order = {k: i for i, k in enumerate(KINDS)}
    d.records.sort(
        key=lambda r: (
            order[r["kind"]],
            PACKAGES.index(r["package"]) if r["package"] in PACKAGES else 99,
            _key(r["version"] or "0") or (),
            r["fact"],
        )
    )
    return {"packages": summary, "drift": d.records, "notes": d.notes}


def _existence(d: _Drift, pkg: str, named: dict[str, list[str]], rels: dict[str, ReleaseState]) -> None:
    for version, where in sorted(named.items(), key=lambda kv: _key(kv[0]) or ()):
        st = rels.get(version)
        if st is None:
            d.add(
                "contradicted",
                pkg,
                version,
                "release",
                f"{pkg} {version} is not on PyPI: "
                "no such release (a typo, or a build only another index has).",
                where,
                matrix=version,
                pypi=None,
            )
        elif not st["files"]:
            d.add(
                "contradicted",
                pkg,
                version,
                "release",
                f"{pkg} {version} has no files on PyPI: nothing to install.",
                where,
                matrix=version,
                pypi="no files",
            )
        elif st["yanked"]:
            d.add(
                "contradicted",
                pkg,
                version,
                "yanked",
                f"{pkg} {version} is yanked on PyPI"
                + (f" ({st['reason']})" if st["reason"] else "")
                + ": pip installs it only when "
                "pinned exactly, and its maintainers say not to.",
                where,
                matrix=version,
                pypi=f"yanked: {st['reason'] or 'no reason given'}",
            )
        elif st["some_yanked"]:
            d.notes.append(
                f"{pkg} {version}: some of its files are yanked on PyPI (named by {', '.join(where)})"
            )


def _new(
    d: _Drift, pkg: str, newest: str | None, rels: dict[str, ReleaseState], meta: _Meta, universe: list[str]
) -> None:
    finals, pres = new_versions(newest, rels)
    if finals:
        details: dict[str, dict[str, object]] = {}
        for v in finals:
            info = _release_facts(pkg, v, rels[v], meta(pkg, v), universe)
            if info:
                details[v] = info
        d.add(
            "new",
            pkg,
            finals[-1],
            "releases",
            f"{pkg}: {len(finals)} release"
            f"{'s' if len(finals) > 1 else ''} newer than {newest or 'none'} (the newest the "
            f"matrix {'records' if pkg in CATALOG else 'pins'}).",
            [],
            matrix=newest,
            pypi=finals[-1],
            versions=finals,
            details=details,
        )
    if pres:
        d.add(
            "prerelease",
            pkg,
            pres[-1],
            "pre-releases",
            f"{pkg}: pre-release{'s' if len(pres) > 1 else ''} {', '.join(pres)} (no final release yet).",
            [],
            matrix=newest,
            pypi=pres[-1],
            versions=pres,
        )


def _release_facts(
    pkg: str, version: str, st: ReleaseState, md: ReleaseMeta | None, universe: list[str]
) -> dict[str, object]:
    """What PyPI says of a release the matrix lacks: the facts a record of it would derive."""
    rp = (md or {}).get("requires_python") or st["requires_python"]
    out: dict[str, object] = {}
    if pkg == "torch":
        if st["pythons"]:
            out["python"] = st["pythons"]
        cuda = default_cuda(requirements(md["requires_dist"], universe[-1])) if md else None
        if cuda:
            out["pypi_default"] = cuda
    elif pkg == "vllm" and md:
        pin = _pin(md, "torch", universe)
        if pin:
            out["torch"] = pin
        out["python"] = pythons_allowed(rp, universe)
    elif pkg == "verl" and md:
        rng = _verl_vllm_range(md, universe)
        if rng is not None:
            out["vllm"] = rng
    if md is not None or pkg == "torch":
        out["requires_python"] = rp
    return out if pkg in CATALOG else {}


def _pin(md: ReleaseMeta, name: str, universe: list[str]) -> str | None:
    """The exact version `md` pins `name` to (vllm's torch==2.8.0), on the target platform."""
    for python in reversed(universe):
        for r in requirements(md.get("requires_dist") or [], python):
            m = re.fullmatch(r"===?([\w.]+)", r["spec"])
            if r["name"] == name and m:
                return m.group(1)
    return None


def _verl_vllm_range(md: ReleaseMeta, universe: list[str]) -> str | None:
    for python in reversed(universe):
        for r in requirements(md.get("requires_dist") or [], python, ("vllm",)):
            if r["name"] == "vllm":
                return r["spec"]
    return None


def _torch_records(d: _Drift, sections: _Rec, rels: dict[str, ReleaseState], meta: _Meta) -> None:
    for v, rec in _records(sections.get("torch")).items():
        st, md = rels.get(v), meta("torch", v)
        if not st or not st["files"]:
            continue
        python, pypi_default = _strs(rec["python"]), _str(rec, "pypi_default")
        if st["pythons"] and st["pythons"] != python:
            d.add(
                "changed",
                "torch",
                v,
                "python",
                f"torch {v}: the matrix says wheels for Python "
                f"{', '.join(python)}; PyPI's Linux x86_64 wheels are for "
                f"{', '.join(st['pythons'])}.",
                [f"torch.{v}.python"],
                matrix=python,
                pypi=st["pythons"],
                fix={"path": ["torch", v, "python"], "value": st["pythons"]},
            )
        cuda = default_cuda(requirements(md["requires_dist"] or [], python[-1])) if md else None
        if cuda and cuda != pypi_default:
            d.add(
                "changed",
                "torch",
                v,
                "pypi_default",
                f"torch {v}: the matrix says PyPI's build "
                f"is {pypi_default}; its Linux wheel pins the CUDA {cuda[2:-1]}."
                f"{cuda[-1]} runtime ({cuda}).",
                [f"torch.{v}.pypi_default"],
                matrix=pypi_default,
                pypi=cuda,
                fix={"path": ["torch", v, "pypi_default"], "value": cuda},
            )


def _vllm_records(d: _Drift, sections: _Rec, rels: dict[str, ReleaseState], meta: _Meta) -> None:
    for v, rec in _records(sections.get("vllm")).items():
        md = meta("vllm", v)
        if md is None:
            continue
        python = _strs(rec["python"])
        pin = _pin(md, "torch", python)
        if pin != rec["torch"]:
            d.add(
                "changed",
                "vllm",
                v,
                "torch pin",
                f"vllm {v}: the matrix says it pins "
                f"torch=={rec['torch']}; its requires_dist says "
                + (f"torch=={pin}." if pin else "no exact torch pin."),
                [f"vllm.{v}.torch"],
                matrix=rec["torch"],
                pypi=pin,
                fix={"path": ["vllm", v, "torch"], "value": pin} if pin else None,
            )
        st = rels.get(v)
        rp = md.get("requires_python") or (st["requires_python"] if st else None)
        bad = [p for p in python if rp and not satisfies(p, rp)]
        if bad:
            keep = [p for p in python if p not in bad]
            d.add(
                "contradicted",
                "vllm",
                v,
                "python",
                f"vllm {v}: the matrix lists Python "
                f"{', '.join(bad)}, which its requires_python {rp!r} refuses.",
                [f"vllm.{v}.python"],
                matrix=python,
                pypi=rp,
                fix={"path": ["vllm", v, "python"], "value": keep} if keep else None,
            )


def _verl_records(d: _Drift, sections: _Rec, meta: _Meta, universe: list[str]) -> None:
    for v, rec in _records(sections.get("verl")).items():
        md = meta("verl", v)
        if md is None:
            continue
        rng, vllm = _verl_vllm_range(md, universe), _str(rec, "vllm")
        if rng is None:
            d.add(
                "changed",
                "verl",
                v,
                "vllm range",
                f"verl {v}: the matrix says it accepts vllm "
                f"{vllm}; its requires_dist (extra 'vllm') names no vllm.",
                [f"verl.{v}.vllm"],
                matrix=vllm,
                pypi=None,
            )
        elif not same_range(rng, vllm):
            fix = plain_range(rng)
            d.add(
                "changed",
                "verl",
                v,
                "vllm range",
                f"verl {v}: the matrix says vllm {vllm}; its requires_dist (extra 'vllm') says vllm{rng}.",
                [f"verl.{v}.vllm"],
                matrix=vllm,
                pypi=rng,
                fix={"path": ["verl", v, "vllm"], "value": fix} if fix and "!=" not in rng else None,
            )


def _requires_records(d: _Drift, sections: _Rec, meta: _Meta, universe: list[str]) -> None:
    for spec, by_version in _rec(sections.get("requires")).items():
        pkg, extras = canon(spec), extras_of(spec)
        if pkg not in PACKAGES:
            continue
        for v, rec in _records(by_version).items():
            md = meta(pkg, v)
            if md is None:
                continue
            found: dict[str, list[str]] = {}
            for python in universe:  # a range under a Python marker counts once
                for r in requirements(md.get("requires_dist") or [], python, extras):
                    if r["spec"] not in found.setdefault(r["name"], []):
                        found[r["name"]].append(r["spec"])
            for dep, rng in _needs(rec).items():
                now = [s for s in found.get(canon(dep), []) if s]
                if any(same_range(s, rng) for s in now):
                    continue
                pypi = ",".join(now) or None
                fix = plain_range(pypi) if pypi and len(now) == 1 else None
                d.add(
                    "changed",
                    pkg,
                    v,
                    f"requires {dep}",
                    f"{spec} {v}: the matrix says it "
                    f"needs {dep}{rng}; its requires_dist says "
                    + (f"{dep}{pypi}." if pypi else f"nothing of {dep}."),
                    [f"requires.{spec}.{v}.needs.{dep}"],
                    matrix=rng,
                    pypi=pypi,
                    fix={"path": ["requires", spec, v, "needs", dep], "value": fix} if fix else None,
                )


# -- what is installed together ------------------------------------------------------------------


class _Combo(Record):
    label: str
    python: str
    installs: dict[str, _Install]
    pair: bool = False  # a verl release with a vLLM release (no Python of a profile's)


class _Found(TypedDict):
    """A drift record of the combinations, before the list of those it was found in."""

    kind: str
    package: str
    version: str
    fact: str
    matrix: str | None
    pypi: str
    where: list[str]
    labels: list[str]
    message: str


def _combinations(d: _Drift, m: Matrix, rels: dict[str, dict[str, ReleaseState]], meta: _Meta) -> None:
    """Each profile as the resolver resolves it, and each verl release with each vLLM release
    its range admits: every pin against the requires_dist of the releases installed with it,
    the profile's Python against their requires_python, and shared dependencies."""
    from envbuilder.errors import EnvbuildError
    from envbuilder.model.resolve import resolve

    sections = m.sections
    combos: list[_Combo] = []
    installs: dict[str, _Install]
    for name in _rec(sections.get("profiles")):
        try:
            env = resolve(m, name)
        except EnvbuildError as e:
            d.notes.append(f"profile {name}: not checked: it does not resolve ({str(e).splitlines()[0]})")
            continue
        installs = {
            "torch": (env.torch.version, (), f"profiles.{name}.torch", "torch"),
            "verl": (env.verl.version, (), f"profiles.{name}.verl", "verl"),
        }
        if env.vllm:
            installs["vllm"] = (env.vllm.version, (), f"profiles.{name}.vllm", "vllm")
        if env.flash_attn:
            installs["flash-attn"] = (
                env.flash_attn.version,
                (),
                f"profiles.{name}.components.flash-attn",
                "flash-attn",
            )
        for pkg, v in env.verl.pins.items():
            installs[canon(pkg)] = (v, extras_of(pkg), _pin_origin(sections, name, env, pkg), pkg)
        combos.append(_Combo(f"profile {name}", env.python, installs))
    pythons = sorted({c.python for c in combos}) or ["3.10"]
    from envbuilder.model.versions import in_range

    for vv, vrec in _records(sections.get("verl")).items():
        for lv, lrec in _records(sections.get("vllm")).items():
            if not in_range(lv, _str(vrec, "vllm")):
                continue
            # verl's pins, then the vLLM release's own (the resolver's order: resolve.py); no
            # torch: the pair's is the vLLM record's pin, which "changed" compares already
            installs = {
                "verl": (vv, (), f"verl.{vv}", "verl"),
                "vllm": (lv, (), f"vllm.{lv}", "vllm"),
            }
            for src, pins in ((f"verl.{vv}", vrec.get("pins")), (f"vllm.{lv}", lrec.get("pins"))):
                for pkg, v in _pins(pins).items():
                    installs[canon(pkg)] = (v, extras_of(pkg), f"{src}.pins.{pkg}", pkg)
            for python in pythons:
                combos.append(_Combo(f"verl {vv} + vllm {lv}", python, installs, pair=True))
    found: dict[tuple[str, ...], _Found] = {}
    for c in combos:
        _check_combo(c, rels, meta, found, sections)
    for rec in found.values():
        labels = rec["labels"]
        shown = ", ".join(labels[:4]) + (f" (+{len(labels) - 4} more)" if len(labels) > 4 else "")
        d.add(
            rec["kind"],
            rec["package"],
            rec["version"],
            rec["fact"],
            rec["message"] + f" In: {shown}.",
            rec["where"],
            matrix=rec["matrix"],
            pypi=rec["pypi"],
            combinations=labels,
        )


def _pins(value: object) -> dict[str, str]:
    """A record's `pins` (package -> version), {} for none."""
    pins = _rec(value)
    return {pkg: _str(pins, pkg) for pkg in pins}


def _needs(rec: _Rec) -> dict[str, str]:
    """A `requires` record's `needs` (dependency -> the range it needs)."""
    needs = _rec(rec["needs"])
    return {dep: _str(needs, dep) for dep in needs}


def _pin_origin(sections: _Rec, profile: str, env: ResolvedEnv, pkg: str) -> str:
    p = _records(sections["profiles"])[profile]
    if pkg in _rec(p.get("pins")):
        return f"profiles.{profile}.pins.{pkg}"
    vllm = env.vllm.version if env.vllm else None
    if vllm and pkg in _rec(_records(sections["vllm"])[vllm].get("pins")):
        return f"vllm.{vllm}.pins.{pkg}"
    if pkg in _rec(_records(sections["verl"])[env.verl.version].get("pins")):
        return f"verl.{env.verl.version}.pins.{pkg}"
    return "flash_attn.runtime_pins"


def _check_combo(
    c: _Combo,
    rels: dict[str, dict[str, ReleaseState]],
    meta: _Meta,
    found: dict[tuple[str, ...], _Found],
    sections: _Rec,
) -> None:
    installs, python = c.installs, c.python
    reqs: dict[str, list[Requirement]] = {}
    key: tuple[str, ...]
    for pkg, (v, extras, origin, _) in installs.items():
        if pkg not in PACKAGES:
            continue
        md = meta(pkg, v)
        st = rels[pkg].get(v)
        rp = (md or {}).get("requires_python") or (st["requires_python"] if st else None)
        if not c.pair and rp and not satisfies(python, rp):
            key = ("python", c.label, pkg, v)
            found.setdefault(
                key,
                {
                    "kind": "contradicted",
                    "package": pkg,
                    "version": v,
                    "fact": "requires_python",
                    "matrix": python,
                    "pypi": rp,
                    "where": [origin],
                    "labels": [],
                    "message": f"{pkg} {v} requires Python {rp}; the profile's Python is {python}.",
                },
            )["labels"].append(c.label)
        if md is not None:
            reqs[pkg] = requirements(md.get("requires_dist") or [], python, extras)
    for pkg, rs in reqs.items():
        v = installs[pkg][0]
        for r in rs:
            target = installs.get(r["name"])
            if target and r["spec"] and not satisfies(target[0], r["spec"]):
                key = ("pin", pkg, v, r["text"], r["name"], target[0])
                rec = found.setdefault(
                    key,
                    {
                        "kind": "contradicted",
                        "package": pkg,
                        "version": v,
                        "fact": "requirement",
                        "matrix": f"{target[3]} {target[0]}",
                        "pypi": r["text"],
                        "where": [target[2]],
                        "labels": [],
                        "message": f"{pkg} {v} requires {r['text']}, but the matrix "
                        f"installs {target[3]} {target[0]} beside it ({target[2]}).",
                    },
                )
                if target[2] not in rec["where"]:
                    rec["where"].append(target[2])
                rec["labels"].append(c.label)
    names = sorted(reqs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for ra in reqs[a]:
                if ra["name"] in installs or not ra["spec"]:
                    continue
                for rb in reqs[b]:
                    if rb["name"] != ra["name"] or not rb["spec"] or not disjoint(ra["spec"], rb["spec"]):
                        continue
                    va, vb = installs[a][0], installs[b][0]
                    if _recorded(sections, a, va, ra["name"]) and _recorded(sections, b, vb, rb["name"]):
                        continue
                    key = ("shared", a, va, b, vb, ra["name"])
                    found.setdefault(
                        key,
                        {
                            "kind": "unrecorded",
                            "package": a,
                            "version": va,
                            "fact": f"shared {ra['name']}",
                            "matrix": None,
                            "pypi": f"{a} {va}: {ra['text']}; {b} {vb}: {rb['text']}",
                            "where": [installs[a][2], installs[b][2]],
                            "labels": [],
                            "message": f"{a} {va} requires {ra['text']} and {b} {vb} requires "
                            f"{rb['text']}: no version satisfies both, and dependencies.yaml "
                            "(`requires`) does not record it, so the resolver lets the pair through.",
                        },
                    )["labels"].append(c.label)


def _recorded(sections: _Rec, pkg: str, version: str, dep: str) -> bool:
    for spec, by_version in _rec(sections.get("requires")).items():
        if canon(spec) == pkg and any(
            canon(x) == dep for x in _rec(_rec(_rec(by_version).get(version)).get("needs"))
        ):
            return True
    return False


# -- the report ----------------------------------------------------------------------------------

HEADINGS = {
    "new": "new releases (newer than the newest the matrix records or pins)",
    "prerelease": "pre-releases (no final release yet)",
    "changed": "changed (the matrix says one thing, PyPI's metadata another)",
    "contradicted": "contradicted (PyPI refutes what the matrix names)",
    "unrecorded": "unrecorded conflicts (the resolver can't refuse them)",
}


def _short(versions: list[str], keep: int = 12) -> str:
    if len(versions) <= keep:
        return ", ".join(versions)
    return f"{', '.join(versions[:3])}, ... ({len(versions) - 6} more), {', '.join(versions[-3:])}"


def text(report: Report) -> str:
    """The human report: one section per kind, one entry per drift, each with its matrix key."""
    drift = report["drift"]
    lines = [f"envbuild refresh: {report['index']} against the matrix"]
    width = max(len(p) for p in report["packages"])
    for pkg, s in report["packages"].items():
        lines.append(
            f"  {pkg:<{width}}  PyPI latest {s['latest']}, matrix newest "
            f"{s['newest_in_matrix'] or '-'}, {s['releases']} releases, metadata of "
            f"{s['metadata_read']} read"
        )
    for kind in KINDS:
        recs = [r for r in drift if r["kind"] == kind]
        if not recs:
            continue
        lines += ["", f"{HEADINGS[kind]}: {len(recs)}"]
        for r in recs:
            if kind in ("new", "prerelease"):
                lines.append(
                    f"  {r['package']}: {_short(r['versions'])}"
                    + ("" if kind == "prerelease" else f"  (matrix newest {r['matrix'] or '-'})")
                )
                for v, facts in (r.get("details") or {}).items():
                    lines.append(f"    {v}: " + "; ".join(f"{k} {_fmt(x)}" for k, x in facts.items()))
                continue
            lines.append(f"  {r['message']}")
            for w in r["where"]:
                lines.append(f"    at {w}")
            if r.get("fix"):
                lines.append(f"    overlay: {'.'.join(r['fix']['path'])} = {_fmt(r['fix']['value'])}")
    if report["notes"]:
        lines += ["", f"not checked / notes: {len(report['notes'])}"]
        lines += [f"  {n}" for n in report["notes"]]
    counts = {k: sum(1 for r in drift if r["kind"] == k) for k in KINDS}
    lines += [
        "",
        "summary: "
        + ", ".join(f"{n} {k}" for k, n in counts.items())
        + (". Nothing drifted." if not drift else "."),
    ]
    if report.get("overlay"):
        lines.append(
            f"overlay: {report['overlay']} (review it; use it with --matrix-dir "
            f"{os.path.dirname(report['overlay']) or '.'})"
        )
    # the index's strings (a yanked_reason, a requires_python) are in these lines: each stays
    # one line, its control characters and escape sequences written as escapes
    return "\n".join(map(quoting.line, lines)) + "\n"


def markdown(report: Report) -> str:
    """The human report as one Markdown code block (the refresh workflow's pull request body):
    nothing an index wrote renders, and no line of it can end the block."""
    return quoting.md_code_block(text(report))


def _fmt(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(str, cast("list[object]", value))) + "]"
    return "none" if value is None else str(value)


# -- the overlay ---------------------------------------------------------------------------------

OVERLAY_HEADER = "# envbuild refresh overlay"


def overlay_text(report: Report, m: Matrix, sources_of: Callable[[str, str], Mapping[str, str]]) -> str:
    """A --matrix-dir file for review: the records a mechanical fix changes, each copied whole
    from the matrix with the fix applied and its sources written out as URLs (an overlay file
    checks `source:` against its own `sources:`); everything else as a commented TODO report,
    with the facts PyPI gives for new releases. Same input, same bytes (no date): a weekly job
    whose upstream did not move proposes nothing.

    What the index says reaches the file two ways only: as typed values of the copied records,
    which yaml.safe_dump writes (a fix whose value the matrix schema refuses is not applied: it
    is listed as a TODO instead), and inside comments, each one line (`_comment_lines`): no
    string of the index can add a key, a record or a line of YAML."""
    import yaml

    units: dict[tuple[str, str], dict[str, object]] = {}
    fixed: list[str] = []
    refused: list[DriftRecord] = []
    for r in report["drift"]:
        fix = r.get("fix")
        if not fix:
            continue
        section, key, *inner = fix["path"]
        unit = units.get((section, key))
        if unit is None:
            unit = _urls(
                _editable(copy.deepcopy(_rec(_rec(m.sections)[section])[key])), sources_of(section, key)
            )
        unit = copy.deepcopy(unit)
        node, holder = unit, None
        for part in inner[:-1]:
            holder, node = node, _editable(node[part])
        node[inner[-1]] = fix["value"]
        cite = project_url(r["package"], r["version"])
        for rec in (node, holder, unit):  # the nearest record that carries a source
            if rec is not None and "source" in rec:
                if cite not in str(rec["source"]):
                    rec["source"] = f"{cite}, {rec['source']}"
                break
        if not _schema_takes(section, key, unit):
            refused.append(r)
            continue
        units[(section, key)] = unit
        fixed.append(f"{'.'.join(fix['path'])}: {_fmt(r['matrix'])} -> {_fmt(fix['value'])}")
    lines = _comment_lines(
        [
            f"{OVERLAY_HEADER[2:]} (envbuild refresh --write-overlay, against {report['index']}).",
            "For review: use it with `--matrix-dir DIR`, then fold what holds into matrices/ by",
            "hand. Live records below are copies of the matrix's with only mechanical fixes from",
            "PyPI's metadata applied; everything else is a TODO in comments.",
        ]
    ) + [""]
    if fixed:
        lines += _comment_lines(["mechanical fixes:", *(f"  {f}" for f in fixed)])
        by_section: dict[str, dict[str, dict[str, object]]] = {}
        for (section, key), unit in sorted(
            units.items(), key=lambda kv: (kv[0][0], _key(kv[0][1]) or (), kv[0][1])
        ):
            by_section.setdefault(section, {})[key] = unit
        lines.append(
            yaml.safe_dump(
                by_section, sort_keys=False, default_flow_style=None, width=100, allow_unicode=True
            ).rstrip()
        )
    else:
        lines += _comment_lines(["mechanical fixes: none"])
    todo = [r for r in report["drift"] if not r.get("fix") or r in refused]
    if todo:
        lines += ["", *_comment_lines(["TODO (needs a person: PyPI's metadata alone does not settle these)"])]
        for r in todo:
            notes = [f"- [{r['kind']}] {r['message']}"]
            notes += [f"    at {w}" for w in r["where"]]
            if r in refused:
                notes.append(
                    f"    PyPI's value {_scalar(r['fix']['value'])} is not one the matrix takes: not applied"
                )
            if r.get("versions"):
                notes.append(f"    versions: {_short(r['versions'], 40)}")
            details = r.get("details") or {}
            if details and r["package"] == "vllm":
                notes.append("    vllm:")
            for v, facts in details.items():
                notes += [f"    {line}" for line in _template(r["package"], v, facts)]
            lines += _comment_lines(notes)
    return "\n".join(lines) + "\n"


def _comment_lines(texts: list[str]) -> list[str]:
    """YAML comment lines: `# ` and the text, one line each whatever it holds (a newline, a
    line separator or an escape sequence in it is written as its escape)."""
    return [f"# {quoting.line(t)}".rstrip() for t in texts]


def _schema_takes(section: str, key: str, unit: object) -> bool:
    """Whether the matrix schema takes `unit` as the record `section.key` (its `source:` URLs
    aside, which matrix._check_sources checks against the file's own `sources:`)."""
    from envbuilder.model import schema as S
    from envbuilder.model.matrix_schema import SECTIONS

    try:
        S.check({key: unit}, SECTIONS[section][0], "refresh.yaml")
    except (S.SchemaError, ValueError, TypeError):
        return False
    return True


def _scalar(value: object) -> str:
    """A value of PyPI's as YAML writes it, on one line: a plain token as itself, anything else
    double-quoted with JSON's escapes (YAML reads them the same)."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", value):
        return value
    return json.dumps(value)


def _template(pkg: str, version: str, facts: Mapping[str, object]) -> list[str]:
    """A commented record for a new release: what PyPI gives, TODO for the rest."""
    src = project_url(pkg, version)
    v = _scalar(version)
    if pkg == "vllm":
        return [
            f"  {v}: {{torch: {_scalar(facts.get('torch', 'TODO'))}, wheel_cuda: TODO, "
            f"python: {json.dumps(facts.get('python', 'TODO'))}, source: {src}}}  "
            "# wheel_cuda: release notes"
        ]
    if pkg == "torch":
        return [
            f"{v}: python {json.dumps(facts.get('python', 'TODO'))}, pypi_default "
            f"{_scalar(facts.get('pypi_default', 'TODO'))}; TODO torchvision, torchaudio, "
            f"builds and their arch lists (pytorch RELEASE.md, build_cuda.sh); source {src}"
        ]
    if pkg == "verl":
        return [
            f"{v}: vllm {_scalar(facts.get('vllm', 'TODO'))}, requires_python "
            f"{_scalar(facts.get('requires_python'))}; TODO rollouts, attention_override, "
            f"patches, precision, pins, training_path (read the release); source {src}"
        ]
    return [
        f"{v}: requires_python {_scalar(facts.get('requires_python'))}; TODO torch range, "
        f"wheel_cuda (the GitHub release's wheels); source {src}"
    ]


def _editable(value: object) -> dict[str, object]:
    """A matrix record (or a mapping inside one: `needs`) to edit in a copy; TypeError for
    anything else (a fix's path names records only)."""
    if not isinstance(value, dict):
        raise TypeError(f"not a record: {value!r}")
    return cast("dict[str, object]", value)


def _urls(node: dict[str, object], sources: Mapping[str, str]) -> dict[str, object]:
    """`source:` tokens that are keys of the origin file's `sources:`, as their URLs."""
    _urls_in(node, sources)
    return node


def _urls_in(node: object, sources: Mapping[str, str]) -> None:
    if isinstance(node, dict):
        for k, v in cast("dict[str, object]", node).items():
            if k in ("source", "min_compute_capability_source", "torch_source") and isinstance(v, str):
                node[k] = ", ".join(sources.get(t.strip(), t.strip()) for t in v.split(","))
            else:
                _urls_in(v, sources)
    elif isinstance(node, list):
        for v in cast("list[object]", node):
            _urls_in(v, sources)
