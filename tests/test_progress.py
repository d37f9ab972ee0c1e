"""The shared progress pieces: elapsed-time spelling and the heartbeat of steps that have no
progress of their own (lock's resolver and solver)."""

from __future__ import annotations

import io
import time

import pytest

from envbuilder.progress import Heartbeat, clock_text


@pytest.mark.parametrize(
    "seconds,text",
    [
        (0.04, "0.0s"),
        (4.25, "4.2s"),
        (9.94, "9.9s"),
        (10.2, "10s"),
        (59.4, "59s"),
        (60, "1m00s"),
        (185.0, "3m05s"),
        (-1, "0.0s"),
    ],
)
def test_clock_text(seconds, text):
    assert clock_text(seconds) == text


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_heartbeat_off_a_terminal_says_a_plain_line_every_interval():
    clock, lines = FakeClock(), []
    hb = Heartbeat("p40: pip part", lines.append, every=12, clock=clock, detail=lambda: "resolving")
    hb.start = hb.last = clock()
    for _ in range(30):  # 30 one-second ticks: beats at 12 s and 24 s only
        clock.now += 1
        hb.beat()
    assert lines == ["p40: pip part: running 12s (resolving)", "p40: pip part: running 24s (resolving)"]
    assert not any("\r" in line for line in lines)


def test_heartbeat_on_a_terminal_rewrites_one_line_and_clears_it():
    out = io.StringIO()
    clock = FakeClock()
    hb = Heartbeat("h100: conda part", stream=out, clock=clock, tty=True)
    with hb:
        clock.now += 3
        hb.beat()
        clock.now += 2
    text = out.getvalue()
    assert "\r\x1b[Kh100: conda part: running 3.0s" in text
    assert text.endswith("\r\x1b[Kh100: conda part: done in 5.0s\n")


def test_heartbeat_names_a_step_that_failed_and_a_broken_detail_never_stops_the_work():
    lines: list[str] = []

    def broken():
        raise RuntimeError("no note")

    clock = FakeClock()
    with pytest.raises(ValueError):
        with Heartbeat("p40: images", lines.append, every=1, clock=clock, detail=broken) as hb:
            clock.now += 2
            hb.beat()
            raise ValueError("registry said no")
    assert lines == ["p40: images: running 2.0s", "p40: images: stopped in 2.0s"]


def test_heartbeat_thread_beats_while_the_work_runs():
    lines: list[str] = []
    with Heartbeat("t4: pip part", lines.append, every=0.5):
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and not lines:  # the thread ticks once a second
            time.sleep(0.1)
    assert lines[0].startswith("t4: pip part: running ")
    assert lines[-1].startswith("t4: pip part: done in ")
