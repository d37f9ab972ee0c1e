"""Reading a docker-bake.hcl as buildx does, for the tests (buildx itself is not installable
here): python-hcl2 parses it, and `${VAR}` references take the variables' defaults."""

from __future__ import annotations

import re
from pathlib import Path


def _unquote(v):
    if isinstance(v, str) and len(v) >= 2 and v[0] == v[-1] == '"':
        return v[1:-1].replace("$${", "${").replace('\\"', '"')
    return v


def load(path: Path, overrides: dict | None = None) -> dict:
    """{"variables": {...}, "groups": {...}, "targets": {name: {attr: value}}} with every
    `${VAR}` in a target replaced by the variable's value (an override first, as the
    environment overrides a bake variable)."""
    import hcl2

    doc = hcl2.loads(Path(path).read_text())
    variables = {}
    for block in doc.get("variable", []):
        for name, body in block.items():
            variables[_unquote(name)] = _unquote(body.get("default"))
    variables.update(overrides or {})

    def subst(v):
        if isinstance(v, list):
            return [subst(x) for x in v]
        if isinstance(v, dict):
            return {_unquote(k): subst(x) for k, x in v.items() if k != "__is_block__"}
        v = _unquote(v)
        return re.sub(r"(?<!\$)\$\{(\w+)\}", lambda m: str(variables[m[1]]), v) if isinstance(v, str) else v

    groups = {
        _unquote(n): [_unquote(t) for t in b["targets"]]
        for block in doc.get("group", [])
        for n, b in block.items()
    }
    targets = {_unquote(n): subst(b) for block in doc.get("target", []) for n, b in block.items()}
    return {"variables": variables, "groups": groups, "targets": targets}
