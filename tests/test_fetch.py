"""fetch_all against real loopback HTTP servers: one behaviour per test."""

from __future__ import annotations

import hashlib
import io
import os

import pytest

from envbuilder.errors import ActionError, UserError
from envbuilder.offline.fetch import FetchEvent, FetchItem, TerminalProgress, fetch_all
from httpfixtures import FileServer, closed_port_url

WHEEL = "demo-1.0-py3-none-any.whl"
DATA = os.urandom(300_000)  # several chunks, so a drop lands mid-body


def item_for(name, data, *urls, size=None):
    return FetchItem(name, hashlib.sha256(data).hexdigest(), tuple(urls), size)


def fetch(items, dest, **kwargs):
    """fetch_all with fast retries and no terminal output, as the tests want it."""
    kwargs.setdefault("backoff", 0.01)
    kwargs.setdefault("progress", lambda event: None)
    return fetch_all(items, dest, **kwargs)


def test_downloads_every_file_verified_into_dest(tmp_path):
    files = {f"pkg{i}-1.0-py3-none-any.whl": os.urandom(50_000 + i) for i in range(5)}
    with FileServer(files) as srv:
        report = fetch([item_for(n, d, srv.url(n)) for n, d in files.items()], tmp_path)
    assert sorted(report.downloaded) == sorted(files)
    assert report.bytes_transferred == sum(map(len, files.values()))
    assert all((tmp_path / n).read_bytes() == d for n, d in files.items())
    assert not (tmp_path / ".partial").exists()


def test_parallel_jobs_overlap_per_request_latency(tmp_path):
    files = {f"pkg{i}.whl": os.urandom(10_000) for i in range(8)}
    with FileServer(files, latency=0.3) as srv:
        fetch([item_for(n, d, srv.url(n)) for n, d in files.items()], tmp_path, jobs=8)
    # counted at the server, not timed: several requests were waiting out their latency at once
    assert srv.max_in_flight > 1


def test_dropped_connection_resumes_with_range_request(tmp_path):
    with FileServer({WHEEL: DATA}, script={WHEEL: ["drop"]}) as srv:
        report = fetch([item_for(WHEEL, DATA, srv.url(WHEEL))], tmp_path)
        ranges = [r.range for r in srv.requests_for(WHEEL)]
    assert ranges[0] is None
    assert ranges[1] is not None and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"
    assert (tmp_path / WHEEL).read_bytes() == DATA
    assert report.downloaded == [WHEEL]


def test_server_ignoring_range_restarts_from_scratch(tmp_path):
    with FileServer({WHEEL: DATA}, script={WHEEL: ["drop", "ignore-range"]}) as srv:
        fetch([item_for(WHEEL, DATA, srv.url(WHEEL))], tmp_path)
    assert (tmp_path / WHEEL).read_bytes() == DATA


def test_wrong_byte_fails_naming_file_and_both_hashes_leaving_no_file(tmp_path):
    good = item_for(WHEEL, DATA, "unused")
    got = hashlib.sha256(bytes([DATA[0] ^ 0xFF]) + DATA[1:]).hexdigest()
    with FileServer({WHEEL: DATA}, default="corrupt") as srv:
        with pytest.raises(ActionError) as caught:
            fetch([FetchItem(WHEEL, good.sha256, (srv.url(WHEEL),))], tmp_path)
    message = str(caught.value)
    assert caught.value.exit_code == 1
    assert WHEEL in message and good.sha256 in message and got in message
    assert caught.value.report.failed[0].filename == WHEEL
    assert not (tmp_path / WHEEL).exists()
    assert not (tmp_path / ".partial" / WHEEL).exists()


def test_404_on_first_mirror_falls_back_to_second(tmp_path):
    with FileServer({}) as empty, FileServer({WHEEL: DATA}) as mirror:
        fetch([item_for(WHEEL, DATA, empty.url(WHEEL), mirror.url(WHEEL))], tmp_path)
        assert len(empty.requests_for(WHEEL)) == 1  # a 404 is final: not retried
    assert (tmp_path / WHEEL).read_bytes() == DATA


def test_closed_port_first_mirror_falls_back_to_second(tmp_path):
    with FileServer({WHEEL: DATA}) as mirror:
        urls = (closed_port_url(WHEEL), mirror.url(WHEEL))
        fetch([item_for(WHEEL, DATA, *urls)], tmp_path, retries=1)
    assert (tmp_path / WHEEL).read_bytes() == DATA


def test_server_error_is_retried_on_the_same_mirror(tmp_path):
    with FileServer({WHEEL: DATA}, script={WHEEL: [503, 429]}) as srv:
        fetch([item_for(WHEEL, DATA, srv.url(WHEEL))], tmp_path)
        assert len(srv.requests_for(WHEEL)) == 3
    assert (tmp_path / WHEEL).read_bytes() == DATA


def test_present_valid_file_makes_no_request(tmp_path):
    (tmp_path / WHEEL).write_bytes(DATA)
    with FileServer({WHEEL: DATA}) as srv:
        report = fetch([item_for(WHEEL, DATA, srv.url(WHEEL))], tmp_path)
        assert srv.log == []
    assert report.skipped == [WHEEL] and report.bytes_transferred == 0


def test_corrupt_present_file_is_fetched_again(tmp_path):
    (tmp_path / WHEEL).write_bytes(b"not a wheel")
    with FileServer({WHEEL: DATA}) as srv:
        report = fetch([item_for(WHEEL, DATA, srv.url(WHEEL))], tmp_path)
    assert report.downloaded == [WHEEL]
    assert (tmp_path / WHEEL).read_bytes() == DATA


def test_stale_wrong_partial_is_discarded_and_fetched_whole(tmp_path):
    (tmp_path / ".partial").mkdir()
    (tmp_path / ".partial" / WHEEL).write_bytes(b"x" * 1000)  # left by some earlier run
    with FileServer({WHEEL: DATA}) as srv:
        fetch([item_for(WHEEL, DATA, srv.url(WHEEL))], tmp_path)
        ranges = [r.range for r in srv.requests_for(WHEEL)]
    assert ranges == ["bytes=1000-", None]
    assert (tmp_path / WHEEL).read_bytes() == DATA


def test_one_failure_does_not_stop_the_others(tmp_path):
    other = "other-1.0-py3-none-any.whl"
    with FileServer({other: DATA}) as srv:
        with pytest.raises(ActionError) as caught:
            fetch([item_for(WHEEL, DATA, srv.url(WHEEL)), item_for(other, DATA, srv.url(other))], tmp_path)
    report = caught.value.report
    assert report.downloaded == [other] and [f.filename for f in report.failed] == [WHEEL]
    assert "HTTP 404" in str(caught.value)


def test_unsafe_file_name_is_bad_input(tmp_path):
    with pytest.raises(UserError):
        fetch([item_for("../escape.whl", DATA, "http://127.0.0.1:9/x")], tmp_path)


def test_progress_reports_begin_bytes_and_end(tmp_path):
    events: list[FetchEvent] = []
    with FileServer({WHEEL: DATA}) as srv:
        fetch([item_for(WHEEL, DATA, srv.url(WHEEL))], tmp_path, progress=events.append)
    kinds = [e.kind for e in events]
    assert kinds[0] == "begin" and events[0].total == 1
    assert kinds[-2:] == ["done", "end"]
    assert sum(e.nbytes for e in events if e.kind == "progress") == len(DATA)


class FakeTty(io.StringIO):
    def isatty(self):
        return True


def test_terminal_progress_off_a_tty_prints_one_summary_line(tmp_path):
    out = io.StringIO()
    with FileServer({WHEEL: DATA}) as srv:
        fetch([item_for(WHEEL, DATA, srv.url(WHEEL))], tmp_path, progress=TerminalProgress(out))
    assert out.getvalue().count("\n") == 1
    assert out.getvalue().startswith("fetched 1, already present 0, failed 0 of 1 files")


def test_terminal_progress_on_a_tty_redraws_one_line(tmp_path):
    out = FakeTty()
    with FileServer({WHEEL: DATA}) as srv:
        fetch([item_for(WHEEL, DATA, srv.url(WHEEL))], tmp_path, progress=TerminalProgress(out))
    assert "\r1/1 files" in out.getvalue()
    assert out.getvalue().count("\n") == 1


def test_a_long_download_off_a_tty_says_files_bytes_rate_and_eta_every_interval():
    """A CI log of a 3 GB export: a plain line every 12 s (no carriage return) with the files,
    the bytes of the total the lock's sizes give, the rate and the time left."""
    now = [0.0]
    out = io.StringIO()
    p = TerminalProgress(out, interval=12.0, clock=lambda: now[0], label="wheelhouse")
    p(FetchEvent("begin", total=40, nbytes=3 << 30))
    for second in range(1, 31):  # 50 MiB a second for 30 s, a file done every 3 s
        now[0] = float(second)
        p(FetchEvent("progress", "torch.whl", nbytes=50 << 20))
        if second % 3 == 0:
            p(FetchEvent("done", f"f{second}.whl"))
    p(FetchEvent("end"))
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[:2] == [
        "wheelhouse: 3/40 files  600.0 MiB of 3.0 GiB  50.0 MiB/s  ETA 49s",
        "wheelhouse: 7/40 files  1.2 GiB of 3.0 GiB  50.0 MiB/s  ETA 37s",
    ]
    assert lines[2].startswith("fetched 10, already present 0, failed 0 of 40 files: 1.5 GiB")


# ---- faults that never end: an endless body, a stall, a stop ----------------------------------


def test_a_body_longer_than_the_locked_size_is_cut_off_and_removed(tmp_path):
    from faultserver import FaultServer

    with FaultServer({WHEEL: DATA}, default="endless") as srv:
        with pytest.raises(ActionError) as caught:
            fetch([item_for(WHEEL, DATA, srv.url(WHEEL), size=len(DATA))], tmp_path)
        sent = srv.sent_endless
    assert f"more than the {len(DATA)} bytes the lock records" in str(caught.value)
    assert not (tmp_path / WHEEL).exists() and not (tmp_path / ".partial" / WHEEL).exists()
    assert sent < 16 << 20  # it stopped reading; the server would have sent 64 MiB


def test_a_body_of_no_recorded_size_is_cut_off_at_the_cap(tmp_path, monkeypatch):
    from envbuilder.offline import fetch as F
    from faultserver import FaultServer

    monkeypatch.setattr(F, "MAX_UNSIZED", 1 << 20)
    with FaultServer({WHEEL: DATA}, default="endless") as srv:
        with pytest.raises(ActionError) as caught:
            fetch([item_for(WHEEL, DATA, srv.url(WHEEL))], tmp_path)
    assert f"more than the {1 << 20} bytes any file here may have" in str(caught.value)
    assert not (tmp_path / ".partial" / WHEEL).exists()


def test_a_stalled_download_is_reported_off_a_tty_and_then_completes(tmp_path):
    import threading

    from faultserver import FaultServer

    out = io.StringIO()
    with FaultServer({WHEEL: DATA}, script={WHEEL: ["stall"]}) as srv:
        threading.Timer(2.5, srv.release.set).start()
        fetch(
            [item_for(WHEEL, DATA, srv.url(WHEEL))],
            tmp_path,
            progress=TerminalProgress(out),
            stall_notice=1.0,
        )
    lines = out.getvalue().splitlines()
    assert lines[0] == f"waiting for {WHEEL} from 127.0.0.1:{srv.port}: no bytes for 1 s"
    assert lines[1].endswith("no bytes for 2 s")
    assert lines[-1].startswith("fetched 1,")
    assert (tmp_path / WHEEL).read_bytes() == DATA


def test_ctrl_c_stops_a_stalled_download_at_once_and_keeps_its_partial(tmp_path):
    """Ctrl-C while a mirror hangs mid-body: fetch_all returns (raising) within a second,
    starts no other file, and leaves the partial to resume from."""
    import time

    from faultserver import FaultServer

    others = {f"other{i}.whl": DATA for i in range(4)}
    stopped = []

    def ctrl_c(event):
        if event.kind == "stalled" and not stopped:
            stopped.append(time.monotonic())
            raise KeyboardInterrupt

    with FaultServer({WHEEL: DATA, **others}, script={WHEEL: ["stall"]}) as srv:
        items = [item_for(WHEEL, DATA, srv.url(WHEEL))] + [
            item_for(n, d, srv.url(n)) for n, d in others.items()
        ]
        with pytest.raises(KeyboardInterrupt):
            fetch(items, tmp_path, jobs=1, progress=ctrl_c, stall_notice=0.3)
        took = time.monotonic() - stopped[0]
        assert [r.path for r in srv.log] == [f"/{WHEEL}"]  # no other file started
    # (a bound with a wide margin for a loaded machine: the stalled download itself would
    # hold it until the server's release, which never comes)
    assert took < 8
    assert 0 < (tmp_path / ".partial" / WHEEL).stat().st_size < len(DATA)
    assert not (tmp_path / WHEEL).exists()
