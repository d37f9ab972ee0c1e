"""`envbuild install` under faults, with stand-ins: a wheelhouse whose install.sh is a short
script, and a loopback index that answers envbuild's probe and then keeps uv waiting (or says
404). Real processes, real signals: what each test proves is what is left on the machine after a
SIGTERM, a Ctrl-C, a second install beside the first, a prefix that takes no write, a user's own
file where the rendered folder goes, and the environment every child of the install sees.

(The real offline route, install.sh with pip, the patches and the audit, is in test_wheelhouse.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import envbuilder
from envbuilder.context.prepare import prepare
from envbuilder.render.context import BuildContext
from mounts import mounted  # noqa: F401  (a fixture)
from test_lock import _python310

STANDIN_MANIFEST = {"format": 1, "files": {}, "profiles": {"p40": {"python": "3.10", "files": []}}}


def standin_wheelhouse(root: Path, script: str) -> Path:
    """A wheelhouse envbuild install accepts for p40, whose install.sh is `script` (bash)."""
    wh = root / "wh"
    wh.mkdir()
    (wh / "install.sh").write_text("#!/usr/bin/env bash\nset -eu\n" + script)
    (wh / "manifest.json").write_text(json.dumps(STANDIN_MANIFEST))
    return wh


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of an `envbuild install` child: the caller's without pip's, uv's index
    or envbuild's settings, its own TMPDIR and caches (so what it leaves there can be seen)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "ENVBUILD_", "UV_INDEX"))}
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin",
        TMPDIR=str(tmp),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        UV_CACHE_DIR=str(tmp_path / "uv-cache"),
        PYTHONPATH=str(Path(envbuilder.__file__).parent.parent),  # (the envbuilder under test)
    )
    env.update(extra)
    return env


def start(args: list[str], tmp_path: Path, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "envbuilder", "install", *args],
        env=child_env(tmp_path, **extra),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def install(
    args: list[str], tmp_path: Path, timeout: float = 300, **extra: str
) -> subprocess.CompletedProcess[str]:
    p = start(args, tmp_path, **extra)
    out, err = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def wait_for(check, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def pids_with(text: str) -> list[int]:
    """Processes (other than zombies) whose command line holds `text`."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and alive(int(entry.name)):
                out.append(int(entry.name))
    return out


class Index:
    """A loopback index: envbuild's probe (python-requests) gets answers; uv's requests wait
    `hang` seconds (hang=0: a 404 at once). `asked` is set at uv's first request."""

    def __init__(self, hang: float):
        self.hang = hang
        self.asked = threading.Event()
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if "uv/" in (self.headers.get("User-Agent") or ""):
                    index.asked.set()
                    time.sleep(index.hang)
                    self.send_error(404)
                    return
                body = b"<html><body></body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                # a hanging answer outlives its client (uv gave up, the test ended): its broken
                # pipe is expected, and its traceback, printed from a handler thread into a later
                # test's captured stderr, failed that test (test_readers_hypothesis, CI run)
                pass

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def args(self) -> list[str]:
        base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return ["--index-url", f"{base}/simple", "--torch-index-url", f"{base}/whl/cu118"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(autouse=True)
def no_leftovers(tmp_path):
    """A test that fails still ends what it started (each process names its tmp_path)."""
    yield
    for pid in pids_with(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def index():
    made: list[Index] = []

    def make(hang: float) -> Index:
        made.append(Index(hang))
        return made[-1]

    yield make
    for i in made:
        i.close()


# ---- signals: children end, and a re-run goes on ---------------------------------------------------


def test_sigterm_during_a_wheelhouse_install_ends_install_sh_and_what_it_started(tmp_path):
    """SIGTERM to envbuild while install.sh's pip runs: envbuild ends install.sh and its
    children (in a session of their own, as the terminal would not), says so, exits 143."""
    pids = tmp_path / "pids"
    wh = standin_wheelhouse(
        tmp_path, f'(exec -a "sleep {tmp_path}" sleep 300) & echo "$$ $!" > {pids}; wait\n'
    )
    p = start(["p40", "--prefix", str(tmp_path / "env"), "--from-wheelhouse", str(wh)], tmp_path)
    wait_for(lambda: pids.is_file() and len(pids.read_text().split()) == 2, "install.sh")
    script, child = map(int, pids.read_text().split())
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    wait_for(lambda: not alive(script) and not alive(child), "install.sh and its sleep to end", 20)
    assert p.returncode == 143 and "Terminated" in err and "Traceback" not in err, err[-2000:]


def test_sigterm_during_an_online_install_ends_uv_removes_its_work_folder_and_a_rerun_goes_on(
    tmp_path, index
):
    """SIGTERM while uv installs into the prefix (uv waits on the index): uv is ended, verify's
    work folder leaves TMPDIR, the prefix keeps its venv and marker, and the same command goes on
    with that venv."""
    prefix = tmp_path / "env"
    slow = index(hang=120)
    args = ["p40", "--prefix", str(prefix), "--interpreter", _python310()]
    p = start([*args, *slow.args()], tmp_path)
    assert slow.asked.wait(120), "uv never asked the index"
    assert pids_with(str(prefix / "bin" / "python")), "no uv installing into the prefix"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143 and "Traceback" not in err, err[-2000:]
    wait_for(lambda: not pids_with(str(prefix / "bin" / "python")), "uv to end", 20)
    assert list((tmp_path / "tmp").iterdir()) == []  # (verify's work folder removed)
    assert (prefix / "bin" / "python").exists() and (prefix / ".envbuild-install").is_file()

    quick = index(hang=0)
    r = install([*args, *quick.args()], tmp_path)
    assert "going on with the environment an earlier run made" in r.stderr, r.stderr[-2000:]
    assert r.returncode == 1 and "Traceback" not in r.stderr  # (the stand-in index has no packages)


def has_pip(prefix: Path) -> bool:
    return any(prefix.glob("lib/python*/site-packages/pip-*.dist-info/RECORD"))


def test_ctrl_c_during_the_venv_step_leaves_a_prefix_the_next_run_finishes(tmp_path, index):
    """Ctrl-C while `python -m venv` seeds pip: the venv is left without pip; the next run makes
    it whole (pip check and the patches need its pip) instead of going on without it for good."""
    prefix = tmp_path / "env"
    quick = index(hang=0)
    args = ["p40", "--prefix", str(prefix), "--interpreter", _python310(), *quick.args()]
    p = start(args, tmp_path)
    wait_for(lambda: (prefix / "pyvenv.cfg").exists(), "the venv step")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert not has_pip(prefix)  # (stopped before ensurepip finished: the case under test)

    r = install(args, tmp_path)
    assert has_pip(prefix), r.stderr[-2000:]
    ran = subprocess.run([prefix / "bin" / "python", "-m", "pip", "--version"], capture_output=True)
    assert ran.returncode == 0
    assert r.returncode == 1 and "Traceback" not in r.stderr  # (the stand-in index has no packages)


# ---- the prefix: held by one install, written only where it may be ----------------------------------


def venv_310(path: Path) -> Path:
    subprocess.run([_python310(), "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def test_a_second_install_into_the_same_prefix_is_refused_while_the_first_runs(tmp_path):
    """Two installs into one prefix would race (one's pip over the other's venv): the second
    says another install holds the prefix, exit 2, and touches nothing; the first goes on."""
    started = tmp_path / "started"
    wh = standin_wheelhouse(tmp_path, f'echo $$ > {started}; exec -a "sleep {tmp_path}" sleep 300\n')
    args = ["p40", "--prefix", str(tmp_path / "env"), "--from-wheelhouse", str(wh)]
    first = start(args, tmp_path)
    wait_for(started.is_file, "the first install's install.sh")
    second = install(args, tmp_path, timeout=60)
    assert second.returncode == 2, second.stderr[-2000:]
    assert "Another envbuild install is installing into" in second.stderr and "--prefix" in second.stderr
    assert started.read_text().split() == [started.read_text().split()[0]]  # (install.sh ran once)
    assert first.poll() is None  # (the first is still at work)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)


def test_an_unwritable_prefix_is_bad_input_said_plainly(tmp_path, mounted):
    """A --prefix on a read-only file system, new or existing: exit 2 with what to do, on both
    routes, not an internal error."""
    ro = mounted("ro,size=1m")
    wh = standin_wheelhouse(tmp_path, "exit 0\n")
    for prefix in (ro / "env", ro):
        r = install(["p40", "--prefix", str(prefix), "--from-wheelhouse", str(wh)], tmp_path)
        assert r.returncode == 2 and ("takes no write" in r.stderr or "cannot be made" in r.stderr), r.stderr
        assert "internal error" not in r.stderr and "Pass a path in a folder you can write to" in r.stderr


def test_an_unwritable_prefix_is_bad_input_on_the_online_route_too(tmp_path, mounted, index):
    ro = mounted("ro,size=1m")
    quick = index(hang=0)
    r = install(["p40", "--prefix", str(ro / "env"), "--interpreter", _python310(), *quick.args()], tmp_path)
    assert r.returncode == 2 and "cannot be made" in r.stderr, r.stderr[-2000:]
    assert "internal error" not in r.stderr


def test_a_users_own_file_in_prefix_envbuild_is_kept_unless_force(tmp_path):
    """PREFIX/envbuild/README.md of the user's own, in the environment a wheelhouse installs
    into: refused before anything is installed, as render refuses it (exit 2, --force named);
    with --force, replaced."""
    prefix = venv_310(tmp_path / "env")
    (prefix / "envbuild").mkdir()
    (prefix / "envbuild" / "README.md").write_text("my notes\n")
    ran = tmp_path / "ran"
    wh = standin_wheelhouse(tmp_path, f"touch {ran}\n")
    args = ["p40", "--prefix", str(prefix), "--from-wheelhouse", str(wh)]
    r = install(args, tmp_path)
    assert r.returncode == 2 and "--force" in r.stderr and "was not written by envbuild" in r.stderr, r.stderr
    assert (prefix / "envbuild" / "README.md").read_text() == "my notes\n" and not ran.exists()
    r = install([*args, "--force"], tmp_path)
    assert ran.exists() and (prefix / "envbuild" / "README.md").read_text() != "my notes\n", r.stderr[-2000:]


def test_a_damaged_install_marker_names_a_new_prefix_as_the_way_on(tmp_path):
    prefix = tmp_path / "env"
    prefix.mkdir()
    (prefix / ".envbuild-install").write_bytes(b"p40\xff\n")  # (not UTF-8)
    r = install(["p40", "--prefix", str(prefix), "--interpreter", _python310()], tmp_path)
    assert r.returncode == 2 and "not UTF-8" in r.stderr and "pass a new --prefix" in r.stderr, r.stderr
    (prefix / ".envbuild-install").write_bytes(b"p40\n" * 2000)  # (larger than any marker)
    r = install(["p40", "--prefix", str(prefix), "--interpreter", _python310()], tmp_path)
    assert r.returncode == 2 and "pass a new --prefix" in r.stderr, r.stderr


# ---- what the children see, and what is printed -----------------------------------------------------


def test_install_sh_sees_none_of_the_callers_python_settings(tmp_path):
    """A checkout on PYTHONPATH (or a startup file, a user base) is not the environment: pip
    would call it installed and apply_patches.py patch it. install.sh runs without them."""
    seen = tmp_path / "seen"
    wh = standin_wheelhouse(tmp_path, f"env > {seen}\n")
    prefix = venv_310(tmp_path / "env")
    checkout = tmp_path / "verl-checkout"
    checkout.mkdir()
    install(
        ["p40", "--prefix", str(prefix), "--from-wheelhouse", str(wh)],
        tmp_path,
        PYTHONPATH=f"{checkout}:{Path(envbuilder.__file__).parent.parent}",
        PYTHONSTARTUP=str(checkout / "startup.py"),
        PYTHONUSERBASE=str(checkout),
    )
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert not {"PYTHONPATH", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONHOME"} & set(env), env
    assert env.get("PYTHONNOUSERSITE") == "1"


def test_a_byte_that_is_no_utf8_in_install_sh_output_is_shown_not_a_crash(tmp_path):
    """install.sh's output passes through envbuild to the terminal: a byte that is no UTF-8 is
    replaced, an escape sequence shown as text; the failure is reported as install.sh's."""
    wh = standin_wheelhouse(tmp_path, r"printf 'bad \xff byte \033]0;owned\007\n'; exit 3" + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "envbuilder", "install", "p40", "--prefix", str(tmp_path / "env")]
        + ["--from-wheelhouse", str(wh)],
        env=child_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
    )
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 1 and "internal error" not in err and "install.sh" in err, err
    assert b"\x1b" not in r.stderr + r.stdout and "bad \ufffd byte \\x1b]0;owned\\x07" in err


def test_the_closing_line_trains_as_written(tmp_path):
    """The summary's `train with` line, run as printed in bash, reaches the rendered folder's
    preflight.py (the run script finds it through ENVBUILD_HOME: outside an image there is no
    /opt/envbuild)."""
    from envbuilder.machine.install import InstallReport, summary
    from envbuilder.render.files import render_files, write_dir

    from conftest import resolved

    prefix = venv_310(tmp_path / "env")
    home = prefix / "envbuild"
    write_dir(home, render_files(BuildContext.of(resolved("p40"))))
    reached = tmp_path / "reached"
    (home / "preflight.py").write_text(
        f"import pathlib, sys; pathlib.Path({str(reached)!r}).write_text(sys.executable)\nsys.exit(7)\n"
    )
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.parquet").touch()
    (data / "test.parquet").touch()
    line = summary(InstallReport("p40", str(prefix), "wheelhouse", ok=True)).splitlines()[-1]
    command = line.split("train with `", 1)[1].rsplit("`", 1)[0]
    r = subprocess.run(
        ["bash", "-c", command],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DATA_DIR": str(data)},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert reached.is_file(), r.stderr[-2000:]
    assert reached.read_text().startswith(str(prefix / "bin"))  # (the environment's Python)
    assert r.returncode == 7


def test_install_mirror_fills_the_pytorch_index_variant(cli, monkeypatch, tmp_path):
    """--mirror cn: its PyTorch endpoint is .../whl/{variant}; the install gets the profile's
    variant filled in (cu118 for p40), as a build's RUN steps do."""
    import envbuilder.machine.install as I

    got = {}

    def fake(ctx, prefix, **kw):
        got.update(kw)
        return I.InstallReport(ctx.env.profile, str(prefix), "online", ok=True)

    monkeypatch.setattr(I, "install", fake)
    code, out, err = cli("install", "p40", "--prefix", tmp_path / "env", "--mirror", "cn")
    assert code == 0, err
    assert got["torch_index_url"].reveal() == "https://mirrors.nju.edu.cn/pytorch/whl/cu118"
    assert got["index_url"].reveal() == "https://pypi.tuna.tsinghua.edu.cn/simple"


def test_install_mirror_goes_through_prepare(cli, monkeypatch, tmp_path):
    """--mirror cn joins the environment in context.prepare, as it does for render and build:
    the install's steps and its PREFIX/envbuild/ are the files of prepare(env, mirror=cn)."""
    import envbuilder.machine.install as I
    from conftest import resolved, shipped
    from envbuilder.model import mirrors as M
    from envbuilder.render.files import render_files

    got = {}

    def fake(ctx, prefix, **kw):
        got["ctx"] = ctx
        return I.InstallReport(ctx.env.profile, str(prefix), "online", ok=True)

    monkeypatch.setattr(I, "install", fake)
    assert cli("install", "p40", "--prefix", tmp_path / "env", "--mirror", "cn")[0] == 0
    m = shipped()
    want = prepare(resolved("p40"), mirror=M.choice("cn", M.get_set(m, "cn")))
    ctx = got["ctx"]
    assert ctx.mirror == want.mirror and ctx.env == want.env and ctx.constraints == want.constraints
    assert ctx.env.mirror is not None and ctx.env.mirror.name == "cn"
    assert render_files(ctx) == render_files(want)


def test_a_bounded_tool_run_ends_its_group_on_sigterm(tmp_path):
    """tools.run.run (lock's uv, the wheelhouse's sdist builds) under cli.main's SIGTERM
    handler: the tool's whole process group ends with the command, as on Ctrl-C."""
    pid_file = tmp_path / "tool.pid"
    code = (
        "import sys\n"
        "from envbuilder.tools.run import run, sigterm_as_interrupt\n"
        "with sigterm_as_interrupt():\n"
        f"    run(['bash', '-c', '(exec -a \"sleep {tmp_path}\" sleep 300) & echo $! > {pid_file}; wait'])\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], env=child_env(tmp_path), stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip(), "the tool")
    tool = int(pid_file.read_text())
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert "Terminated" in err and p.returncode == 1  # (uncaught here: cli.main says it, exit 143)
    wait_for(lambda: not alive(tool), "the tool's child to end", 20)


def test_a_signal_on_the_first_line_after_the_tool_starts_still_ends_its_group(tmp_path):
    """The race the test above lost under CI's load: the tool had started its own child before
    this process ran again, and the signal was raised on run()'s first line after Popen, before
    its guard (there: making the readers), so nothing stopped the tool. The signal is planted
    exactly there: the readers' Thread raises Terminated as it is made."""
    pid_file = tmp_path / "tool.pid"
    code = (
        "import threading, time\n"
        "from envbuilder.tools import run as R\n"
        "class Late(threading.Thread):\n"
        "    def __init__(self, *a, **k):\n"
        f"        while not __import__('os').path.exists({str(pid_file)!r}): time.sleep(0.05)\n"
        "        raise R.Terminated()\n"
        "R.threading.Thread = Late\n"
        f"R.run(['bash', '-c', '(exec -a \"sleep {tmp_path}\" sleep 300) & echo $! > {pid_file}; wait'])\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], env=child_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert "Terminated" in p.stderr and p.returncode == 1, p.stderr
    tool = int(pid_file.read_text())
    wait_for(lambda: not alive(tool), "the tool's child to end", 20)


def test_the_wheelhouse_route_finds_the_locks_python_as_the_online_route_does(tmp_path):
    """Issue 44, Medium 4. Before: install.sh took python3 (here 3.11) and refused "the lock is
    for Python 3.10, and python3 is Python 3.11", though the pyenv 3.10 the online route finds
    was there. Now install finds it (tools/python.py's one search) and hands it to install.sh."""
    seen = tmp_path / "seen"
    wh = standin_wheelhouse(tmp_path, f'echo "${{PYTHON:-}}" > {seen}\nexit 1\n')
    r = install(["p40", "--prefix", str(tmp_path / "env"), "--from-wheelhouse", str(wh)], tmp_path)
    assert r.returncode == 1, r.stderr
    python = seen.read_text().strip()
    assert python, "install.sh was given no PYTHON"
    got = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    assert got.stdout.strip() == "(3, 10)", (python, got)
    assert python == _python310() or "3.10" in python


def test_no_python_of_the_wheelhouse_lock_names_installs_own_interpreter_option(tmp_path):
    """No Python 3.99 anywhere: refused before install.sh runs (exit 2), naming install's own
    --interpreter, not install.sh's PYTHON=."""
    ran = tmp_path / "ran"
    wh = standin_wheelhouse(tmp_path, f"touch {ran}\n")
    manifest = json.loads((wh / "manifest.json").read_text())
    manifest["profiles"]["p40"]["python"] = "3.99"
    (wh / "manifest.json").write_text(json.dumps(manifest))
    r = install(["p40", "--prefix", str(tmp_path / "env"), "--from-wheelhouse", str(wh)], tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Python 3.99" in r.stderr and "--interpreter" in r.stderr and "Traceback" not in r.stderr
    assert not ran.exists() and not (tmp_path / "env").exists()


def test_the_online_route_lists_only_the_profiles_layers_from_a_work_folder_named_install(
    tmp_path, monkeypatch
):
    """p40 has no vLLM layer (its rollout is HF): install lists no `✓ layer vllm`; and the folder
    it works in says install, not verify (issue 44)."""
    from conftest import resolved
    from envbuilder.machine import install as I
    from envbuilder.machine import verify as V
    from envbuilder.tools.python import Interpreter

    env = resolved("p40")
    seen = {}

    def run(self, work, venv):
        seen["work"] = work.name
        self.r.layers = [
            {"layer": "torch", "requirements": ["torch"], "ok": True, "seconds": 3.0, "pip_check": None},
            {
                "layer": "vllm",
                "requirements": [],
                "ok": True,
                "seconds": 0.0,
                "empty": True,
                "pip_check": None,
            },
        ]
        return self.r

    monkeypatch.setattr(V._Verifier, "run", run)
    (tmp_path / "env").mkdir()
    report = I.InstallReport(env.profile, str(tmp_path / "env"), "online")
    interp = Interpreter(path=sys.executable, version="3.10.13")
    assert I._online(prepare(env), tmp_path / "env", interp, None, None, report, lambda line: None)
    assert [s["step"] for s in report.steps] == ["layer torch"]
    assert seen["work"].startswith("envbuild-install-p40-")


def test_an_online_install_whose_torch_build_only_the_pytorch_index_has_stops_when_it_is_down(
    cli, monkeypatch, tmp_path
):
    """p40's torch is 2.6.0+cu118, which only the PyTorch index has: with PyPI answering (a
    loopback index) and the PyTorch index not (a closed loopback port), the install stops
    before anything is made, naming the index, --torch-index-url and the wheelhouse route,
    instead of swapping in PyPI's torch of another CUDA (issue 44, Medium 5)."""
    import envbuilder.machine.install as I
    from httpfixtures import FileServer, closed_port_url

    def online(*a, **kw):
        raise AssertionError("the install went on without the PyTorch index")

    monkeypatch.setattr(I, "_online", online)
    prefix = tmp_path / "env"
    torch_index = closed_port_url("whl/cu118")
    with FileServer({"simple/": b"<html></html>"}) as pypi:
        code, out, err = cli(
            "install", "p40", "--prefix", prefix, "--interpreter", _python310(),
            "--index-url", pypi.url("simple/"), "--torch-index-url", torch_index,
        )  # fmt: skip
    assert code == 1, err
    assert torch_index in err and "--torch-index-url" in err
    assert "envbuild wheelhouse p40" in err and "--from-wheelhouse" in err
    assert not prefix.exists()


def test_an_online_install_probes_the_profiles_own_pytorch_index_and_only_where_it_has_one(
    monkeypatch, tmp_path
):
    """Without --torch-index-url the profile's PyTorch index is the one probed (a stand-in
    probe: no traffic); a profile on PyPI's default torch build (4090) probes none."""
    import envbuilder.machine.install as I
    import envbuilder.machine.verify as V
    from conftest import resolved
    from envbuilder.errors import ActionError

    asked: list[str] = []

    def answers(url, timeout=0.0):
        asked.append(url.reveal() if hasattr(url, "reveal") else url)
        return "pypi.org" in asked[-1]

    monkeypatch.setattr(V, "index_answers", answers)
    monkeypatch.setattr(I, "_interpreter", lambda *a: None)
    monkeypatch.setattr(I, "_online", lambda *a: False)
    with pytest.raises(ActionError, match="download.pytorch.org/whl/cu118"):
        I.install(prepare(resolved("p40")), tmp_path / "p40")
    assert asked == ["https://pypi.org/simple", "https://download.pytorch.org/whl/cu118"]
    asked.clear()
    assert not I.install(prepare(resolved("4090")), tmp_path / "4090").ok
    assert asked == ["https://pypi.org/simple"]
