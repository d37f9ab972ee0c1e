"""The compatibility grid: every GPU of the matrix against the choices render's flags offer (a
torch/CUDA pair, a rollout and vLLM release, a verl release, flash-attn, apex), each cell the
resolver's own verdict for `envbuild check PROFILE FLAGS` on the GPU's profile (`check CARD
FLAGS` for a card without a profile of its own): ✓ it resolves, ~ it resolves once a named
override is added (a fix the refusal names, or a whole stack), ✗ it does not, · no profile's
build runs on that GPU. One resolve per combination, cached, so the grid
cannot disagree with `render`.

The page (`grid.html.j2`) is one self-contained file: inline CSS and script, the verdicts as
JSON, one grid per driver level (the drivers the matrix's CUDA releases name: the resolver's
driver rule compares a driver with those only, so every driver falls in one level)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TypedDict

from envbuilder.errors import UserError
from envbuilder.model import fixes
from envbuilder.model.components import registry as COMPONENTS
from envbuilder.model.matrix import Matrix, cc_tuple
from envbuilder.model.resolve import ResolveError, resolve
from envbuilder.model.matrix import cc_runs
from envbuilder.model.names import match_gpu, nearest_profile, profile_named
from envbuilder.model.resolved import Overrides, ResolvedEnv
from envbuilder.model.versions import version_key
from envbuilder.record import Record
from envbuilder.text import without_credentials

MARK = {"ok": "\u2713", "fix": "~", "no": "\u2717", "none": "\u00b7"}


def NEWEST(xs: Iterable[str]) -> list[str]:
    return sorted(xs, key=version_key, reverse=True)


# the matrix's records are plain data its schema checked: these read a field of one as that type
def _table(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _text(record: Mapping[str, object], key: str) -> str:
    value = record[key]
    return value if isinstance(value, str) else str(value)


def _maybe(record: Mapping[str, object], key: str) -> str | None:
    value = record.get(key)
    return value if isinstance(value, str) else None


class Column(Record):
    group: str
    label: str
    flags: tuple[tuple[str, str], ...]  # render's flags, ("torch", "2.6.0"), in order


class Row(Record):
    gpu: str  # the matrix's key
    name: str
    cc: str
    profile: str | None  # None: no profile's build runs on this GPU
    asked: str = ""  # what each cell resolves (`envbuild check ASKED`): the profile, or the card's key where it takes another card's profile


class _Rule(TypedDict):
    rule: str
    what: str
    why: str
    fix: str


class Rule(_Rule, total=False):
    """A rule of a refusal, as the page shows it (a resolver violation's fields)."""

    hard: bool


Source = tuple[str, str]  # (what, URL or text) of a record involved


class Cell(Record):
    state: str  # ok, fix, no, none
    fix: tuple[tuple[str, str], ...]  # (state fix) the override that makes it resolve
    rules: tuple[Rule, ...]  # the refusal
    summary: str  # what resolves (ok, fix), or the refusal in one line
    command: str  # the `envbuild render` line for the combination (with the fix, if any)
    sources: tuple[Source, ...]  # the records involved
    driver: tuple[str, str, str] | None = None  # (ok, fix) the CUDA it needs, min and compat driver


class Grid(Record):
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]
    cells: dict[
        str | None, dict[tuple[int, int], Cell]
    ]  # driver (None: not given) -> {(row index, column index): Cell}
    resolves: int  # distinct resolver calls made


def columns(m: Matrix) -> list[Column]:
    """The choices, from the matrix: the profile as shipped; each torch/CUDA pair and vLLM
    release that a profile or a stack runs; the HF rollout; every verl release; each optional
    component. Every one is a set of render's own flags."""
    stacks = _table(m.sections.get("stacks"))
    runs = [*m.profiles.values(), *(_table(s) for s in stacks.values())]
    pairs = {(_text(r, "torch"), _text(r, "cuda")) for r in runs if r.get("torch") and r.get("cuda")}
    vllms = {_text(r, "vllm") for r in runs if r.get("vllm") in m.vllm}
    cols = [Column("profile", "as shipped", ())]
    for t, c in sorted(pairs, key=lambda tc: (version_key(tc[0]), version_key(tc[1]))):
        cols.append(Column("torch / CUDA", f"{t} / {c}", (("torch", t), ("cuda", c))))
    cols.append(Column("rollout", "HF", (("rollout", "hf"),)))
    for v in sorted(vllms, key=version_key):
        cols.append(Column("rollout", f"vLLM {v}", (("rollout", "vllm"), ("vllm", v))))
    if m.sections.get("sglang"):  # (the release's own SGLang pin: verl.yaml)
        cols.append(Column("rollout", "SGLang", (("rollout", "sglang"),)))
    for v in sorted(m.verl, key=version_key):
        cols.append(Column("verl", v, (("verl", v),)))
    cols += [Column(c.name, c.name, (("with", c.name),)) for c in COMPONENTS.REGISTRY]
    return cols


def _known(m: Matrix, typed: str) -> str:
    """A --gpu value as `check` takes it (a profile, a GPU key, a card's name in any case: `L40S`,
    `NVIDIA L40S`) as the key rows() looks for: the card's, or the profile's; else as typed."""
    if typed in m.gpus or typed in m.profiles:
        return typed
    named = profile_named(m, typed)
    if named is not None:
        return named.gpu or named.profile
    return match_gpu(m, typed) or typed


def rows(m: Matrix, gpus: tuple[str, ...] = ()) -> list[Row]:
    """One row per profile, in gpus.yaml's order; a card without a profile of its own gets one
    row of the profile whose stack it takes (names.nearest_profile, as `check CARD` resolves
    it, planned for the card), or one row of · where no profile's build runs on it. `gpus`
    narrows to those GPU keys (or profile names)."""
    gpus = tuple(_known(m, typed) for typed in gpus)
    out: list[Row] = []
    for key, g in m.gpus.items():
        names = [n for n, p in m.profiles.items() if p.get("gpu") == key]
        if gpus and key not in gpus and not set(names) & set(gpus):
            continue
        if not names:  # (the card by its own name: its identity and memory, another's stack)
            out.append(
                Row(key, _text(g, "name"), _text(g, "compute_capability"), nearest_profile(m, key), key)
            )
            continue
        for name in names:
            if gpus and key not in gpus and name not in gpus:
                continue
            out.append(Row(key, _text(g, "name"), _text(g, "compute_capability"), name, name))
    if gpus and not out:
        raise UserError(
            f"--gpu {', '.join(gpus)} names no GPU of the matrix: known are "
            f"{', '.join(m.gpus)} (and the profiles {', '.join(m.profiles)})."
        )
    return out


def driver_levels(m: Matrix) -> list[str]:
    """The drivers the resolver's driver rule tells apart: each CUDA release's min_driver and
    compat_driver, and one older than all of them."""
    found = {r[k] for r in m.cuda.values() for k in ("min_driver", "compat_driver")}
    low = min(found, key=version_key)
    older = f"{int(low.split('.')[0]) - 1}.00"
    return [older, *sorted(found, key=version_key)]


def level_of(levels: list[str], driver: str) -> str:
    """The level a driver falls in: the highest at or below it (the lowest when below all)."""
    at = [lv for lv in levels if version_key(lv) <= version_key(driver)]
    return at[-1] if at else levels[0]


class Verdicts:
    """resolve(m, profile, overrides), as `envbuild check` calls it, each combination once:
    the environment, or the refusal (ResolveError, or UserError for a choice the matrix cannot
    make at all)."""

    def __init__(self, m: Matrix):
        self.m = m
        self.seen: dict[tuple[str, Overrides], ResolvedEnv | UserError] = {}

    def __call__(self, profile: str, ov: Overrides) -> ResolvedEnv | UserError:
        key = (profile, ov)
        if key not in self.seen:
            try:
                self.seen[key] = resolve(self.m, profile, ov, check_fixes=False, pick_stack=False)
            except UserError as e:  # (ResolveError is one)
                self.seen[key] = e
        return self.seen[key]


def overrides(flags: Iterable[tuple[str, str]], driver: str | None) -> Overrides:
    return fixes.applied(Overrides(driver=driver), dict(flags))


def _keeps(col: Column, flags: dict[str, str]) -> bool:
    """A fix that leaves the column's own choice as it is (and the machine's driver alone)."""
    mine = dict(col.flags)
    if "driver" in flags or mine.get("with") in (flags.get("without") or "").split(","):
        return False
    return all(f not in mine or flags[f] == mine[f] for f in flags)


def _candidates(m: Matrix, col: Column, refusal: UserError) -> Iterator[dict[str, str]]:
    """The overrides that may lift a refusal: each concrete alternative the resolver's fixes
    name, then each stack (stacks.yaml, newest first), then, for a vLLM release, the torch it
    pins with each CUDA of the same major."""
    if isinstance(refusal, ResolveError):
        for v in refusal.violations:
            for alt in fixes.alternatives(v.fix):
                flags = fixes.concrete(m, alt)
                given = {f: x for f, x in (flags or {}).items() if x is not None}
                if given and len(given) == len(flags or {}):
                    yield given
    for s in NEWEST(_table(m.sections.get("stacks"))):
        yield {"verl": s}
    vllm = dict(col.flags).get("vllm")
    if vllm:
        rec = m.vllm[vllm]
        major, torch = _text(rec, "wheel_cuda").split(".")[0], _text(rec, "torch")
        builds = _table(_table(m.torch.get(torch)).get("builds")).values()
        cudas = [_text(_table(b), "cuda") for b in builds]
        for c in NEWEST({c for c in cudas if c.split(".")[0] == major and c in m.cuda}):
            yield {"torch": torch, "cuda": c}


def cell(m: Matrix, verdicts: Verdicts, row: Row, col: Column, driver: str | None, links: Links) -> Cell:
    if row.profile is None:
        near = [n for n, p in m.profiles.items() if cc_runs(row.cc, [_cc(m, p)])]
        near.sort(key=lambda n: cc_tuple(_cc(m, m.profiles[n])), reverse=True)
        why = f"no profile's build runs on the {row.name} (CC {row.cc}), so render has nothing to resolve for it"
        if near:
            why += f"; the code of profile {near[0]} runs on CC {row.cc} (`envbuild detect` weighs it)"
        rule: Rule = {
            "rule": "profile",
            "what": why,
            "why": "",
            "fix": "add a profile in a --matrix-dir overlay",
        }
        return Cell("none", (), (rule,), why, "", tuple(links(m.gpus[row.gpu], "gpus", row.gpu, row.name)))
    base = overrides(col.flags, driver)
    got = verdicts(row.asked, base)
    if not isinstance(got, UserError):
        return _done("ok", (), (), got, row, col, driver, links)
    rules = _rules(got)
    seen = set()
    for flags in _candidates(m, col, got):
        key = tuple(sorted(flags.items()))
        if key in seen or not _keeps(col, flags):
            continue
        seen.add(key)
        env = verdicts(row.asked, fixes.applied(base, flags))
        if not isinstance(env, UserError):
            return _done("fix", tuple(flags.items()), rules, env, row, col, driver, links)
    first = rules[0]
    summary = f"{first['what']}: {first['why']}" if first["why"] else first["what"]
    return Cell(
        "no", (), rules, summary, command(row.asked, col.flags, (), driver), _sources(m, row, col, links)
    )


def _cc(m: Matrix, profile: Mapping[str, object]) -> str:
    """The compute capability of a profile's GPU."""
    return _text(m.gpus[_text(profile, "gpu")], "compute_capability")


def _rules(refusal: UserError) -> tuple[Rule, ...]:
    if isinstance(refusal, ResolveError):
        return tuple(
            {"rule": v.rule, "what": v.what, "why": v.why, "fix": v.fix, "hard": v.hard}
            for v in refusal.violations
        )
    return ({"rule": "input", "what": str(refusal), "why": "", "fix": "", "hard": True},)


def _done(
    state: str,
    fix: tuple[tuple[str, str], ...],
    rules: tuple[Rule, ...],
    env: ResolvedEnv,
    row: Row,
    col: Column,
    driver: str | None,
    links: Links,
) -> Cell:
    summary = (
        f"CUDA {env.cuda.version}, torch {env.torch.version}+{env.torch.variant}, verl "
        f"{env.verl.version} with the {env.rollout} rollout"
        + (f" (vLLM {env.vllm.version})" if env.vllm else "")
        + f", {env.dtype}"
        + "".join(f", {c.name}" for c in COMPONENTS.REGISTRY if c.part(env) is not None)
    )
    if driver:
        summary += f"; driver {driver}: {env.driver.mode}"
    cmd = command(row.asked, col.flags, fix, driver)
    need = (env.driver.for_cuda, env.driver.min_driver, env.driver.compat_driver)
    return Cell(state, fix, rules, summary, cmd, _env_sources(env, row, links), need)


def command(
    profile: str, flags: Iterable[tuple[str, str]], fix: Iterable[tuple[str, str]], driver: str | None
) -> str:
    from envbuilder.render.quoting import sh

    parts = ["envbuild", "render", sh(profile)]
    for f, v in (*flags, *fix):
        parts += [f"--{f}", sh(v)]
    if driver:
        parts += ["--driver", sh(driver)]
    return " ".join(parts)


def _env_sources(env: ResolvedEnv, row: Row, links: Links) -> tuple[Source, ...]:
    m = links.m
    out = [*links(m.gpus[row.gpu], "gpus", row.gpu, env.gpu.name)]
    out += links(m.cuda[env.cuda.version], "cuda", env.cuda.version, f"CUDA {env.cuda.version}")
    out += links(m.torch[env.torch.version], "torch", env.torch.version, f"torch {env.torch.version}")
    out += links(m.verl[env.verl.version], "verl", env.verl.version, f"verl {env.verl.version}")
    if env.vllm:
        out += links(m.vllm[env.vllm.version], "vllm", env.vllm.version, f"vLLM {env.vllm.version}")
    for c in COMPONENTS.REGISTRY:
        if c.part(env) is not None:
            out += links(c.entry(m), c.section, None, c.name)
    return tuple(dict.fromkeys(out))


def _sources(m: Matrix, row: Row, col: Column, links: Links) -> tuple[Source, ...]:
    p, flags = m.profiles[row.profile or ""], dict(col.flags)
    out = [*links(m.gpus[row.gpu], "gpus", row.gpu, row.name)]
    for sec, what in (("cuda", "CUDA"), ("torch", "torch"), ("verl", "verl"), ("vllm", "vLLM")):
        v = flags.get(sec) or _maybe(p, sec)
        records = _table(m.sections.get(sec))
        if v and v in records:
            out += links(_table(records[v]), sec, v, f"{what} {v}")
    comp = flags.get("with")
    if comp:
        sec = comp.replace("-", "_")
        out += links(_table(m.sections.get(sec)), sec, None, comp)
    return tuple(dict.fromkeys(out))


URL = re.compile(r"https?://[^\s,;()<>\"']+")


class Links:
    """A record's `source:` tokens as (what, URL): a token is a URL or a key of its file's
    `sources:` (read from the file the record came from; the loaded matrix keeps no sources)."""

    FILES = {c.section: "extensions.yaml" for c in COMPONENTS.REGISTRY}  # (the components' sections)

    def __init__(self, m: Matrix):
        self.m = m
        # (section, key) -> the `sources:` of the file it came from; that file's path -> the same
        self.maps: dict[tuple[str, str | None] | str, Mapping[str, object]] = {}

    def _map(self, section: str, key: str | None) -> Mapping[str, object]:
        if (section, key) not in self.maps:
            self.maps[(section, key)] = self._read(section, key)
        return self.maps[(section, key)]

    def _read(self, section: str, key: str | None) -> Mapping[str, object]:
        from pathlib import Path

        from envbuilder.limits import load_yaml, read_text_bounded
        from envbuilder.paths import data_dir

        path = self.m.origin.get((section, key)) if key is not None else None
        if path is None:
            name = self.FILES.get(section)
            path = str(data_dir("matrices") / name) if name else None
        if path is None:
            return {}
        if path not in self.maps:
            try:
                doc: object = load_yaml(read_text_bounded(Path(path), "matrix file"), path)
            except (OSError, UserError):
                doc = None
            found = doc.get("sources") if isinstance(doc, dict) else None
            self.maps[path] = found if isinstance(found, dict) else {}
        return self.maps[path]

    def __call__(
        self, record: Mapping[str, object], section: str, key: str | None, what: str
    ) -> list[Source]:
        tokens = [t.strip() for t in str(record.get("source") or "").split(",") if t.strip()]
        out = []
        for t in tokens:
            text = t if URL.match(t) else self._map(section, key).get(t, t)
            found = URL.search(str(text))
            # (a URL's user:password@ is a secret wherever it comes from: the page names none)
            link = without_credentials(found[0] if found else str(text))
            out.append((f"{what}: {without_credentials(t)}", link))
        return out


def build(m: Matrix, gpus: tuple[str, ...] = (), drivers: tuple[str | None, ...] = (None,)) -> Grid:
    """The grid for each driver in `drivers` (None: no --driver)."""
    verdicts, links = Verdicts(m), Links(m)
    rs, cs = rows(m, gpus), columns(m)
    cells = {
        d: {(i, j): cell(m, verdicts, r, c, d, links) for i, r in enumerate(rs) for j, c in enumerate(cs)}
        for d in drivers
    }
    return Grid(tuple(rs), tuple(cs), cells, len(verdicts.seen))


def text(grid: Grid, driver: str | None) -> str:
    """The grid as terminal tables, one per group of columns (a GPU row each), and a legend."""
    cells = grid.cells[driver]
    head = [f"{r.gpu} ({r.profile})" if r.profile and r.profile != r.gpu else r.gpu for r in grid.rows]
    width = max(len(h) for h in [*head, "GPU (profile)"])
    out = []
    groups = list(dict.fromkeys(c.group for c in grid.columns))
    for g in groups:
        idx = [j for j, c in enumerate(grid.columns) if c.group == g]
        widths = [max(len(grid.columns[j].label), 1) for j in idx]
        out.append(
            f"{g:<{width}}  " + "  ".join(f"{grid.columns[j].label:^{w}}" for j, w in zip(idx, widths))
        )
        for i, label in enumerate(head):
            marks = [f"{MARK[cells[(i, j)].state]:^{w}}" for j, w in zip(idx, widths)]
            out.append(f"{label:<{width}}  " + "  ".join(marks).rstrip())
        out.append("")
    out.append(
        "\u2713 resolves   ~ resolves with a named override   \u2717 refused   \u00b7 no profile for this GPU"
        + (f"   (driver {driver})" if driver else "")
    )
    return "\n".join(out)


def details(grid: Grid, driver: str | None) -> list[str]:
    """Each ~ cell's override and each ✗ cell's first reason, one line each."""
    cells, out = grid.cells[driver], []
    for (i, j), c in sorted(cells.items()):
        if c.state in ("fix", "no"):
            who = grid.rows[i].asked
            col = grid.columns[j]
            what = f"{who} {col.group} {col.label}"
            if c.state == "fix":
                out.append(f"~ {what}: {c.command}")
            else:
                out.append(f"\u2717 {what}: {c.summary}")
    return out


def page_data(grid: Grid, driver: str | None = None) -> dict[str, object]:
    """What the page's script reads: rows, columns and cells (each with the driver facts of the
    environment it resolved to, for the picker)."""
    sources: dict[tuple[str, str], int] = {}  # each (what, URL) once; a cell lists their numbers

    def numbered(pairs: Iterable[Source]) -> list[int]:
        return [sources.setdefault(p, len(sources)) for p in pairs]

    cells = [
        [
            {
                "state": c.state,
                "rules": list(c.rules),
                "summary": c.summary,
                "command": c.command,
                "sources": numbered(c.sources),
                "driver": list(c.driver) if c.driver else None,
            }
            for c in (grid.cells[driver][(i, j)] for j in range(len(grid.columns)))
        ]
        for i in range(len(grid.rows))
    ]
    return {
        "rows": [r._asdict() for r in grid.rows],
        "columns": [{"group": c.group, "label": c.label} for c in grid.columns],
        "marks": MARK,
        "cells": cells,
        "sources": [list(p) for p in sources],
    }


def html(m: Matrix, gpus: tuple[str, ...] = (), grid: Grid | None = None, driver: str | None = None) -> str:
    """The self-contained page of the grid without a driver (the page's picker applies one;
    `driver` is filled in there)."""
    import jinja2

    from envbuilder import __version__
    from envbuilder.paths import data_dir

    grid = grid or build(m, gpus)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    groups: dict[str, int] = {}
    for c in grid.columns:
        groups[c.group] = groups.get(c.group, 0) + 1
    return env.get_template("grid.html.j2").render(
        grid=grid,
        data=page_data(grid),
        marks=MARK,
        version=__version__,
        levels=driver_levels(m),
        driver=driver or "",
        groups=list(groups.items()),
        gpus=list(dict.fromkeys((r.gpu, r.name) for r in grid.rows)),
    )
