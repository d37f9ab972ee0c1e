"""Parallel, hash-verified, resumable downloads: the engine under the offline wheelhouse export.

Every file is written to `dest/.partial/<name>`, hashed while it streams, and moved to
`dest/<name>` with `os.replace` only when its sha256 matches, so `dest/<name>` is either absent
or right. A partial left by a dropped connection (or an earlier run) is resumed with `Range`.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, TextIO

import requests
from requests.adapters import HTTPAdapter

from envbuilder.errors import ActionError, UserError

CHUNK = 64 * 1024  # small enough that a dropped connection loses little of what arrived
HASH_BLOCK = 1024 * 1024
PARTIAL_DIR = ".partial"
MAX_RETRY_AFTER = 60.0  # cap on a server's Retry-After, so one slow mirror cannot stall an export
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FetchItem:
    """One file to fetch: the same bytes at one or more mirror URLs, tried in order."""

    filename: str
    sha256: str
    urls: tuple[str, ...]
    size: int | None = None


@dataclass(frozen=True)
class FetchFailure:
    filename: str
    reason: str


@dataclass
class FetchReport:
    downloaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[FetchFailure] = field(default_factory=list)
    bytes_transferred: int = 0


@dataclass(frozen=True)
class FetchEvent:
    """What a progress callback receives, from any worker thread.

    kind: "begin" (total = number of files), "progress" (nbytes received), "retry" (message),
    "skipped", "done", "failed" (message), "end".
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
    """This URL will not serve the file (404, 403, ...): go to the next one."""


class _ItemFailed(Exception):
    """Every URL and retry for one item is spent; the message lists why."""


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
) -> FetchReport:
    """Fetch every item into `dest`, `jobs` at a time; raise ActionError if any failed.

    `retries` is per URL for transient failures, waiting `backoff * 2**n` seconds between tries.
    `progress=None` shows a TerminalProgress on stderr. A `session` passed in is used as is.
    """
    items = _validated(items)
    if jobs < 1:
        raise UserError(f"jobs must be at least 1, got {jobs}. "
                        "Pass a positive number of parallel downloads.")
    dest = Path(dest)
    (dest / PARTIAL_DIR).mkdir(parents=True, exist_ok=True)
    emit = progress or TerminalProgress()
    own_session = session is None
    session = session or _pooled_session(jobs)
    report = FetchReport()
    counted = _ByteCounter(emit)

    def work(item: FetchItem) -> str:
        return _fetch_one(item, dest, session, retries, backoff, timeout, counted, emit)

    emit(FetchEvent("begin", total=len(items)))
    try:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="fetch") as pool:
            futures = [(item, pool.submit(work, item)) for item in items]
            for item, future in futures:  # in input order, so reports are stable
                try:
                    outcome = future.result()
                except _ItemFailed as exc:
                    report.failed.append(FetchFailure(item.filename, str(exc)))
                    emit(FetchEvent("failed", item.filename, message=str(exc)))
                    continue
                done = report.skipped if outcome == "skipped" else report.downloaded
                done.append(item.filename)
    finally:
        report.bytes_transferred = counted.total
        emit(FetchEvent("end"))
        if own_session:
            session.close()
    _remove_if_empty(dest / PARTIAL_DIR)
    if report.failed:
        raise _failure_error(report, dest, len(items))
    return report


def _validated(items: Iterable[FetchItem]) -> list[FetchItem]:
    """Reject names that would escape `dest`, malformed hashes, and one name with two hashes."""
    by_name: dict[str, FetchItem] = {}
    for item in items:
        name = item.filename
        if not name or name in (".", "..", PARTIAL_DIR) or "/" in name or "\\" in name:
            raise UserError(f"Cannot fetch {name!r}: a file name must be a plain name inside the "
                            "destination directory. Fix the entry in the lockfile or wheel list.")
        if not _SHA256.fullmatch(item.sha256.lower()):
            raise UserError(f"Cannot fetch {name}: {item.sha256!r} is not a sha256 hex digest. "
                            "Regenerate the lockfile so every file carries its sha256.")
        if not item.urls:
            raise UserError(f"Cannot fetch {name}: it has no URL. "
                            "Add a mirror or index URL for it.")
        seen = by_name.get(name)
        if seen is not None and seen.sha256.lower() != item.sha256.lower():
            raise UserError(f"Cannot fetch {name}: it is listed twice with different hashes "
                            f"({seen.sha256} and {item.sha256}). Keep one entry in the lockfile.")
        by_name.setdefault(name, item)
    return list(by_name.values())


def _pooled_session(jobs: int) -> requests.Session:
    """A session whose pool keeps one connection per worker; retries are ours, not urllib3's."""
    session = requests.Session()
    adapter = HTTPAdapter(pool_connections=jobs, pool_maxsize=jobs, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class _ByteCounter:
    """Adds up bytes received across workers and reports each chunk as progress."""

    def __init__(self, emit: ProgressCallback):
        self._emit = emit
        self._lock = threading.Lock()
        self.total = 0

    def add(self, filename: str, nbytes: int) -> None:
        with self._lock:
            self.total += nbytes
        self._emit(FetchEvent("progress", filename, nbytes=nbytes))


def _fetch_one(item, dest, session, retries, backoff, timeout, counted, emit) -> str:
    """Fetch one item through its mirrors: "skipped" or "downloaded", or raise _ItemFailed."""
    target = dest / item.filename
    expected = item.sha256.lower()
    if target.is_file() and sha256_file(target) == expected:
        emit(FetchEvent("skipped", item.filename))
        return "skipped"
    partial = dest / PARTIAL_DIR / item.filename
    if item.size is not None and partial.is_file() and partial.stat().st_size > item.size:
        partial.unlink()  # longer than the file can be: not worth resuming
    errors: list[str] = []
    for url in item.urls:
        attempt = 0
        while attempt <= retries:
            try:
                got, resumed = _download(session, url, partial, item, timeout, counted)
            except _Retry as exc:
                errors.append(f"{exc} from {url}")
                attempt += 1
                if attempt <= retries:
                    emit(FetchEvent("retry", item.filename, message=errors[-1]))
                    time.sleep(max(backoff * 2 ** (attempt - 1), exc.after))
                continue
            except _NextMirror as exc:
                errors.append(f"{exc} from {url}")
                break
            if got == expected:
                os.replace(partial, target)
                emit(FetchEvent("done", item.filename))
                return "downloaded"
            partial.unlink(missing_ok=True)
            errors.append(f"sha256 mismatch from {url}: expected {expected}, got {got}")
            if not resumed:
                break  # this mirror serves other bytes than the lockfile names: try the next
            attempt += 1  # the stale part may be the bad one: fetch it whole once more here
    raise _ItemFailed("; ".join(dict.fromkeys(errors)))  # each distinct reason once


def _download(session, url, partial: Path, item: FetchItem, timeout, counted) -> tuple[str, bool]:
    """Complete `partial` from `url`; return its sha256 and whether earlier bytes were kept."""
    offset = partial.stat().st_size if partial.is_file() else 0
    if offset and offset == item.size:
        return sha256_file(partial), True  # whole already (e.g. stopped before the move)
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        with session.get(url, headers=headers, stream=True, timeout=timeout) as resp:
            _check_status(resp, offset)
            if resp.status_code == 416:
                return sha256_file(partial), True  # nothing left to send: the part is whole
            if resp.status_code == 206 and _range_start(resp) != offset:
                partial.unlink(missing_ok=True)  # bytes for another offset: start clean
                raise _Retry(f"unexpected Content-Range {resp.headers.get('Content-Range')!r}")
            resume = offset > 0 and resp.status_code == 206  # a 200 means start over
            hasher = _sha256_of(partial) if resume else hashlib.sha256()
            with open(partial, "ab" if resume else "wb") as out:
                for chunk in resp.iter_content(CHUNK):
                    out.write(chunk)
                    hasher.update(chunk)
                    counted.add(item.filename, len(chunk))
                out.flush()
                os.fsync(out.fileno())  # the bytes are on disk before os.replace publishes them
    except (requests.ConnectionError, requests.Timeout,
            requests.exceptions.ChunkedEncodingError) as exc:  # incl. a body cut short
        raise _Retry(f"{type(exc).__name__}: {_first_line(exc)}") from exc
    except requests.RequestException as exc:
        raise _NextMirror(f"{type(exc).__name__}: {_first_line(exc)}") from exc
    return hasher.hexdigest(), resume


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


def _sha256_of(path: Path):
    """A running sha256 seeded with the file's bytes, to continue hashing a resumed download."""
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(HASH_BLOCK), b""):
            hasher.update(block)
    return hasher


def sha256_file(path: Path) -> str:
    return _sha256_of(path).hexdigest()


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [""])[0][:200]


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass  # partial downloads remain, kept for resuming


def _failure_error(report: FetchReport, dest: Path, total: int) -> ActionError:
    details = "; ".join(f"{f.filename} ({f.reason})" for f in report.failed)
    err = ActionError(
        f"Could not download {len(report.failed)} of {total} file(s) into {dest}: {details}. "
        f"The other files are in place, and partial downloads stay in {dest / PARTIAL_DIR} to "
        "resume from. Check that the mirrors are reachable and serve these files (a hash "
        "mismatch means the mirror or the lockfile is wrong), then run the export again."
    )
    err.report = report
    return err


class TerminalProgress:
    """Default display: a line redrawn with \\r on a TTY; elsewhere one summary line at the end."""

    def __init__(self, stream: TextIO | None = None, min_interval: float = 0.1):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.min_interval = min_interval  # redraws per second are bounded, not per chunk
        self._lock = threading.Lock()
        self._start = self._drawn = time.monotonic()
        self.total = self.bytes = 0
        self.counts = {"done": 0, "skipped": 0, "failed": 0}

    def __call__(self, event: FetchEvent) -> None:
        with self._lock:
            if event.kind == "begin":
                self.total, self._start = event.total, time.monotonic()
            elif event.kind == "progress":
                self.bytes += event.nbytes
            elif event.kind in self.counts:
                self.counts[event.kind] += 1
            if event.kind == "end":
                self._finish()
            elif self.tty:
                self._draw(force=event.kind != "progress")

    def _rate(self) -> float:
        return self.bytes / max(time.monotonic() - self._start, 1e-6)

    def _draw(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._drawn < self.min_interval:
            return
        self._drawn = now
        finished = sum(self.counts.values())
        self.stream.write(f"\r{finished}/{self.total} files  {_human(self.bytes)}  "
                          f"{_human(self._rate())}/s\x1b[K")
        self.stream.flush()

    def _finish(self) -> None:
        elapsed = time.monotonic() - self._start
        c = self.counts
        self.stream.write(("\r\x1b[K" if self.tty else "")
                          + f"fetched {c['done']}, already present {c['skipped']}, "
                          f"failed {c['failed']} of {self.total} files: {_human(self.bytes)} "
                          f"in {elapsed:.1f} s ({_human(self._rate())}/s)\n")
        self.stream.flush()


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
