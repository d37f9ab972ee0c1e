"""Every network client of envbuild against a loopback server that misbehaves (tests/faultserver.py):
bodies that never end, HTML where JSON belongs, JSON of the wrong kind, headers that drip or
stall, redirect loops and redirects to another host, credentials in URLs. Each client is driven
through its own code path (the registry client, the mirror probe, lock's and verify's index
probe, the wheelhouse's --build-index-url page, refresh's JSON client and range reader, the
flash-attn download, lock's source pins, export-image and import-image as commands), and each
must stop at its size cap or deadline with an error that says what happened, names the URL
without its credentials, and never is an internal error.

The memory of a command is measured where it runs (os.wait4's ru_maxrss of the child); in
process, the server's count of what it sent shows where the client stopped reading.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

pytest.importorskip("requests")

from faultserver import FaultServer  # noqa: E402
from httpfixtures import FileServer, closed_port_url  # noqa: E402

from envbuilder.errors import ActionError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MANIFEST = "v2/envbuild/app/manifests/1.0"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
SLACK = 8 << 20  # what socket buffers hold between a server that writes and a client that stopped
SECRET = "s3cr3t-pw"


def ref(srv: FaultServer) -> str:
    return f"127.0.0.1:{srv.port}/envbuild/app:1.0"


def within(fn, seconds: float):
    """(finished, result or exception) of fn() run in a thread for at most `seconds`: a client
    that hangs on a dripping server is a failure, not a test that never ends (the server stops
    dripping when it closes)."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["result"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return (not t.is_alive()), box.get("result")


def short_deadlines(monkeypatch, seconds: float = 1.0) -> None:
    """Every client's total-time deadline made short, so that a dripping server is given up on
    in a second (the defaults are minutes)."""
    try:
        from envbuilder.oci import http as net
    except ImportError:  # (the code before envbuilder/oci/http.py: nothing to shorten)
        return
    monkeypatch.setattr(net, "DEADLINE_SCALE", seconds / 60.0)


# ---- the registry client: manifest, token service, /v2/ ---------------------------------------


def test_a_manifest_that_never_ends_is_cut_at_its_cap():
    from envbuilder.oci.registry import digest

    # HEAD without Docker-Content-Digest: the client GETs the body to hash it
    head = ("answer", 200, {"Content-Type": OCI_MANIFEST}, b"")
    with FaultServer({}, script={MANIFEST: [head, "endless"]}) as srv:
        with pytest.raises(ActionError) as e:
            digest(ref(srv))
        sent = srv.sent_endless
    assert "more than" in str(e.value) and "manifest" in str(e.value)
    assert sent < (4 << 20) + SLACK  # the manifest cap, not the server's 64 MiB


def challenge(srv: FaultServer) -> tuple:
    realm = srv.url("token")
    return ("answer", 401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="test"'}, b"")


@pytest.mark.parametrize(
    "answer",
    [
        "html",
        ("json", ["token", "abc"]),
        ("json", "abc"),
        ("raw", b"[" * 100_000),
        ("json", {"token": 5}),
        ("json", {"token": "abc\r\nX-Evil: 1"}),
        ("json", {}),
        "endless",
    ],
    ids=["captive-portal", "list", "string", "deep", "number", "header-injection", "no-token", "endless"],
)
def test_a_token_service_that_answers_nonsense_is_an_action_error_naming_it(answer):
    from envbuilder.oci.registry import digest

    with FaultServer({}, script={MANIFEST: []}) as srv:
        srv.script[MANIFEST].append(challenge(srv))
        srv.script["token"] = [answer]
        with pytest.raises(ActionError) as e:
            digest(ref(srv))
        sent = srv.sent_endless
    assert "token service" in str(e.value) and srv.url("token") in str(e.value)
    assert sent < (1 << 20) + SLACK


def test_v2_that_never_ends_is_not_read():
    from envbuilder.oci.registry import check_registry

    with FaultServer({}, script={"v2/": ["endless"]}) as srv:
        check_registry(f"127.0.0.1:{srv.port}", "--registry", "nothing was loaded")
        sent = srv.sent_endless
    assert sent < SLACK  # a 200 is all /v2/ has to say


def test_a_registry_that_drips_its_headers_is_given_up_on_at_the_deadline(monkeypatch):
    from envbuilder.oci.registry import digest

    short_deadlines(monkeypatch)
    with FaultServer({}, script={MANIFEST: ["drip"] * 4}) as srv:
        done, got = within(lambda: digest(ref(srv)), 15)
    assert done, "digest() still waiting on a server that sends one header byte at a time"
    assert isinstance(got, ActionError) and "within" in str(got)


def test_a_retry_after_of_an_hour_does_not_hold_the_client(monkeypatch):
    from envbuilder.oci.registry import digest

    short_deadlines(monkeypatch)
    busy = ("answer", 429, {"Retry-After": "3600"}, b"")
    with FaultServer({}, script={MANIFEST: [busy] * 8}) as srv:
        done, got = within(lambda: digest(ref(srv)), 15)
    assert done, "digest() sleeps the hour a 429's Retry-After asks for"
    assert isinstance(got, ActionError)


def test_registry_messages_never_print_the_credentials_of_a_mirror():
    from envbuilder.oci.registry import digest

    with FaultServer({}, script={"v2/prefix/" + MANIFEST[3:]: [("answer", 418, {}, b"")]}) as srv:
        mirror = f"http://envbuild:{SECRET}@127.0.0.1:{srv.port}/prefix"
        with pytest.raises(ActionError) as e:
            digest("docker.io/envbuild/app:1.0", mirror)
    assert "418" in str(e.value)
    assert SECRET not in str(e.value) and "***@" in str(e.value)


def test_the_mirror_pick_of_build_reads_a_bounded_manifest():
    from envbuilder.engines.docker import pick_registries

    head = ("answer", 200, {"Content-Type": OCI_MANIFEST}, b"")
    path = "v2/library/ubuntu/manifests/22.04"
    with FaultServer({}, script={path: [head, "endless"]}) as srv:
        body = {"registries": {"docker.io": [f"127.0.0.1:{srv.port}"]}}
        with pytest.raises(ActionError) as e:
            pick_registries("loop", body, ["ubuntu:22.04"], None, lambda s: None)
        sent = srv.sent_endless
    assert "more than" in str(e.value)
    assert sent < (4 << 20) + SLACK


# A child's peak RSS, measured clean: Linux carries the high-water mark of the process a child
# was forked from (the test run, hundreds of MB late in a suite) into the child's ru_maxrss across
# its exec. So a small wrapper forks the child itself (a fresh signal struct, counting from the
# wrapper's few MB), waits for it with wait4 and prints the child's own peak.
_MEASURE = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.argv[1], sys.argv[1:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "sys.stderr.write('\\nENVBUILD_TEST_MAXRSS_KB=%d\\n' % usage.ru_maxrss)\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def _child_rss(argv: list[str], env: dict, timeout: float = 60) -> tuple[int, str, int]:
    """(exit status, stderr, peak RSS in MiB) of a child process."""
    err_path = Path(env["TMPDIR"]) / "stderr"
    with open(err_path, "wb") as err:
        p = subprocess.Popen(
            [sys.executable, "-c", _MEASURE, *argv],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=env["TMPDIR"],
            start_new_session=True,
        )
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
    text = err_path.read_text()
    found = re.findall(r"ENVBUILD_TEST_MAXRSS_KB=(\d+)", text)
    rss = int(found[-1]) // 1024 if found else 1 << 20  # (killed: no report, a failing size)
    return p.returncode, text.split("\nENVBUILD_TEST_MAXRSS_KB=")[0], rss


@pytest.fixture
def child_env(tmp_path):
    """The environment of an `envbuild` child: no Docker engine to ask, a stand-in skopeo (never
    run: the registry is read first), this checkout on PYTHONPATH, caches in tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "skopeo").write_text("#!/bin/sh\nexit 99\n")
    (bin_dir / "skopeo").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVBUILD_")}
    env.update(
        PATH=f"{bin_dir}:{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
        DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock",
        TMPDIR=str(tmp_path),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    return env


def test_export_image_stays_small_when_the_manifest_never_ends(tmp_path, child_env):
    head = ("answer", 200, {"Content-Type": OCI_MANIFEST}, b"")
    with FaultServer({}, script={MANIFEST: [head, "endless"]}) as srv:
        srv.endless_cap = 512 << 20
        code, err, rss = _child_rss(
            [sys.executable, "-m", "envbuilder", "export-image", ref(srv), "-o", str(tmp_path / "app.tar")],
            child_env,
        )
        sent = srv.sent_endless
    assert code == 1, err
    assert "internal error" not in err and "more than" in err
    assert rss < 250, f"export-image peaked at {rss} MiB reading a manifest"
    assert sent < (4 << 20) + SLACK


def test_import_image_stays_small_when_v2_never_ends(tmp_path, child_env):
    from envbuilder.engines.archive import FORMAT

    archive = tmp_path / "app.tar"
    archive.write_bytes(b"not read: the registry is checked first")
    (tmp_path / "app.tar.json").write_text(
        json.dumps(
            {
                "format": FORMAT,
                "name": "envbuild/app:1.0",
                "manifest_digest": "sha256:" + "a" * 64,
                "archive_sha256": "b" * 64,
                "archive_size": 1,
            }
        )
    )
    with FaultServer({}, script={"v2/": ["endless"]}) as srv:
        srv.endless_cap = 512 << 20
        code, err, rss = _child_rss(
            [
                sys.executable,
                "-m",
                "envbuilder",
                "import-image",
                str(archive),
                "--registry",
                f"127.0.0.1:{srv.port}",
            ],
            child_env,
        )
        sent = srv.sent_endless
    # /v2/ answered 200: a registry; then the archive is checked (and refused: exit 2)
    assert code == 2 and "internal error" not in err and "sidecar says 1" in err, err
    assert rss < 250, f"import-image peaked at {rss} MiB reading /v2/"
    assert sent < SLACK


def test_export_image_with_a_captive_portal_for_a_token_service_is_exit_1(tmp_path, child_env):
    with FaultServer({}, script={MANIFEST: []}) as srv:
        srv.script[MANIFEST].append(challenge(srv))
        srv.script["token"] = ["html"]
        code, err, _ = _child_rss(
            [sys.executable, "-m", "envbuilder", "export-image", ref(srv), "-o", str(tmp_path / "app.tar")],
            child_env,
        )
    assert code == 1 and "internal error" not in err, err
    assert "token service" in err and "HTML" in err


# ---- "does this index answer?": one rule for lock and verify -----------------------------------


def _probes(url: str, timeout: float = 1.0) -> tuple[bool, bool]:
    from envbuilder.lock.pip import index_answers as lock_answers
    from envbuilder.machine.verify import index_answers as verify_answers

    return lock_answers(url, timeout=timeout), verify_answers(url, timeout=timeout)


PAGE = b"<html><body><a href='torch-2.6.0-py3-none-any.whl'>torch</a></body></html>"


@pytest.mark.parametrize(
    "torch_page, root, expected",
    [
        ("serve", "serve", True),
        (
            ("answer", 401, {"WWW-Authenticate": 'Basic realm="x"'}, b""),
            ("answer", 401, {"WWW-Authenticate": 'Basic realm="x"'}, b""),
            False,
        ),
        (403, 403, False),
        (404, "serve", True),  # an index that answers, without torch
        (404, 404, False),
        (503, 503, False),
        ("redirect-loop", "redirect-loop", False),
        ("stall-header", "stall-header", False),
    ],
    ids=["200", "401", "403", "404-torch-only", "404", "503", "redirect-loop", "stall-header"],
)
def test_lock_and_verify_ask_whether_an_index_answers_by_one_rule(torch_page, root, expected):
    with FaultServer({"simple/torch/": PAGE, "simple/": PAGE}) as srv:

        def actions(a):
            if a == "redirect-loop":
                return [("redirect", srv.url("simple/torch/"))] * 40
            return [a] * 4

        srv.script = {"simple/torch/": actions(torch_page), "simple/": actions(root)}
        got = _probes(srv.url("simple"))
    assert got == (expected, expected)


def test_an_index_behind_credentials_answers_to_both_probes():
    with FaultServer({"simple/torch/": PAGE, "simple/": PAGE}) as srv:
        url = f"http://envbuild:{SECRET}@127.0.0.1:{srv.port}/simple"
        got = _probes(url)
        auth = {r.authorization for r in srv.log}
    assert got == (True, True)
    assert auth == {"Basic ZW52YnVpbGQ6czNjcjN0LXB3"}  # envbuild:s3cr3t-pw


def test_index_probes_give_up_on_dripping_headers(monkeypatch):
    short_deadlines(monkeypatch)
    with FaultServer({}, default="drip") as srv:
        done, got = within(lambda: _probes(srv.url("simple"), timeout=1.0), 20)
    assert done, "an index probe waits on headers that drip forever"
    assert got == (False, False)


def test_the_mirror_probe_gives_up_on_dripping_headers(monkeypatch):
    from envbuilder.model.mirrors import probe_jobs
    from envbuilder.oci.probe import run

    short_deadlines(monkeypatch)
    with FaultServer({}, default="drip") as srv:
        body = {"pypi": [srv.url("simple/")], "registries": {"docker.io": [f"127.0.0.1:{srv.port}"]}}
        done, got = within(lambda: run(probe_jobs(body), timeout=1.0), 15)
    assert done, "the mirror probe waits on headers that drip forever"
    assert [p.ok for p in got] == [False, False]
    assert all("timeout" in p.status for p in got)


def test_a_redirect_whose_body_never_ends_is_not_read():
    """requests reads a redirect's whole body before it follows the Location."""
    from envbuilder.model.mirrors import probe_jobs
    from envbuilder.oci.probe import run

    with FaultServer({"simple/": b"<html></html>"}) as srv:
        srv.script = {"moved/": [("redirect", srv.url("simple/"), "endless")]}
        got = run(probe_jobs({"pypi": [srv.url("moved/")]}), timeout=5)
        sent = srv.sent_endless
    assert [p.ok for p in got] == [True]
    assert sent < SLACK


# ---- the wheelhouse's --build-index-url page, and its download messages ------------------------


def test_the_uv_page_of_a_build_index_is_read_to_its_cap():
    from envbuilder.offline.wheelhouse import uv_artifacts

    pin = types.SimpleNamespace(
        filename="uv-0.7.0-py3-none-any.whl", version="0.7.0", sha256="0" * 64, size=1
    )
    said: list[str] = []
    with FaultServer({}, script={"simple/uv/": ["endless"]}) as srv:
        srv.endless_cap = 160 << 20
        got = uv_artifacts(pin, {}, srv.url("simple"), None, said.append)
        sent = srv.sent_endless
    assert got == []
    assert sent < (32 << 20) + SLACK
    assert any("more than" in s for s in said), said


def test_download_stall_and_failure_messages_never_print_credentials(tmp_path):
    import hashlib

    from envbuilder.offline.fetch import FetchItem, fetch_all

    data = os.urandom(256 << 10)
    events = []
    with FaultServer({"a.whl": data, "b.whl": data}, script={"a.whl": ["stall"], "b.whl": [404]}) as srv:
        base = f"http://envbuild:{SECRET}@127.0.0.1:{srv.port}"
        items = [
            FetchItem("a.whl", hashlib.sha256(data).hexdigest(), (f"{base}/a.whl",), len(data)),
            FetchItem("b.whl", hashlib.sha256(data).hexdigest(), (f"{base}/b.whl",), len(data)),
        ]
        threading.Thread(
            target=lambda: (srv.stalled.wait(10), time.sleep(0.6), srv.release.set()), daemon=True
        ).start()
        with pytest.raises(ActionError) as e:
            fetch_all(items, tmp_path, jobs=2, retries=0, progress=events.append, stall_notice=0.2)
    said = [ev.message for ev in events if ev.message] + [str(e.value)]
    assert any(ev.kind == "stalled" for ev in events)
    assert not [s for s in said if SECRET in s], said
    assert any("***@" in s for s in said)


def test_a_failed_sdist_build_never_prints_the_build_index_credentials(tmp_path):
    """The wheel built from a lock's sdist gets its build backend from --build-index-url; when
    that fails, neither what export says nor its error names the index's password."""
    import hashlib

    from faultserver import TARGET
    from fixture_wheels import make_sdist

    from envbuilder.lock import lockfile as L
    from envbuilder.offline.wheelhouse import export

    sdist = make_sdist(tmp_path / "src", "demo_pkg", "1.0")
    data, sha = sdist.read_bytes(), hashlib.sha256(sdist.read_bytes()).hexdigest()
    said: list[str] = []
    with FileServer({sdist.name: data}) as srv:
        lock = tmp_path / "lock"
        lock.mkdir()
        pylock = "\n".join(
            [
                'lock-version = "1.0"',
                'created-by = "envbuild tests"',
                "",
                "[[packages]]",
                'name = "demo-pkg"',
                'version = "1.0"',
                f'sdist = {{ url = "{srv.url(sdist.name)}", hashes = {{ sha256 = '
                f'"{sha}" }}, size = {len(data)} }}',
                "",
            ]
        )
        texts = {L.PYLOCK: pylock, L.REQUIREMENTS: f"demo-pkg==1.0 \\\n    --hash=sha256:{sha}\n"}
        meta = {
            "format": L.FORMAT,
            "profile": "demo",
            "input_sha256": "0" * 64,
            "inputs": {},
            "parts": ["pip"],
            "target": TARGET,
            "sources": {"pypi": srv.url("simple")},
            "files": {n: L.sha256_text(x) for n, x in texts.items()},
        }
        for name, text in {**texts, L.META: L.dumps(meta)}.items():
            (lock / name).write_text(text, encoding="utf-8")
        with FaultServer({}, default=403) as refusing:
            index = f"http://envbuild:{SECRET}@127.0.0.1:{refusing.port}/simple"
            with pytest.raises(ActionError) as e:
                export({"demo": lock}, tmp_path / "wh", build_index=index, say=said.append)
    assert "demo" in str(e.value)
    assert SECRET not in str(e.value) and not [s for s in said if SECRET in s], said
    assert any("***@" in s for s in said + [str(e.value)])


# ---- refresh: PyPI's JSON API and the range reader -----------------------------------------------

EMPTY_PROJECT = ("json", {"info": {"version": "1.0"}, "releases": {}})


@pytest.mark.parametrize(
    "project",
    [
        ("json", {"info": {"version": "99.0"}, "releases": {"99.0": "a string"}}),
        ("json", {"info": {"version": "99.0"}, "releases": {"99.0": [1, "two"]}}),
        ("json", {"info": {"version": "99.0"}, "releases": {"99.0": [{"filename": 5, "url": []}]}}),
        ("json", {"info": "not an object", "releases": {}}),
        ("raw", b"[" * 100_000),
    ],
    ids=["release-string", "files-of-wrong-kind", "file-fields-of-wrong-kind", "info-string", "deep"],
)
def test_a_project_page_of_the_wrong_shape_is_exit_1_naming_it(cli, project):
    with FaultServer({}, default=EMPTY_PROJECT, script={"pypi/torch/json": [project]}) as srv:
        code, out, err = cli("refresh", "--index-url", f"http://127.0.0.1:{srv.port}")
    assert code == 1, err
    assert f"http://127.0.0.1:{srv.port}/pypi/torch/json" in err


def test_a_release_page_nested_too_deep_is_a_per_release_error(cli):
    wheel = {"filename": "torch-99.0-py3-none-any.whl", "url": "/f.whl", "yanked": False}
    project = ("json", {"info": {"version": "99.0"}, "releases": {"99.0": [wheel]}})
    with FaultServer(
        {},
        default=EMPTY_PROJECT,
        script={"pypi/torch/json": [project], "pypi/torch/99.0/json": [("raw", b"[" * 100_000)]},
    ) as srv:
        code, out, err = cli("refresh", "--json", "--index-url", f"http://127.0.0.1:{srv.port}")
    assert code in (0, None), err
    assert "nested" in out


def test_a_wheel_that_is_no_zip_is_a_per_release_error():
    from envbuilder.cli.refresh import PyPIJson

    junk = os.urandom(300_000)
    wheel = {
        "filename": "torch-99.0-cp311-cp311-manylinux1_x86_64.whl",
        "url": "/files/torch.whl",
        "size": len(junk),
        "yanked": False,
    }
    project = {"info": {"version": "99.0"}, "releases": {"99.0": [wheel]}}
    with FaultServer(
        {"files/torch.whl": junk},
        script={
            "pypi/torch/json": [("json", project)],
            "pypi/torch/99.0/json": [404],
            "files/torch.whl": ["ranges"] * 10,
        },
    ) as srv:
        client = PyPIJson(f"http://127.0.0.1:{srv.port}", timeout=5)
        md = client.metadata("torch", "99.0", client.projects(["torch"])["torch"])
    assert "error" in md and "zip" in md["error"]


def test_a_project_page_that_drips_is_given_up_on(monkeypatch):
    from envbuilder.cli.refresh import PyPIJson

    short_deadlines(monkeypatch)
    with FaultServer({}, default="drip") as srv:
        client = PyPIJson(f"http://127.0.0.1:{srv.port}", timeout=1)
        done, got = within(lambda: client.projects(["torch"]), 15)
    assert done, "refresh waits on a project page whose headers drip forever"
    assert isinstance(got, ActionError) and "does not answer" in str(got)


def test_refresh_messages_never_print_the_credentials_of_the_index():
    from envbuilder.cli.refresh import PyPIJson

    with FaultServer({}, default=418) as srv:
        client = PyPIJson(f"http://envbuild:{SECRET}@127.0.0.1:{srv.port}", timeout=5)
        with pytest.raises(ActionError) as e:
            client.projects(["torch"])
    assert "418" in str(e.value) and SECRET not in str(e.value) and "***@" in str(e.value)


# ---- the flash-attn wheel download (in the builder: standard library only) ----------------------


def test_flash_attn_credentials_do_not_follow_a_redirect_to_another_host(tmp_path):
    from envbuilder.images import flash_attn_wheel as F

    data = b"wheel bytes"
    with (
        FileServer({"w.whl": data}) as other,
        FaultServer(
            {"w.whl": data},
            script={"w.whl": [("redirect", other.url("w.whl"))], "same.whl": [("redirect", "/w.whl")]},
        ) as first,
    ):
        url = f"http://envbuild:{SECRET}@127.0.0.1:{first.port}"
        F.download(f"{url}/w.whl", str(tmp_path / "a"), attempts=1)
        F.download(f"{url}/same.whl", str(tmp_path / "b"), attempts=1)
        elsewhere = [r.authorization for r in other.log]
        here = [r.authorization for r in first.log]
    assert elsewhere == [None], "the mirror's credentials went to the host it redirected to"
    assert here == ["Basic ZW52YnVpbGQ6czNjcjN0LXB3"] * 3  # the same host keeps them
    assert (tmp_path / "a").read_bytes() == data == (tmp_path / "b").read_bytes()


def test_flash_attn_download_gives_up_on_a_body_that_drips(tmp_path, monkeypatch):
    from envbuilder.images import flash_attn_wheel as F

    monkeypatch.setattr(F, "DEADLINE_S", 1.5, raising=False)
    with FaultServer({}, default="drip-body") as srv:
        done, got = within(
            lambda: F.download(srv.url("w.whl"), str(tmp_path / "w"), timeout=1, attempts=1), 15
        )
    assert done, "the flash-attn download waits on a body that drips one byte at a time"
    assert isinstance(got, F.Unavailable) and "within" in str(got)


def test_flash_attn_download_retries_a_body_cut_short(tmp_path):
    from envbuilder.images import flash_attn_wheel as F

    data = os.urandom(1 << 20)
    with FaultServer({"w.whl": data}, script={"w.whl": ["drop"]}) as srv:
        F.download(srv.url("w.whl"), str(tmp_path / "w"), attempts=2)
    assert (tmp_path / "w").read_bytes() == data


# ---- lock's source pins (apex's archive, flash-attn's wheels) -----------------------------------


def test_a_source_archive_that_never_ends_is_not_pinned(monkeypatch):
    from envbuilder.lock import sources

    monkeypatch.setattr(sources, "MAX_SOURCE_BYTES", 1 << 20, raising=False)
    with FaultServer({}, default="endless") as srv:
        with pytest.raises(ActionError) as e:
            sources._sha256(srv.url("apex.tar.gz"), None, "the apex source")
        sent = srv.sent_endless
    assert "more than" in str(e.value)
    assert sent < (1 << 20) + SLACK


def test_source_pin_messages_never_print_the_credentials_of_the_github_mirror():
    from envbuilder.lock import sources

    with FaultServer({}, default=418) as srv:
        prefix = f"http://envbuild:{SECRET}@127.0.0.1:{srv.port}/gh"
        with pytest.raises(ActionError) as e:
            sources._sha256("https://github.com/NVIDIA/apex/archive/x.tar.gz", prefix, "apex")
    assert "418" in str(e.value) and SECRET not in str(e.value) and "***@" in str(e.value)


def test_a_proxys_page_where_the_apex_archive_belongs_is_not_locked(cli, tmp_path):
    """A mirror (or a proxy) that answers 200 with an HTML page for apex's archive: exit 1, the
    page named for what it is, and no sources.lock pinning its 26 bytes as apex-25.08.tar.gz."""
    with FaultServer({}, default="html") as srv:
        code, out, err = cli(
            "lock", "p40", "--only", "sources", "--github-url", srv.url("gh"), "-o", tmp_path / "lock"
        )
    assert code == 1, (out, err)
    assert "not a gzip tarball" in err and "<!DOCTYPE html>" in err and "--github-url" in err, err
    assert not list(tmp_path.rglob("sources.lock"))


def test_a_truncated_gzip_or_a_gzip_of_no_tar_is_not_a_source_archive():
    import gzip
    import io
    import tarfile

    from envbuilder.lock.sources import archive_problem

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"setup()\n"
        info = tarfile.TarInfo("apex-25.08/setup.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert archive_problem(buf.getvalue()) is None
    assert "not a gzip tarball" in archive_problem(b"<html>moved</html>")
    assert "not a tar archive" in archive_problem(gzip.compress(b"x" * 2000))
    assert "not a gzip tarball" in archive_problem(gzip.compress(b"x" * 2000)[:-30] + b"\0" * 3)


# ---- an empty index URL is a mistake, not the public index ----------------------------------------


@pytest.mark.parametrize(
    "args, option",
    [
        (["check", "p40", "--index-url", ""], "--index-url"),
        (["check", "p40", "--torch-index-url", " "], "--torch-index-url"),
        (["lock", "p40", "--check", "--index-url", ""], "--index-url"),
        (["lock", "p40", "--check", "--torch-index-url", ""], "--torch-index-url"),
        (["lock", "p40", "--check", "--github-url", ""], "--github-url"),
        (["lock", "p40", "--check", "--registry-mirror", ""], "--registry-mirror"),
        (["wheelhouse", "p40", "-o", "out", "--build-index-url", ""], "--build-index-url"),
        (["refresh", "--index-url", ""], "--index-url"),
    ],
)
def test_an_empty_index_url_is_exit_2(cli, args, option):
    code, out, err = cli(*args)
    assert code == 2, (out, err)
    assert option in err and "empty" in err


# ---- the session itself ----------------------------------------------------------------------------


def test_redaction_covers_urls_and_authorization_values():
    from envbuilder.oci.http import redact

    text = (
        f"GET http://u:{SECRET}@h:1/x and https://tok@h/y failed; Authorization: Bearer "
        f"eyJhbGci.abc-def_1 and basic ZW52YnVpbGQ6czNj==, ftp://a:b@c; the token service "
        f'asked: Basic realm="registry"'
    )
    out = redact(text)
    assert SECRET not in out and "eyJhbGci" not in out and "ZW52YnVpbGQ6czNj" not in out
    assert "http://***@h:1/x" in out and "https://***@h/y" in out and "ftp://***@c" in out
    assert "Bearer ***" in out and "basic ***," in out
    assert 'the token service asked: Basic realm="registry"' in out


def test_a_redirect_loop_and_a_closed_port_are_network_errors_not_crashes():
    from envbuilder.oci import http as net

    with FaultServer({}) as srv:
        srv.script = {"loop": [("redirect", srv.url("loop"))] * 40}
        s = net.session()
        with pytest.raises(net.NetError) as e:
            net.request(s, "GET", srv.url("loop"), net.JSON_API, timeout=2)
    assert "redirect" in str(e.value)
    with pytest.raises(net.NetError) as e:
        net.request(net.session(retries=0), "GET", closed_port_url("x"), net.JSON_API, timeout=2)
    assert "refused" in str(e.value)


# ---- uv reads index pages itself: its process is bounded from outside ----------------------------


def test_uv_on_an_index_page_that_never_ends_is_stopped_at_its_memory_cap(tmp_path, monkeypatch):
    """uv pip compile reads a simple page whole (6 GB in 25 s on an endless one); the lock runs
    it under envbuild's runner, which stops its process group at a cap (here 300 MiB) and names
    the index, instead of letting it fill the machine."""
    from envbuilder.lock import pip as P
    from envbuilder.secret import SecretUrl

    monkeypatch.setattr("envbuilder.tools.run.MAX_RSS", 300 << 20)
    (tmp_path / "requirements.in").write_text("six==1.16.0\n")
    with FaultServer({}) as srv:
        srv.endless_cap = 4 << 30
        srv.script = {"simple/six/": ["endless-html"]}
        index = srv.url("simple").replace("http://", f"http://envbuild:{SECRET}@")
        with pytest.raises(ActionError) as e:
            P._run_uv(["requirements.in", "--no-cache"], tmp_path, [SecretUrl(index)])
    msg = str(e.value)
    assert "was stopped" in msg and "over its cap of 300 MiB" in msg, msg
    assert SECRET not in msg and "***@" in msg
    assert srv.sent_endless < 3 << 30  # (stopped long before the server's own cap)
