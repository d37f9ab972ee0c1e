"""Running a tool as a child process, bounded: a time limit and a cap on the memory of the
child and everything it starts (its process group), so a tool that reads an endless answer
(uv on an index page that never ends: 6 GB in 25 s) is stopped and named, not left to fill the
machine. Output is captured as `subprocess.run` captures it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, Literal, overload

from envbuilder.errors import Terminated

# what a resolver or a wheel build needs is far less; an endless read is more
# (ENVBUILD_TOOL_MAX_RSS_MB sets another cap: a small machine, or a test)
MAX_RSS = int(os.environ.get("ENVBUILD_TOOL_MAX_RSS_MB") or 6 << 10) << 20
POLL = 0.2


class TooMuchMemory(Exception):
    """The child's process group went over `max_rss` bytes and was stopped."""

    def __init__(self, rss: int, cap: int):
        super().__init__(f"used {rss >> 20} MiB, over its cap of {cap >> 20} MiB")
        self.rss, self.cap = rss, cap


def _group_stats(pgid: int) -> Iterator[list[str]]:
    """The /proc/PID/stat fields after the command's name (state first) of every process in
    group `pgid` (Linux /proc; none where it is absent)."""
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text(errors="replace").rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # (pgrp is the 5th field, the 3rd after the name)
                yield fields
        except (OSError, ValueError, IndexError):
            continue


def _group_rss(pgid: int) -> int:
    """Resident bytes of every process in group `pgid` (0 where /proc is absent)."""
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    total = 0
    for fields in _group_stats(pgid):
        try:
            total += int(fields[21]) * page  # rss in pages, the 24th field
        except (ValueError, IndexError):
            continue
    return total


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises Terminated (a KeyboardInterrupt) while a command runs (cli.main): a batch
    system's or a user's `kill` ends the children and leaves the state Ctrl-C leaves, one a
    re-run goes on from."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def interruption(e: BaseException) -> tuple[str, int]:
    """What a command stopped by Ctrl-C or SIGTERM says, and its exit code (130, 143 for
    SIGTERM); click hands either over wrapped in its Abort."""
    cause = e if isinstance(e, KeyboardInterrupt) else e.__cause__
    if isinstance(cause, Terminated):
        return "Terminated.", 143
    return ("Interrupted." if isinstance(e, KeyboardInterrupt) else "Aborted."), 130


def stop_group(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """End a child started in a session of its own and everything it started (its process
    group): SIGTERM, then SIGKILL for what is left after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        # the whole group, not only its leader: a child the leader started may outlive it
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                proc.wait(0.1)
            except subprocess.TimeoutExpired:
                continue
            if not _group_running(proc.pid):
                return


def _group_running(pgid: int) -> bool:
    """Whether any process of group `pgid` is still running (a zombie has ended)."""
    return any(fields[0] != "Z" for fields in _group_stats(pgid))


@overload
def run(
    cmd: list[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    max_rss: int | None = None,
    text: Literal[True] = True,
) -> subprocess.CompletedProcess[str]: ...
@overload
def run(
    cmd: list[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    max_rss: int | None = None,
    text: Literal[False],
) -> subprocess.CompletedProcess[bytes]: ...
def run(
    cmd: list[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    max_rss: int | None = None,
    text: bool = True,
) -> subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]:
    """`subprocess.run(cmd, capture_output=True)` in a process group of its own, stopped (the
    whole group) when it runs past `timeout` (subprocess.TimeoutExpired) or its resident
    memory passes `max_rss` (TooMuchMemory; default MAX_RSS)."""
    max_rss = MAX_RSS if max_rss is None else max_rss
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    # Ctrl-C or SIGTERM (cli.main raises it) ends the child's whole group too, from the first
    # bytecode after Popen: on a loaded machine the child has started its own children before
    # this process runs again, and the signal is raised on the first line it runs
    try:
        out: dict[str, bytes] = {}
        readers: list[threading.Thread] = []
        problem: Exception | None = None

        def drain(name: str, stream: IO[bytes]) -> None:
            out[name] = stream.read()

        readers += [
            threading.Thread(target=drain, args=(n, s), daemon=True)
            for n, s in (("stdout", proc.stdout), ("stderr", proc.stderr))
        ]
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in readers:
            t.start()
        while proc.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                problem = subprocess.TimeoutExpired(cmd, timeout or 0.0)
            else:
                rss = _group_rss(proc.pid)
                if rss > max_rss:
                    problem = TooMuchMemory(rss, max_rss)
            if problem is not None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
                break
            try:
                proc.wait(POLL)
            except subprocess.TimeoutExpired:
                pass
    except BaseException:
        stop_group(proc)
        raise
    for t in readers:
        t.join(5)
    if problem is not None:
        raise problem
    stdout, stderr = out.get("stdout", b""), out.get("stderr", b"")
    if text:
        return subprocess.CompletedProcess(
            cmd, proc.returncode, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
