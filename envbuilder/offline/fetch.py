"""Parallel, hash-verified, resumable, interruptible downloads: the engine under the offline
wheelhouse export.

Every file is written to `dest/.partial/<name>`, hashed while it streams, and moved to
`dest/<name>` with `os.replace` only when its sha256 matches, so `dest/<name>` is either absent
or right. A partial left by a dropped connection (or an earlier run, killed or stopped) is
resumed with `Range`. A body longer than the file can be is cut off there. Ctrl-C (or a full
disk) stops every worker within about a second: no new file starts, and the reads in flight are
cut by shutting their sockets down. A download that receives nothing for a while is reported.
The session is envbuilder/oci/http.py's (proxies and CAs from the environment, no redirect body read),
and no message names a URL's credentials.
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, TextIO, cast
from urllib.parse import urlsplit

import requests

from envbuilder.errors import ActionError, UserError
from envbuilder.record import Record
from envbuilder.oci.http import redact
from envbuilder.progress import clock_text

CHUNK = 64 * 1024  # small enough that a dropped connection loses little of what arrived
HASH_BLOCK = 1024 * 1024
PARTIAL_DIR = ".partial"
MAX_RETRY_AFTER = 60.0  # cap on a server's Retry-After, so one slow mirror cannot stall an export
MAX_UNSIZED = 32 << 30  # a file whose size the lock does not record (conda's) is cut off here
STALL_NOTICE = 10.0  # seconds without a byte before a download is reported as waiting
TICK = 0.25  # how often the main thread looks up from the workers (stall notices, Ctrl-C)
STOP_GRACE = 1.0  # seconds the main thread waits for workers to leave once stopped
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class FetchItem(Record):
    """One file to fetch: the same bytes at one or more mirror URLs, tried in order."""

    filename: str
    sha256: str
    urls: tuple[str, ...]
    size: int | None = None


class FetchFailure(Record):
    filename: str
    reason: str


@dataclass  # not a record: fetch_all appends each file's outcome as it lands
class FetchReport:
    downloaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[FetchFailure] = field(default_factory=list)
    bytes_transferred: int = 0


class FetchEvent(Record):
    """What a progress callback receives, from any thread (workers, and the main one).

    kind: "begin" (total = number of files), "progress" (nbytes received), "retry" (message),
    "stalled" (message: nothing arrived for a while), "skipped", "done", "failed" (message),
    "end".
    """

    kind: str
    filename: str = ""
    nbytes: int = 0
    total: int = 0
    message: str = ""


ProgressCallback = Callable[[FetchEvent], None]


class _Retry(Exception):
    """A transient failure: the same URL may work after a pause."""

    def __init__(self, message: str, after: float = 0.0):
        super().__init__(message)
        self.after = after


class _NextMirror(Exception):
    """This URL will not serve the file (404, 403, too long a body, ...): go to the next one."""


class _ItemFailed(Exception):
    """Every URL and retry for one item is spent (or its partial cannot be written)."""


class _Stopped(Exception):
    """The fetch was stopped (Ctrl-C, or a full disk elsewhere): the partial stays to resume."""


class _NoSpace(Exception):
    """The disk under `dest` is full: nothing else can land either."""


class _TooLong(Exception):
    """The body goes on past the size the file can have."""


def fetch_all(
    items: Iterable[FetchItem],
    dest: Path,
    *,
    jobs: int = 8,
    retries: int = 3,
    backoff: float = 0.5,
    timeout: float = 30,
    progress: ProgressCallback | None = None,
    session: requests.Session | None = None,
    stall_notice: float = STALL_NOTICE,
) -> FetchReport:
    """Fetch every item into `dest`, `jobs` at a time; raise FetchFailed if any failed (with
    `.report`, and `.no_space` True when the disk filled up); ActionError when `dest` cannot
    take the partial downloads' folder.

    `retries` is per URL for transient failures, waiting `backoff * 2**n` seconds between tries;
    `timeout` bounds a connect and each wait for bytes. A download that gets no byte for
    `stall_notice` seconds is reported ("stalled" events). `progress=None` shows a
    TerminalProgress on stderr. A `session` passed in is used as is.
    """
    items = _validated(items)
    if jobs < 1:
        raise UserError(f"jobs must be at least 1, got {jobs}. Pass a positive number of parallel downloads.")
    dest = Path(dest)
    _partial_dir(dest, items)
    emit = progress or TerminalProgress()
    own_session = session is None
    session = session or _pooled_session(jobs)
    report = FetchReport()
    activity = _Activity(emit, stall_notice)
    try:
        outcomes = _run_workers(items, dest, jobs, session, retries, backoff, timeout, activity, emit)
    finally:
        report.bytes_transferred = activity.total
        if own_session:
            try:
                session.close()
            except Exception:
                pass  # (nothing raised while closing may take an interrupt's place)
    for index, item in enumerate(items):  # in input order, so reports are stable
        outcome = outcomes.get(index)  # (None, _Stopped, _NoSpace: left undone by a full disk)
        if outcome == "skipped":
            report.skipped.append(item.filename)
        elif outcome == "downloaded":
            report.downloaded.append(item.filename)
        elif isinstance(outcome, _ItemFailed):
            report.failed.append(FetchFailure(item.filename, str(outcome)))
    no_space = any(isinstance(o, _NoSpace) for o in outcomes.values())
    _remove_if_empty(dest / PARTIAL_DIR)
    if no_space:
        raise _no_space_error(report, dest, items)
    if report.failed:
        raise _failure_error(report, dest, len(items))
    return report


def _partial_dir(dest: Path, items: list[FetchItem]) -> None:
    """The folder the partial downloads go to (resumed from there), made or refused."""
    if (dest / PARTIAL_DIR).is_symlink():
        raise UserError(
            f"{dest / PARTIAL_DIR} is a symbolic link; envbuild does not write "
            "through links. Remove it, then run again."
        )
    try:
        (dest / PARTIAL_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise _no_space_error(FetchReport(), dest, items) from None
        raise ActionError(
            f"Cannot make {dest / PARTIAL_DIR}: {exc.strerror}. Check the "
            "directory's permissions and free space."
        ) from None


def _run_workers(
    items: list[FetchItem],
    dest: Path,
    jobs: int,
    session: requests.Session,
    retries: int,
    backoff: float,
    timeout: float,
    activity: _Activity,
    emit: ProgressCallback,
) -> dict[int, object]:
    """Each item fetched by one of `jobs` worker threads; {item index: its outcome} ("skipped",
    "downloaded", or the exception that ended it). A full disk stops them all; Ctrl-C (or a
    bug in a worker, re-raised here with its own traceback) stops them and is raised."""
    stop = threading.Event()
    todo: queue.SimpleQueue[tuple[int, FetchItem]] = queue.SimpleQueue()
    for index, item in enumerate(items):
        todo.put((index, item))
    results: queue.SimpleQueue[tuple[int, object]] = queue.SimpleQueue()

    def work() -> None:
        while not stop.is_set():  # a stopped fetch starts no new file
            try:
                index, item = todo.get_nowait()
            except queue.Empty:
                return
            outcome: object
            try:
                outcome = _fetch_one(item, dest, session, retries, backoff, timeout, activity, emit, stop)
            except BaseException as exc:  # sorted by the main thread (a bug re-raises there)
                outcome = exc
            results.put((index, outcome))

    # daemon threads: a worker stuck in a connect cannot hold up the exit after Ctrl-C (its
    # partial stays as it is, to resume from)
    workers = [
        threading.Thread(target=work, name=f"fetch-{n}", daemon=True) for n in range(min(jobs, len(items)))
    ]
    outcomes: dict[int, object] = {}
    emit(FetchEvent("begin", total=len(items), nbytes=sum(i.size or 0 for i in items)))
    try:
        for w in workers:
            w.start()
        while len(outcomes) < len(items):
            try:
                index, outcome = results.get(timeout=TICK)
            except queue.Empty:
                if not any(w.is_alive() for w in workers) and results.empty():
                    break  # stopped: the files not started stay undone
                activity.notice_stalls()
                continue
            outcomes[index] = outcome
            if isinstance(outcome, _ItemFailed):
                emit(FetchEvent("failed", items[index].filename, message=str(outcome)))
            elif isinstance(outcome, _NoSpace):
                _stop(stop, activity, workers)  # the other files cannot land either
            elif isinstance(outcome, BaseException) and not isinstance(outcome, _Stopped):
                raise outcome  # a bug in a worker: its own traceback
    except BaseException:  # Ctrl-C (or a bug): no new file, the reads in flight cut short
        # (nothing raised while stopping may take the interrupt's place: a Ctrl-C ends as one,
        # exit 130, whatever closing a session with reads cut short says)
        try:
            _stop(stop, activity, workers)
            emit(FetchEvent("end"))
        except Exception:
            pass
        raise
    emit(FetchEvent("end"))
    return outcomes


def _stop(stop: threading.Event, activity: "_Activity", workers: list[threading.Thread]) -> None:
    """Stop every worker: none takes a new file, the reads in flight are cut; wait for them a
    little (they leave their partials as they are)."""
    stop.set()
    activity.abort()
    deadline = time.monotonic() + STOP_GRACE
    for w in workers:
        w.join(max(deadline - time.monotonic(), 0))


def _validated(items: Iterable[FetchItem]) -> list[FetchItem]:
    """Reject names that would escape `dest`, malformed hashes, and one name with two hashes."""
    by_name: dict[str, FetchItem] = {}
    for item in items:
        name = item.filename
        if not name or name in (".", "..", PARTIAL_DIR) or "/" in name or "\\" in name:
            raise UserError(
                f"Cannot fetch {name!r}: a file name must be a plain name inside the "
                "destination directory. Fix the entry in the lockfile or wheel list."
            )
        if not _SHA256.fullmatch(item.sha256.lower()):
            raise UserError(
                f"Cannot fetch {name}: {item.sha256!r} is not a sha256 hex digest. "
                "Regenerate the lockfile so every file carries its sha256."
            )
        if not item.urls:
            raise UserError(f"Cannot fetch {name}: it has no URL. Add a mirror or index URL for it.")
        seen = by_name.get(name)
        if seen is not None and seen.sha256.lower() != item.sha256.lower():
            raise UserError(
                f"Cannot fetch {name}: it is listed twice with different hashes "
                f"({seen.sha256} and {item.sha256}). Keep one entry in the lockfile."
            )
        by_name.setdefault(name, item)
    return list(by_name.values())


def _pooled_session(jobs: int) -> requests.Session:
    """A session whose pool keeps one connection per worker; retries are ours, not urllib3's."""
    from envbuilder.oci.http import session

    return session(retries=0, pool=jobs)


@dataclass  # not a record: the stall watch updates it as bytes come
class _InFlight:
    """A download in flight: its host, when its last byte came, the stall notices so far."""

    host: str
    last: float
    told: int = 0


class _Activity:
    """What the workers are doing, for the main thread: the bytes received (progress), when
    each file in flight last received any (stall notices), and the sockets of the responses
    being read (shut down to stop)."""

    def __init__(self, emit: ProgressCallback, notice_every: float):
        self._emit = emit
        self._every = notice_every
        self._lock = threading.Lock()
        self._flight: dict[str, _InFlight] = {}
        self._sockets: dict[str, socket.socket] = {}
        self._aborted = False
        self.total = 0

    def begin(self, filename: str, url: str) -> None:
        with self._lock:
            host = urlsplit(url).netloc.rsplit("@", 1)[-1]  # (never its user:password@)
            self._flight[filename] = _InFlight(host, time.monotonic())

    def reading(self, filename: str, resp: requests.Response) -> bool:
        """Note the socket under `resp` (so abort() can cut it); False once aborted."""
        sock = _socket_of(resp)
        with self._lock:
            if sock is not None:
                self._sockets[filename] = sock
            return not self._aborted

    def add(self, filename: str, nbytes: int) -> None:
        with self._lock:
            self.total += nbytes
            if filename in self._flight:
                entry = self._flight[filename]
                entry.last, entry.told = time.monotonic(), 0
        self._emit(FetchEvent("progress", filename, nbytes=nbytes))

    def end(self, filename: str) -> None:
        with self._lock:
            self._flight.pop(filename, None)
            self._sockets.pop(filename, None)

    def notice_stalls(self) -> None:
        """A "stalled" event for each download that has had no byte for another `every` s."""
        now, due = time.monotonic(), []
        with self._lock:
            for name, entry in self._flight.items():
                host, last, told = entry.host, entry.last, entry.told
                if now - last >= self._every * (told + 1):
                    entry.told += 1
                    due.append(
                        FetchEvent(
                            "stalled",
                            name,
                            message=(f"waiting for {name} from {host}: no bytes for {now - last:.0f} s"),
                        )
                    )
        for event in due:
            self._emit(event)

    def abort(self) -> None:
        """Wake every read in flight: a shut-down socket returns end-of-file at once."""
        with self._lock:
            self._aborted = True
            sockets = list(self._sockets.values())
        for sock in sockets:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # (not TLS's: only the socket)
            except OSError:
                pass


def _socket_of(resp: requests.Response) -> socket.socket | None:
    """The socket a streamed response is read from (urllib3's connection), None if unknown."""
    conn = getattr(resp.raw, "connection", None) or getattr(resp.raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _fetch_one(
    item: FetchItem,
    dest: Path,
    session: requests.Session,
    retries: int,
    backoff: float,
    timeout: float,
    activity: _Activity,
    emit: ProgressCallback,
    stop: threading.Event,
) -> str:
    """Fetch one item through its mirrors: "skipped" or "downloaded", or raise _ItemFailed
    (_Stopped when stopped, _NoSpace when the disk is full)."""
    target = dest / item.filename
    expected = item.sha256.lower()
    try:
        if target.is_file() and not target.is_symlink() and sha256_file(target) == expected:
            emit(FetchEvent("skipped", item.filename))
            return "skipped"
    except OSError as exc:
        raise _ItemFailed(f"cannot read {target}: {exc.strerror}") from None
    partial = dest / PARTIAL_DIR / item.filename
    if item.size is not None and partial.is_file() and partial.stat().st_size > item.size:
        partial.unlink()  # longer than the file can be: not worth resuming
    errors: list[str] = []
    for url in item.urls:
        shown = redact(url)
        attempt = 0
        while attempt <= retries:
            if stop.is_set():
                raise _Stopped()
            try:
                got, resumed = _download(session, url, partial, item, timeout, activity, stop)
            except _Retry as exc:
                errors.append(redact(f"{exc} from {shown}"))
                attempt += 1
                if attempt <= retries:
                    emit(FetchEvent("retry", item.filename, message=errors[-1]))
                    if stop.wait(max(backoff * 2 ** (attempt - 1), exc.after)):
                        raise _Stopped() from None
                continue
            except _NextMirror as exc:
                errors.append(redact(f"{exc} from {shown}"))
                break
            if got == expected:
                try:
                    os.replace(partial, target)
                except OSError as exc:
                    raise _ItemFailed(f"cannot move it into {dest}: {exc.strerror}") from None
                emit(FetchEvent("done", item.filename))
                return "downloaded"
            partial.unlink(missing_ok=True)
            errors.append(f"sha256 mismatch from {shown}: expected {expected}, got {got}")
            if not resumed:
                break  # this mirror serves other bytes than the lockfile names: try the next
            attempt += 1  # the stale part may be the bad one: fetch it whole once more here
    raise _ItemFailed("; ".join(dict.fromkeys(errors)))  # each distinct reason once


def _download(
    session: requests.Session,
    url: str,
    partial: Path,
    item: FetchItem,
    timeout: float,
    activity: _Activity,
    stop: threading.Event,
) -> tuple[str, bool]:
    """Complete `partial` from `url`; return its sha256 and whether earlier bytes were kept.
    Reads stop at the size the lock records (MAX_UNSIZED without one), and when `stop` is set."""
    offset = partial.stat().st_size if partial.is_file() and not partial.is_symlink() else 0
    if offset and offset == item.size:
        return sha256_file(partial), True  # whole already (e.g. stopped before the move)
    limit = item.size if item.size is not None else MAX_UNSIZED
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    activity.begin(item.filename, url)
    try:
        with session.get(url, headers=headers, stream=True, timeout=timeout) as resp:
            if not activity.reading(item.filename, resp):
                raise _Stopped()
            _check_status(resp, offset)
            if resp.status_code == 416:
                return sha256_file(partial), True  # nothing left to send: the part is whole
            if resp.status_code == 206 and _range_start(resp) != offset:
                partial.unlink(missing_ok=True)  # bytes for another offset: start clean
                raise _Retry(f"unexpected Content-Range {resp.headers.get('Content-Range')!r}")
            resume = offset > 0 and resp.status_code == 206  # a 200 means start over
            hasher = _sha256_of(partial) if resume else hashlib.sha256()
            size = offset if resume else 0
            with _open_partial(partial, resume) as out:
                for chunk in resp.iter_content(CHUNK):
                    if stop.is_set():
                        raise _Stopped()
                    size += len(chunk)
                    if size > limit:
                        raise _TooLong(limit)
                    _write_all(out, chunk)
                    hasher.update(chunk)
                    activity.add(item.filename, len(chunk))
                os.fsync(out.fileno())  # the bytes are on disk before os.replace publishes them
    except _TooLong:
        partial.unlink(missing_ok=True)
        whose = "the lock records" if item.size is not None else "any file here may have"
        raise _NextMirror(
            f"more than the {limit} bytes {whose} (a body that does not end): "
            "stopped reading there and removed the partial download"
        ) from None
    except (
        requests.ConnectionError,
        requests.Timeout,
        requests.exceptions.ChunkedEncodingError,
    ) as exc:  # incl. a body cut short
        if stop.is_set():
            raise _Stopped() from None  # our own abort() cut it
        raise _Retry(f"{type(exc).__name__}: {_first_line(exc)}") from exc
    except requests.RequestException as exc:
        raise _NextMirror(f"{type(exc).__name__}: {_first_line(exc)}") from exc
    except OSError as exc:  # the partial file, not the network (requests' errors are above)
        if stop.is_set():
            raise _Stopped() from None
        if exc.errno in _NO_SPACE:
            raise _NoSpace() from None
        if exc.errno == errno.ELOOP:
            raise _ItemFailed(
                f"{partial} is a symbolic link; envbuild does not write through links"
            ) from None
        raise _ItemFailed(f"cannot write {partial}: {exc.strerror}") from None
    finally:
        activity.end(item.filename)
    return hasher.hexdigest(), resume


def _open_partial(partial: Path, append: bool) -> BinaryIO:
    """The partial file for writing, unbuffered (what write() returns is on its way to disk),
    never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(partial, flags | (os.O_APPEND if append else os.O_TRUNC), 0o644)
    return cast(BinaryIO, open(fd, "ab" if append else "wb", buffering=0))


def _write_all(out: BinaryIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[out.write(view) :]


def _check_status(resp: requests.Response, offset: int) -> None:
    """Sort an HTTP status into go on, try again later, or try the next mirror."""
    code = resp.status_code
    if code in (200, 206) or (code == 416 and offset):
        return
    if code == 429 or code >= 500:
        raise _Retry(f"HTTP {code}", _retry_after(resp))
    raise _NextMirror(f"HTTP {code}")


def _retry_after(resp: requests.Response) -> float:
    try:
        return min(float(resp.headers.get("Retry-After", 0)), MAX_RETRY_AFTER)
    except ValueError:
        return 0.0  # an HTTP date: fall back to our own backoff


def _range_start(resp: requests.Response) -> int | None:
    match = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def _sha256_of(path: Path) -> "hashlib._Hash":
    """A running sha256 seeded with the file's bytes, to continue hashing a resumed download."""
    from envbuilder.tools.digest import sha256_hasher

    return sha256_hasher(path)[0]


def sha256_file(path: Path) -> str:
    from envbuilder.tools.digest import sha256_file as digest

    return digest(path)[0]


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [""])[0][:200]


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass  # partial downloads remain, kept for resuming


class FetchFailed(ActionError):
    """fetch_all's failure: `report` of what did arrive, `no_space` when the disk filled up."""

    def __init__(self, message: str, report: FetchReport, no_space: bool = False):
        super().__init__(message)
        self.report, self.no_space = report, no_space


def _no_space_error(report: FetchReport, dest: Path, items: list[FetchItem]) -> FetchFailed:
    done = set(report.downloaded) | set(report.skipped) | {f.filename for f in report.failed}
    need = 0
    for item in items:
        if item.filename not in done and item.size is not None:
            partial = dest / PARTIAL_DIR / item.filename
            need += max(item.size - (partial.stat().st_size if partial.is_file() else 0), 0)
    return FetchFailed(
        f"No space left on the disk that holds {dest}"
        + (f": the files still to fetch need about {human_size(need)} more" if need else "")
        + ". Free space there (or download elsewhere), then run again: the files that arrived "
        f"are kept, and the partial downloads in {dest / PARTIAL_DIR} resume.",
        report,
        no_space=True,
    )


def _failure_error(report: FetchReport, dest: Path, total: int) -> FetchFailed:
    details = "; ".join(f"{f.filename} ({f.reason})" for f in report.failed)
    return FetchFailed(
        f"Could not download {len(report.failed)} of {total} file(s) into {dest}: {details}. "
        f"The other files are in place, and partial downloads stay in {dest / PARTIAL_DIR} to "
        "resume from. Check that the mirrors are reachable and serve these files (a hash "
        "mismatch means the mirror or the lockfile is wrong), then run the export again.",
        report,
    )


class TerminalProgress:
    """Default display: files, bytes (of the total the lock's sizes give), rate and ETA. On a
    TTY one line redrawn in place; elsewhere (a CI log, a pipe) a plain line every `interval`
    seconds, never a carriage return, so a long download shows life. A download that waits for
    bytes is said on a line of its own either way (a log shows why nothing moves)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        min_interval: float = 0.1,
        interval: float = 12.0,
        clock: Callable[[], float] = time.monotonic,
        label: str = "fetch",
    ):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.min_interval = min_interval  # redraws per second are bounded, not per chunk
        self.interval, self.clock, self.label = interval, clock, label
        self._lock = threading.Lock()
        self._start = self._drawn = self._said = clock()
        self.total = self.bytes = self.expected = 0
        self.counts = {"done": 0, "skipped": 0, "failed": 0}

    def __call__(self, event: FetchEvent) -> None:
        with self._lock:
            if event.kind == "begin":
                self.total, self.expected = event.total, event.nbytes
                self._start = self._said = self.clock()
            elif event.kind == "progress":
                self.bytes += event.nbytes
            elif event.kind in self.counts:
                self.counts[event.kind] += 1
            if event.kind == "end":
                self._finish()
            elif event.kind == "stalled":
                self.stream.write(("\r\x1b[K" if self.tty else "") + event.message + "\n")
                self.stream.flush()
                if self.tty:
                    self._draw(force=True)
            elif self.tty:
                self._draw(force=event.kind != "progress")
            elif self.clock() - self._said >= self.interval:
                self._said = self.clock()
                self.stream.write(f"{self.label}: {self._status()}\n")
                self.stream.flush()

    def _rate(self) -> float:
        return self.bytes / max(self.clock() - self._start, 1e-6)

    def _status(self) -> str:
        finished = sum(self.counts.values())
        rate = self._rate()
        text = f"{finished}/{self.total} files  {human_size(self.bytes)}"
        if self.expected:
            text += f" of {human_size(self.expected)}"
        text += f"  {human_size(rate)}/s"
        left = self.expected - self.bytes
        if self.expected and rate > 0 and left > 0:
            text += f"  ETA {clock_text(left / rate)}"
        return text

    def _draw(self, force: bool) -> None:
        now = self.clock()
        if not force and now - self._drawn < self.min_interval:
            return
        self._drawn = now
        self.stream.write(f"\r{self._status()}\x1b[K")
        self.stream.flush()

    def _finish(self) -> None:
        elapsed = self.clock() - self._start
        c = self.counts
        self.stream.write(
            ("\r\x1b[K" if self.tty else "") + f"fetched {c['done']}, already present {c['skipped']}, "
            f"failed {c['failed']} of {self.total} files: {human_size(self.bytes)} "
            f"in {elapsed:.1f} s ({human_size(self._rate())}/s)\n"
        )
        self.stream.flush()


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
