"""tests/run.sh's parallel run starts the longest files first (tests/schedule.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _order(tmp_path: Path, hook: bool) -> list[str]:
    """The files of a small project in the order one xdist worker ran their tests."""
    tmp_path.mkdir()
    for name, n in (("test_many.py", 6), ("test_some.py", 3), ("test_long.py", 1)):
        (tmp_path / name).write_text("".join(f"def test_{i}():\n    pass\n" for i in range(n)))
    conftest = f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
    if hook:
        conftest += (
            "from schedule import long_first_scheduler\n\n"
            "def pytest_xdist_make_scheduler(config, log):\n"
            "    return long_first_scheduler(config, log, first=('test_long.py',))\n"
        )
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1", "--dist", "loadfile", "-v"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ran = re.findall(r"PASSED (test_\w+\.py)::", r.stdout)
    assert len(ran) == 10, r.stdout
    return list(dict.fromkeys(ran))


def test_the_long_file_starts_first_though_it_has_the_fewest_tests(tmp_path):
    assert _order(tmp_path / "plain", hook=False)[-1] == "test_long.py"  # xdist alone: last
    assert _order(tmp_path / "hooked", hook=True)[0] == "test_long.py"


def test_the_suite_names_only_files_that_exist():
    from schedule import LONG_FIRST

    assert LONG_FIRST and all((TESTS.parent / f).is_file() for f in LONG_FIRST)
