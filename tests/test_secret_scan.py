"""Secrets never in argv, never printed (issue 43 #3, #4, #5): a password with a raw '@' and other
specials planted in every URL-bearing input of the commands that reach an index (flags, the
config file's mirror set, ENVBUILD_CONFIG's environment), then stdout, stderr, every file written
and the argv of every child the command starts are scanned for it.

The commands run in-process (conftest's `cli`) with a stand-in `uv` in place of the real one: it
appends its argv, its parents' argv (/proc) and whether its environment carried the index to a
log, then fails, so no package is downloaded; loopback FileServers answer the index probes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from httpfixtures import FileServer, closed_port_url

TAIL = "Tail77"  # the scanned marker: the part of the password after its '@'
PASSWORD = f"Re@{TAIL}:x!$&*+,;="  # as pasted: '@' and ':' raw (uv and requests split at the last '@')
ENCODED = f"Re%40{TAIL}"  # a config file's mirror set holds URL characters only

STAND_IN = f"""#!{sys.executable}
import json, os, sys
chain, pid = [], os.getppid()
while pid > 1:  # the argv of every process above this one
    try:
        chain.append(open(f"/proc/{{pid}}/cmdline", "rb").read().decode(errors="replace"))
        pid = int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
with open(os.environ["SCAN_LOG"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv, "parents": chain,
                        "index": os.environ.get("UV_INDEX_URL", ""),
                        "extra": os.environ.get("UV_EXTRA_INDEX_URL", "")}}) + "\\n")
print("error: the stand-in uv of envbuild's tests installs nothing", file=sys.stderr)
sys.exit(2)
"""


def creds(url: str, password: str = PASSWORD) -> str:
    return url.replace("://", f"://alice:{password}@", 1)


@pytest.fixture
def scan(cli, monkeypatch, tmp_path):
    """cli with the stand-in uv and a spy on every child's argv; returns run(*args) ->
    (code, out, err), and `children` / `uvs` (what the stand-in logged)."""
    uv = tmp_path / "bin" / "uv"
    uv.parent.mkdir()
    uv.write_text(STAND_IN)
    uv.chmod(0o755)
    log = tmp_path / "uv-log.jsonl"
    monkeypatch.setenv("SCAN_LOG", str(log))
    # (tools.uv.uv_bin asks the uv package each time: a module that imported uv_bin keeps the real one)
    monkeypatch.setattr("uv.find_uv_bin", lambda: str(uv))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)
    children: list[list[str]] = []

    class Spy(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, args, *a, **kw):
            children.append([str(x) for x in ([args] if isinstance(args, (str, Path)) else args)])
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Spy)

    class Scan:
        def __init__(self):
            self.children = children

        def __call__(self, *args):
            return cli(*args)

        @property
        def uvs(self):
            return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []

        def assert_clean(self, out: str, err: str) -> None:
            printed = [ln for ln in (out + err).splitlines() if TAIL in ln]
            assert not printed, printed
            argv = [c for c in self.children if TAIL in " ".join(c)]
            assert not argv, argv
            for u in self.uvs:
                assert TAIL not in " ".join(u["argv"] + u["parents"]), u
            written = [
                str(p)
                for p in tmp_path.rglob("*")
                if p.is_file()
                and not p.is_symlink()
                and p != log
                and "input" not in p.parts
                and TAIL.encode() in p.read_bytes()
            ]
            assert not written, written

    return Scan()


def index_server() -> FileServer:
    """A loopback PEP 503 index that answers the probes (its root and /simple/ pages)."""
    page = b"<!DOCTYPE html><html><body></body></html>"
    return FileServer({"simple/": page, "torch/": page, "simple/pip/": page})


def test_verify_keeps_the_index_passwords_out_of_argv_output_and_report(scan, tmp_path):
    with index_server() as srv:
        pypi, torch = creds(srv.url("simple/")), creds(srv.url("torch/"))
        code, out, err = scan("verify", "p40", "--json", "--index-url", pypi, "--torch-index-url", torch)
    assert code == 1, err  # (the stand-in uv installs nothing)
    report = json.loads(out)["profiles"][0]
    assert report["index_url"] == srv.url("simple/").replace("://", "://***@")
    assert report["torch_index_url"] == srv.url("torch/").replace("://", "://***@")
    assert "PyTorch index http://***@127.0.0.1" in err
    scan.assert_clean(out, err)
    # uv got both indexes, passwords and all, through its environment
    (first, *_) = scan.uvs
    assert first["index"] == pypi and first["extra"] == torch
    assert "--index-url" not in first["argv"] and "--extra-index-url" not in first["argv"]


def test_install_through_a_config_mirror_set_keeps_its_passwords_out(scan, tmp_path, monkeypatch):
    from envbuilder.model import config

    with index_server() as srv:
        mirror = {
            "description": "the lab's loopback mirror",
            "pypi": [creds(srv.url("simple/"), ENCODED)],
            "pytorch": [creds(srv.url("torch/"), ENCODED)],
            "huggingface": [creds(srv.url("hf"), ENCODED)],
        }
        (tmp_path / "input").mkdir()  # (the one file that holds it: the user's own)
        (tmp_path / "input" / "config.yaml").write_text(yaml.safe_dump({"mirrors": {"lab": mirror}}))
        monkeypatch.setenv("ENVBUILD_CONFIG", str(tmp_path / "input" / "config.yaml"))
        config._load.cache_clear()
        try:
            code, out, err = scan("install", "p40", "--prefix", tmp_path / "env", "--mirror", "lab", "--json")
        finally:
            config._load.cache_clear()
    assert code == 1, err
    assert "PyTorch index http://***@127.0.0.1" in err
    scan.assert_clean(out, err)
    assert scan.uvs and ENCODED in scan.uvs[0]["index"]


def test_install_from_flags_keeps_the_password_out(scan, tmp_path):
    with index_server() as srv:
        code, out, err = scan(
            "install",
            "p40",
            "--prefix",
            tmp_path / "env",
            "--index-url",
            creds(srv.url("simple/")),
            "--torch-index-url",
            creds(srv.url("torch/")),  # (install probes the PyTorch index before anything: it answers)
        )
    assert code == 1, err
    scan.assert_clean(out, err)
    assert scan.uvs and scan.uvs[0]["index"] == creds(srv.url("simple/")), err


def test_install_refusing_an_unanswering_pytorch_index_keeps_the_password_out(scan, tmp_path):
    """The refusal before anything is installed names the index as ***@ (issue 44, Medium 5)."""
    with index_server() as srv:
        code, out, err = scan(
            "install",
            "p40",
            "--prefix",
            tmp_path / "env",
            "--index-url",
            creds(srv.url("simple/")),
            "--torch-index-url",
            creds(closed_port_url("whl/cu118")),
        )
    assert code == 1 and "does not answer" in err, err
    scan.assert_clean(out, err)
    assert not scan.uvs and "***@" in err


def test_lock_keeps_the_index_password_out_of_uvs_argv(scan, tmp_path):
    with index_server() as srv:
        code, out, err = scan(
            "lock",
            "p40",
            "--only",
            "pip",
            "-o",
            tmp_path / "locks",
            "--index-url",
            creds(srv.url("simple/")),
            "--torch-index-url",
            creds(srv.url("torch/")),
        )
    assert code not in (0, None), err
    scan.assert_clean(out, err)
    assert scan.uvs and scan.uvs[0]["index"] == creds(srv.url("simple/")), err


# ---- every other command that takes a URL (issue 43, "the scan covers every command") ---------


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A config file (the user's own, under input/) whose mirror set `lab` names loopback
    endpoints with the planted password, URL-encoded as a config file holds it; yields the
    FileServer behind them."""
    from envbuilder.model import config

    page = b"<!DOCTYPE html><html><body></body></html>"
    with FileServer({"simple/": page, "torch/": page, "simple/pip/": page, "hf/": b"{}"}) as srv:
        mirror = {
            "description": "the lab's loopback mirror",
            "pypi": [creds(srv.url("simple/"), ENCODED)],
            "pytorch": [creds(srv.url("torch/"), ENCODED)],
            "huggingface": [creds(srv.url("hf"), ENCODED)],
            "github": [creds(srv.url("gh"), ENCODED)],
        }
        (tmp_path / "input").mkdir()
        (tmp_path / "input" / "config.yaml").write_text(yaml.safe_dump({"mirrors": {"lab": mirror}}))
        monkeypatch.setenv("ENVBUILD_CONFIG", str(tmp_path / "input" / "config.yaml"))
        config._load.cache_clear()
        try:
            yield srv
        finally:
            config._load.cache_clear()


def scanned(scan, *args, codes=(1,)):
    """Runs the command, requires its exit code among `codes`, scans; returns (out, err)."""
    code, out, err = scan(*args)
    assert code in codes, (code, out, err)
    scan.assert_clean(out, err)
    return out, err


@pytest.mark.parametrize("how", ["flag", "environment"])
@pytest.mark.parametrize("url", ["ftp://{}host/simple", "http://{}127.0.0.1:1/simple"])
def test_wheelhouse_keeps_the_build_index_password_out(scan, tmp_path, monkeypatch, how, url):
    """--build-index-url and ENVBUILD_BUILD_INDEX_URL: a URL that is no index is refused naming
    it as ***@; one that is (a lock dir that is no lock) fails without naming the password."""
    index = url.format(f"alice:{PASSWORD}@")
    args = ["wheelhouse", "p40", "--lock-dir", tmp_path / "nolock", "-o", tmp_path / "wh"]
    if how == "flag":
        args += ["--build-index-url", index]
    else:  # (conftest's cli drops the caller's ENVBUILD_* when the test starts, not per run)
        monkeypatch.setenv("ENVBUILD_BUILD_INDEX_URL", index)
    scanned(scan, *args, codes=(1, 2))


def test_refresh_keeps_the_index_password_out(scan, tmp_path):
    with FileServer({}) as srv:  # every page 404s: refresh fails naming the index
        out, err = scanned(scan, "refresh", "--index-url", creds(srv.url("pypi-root")), "--timeout", "2")
    assert "***@127.0.0.1" in out + err


def test_refresh_refusal_of_a_bad_url_keeps_the_password_out(scan):
    scanned(scan, "refresh", "--index-url", f"ftp://alice:{PASSWORD}@host/x", codes=(2,))


def test_lock_through_a_config_mirror_set_keeps_its_passwords_out(scan, tmp_path, lab):
    scanned(scan, "lock", "p40", "--only", "pip", "-o", tmp_path / "locks", "--mirror", "lab", codes=(1, 2))
    assert scan.uvs and ENCODED in scan.uvs[0]["index"]


def test_render_with_a_mirror_writes_no_password(scan, tmp_path, lab):
    scanned(scan, "render", "p40", "--mirror", "lab", "-o", tmp_path / "out", codes=(0,))
    assert list((tmp_path / "out").rglob("Dockerfile"))


def test_mirrors_list_and_probe_keep_the_passwords_out(scan, lab):
    out, _ = scanned(scan, "mirrors", "list", codes=(0,))
    assert "***@127.0.0.1" in out
    scanned(scan, "mirrors", "list", "--json", codes=(0,))
    scanned(scan, "mirrors", "probe", "--mirror", "lab", "--timeout", "2", codes=(0, 1))
    scanned(scan, "mirrors", "probe", "--mirror", "lab", "--timeout", "2", "--json", codes=(0, 1))


def test_build_through_a_mirror_keeps_its_passwords_out_up_to_the_engine(scan, tmp_path, lab, monkeypatch):
    """No Docker here: build goes as far as rendering its context, and stops where it needs an
    engine (no daemon answers; no probe leaves loopback)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")  # (no daemon answers)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    scanned(
        scan, "build", "p40", "--mirror", "lab", "--no-probe", "--context", tmp_path / "ctx", codes=(1, 2)
    )


def test_check_resolve_keeps_the_index_passwords_out(scan):
    with index_server() as srv:
        scanned(
            scan,
            "check",
            "p40",
            "--resolve",
            "--index-url",
            creds(srv.url("simple/")),
            "--torch-index-url",
            creds(srv.url("torch/")),
            codes=(1, 2),
        )
    assert scan.uvs and scan.uvs[0]["index"] == creds(srv.url("simple/"))


def test_check_resolve_through_a_mirror_keeps_its_passwords_out(scan, lab):
    scanned(scan, "check", "p40", "--resolve", "--mirror", "lab", codes=(1, 2))


def test_hf_endpoint_with_userinfo_stays_out_of_render_and_install(scan, tmp_path, monkeypatch):
    with index_server() as srv:  # (the hub answers 404 for the model: a refusal naming HF_ENDPOINT)
        monkeypatch.setenv("HF_ENDPOINT", creds(srv.url("hf")))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        scanned(scan, "render", "p40", "--model", "lab/tiny", "-o", tmp_path / "out", codes=(0, 1, 2))
        scanned(scan, "render", "p40", "-o", tmp_path / "out2", codes=(0,))
        index = ["--index-url", srv.url("simple/"), "--torch-index-url", srv.url("torch/")]
        scanned(scan, "install", "p40", "--prefix", tmp_path / "env", *index, codes=(1,))


def test_a_secret_url_shows_its_password_only_when_revealed():
    from envbuilder.secret import SecretUrl

    url = creds("http://127.0.0.1:1/simple/")
    s = SecretUrl(url)
    shown = "http://***@127.0.0.1:1/simple/"
    assert str(s) == f"{s}" == f"{s:>10}" == "%s" % s == shown and TAIL not in repr(s)
    assert s.reveal() == url and s.public == "http://127.0.0.1:1/simple/"
    with pytest.raises(TypeError):
        json.dumps({"index": s})  # (no str: never written by accident)
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(s)


def test_install_builds_apex_with_pip_reading_the_index_from_its_environment(tmp_path, monkeypatch):
    """apex's (and flash-attn's) source build: the environment's pip gets the install's index
    through its environment (it used PyPI, whatever the mirror), and no password in its argv."""
    from conftest import resolved
    from envbuilder.machine.install import InstallReport, build_extensions
    from envbuilder.secret import SecretUrl

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    (bin_dir / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    log = tmp_path / "pip.log"
    python.write_text(f'#!/bin/sh\necho "$PIP_INDEX_URL" > {log}\necho "$*" >> {log}\n')
    python.chmod(0o755)
    index = creds("http://127.0.0.1:1/simple/")
    report = InstallReport("p40", str(tmp_path), "online")
    assert build_extensions(resolved("p40"), tmp_path / "env", report, lambda s: None, SecretUrl(index))
    got, argv = log.read_text().splitlines()
    assert got == index and TAIL not in argv and "apex @ https://" in argv
