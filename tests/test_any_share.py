"""bench/any_share.py: the ceiling on `Any` that tests/run.sh holds mypy's report to (issue 46)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import any_share  # noqa: E402

HEAD = "  Name   Anys   Exprs   Coverage\n" + "-" * 40 + "\n"


def report(rows: dict[str, tuple[int, int]]) -> str:
    lines = [f"  {n}  {a}  {e}  {100 - 100 * a / e:.2f}%" for n, (a, e) in rows.items()]
    total = (sum(a for a, _ in rows.values()), sum(e for _, e in rows.values()))
    return HEAD + "\n".join(lines) + "\n" + "-" * 40 + f"\n  Total  {total[0]}  {total[1]}  99.00%\n"


def run(tmp_path: Path, text: str, *args: str) -> int:
    p = tmp_path / "any-exprs.txt"
    p.write_text(text)
    return any_share.main([str(p), *args])


def test_a_share_under_the_ceiling_passes_and_one_above_fails(tmp_path, capsys):
    assert run(tmp_path, report({"envbuilder.a": (19, 1000), "envbuilder.b": (0, 500)})) == 0
    assert "19 of 1,500 expressions (1.27 %" in capsys.readouterr().out
    assert run(tmp_path, report({"envbuilder.a": (31, 1000), "envbuilder.b": (0, 500)})) == 1
    out = capsys.readouterr()
    assert "2.07 %" in out.err and "envbuilder.a" in out.out
    assert run(tmp_path, report({"envbuilder.a": (31, 1000), "envbuilder.b": (0, 500)}), "--max", "2.5") == 0


def test_a_report_cut_short_or_of_another_kind_is_refused(tmp_path, capsys):
    whole = report({"envbuilder.a": (10, 1000), "envbuilder.b": (5, 500)})
    cut = "\n".join(line for line in whole.splitlines() if "envbuilder.b" not in line)
    assert run(tmp_path, cut) == 2
    assert "do not add up" in capsys.readouterr().err
    assert run(tmp_path, "Name Imprecise Lines\n") == 2
    assert any_share.main([str(tmp_path / "nowhere.txt")]) == 2
