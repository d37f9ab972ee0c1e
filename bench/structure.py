"""The package's structural facts, read from its source (no import): the packages are ranked
(RANKS, the one place the layering is declared) and each imports only packages ranked below it
(an import inside a function or under TYPE_CHECKING counts the same), no circles between modules,
no module imports or reaches through an attribute (`matrix._load`) for another module's private
names, no module of the command-line layer is longer than about 150 lines, and records
are of one style (envbuilder/record.Record: no NamedTuple, and a dataclass only for a mutable working
object, which says so in a `# not a record: why` comment on its decorator or class line), and
no function is above McCabe complexity 30 (radon's rank D) unless a `# complexity: why` comment
right above it says why it stays one piece.

    python bench/structure.py          # prints the facts; exit 1 when one does not hold

tests/test_structure.py asserts the same facts in CI.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "envbuilder"
CLI_MAX_LINES = 150  # a command's options, one library call and its formatting

# The layers, lowest first: a package imports only packages ranked below it (its own modules
# aside). "top" is envbuilder's top-level modules (errors, paths, text, readers, limits, progress,
# config); envbuilder/__main__.py belongs to the command line it starts. docs/ARCHITECTURE.md's
# package table follows this order.
RANKS: dict[str, int] = {
    "top": 0,
    # the scripts that run inside an image with its Python: they import nothing of envbuilder,
    # not even each other (STANDALONE)
    "images": 0,
    "tools": 1,
    "oci": 2,
    "model": 3,
    "render": 4,
    "lock": 5,
    # prepare (the lock, its pins, the mirror, into render's BuildContext) and `envbuild render`
    "context": 6,
    "offline": 7,
    "engines": 8,
    "machine": 9,
    "upstream": 10,
    "cli": 11,
}
STANDALONE = ("images",)  # packages whose modules are copied out alone: no envbuilder import at all
PACKAGE_OF = {"envbuilder.__main__": "cli"}  # modules that belong to another package than their folder's


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


class Source:
    """One module's text and the nodes the checks look at, each list in ast.walk's order."""

    __slots__ = ("text", "imports", "attributes", "classes", "calls", "functions")

    def __init__(self, text: str) -> None:
        self.text = text
        self.imports: list[ast.Import | ast.ImportFrom] = []
        self.attributes: list[ast.Attribute] = []
        self.classes: list[ast.ClassDef] = []
        self.calls: list[ast.Call] = []
        self.functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.imports.append(node)
            elif isinstance(node, ast.Attribute):
                self.attributes.append(node)
            elif isinstance(node, ast.ClassDef):
                self.classes.append(node)
            elif isinstance(node, ast.Call):
                self.calls.append(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.append(node)


# What the checks read of a file, by the sha256 of its text: each file is parsed and walked once
# in a process, however many times facts() runs (the tests call it ~30 times, on the package and
# on copies with one file changed, which is parsed again because its text is new).
_SEEN: dict[str, Source] = {}


def source(path: Path) -> Source:
    """`path` read now, parsed only if no file with the same text was parsed before."""
    text = path.read_text(encoding="utf-8")
    key = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if key not in _SEEN:
        _SEEN[key] = Source(text)
    return _SEEN[key]


def _resolve(mod: str, is_pkg: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports(mods: dict[str, Path]) -> dict[str, list[tuple[str, list[str], int]]]:
    """module -> [(imported module, names taken from it, line)] for envbuilder's own modules."""
    out: dict[str, list[tuple[str, list[str], int]]] = defaultdict(list)
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in source(path).imports:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("envbuilder"):
                        out[mod].append((a.name, [], node.lineno))
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(mod, is_pkg, node.level, node.module)
                if not target.startswith("envbuilder"):
                    continue
                names = [a.name for a in node.names]
                # `from envbuilder.lock import pip` imports the module envbuilder.lock.pip
                subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods]
                if subs:
                    out[mod].extend((s, [], node.lineno) for s in subs)
                    names = [n for n in names if f"{target}.{n}" not in mods]
                if names or not subs:
                    out[mod].append((target, names, node.lineno))
    return out


# The packages that do no I/O beyond reading envbuild's own data (the matrices, a config, the
# cache): the facts and the rules, and the renderers. A network client, a process, a thread
# pool or Hydra imported there is work that belongs in oci/, tools/ or machine/.
PURE = ("model", "render")
IO_MODULES = (
    "socket",
    "subprocess",
    "urllib.request",
    "http.client",
    "requests",
    "concurrent.futures",
    "threading",
    "hydra",
    "docker",
    "multiprocessing",
)


# scripts that run in the image, not in envbuild's process (copied into the build context byte
# for byte): their fetching is the image build's


def io_imports(mods: dict[str, Path]) -> list[str]:
    """`module:line imports X` for each I/O module (IO_MODULES) a PURE package's module imports."""
    found = []
    for mod, path in mods.items():
        if package_of(mod) not in PURE:
            continue
        for node in source(path).imports:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for n in names:
                if any(n == io or n.startswith(io + ".") for io in IO_MODULES):
                    found.append(f"{mod}:{node.lineno} imports {n}")
    return sorted(found)


def package_of(mod: str) -> str:
    """The ranked package a module belongs to: its first folder under envbuilder/, or "top"."""
    if mod in PACKAGE_OF:
        return PACKAGE_OF[mod]
    parts = mod.split(".")
    if len(parts) > 1 and (PKG / parts[1]).is_dir():
        return parts[1]
    return "top"


def package_edges(
    imp: dict[str, list[tuple[str, list[str], int]]],
) -> dict[tuple[str, str], list[str]]:
    """(package, package it imports) -> the imports that make the edge, as `module:line -> target`."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for m, lst in imp.items():
        for t, _, line in lst:
            a, b = package_of(m), package_of(t)
            if a != b:
                edges[(a, b)].append(f"{m}:{line} -> {t}")
    return edges


def against_rank(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """Every import of a package ranked at or above the importer's own (or of one not ranked)."""
    found = []
    for (a, b), where in sorted(edges.items()):
        ra, rb = RANKS.get(a), RANKS.get(b)
        if ra is None or rb is None or rb >= ra:
            found.extend(f"{w} ({a} imports {b}, ranked {rb} against its {ra})" for w in where)
    return found


def private_attributes(mods: dict[str, Path]) -> list[str]:
    """`matrix._load`: a private name reached through a name bound to another envbuilder module
    (`from envbuilder.model import matrix`, `import envbuilder.model.matrix as m`, `from . import x`)."""
    found = []
    for mod, path in mods.items():
        src = source(path)
        is_pkg = path.name == "__init__.py"
        bound: dict[str, str] = {}
        for node in src.imports:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("envbuilder"):
                        # `import envbuilder.x.y` binds envbuilder; `as n` binds the module
                        if a.asname:
                            bound[a.asname] = a.name
                        else:
                            bound["envbuilder"] = "envbuilder"
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(mod, is_pkg, node.level, node.module)
                if not target.startswith("envbuilder"):
                    continue
                for a in node.names:
                    if f"{target}.{a.name}" in mods:
                        bound[a.asname or a.name] = f"{target}.{a.name}"

        def dotted(node: ast.expr) -> str | None:
            if isinstance(node, ast.Name):
                return bound.get(node.id)
            if isinstance(node, ast.Attribute):
                base = dotted(node.value)
                return f"{base}.{node.attr}" if base else None
            return None

        for node in src.attributes:
            owner = dotted(node.value)
            name = node.attr
            if owner and owner in mods and owner != mod:
                if name.startswith("_") and not name.startswith("__"):
                    found.append(f"{mod}:{node.lineno} reaches {owner}.{name}")
    return sorted(found)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


NOT_A_RECORD = "# not a record:"


def _named(node: ast.expr) -> str:
    """The name a base class or decorator is spelled with: `NamedTuple`, `typing.NamedTuple`,
    `dataclass(frozen=True)` -> NamedTuple, NamedTuple, dataclass."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def other_records(mods: dict[str, Path]) -> list[str]:
    """Records declared other than as a Record: a NamedTuple (a class, or namedtuple()), and a
    dataclass that does not say why it is no record."""
    found = []
    for mod, path in mods.items():
        src = source(path)
        lines = src.text.splitlines()
        for node in src.classes:
            if any(_named(b) == "NamedTuple" for b in node.bases):
                found.append(f"{mod}:{node.lineno} {node.name} is a NamedTuple")
            for d in node.decorator_list:
                if _named(d) == "dataclass" and not any(
                    NOT_A_RECORD in lines[n - 1] for n in (d.lineno, node.lineno)
                ):
                    found.append(f"{mod}:{node.lineno} {node.name} is a dataclass without {NOT_A_RECORD!r}")
        for call in src.calls:
            if _named(call.func) == "namedtuple":
                found.append(f"{mod}:{call.lineno} namedtuple()")
    return sorted(found)


MAX_COMPLEXITY = 30  # radon's rank D at most; above it a function says why (COMPLEXITY_REASON)
COMPLEXITY_REASON = "# complexity:"  # in the comment block right above the def: why it stays one piece


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """McCabe's count as radon takes it: 1, plus each branch (if/elif, a loop, an except, a
    conditional expression, an assert, a case), each comprehension's loops and conditions, and
    each boolean operator's extra operands; a function defined inside counts on its own."""
    n = 1
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(
            node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler, ast.Assert)
        ):
            n += 1
        elif isinstance(node, ast.comprehension):
            n += 1 + len(node.ifs)
        elif isinstance(node, ast.BoolOp):
            n += len(node.values) - 1
        elif isinstance(node, ast.match_case):
            n += 1
        todo.extend(ast.iter_child_nodes(node))
    return n


def complex_functions(mods: dict[str, Path]) -> list[str]:
    """Functions above MAX_COMPLEXITY without a written reason (COMPLEXITY_REASON)."""
    out = []
    for m, path in mods.items():
        src = source(path)
        lines = src.text.splitlines()
        for fn in src.functions:
            c = complexity(fn)
            if c <= MAX_COMPLEXITY:
                continue
            first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)]) - 1  # (0-based)
            above = first
            while above > 0 and lines[above - 1].strip().startswith("#"):
                above -= 1  # (the comment block right above it)
            near = lines[above : fn.body[0].lineno - 1]
            if not any(COMPLEXITY_REASON in line for line in near):
                out.append(f"{m}:{fn.lineno} {fn.name}: {c}")
    return sorted(out)


def facts() -> dict:
    mods = modules()
    imp = imports(mods)
    # `from . import x` with x a module is an edge to x (imports() maps it there); a name taken
    # from a module's own package is an edge to the package's __init__, which may close a circle
    graph = {m: {t for t, _, _ in lst if t in mods and t != m} for m, lst in imp.items()}
    private = sorted(
        f"{m}:{line} takes {t}.{n}"
        for m, lst in imp.items()
        for t, names, line in lst
        for n in names
        if n.startswith("_") and not n.startswith("__") and t != m
    )
    cli_lines = {
        m: len(source(p).text.splitlines())
        for m, p in mods.items()
        if m.startswith("envbuilder.cli.") or m == "envbuilder.cli"
    }
    cli_long = sorted(f"{m}: {n} lines" for m, n in cli_lines.items() if n > CLI_MAX_LINES)
    # the command line is the top layer: only envbuilder/__main__.py reaches into it
    upward = sorted(
        f"{m} imports {t}"
        for m, lst in imp.items()
        for t, _, _ in lst
        if (t == "envbuilder.cli" or t.startswith("envbuilder.cli."))
        and not (m == "envbuilder.cli" or m.startswith("envbuilder.cli."))
        and m != "envbuilder.__main__"
    )
    # a module copied out alone (into an image) finds no envbuilder there, its own package neither
    standalone = sorted(
        f"{m}:{line} imports {t}"
        for m, lst in imp.items()
        if package_of(m) in STANDALONE
        for t, _, line in lst
    )
    edges = package_edges(imp)
    packages = {package_of(m) for m in mods}
    package_graph = {p: {b for a, b in edges if a == p} for p in packages}
    return {
        "modules": len(mods),
        "package_graph": package_graph,
        "package_cycles": cycles(package_graph),
        "against_rank": against_rank(edges),
        "unranked": sorted(packages - set(RANKS)),
        "private_attributes": private_attributes(mods),
        "cycles": cycles(graph),
        "private_imports": private,
        "long_cli_modules": cli_long,
        "cli_imported_below": upward,
        "other_records": other_records(mods),
        "standalone_imports": standalone,
        "io_in_pure": io_imports(mods),
        "complex_functions": complex_functions(mods),
    }


def main() -> int:
    f = facts()
    print(f"{f['modules']} modules")
    print("packages, lowest first (rank: imports):")
    order = sorted(f["package_graph"], key=lambda p: (RANKS.get(p, 99), p))
    for p in order:
        deps = sorted(f["package_graph"][p], key=lambda d: (RANKS.get(d, 99), d))
        print(f"  {RANKS.get(p, '?')!s:>2} {p}: {', '.join(deps) or '-'}")
    print(f"package circles: {len(f['package_cycles'])}")
    for c in f["package_cycles"]:
        print("  " + " <-> ".join(c))
    upward = sorted({a.split("(")[1].rstrip(")").split(",")[0] for a in f["against_rank"]})
    print(f"package edges against the rank (each closes a circle): {len(upward)}")
    for u in upward:
        print("  " + u)
    print(f"packages not ranked: {len(f['unranked'])}")
    for u in f["unranked"]:
        print("  " + u)
    print(f"imports against the rank: {len(f['against_rank'])}")
    for a in f["against_rank"]:
        print("  " + a)
    print(f"circles: {len(f['cycles'])}")
    for c in f["cycles"]:
        print("  " + " <-> ".join(c))
    print(f"private cross-imports: {len(f['private_imports'])}")
    for p in f["private_imports"]:
        print("  " + p)
    print(f"private names reached through a module: {len(f['private_attributes'])}")
    for p in f["private_attributes"]:
        print("  " + p)
    print(f"modules below the command line that import it: {len(f['cli_imported_below'])}")
    for u in f["cli_imported_below"]:
        print("  " + u)
    print(f"command-line modules over {CLI_MAX_LINES} lines: {len(f['long_cli_modules'])}")
    for c in f["long_cli_modules"]:
        print("  " + c)
    print(f"records not declared as a Record: {len(f['other_records'])}")
    for r in f["other_records"]:
        print("  " + r)
    print(
        f"imports of envbuilder in the modules copied out alone ({', '.join(STANDALONE)}): {len(f['standalone_imports'])}"
    )
    for s in f["standalone_imports"]:
        print("  " + s)
    print(
        f"I/O imported by {' and '.join(PURE)} (network, processes, threads, Hydra): {len(f['io_in_pure'])}"
    )
    for r in f["io_in_pure"]:
        print("  " + r)
    print(
        f"functions above complexity {MAX_COMPLEXITY} without a written reason: {len(f['complex_functions'])}"
    )
    for c in f["complex_functions"]:
        print("  " + c)
    failed = (
        "standalone_imports",
        "io_in_pure",
        "package_cycles",
        "against_rank",
        "unranked",
        "private_attributes",
        "cycles",
        "private_imports",
        "long_cli_modules",
        "cli_imported_below",
        "other_records",
        "complex_functions",
    )
    return 1 if any(f[k] for k in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
