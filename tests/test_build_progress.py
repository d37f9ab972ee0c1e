"""Progress a person can follow while `envbuild build` runs: a recorded BuildKit log (real, from
this machine's engine) replayed through the step log with a fake clock, as a CI log (no terminal)
and on a terminal."""

from __future__ import annotations

import io
from pathlib import Path

from envbuilder.engines.docker import StepLog, default_echo

LOG = (Path(__file__).parent / "fixtures" / "buildlogs" / "buildkit-20.10-plain.log").read_text()
STEP = '[runtime 3/6] RUN for i in 1 2 3 4 5; do echo "installing wheel part $i"; sleep 2; done'


def replay(tty: bool, seconds_per_output_line: float = 7.0) -> str:
    """The recorded lines, with the clock moving on while the long step prints its output and
    the heartbeat ticking every second of it, as run_build's timer does."""
    now = [0.0]
    out = io.StringIO()
    log = StepLog(out=out, tty=tty, beat=12.0, clock=lambda: now[0])
    for line in LOG.splitlines():
        log(line)
        if line.startswith("#6 ") and "installing wheel part" in line and "[" not in line:
            for _ in range(int(seconds_per_output_line)):
                now[0] += 1.0
                log.tick()
    log.close(0)
    return out.getvalue()


def test_a_ci_log_gets_each_step_with_its_time_cached_marks_in_order_and_a_line_of_life():
    text = replay(tty=False)
    assert "\r" not in text  # never a carriage-return spinner in a log
    lines = text.splitlines()
    done = [l for l in lines if not l.startswith("  ... ")]
    assert done == [
        "  [builder 2/3] RUN python3 -c \"print('builder step')\"  CACHED",
        '  [builder 3/3] RUN echo "compiling"; sleep 3; echo done  CACHED',
        "  [runtime 2/6] RUN python3 -m venv /opt/venv  CACHED",
        f"  {STEP}  done in 10s",
        "  [runtime 4/6] COPY --from=builder /etc/hostname /tmp/from-builder  done in 0.0s",
        '  [runtime 5/6] RUN python -c "import sys; print(sys.version)"  done in 0.1s',
        "  [runtime 6/6] RUN echo changed-step  done in 0.1s",
        "build done in 35s: 7 steps, 3 cached, 4 run",
    ]
    beats = [l for l in lines if l.startswith("  ... ")]
    assert beats == [
        f"  ... {STEP}  running 12s (installing wheel part 2)",
        f"  ... {STEP}  running 24s (installing wheel part 4)",
    ]


def test_on_a_terminal_the_running_step_is_one_line_rewritten_in_place():
    text = replay(tty=True)
    status = text.split("\n", 1)[0]
    assert status.count("\r\x1b[K") == 36  # a rewrite a second while it runs, then cleared
    assert "running 35s (installing wheel part 5)\r\x1b[K  [builder 2/3]" in status
    assert (
        text.split("\n")[1:-1]
        == [l for l in replay(tty=False).splitlines() if not l.startswith("  ... ")][1:]
    )


def test_verbose_shows_the_whole_log_and_other_engines_keep_their_step_headers():
    assert not isinstance(default_echo(True), StepLog)
    assert isinstance(default_echo(False), StepLog)
    assert not isinstance(default_echo(False, r"^STEP \d+/\d+: "), StepLog)  # podman, buildah
