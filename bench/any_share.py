#!/usr/bin/env python3
"""The share of `Any` among the typed package's expressions, held under a ceiling (issue 46).

  mypy --any-exprs-report DIR && python bench/any_share.py DIR/any-exprs.txt [--max 2.0] [--top 10]

Reads the report mypy writes (a row per module: name, Anys, Exprs, coverage; a `Total` row),
prints the share and the modules that hold the most `Any`, and exits 1 when the share is above
`--max` per cent (2 by default: the issue's bar), 2 when the report cannot be read. Strict mypy
alone lets `Any` data through (a `dict[str, Any]` read is as strict as a typed one), so tests/run.sh
runs this on the report of its own mypy run. Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROW = re.compile(r"^\s*(?P<name>[\w.]+)\s+(?P<anys>\d+)\s+(?P<exprs>\d+)\s+[\d.]+%\s*$")


def read_report(text: str) -> tuple[dict[str, tuple[int, int]], tuple[int, int]]:
    """({module: (anys, exprs)}, (total anys, total exprs)); ValueError if there is no Total row
    or the rows do not add up to it (a report cut short or of another format)."""
    modules: dict[str, tuple[int, int]] = {}
    total: tuple[int, int] | None = None
    for line in text.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        row = (int(m["anys"]), int(m["exprs"]))
        if m["name"] == "Total":
            total = row
        else:
            modules[m["name"]] = row
    if total is None:
        raise ValueError("no Total row: not mypy's any-exprs report")
    if (sum(a for a, _ in modules.values()), sum(e for _, e in modules.values())) != total:
        raise ValueError("the modules' rows do not add up to the Total row")
    return modules, total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", help="any-exprs.txt from mypy --any-exprs-report")
    ap.add_argument("--max", type=float, default=2.0, help="the ceiling, per cent of expressions")
    ap.add_argument("--top", type=int, default=10, help="modules to list, most Any first")
    a = ap.parse_args(argv)
    try:
        modules, (anys, exprs) = read_report(Path(a.report).read_text())
    except (OSError, ValueError) as e:
        print(f"any_share: cannot read {a.report}: {e}", file=sys.stderr)
        return 2
    share = 100.0 * anys / exprs if exprs else 0.0
    print(f"Any: {anys:,} of {exprs:,} expressions ({share:.2f} %; ceiling {a.max:g} %)")
    for name, (n, e) in sorted(modules.items(), key=lambda kv: -kv[1][0])[: a.top]:
        if n:
            print(f"  {n:6,} of {e:7,}  {name}")
    if share > a.max:
        print(
            f"any_share: {share:.2f} % of expressions are Any, above {a.max:g} %: type the modules above",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
