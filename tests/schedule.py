"""The parallel run's order (pytest-xdist's --dist loadfile, tests/run.sh). xdist hands out the
files with the most tests first, so a file of one or two tests that runs for minutes would start
last, and the whole run would wait for it alone. The files named here start first instead."""

from __future__ import annotations

from typing import Any

# the real 4090 image: built and pushed, minutes (tests/test_real_build.py)
LONG_FIRST = ("tests/test_real_build.py",)


def long_first_scheduler(config: Any, log: Any, first: tuple[str, ...] = LONG_FIRST) -> Any:
    """xdist's loadfile scheduler, with the files in `first` (paths from the root) handed out
    before any other."""
    from xdist.scheduler import LoadFileScheduling

    class LongFirst(LoadFileScheduling):  # type: ignore[misc]
        def _assign_work_unit(self, node: Any) -> None:
            for scope in [s for s in self.workqueue if s in first]:
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LongFirst(config, log)
