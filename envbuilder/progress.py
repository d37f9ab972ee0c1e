"""Progress for work that takes more than a few seconds, the one way every command shows it.

On a terminal a status line is rewritten in place; anywhere else (a CI log, a pipe) a plain line
every `every` seconds and never a carriage return, so a log shows life without filling up.
`clock_text` is the one spelling of an elapsed time or an ETA (build steps, downloads, locks).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO


def clock_text(seconds: float) -> str:
    """4.2s, 41s, 3m05s."""
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f}s"
    whole = int(round(seconds))
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


class Heartbeat:
    """`with Heartbeat("p40: pip part", say): solve()` says how long a step without a progress
    of its own (a resolver, a solver) has been running, and at the end how long it took.

    `detail` (optional) is called on each beat for a short note on what the step is doing (the
    last line a subprocess printed, bytes so far). A beat is a plain line every `every` seconds
    off a terminal; on a terminal the line is rewritten about once a second."""

    def __init__(
        self,
        label: str,
        say: Callable[[str], None] | None = None,
        *,
        every: float = 12.0,
        stream: TextIO | None = None,
        detail: Callable[[], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
    ):
        self.label, self.every, self.detail, self.clock = label, every, detail, clock
        self.stream = stream or sys.stderr
        self.say = say or self._line
        self.tty = (self.stream.isatty() if tty is None else tty) and say is None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.start = self.last = clock()
        self.status = False

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def text(self) -> str:
        note = ""
        if self.detail is not None:
            try:
                note = self.detail() or ""
            except Exception:  # a note is a courtesy; it never stops the work it describes
                note = ""
        return f"{self.label}: running {clock_text(self.clock() - self.start)}" + (
            f" ({note[:100]})" if note else ""
        )

    def beat(self) -> None:
        """One tick (the thread calls it every second; tests call it with a fake clock)."""
        now = self.clock()
        if self.tty:
            self.stream.write("\r\x1b[K" + self.text()[:200])
            self.stream.flush()
            self.status = True
        elif now - self.last >= self.every:
            self.last = now
            self.say(self.text())

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.beat()

    def __enter__(self) -> "Heartbeat":
        self.start = self.last = self.clock()
        self._thread = threading.Thread(target=self._run, name="envbuild-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.status:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self.say(
            f"{self.label}: {'done' if kind is None else 'stopped'} in "
            f"{clock_text(self.clock() - self.start)}"
        )
