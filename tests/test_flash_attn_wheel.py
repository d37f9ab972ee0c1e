"""flash-attn's prebuilt release wheel: its name (as flash-attn's own setup.py names it) and the
builder's fetch script (envbuilder/images/flash_attn_wheel.py), run as the Dockerfile runs it: a real
subprocess with a stand-in torch on its path, against loopback HTTP servers. No Docker, no
network beyond 127.0.0.1. (tests/test_real_packages.py checks the names against get_wheel_url
executed from the real sdists on PyPI.)"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import resolved
from fixture_wheels import flash_attn_release_wheel, torch_standin
from httpfixtures import FileServer, free_port

from envbuilder.images import flash_attn_wheel as W

SCRIPT = Path(W.__file__)
TEMPLATE = (
    "flash_attn-{version}+cu{cuda_tag}torch{torch}cxx11abi{cxx11_abi}-{python}-{python}-linux_{machine}.whl"
)
RELEASE = "Dao-AILab/flash-attention/releases/download/v{version}"
PY = f"cp{sys.version_info.major}{sys.version_info.minor}"


# ---- the name --------------------------------------------------------------------------------
# Expected names written out from setup.py's get_wheel_url in the PyPI sdists: 2.6.3 maps CUDA
# 11.x to "118" and 12.x to "123"; 2.8.3 writes the major only ("11", "12"); torch major.minor;
# str(torch._C._GLIBCXX_USE_CXX11_ABI).upper(); cp{major}{minor}; linux_{uname machine}.


@pytest.mark.parametrize(
    "profile,with_,abi,want",
    [
        ("3090", (), False, "flash_attn-2.8.3+cu12torch2.8cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"),
        ("h200", (), True, "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp310-cp310-linux_x86_64.whl"),
        (
            "4090",
            ("flash-attn",),
            False,
            "flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-cp310-cp310-linux_x86_64.whl",
        ),
        (
            "4090",
            ("flash-attn",),
            True,
            "flash_attn-2.6.3+cu123torch2.4cxx11abiTRUE-cp310-cp310-linux_x86_64.whl",
        ),
    ],
)
def test_the_profiles_wheel_names(profile, with_, abi, want):
    """The first is the file verl's install docs fetch for torch 2.8 (the brief's example)."""
    # 3090 and h200 on the verl 0.6.1 stack: flash-attn 2.8.3 for torch 2.8 (stacks.yaml)
    kw = {} if with_ else {"verl": "0.6.1"}
    d = resolved(profile, with_=list(with_), **kw).to_dict()
    fa = d["flash_attn"]
    got = W.wheel_filename(
        fa["wheel"],
        fa["version"],
        d["torch"]["version"],
        d["torch"]["cuda"],
        d["python"],
        abi,
        fa["cuda_tags"],
    )
    assert got == want


@pytest.mark.parametrize(
    "tags,cuda,want",
    [
        ({"11": "118", "12": "123"}, "11.8", "cu118"),  # 2.6.3
        ({"11": "118", "12": "123"}, "12.4", "cu123"),
        ({"11": "11", "12": "12"}, "11.8", "cu11"),  # 2.8.3
        ({"11": "11", "12": "12"}, "12.9", "cu12"),
    ],
)
def test_the_cuda_tag_depends_on_the_release_and_the_cuda_major(tags, cuda, want):
    name = W.wheel_filename(TEMPLATE, "2.6.3", "2.5.1+cu124", cuda, "3.11", False, tags)
    assert name == f"flash_attn-2.6.3+{want}torch2.5cxx11abiFALSE-cp311-cp311-linux_x86_64.whl"


def test_no_tag_for_a_cuda_major_the_release_does_not_build_means_no_wheel():
    """setup.py would guess a cu12 wheel for a CUDA 13 torch; envbuild compiles instead."""
    assert W.wheel_filename(TEMPLATE, "2.8.3", "2.9.0", "13.0", "3.12", False, {"12": "12"}) is None
    assert W.wheel_filename(TEMPLATE, "2.8.3", "2.9.0", "", "3.12", False, {"12": "12"}) is None


# ---- the fetch script, as the builder runs it ------------------------------------------------


def _release(tmp_path, version="2.6.3", torch_v="2.4.0", cuda="12.1", abi=False):
    """(stand-in torch dir, release file name, its bytes) for this interpreter's Python."""
    tag = "123" if version == "2.6.3" else "12"
    name = (
        f"flash_attn-{version}+cu{tag}torch{'.'.join(torch_v.split('.')[:2])}"
        f"cxx11abi{str(abi).upper()}-{PY}-{PY}-linux_x86_64.whl"
    )
    wheel = flash_attn_release_wheel(tmp_path / "release", name, version)
    return torch_standin(tmp_path / "torch-standin", torch_v, cuda, abi), name, wheel.read_bytes()


def run(torch_dir, base, dest, version="2.6.3", pins=None, tags='{"11": "118", "12": "123"}'):
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--version",
        version,
        "--release",
        base,
        "--filename",
        TEMPLATE,
        "--cuda-tags",
        tags,
        "--dest",
        str(dest),
    ]
    if pins is not None:
        cmd += ["--pins", json.dumps(pins)]
    env = {"PYTHONPATH": str(torch_dir), "PATH": "/usr/bin:/bin"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


needs_x86 = pytest.mark.skipif(
    __import__("platform").machine() != "x86_64", reason="the stand-in release names linux_x86_64"
)


@needs_x86
def test_the_wheel_for_the_installed_torch_is_fetched_checked_and_named_by_its_metadata(tmp_path):
    torch_dir, name, data = _release(tmp_path)
    path = f"{RELEASE.format(version='2.6.3')}/{name}"
    with FileServer({path: data}) as srv:
        r = run(torch_dir, srv.url(RELEASE.format(version="2.6.3")), tmp_path / "wheels")
        assert [q.path for q in srv.log] == ["/" + path]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checked against its own RECORD (integrity, not a pin" in r.stdout
    assert "nothing compiled" in r.stdout
    # named with METADATA's version (2.6.3) so pip sees one version in the name and the metadata
    placed = sorted(p.name for p in (tmp_path / "wheels").iterdir())
    assert placed == [f"flash_attn-2.6.3-{PY}-{PY}-linux_x86_64.whl"]
    assert (tmp_path / "wheels" / placed[0]).read_bytes() == data


@needs_x86
def test_the_abi_of_the_installed_torch_picks_the_file(tmp_path):
    torch_dir, name, data = _release(tmp_path, version="2.8.3", torch_v="2.8.0", cuda="12.8", abi=True)
    assert "cxx11abiTRUE" in name
    with FileServer({f"r/{name}": data}) as srv:
        r = run(torch_dir, srv.url("r"), tmp_path / "w", version="2.8.3", tags='{"11": "11", "12": "12"}')
    assert r.returncode == 0, r.stderr
    assert "cxx11abi TRUE" in r.stdout


@needs_x86
def test_a_missing_wheel_or_a_silent_mirror_exits_3_so_the_builder_compiles(tmp_path):
    torch_dir, _, _ = _release(tmp_path)
    with FileServer({}) as srv:
        r = run(torch_dir, srv.url("r"), tmp_path / "w")
    assert r.returncode == 3 and "answered HTTP 404" in r.stderr
    r = run(torch_dir, f"http://127.0.0.1:{free_port()}/r", tmp_path / "w")
    assert r.returncode == 3 and "did not answer" in r.stderr
    # no tag for this CUDA major: nothing is fetched
    r = run(torch_dir, "http://127.0.0.1:9/r", tmp_path / "w", tags='{"11": "118"}')
    assert r.returncode == 3 and "builds no wheel for torch 2.4.0 with CUDA 12.1" in r.stderr
    assert not list((tmp_path / "w").glob("*.whl"))


@needs_x86
def test_a_corrupt_or_foreign_file_stops_the_build_instead_of_compiling(tmp_path):
    torch_dir, name, data = _release(tmp_path)
    bad = tmp_path / "bad.whl"  # one file's bytes changed, RECORD left as it was
    with zipfile.ZipFile(tmp_path / "release" / name) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            body = src.read(item)
            dst.writestr(item, body + b"# changed\n" if item.filename == "flash_attn_2_cuda.py" else body)
    other = flash_attn_release_wheel(tmp_path / "other", name, "2.5.8").read_bytes()
    with FileServer({f"a/{name}": bad.read_bytes(), f"b/{name}": other}) as srv:
        r = run(torch_dir, srv.url("a"), tmp_path / "w")
        assert r.returncode == 1 and "does not match its RECORD hash" in r.stderr, r.stderr
        r = run(torch_dir, srv.url("b"), tmp_path / "w")
        assert r.returncode == 1 and "is flash-attn 2.5.8, not 2.6.3" in r.stderr
    assert not list((tmp_path / "w").iterdir())  # nothing left behind, not even a .part


@needs_x86
def test_locked_only_the_pinned_bytes_install_and_nothing_falls_back(tmp_path):
    torch_dir, name, data = _release(tmp_path)
    sha = hashlib.sha256(data).hexdigest()
    with FileServer({f"r/{name}": data}) as srv:
        ok = run(torch_dir, srv.url("r"), tmp_path / "ok", pins={name: sha})
        wrong = run(torch_dir, srv.url("r"), tmp_path / "wrong", pins={name: "0" * 64})
        other_abi = run(
            torch_dir, srv.url("r"), tmp_path / "abi", pins={name.replace("abiFALSE", "abiTRUE"): sha}
        )
        missing = run(torch_dir, srv.url("nothing-here"), tmp_path / "missing", pins={name: sha})
    assert ok.returncode == 0 and f"sha256 {sha} as the lock pins it" in ok.stdout
    assert wrong.returncode == 1 and "the lock pins " + "0" * 64 in wrong.stderr
    assert other_abi.returncode == 1 and "re-lock" in other_abi.stderr
    assert missing.returncode == 1 and "does not compile instead" in missing.stderr  # not 3


@needs_x86
def test_credentials_in_the_mirror_prefix_become_basic_auth_and_are_never_printed(tmp_path):
    torch_dir, name, data = _release(tmp_path)
    with FileServer({f"r/{name}": data}) as srv:
        base = srv.url("r").replace("http://", "http://envbuild:s3cret-token@")
        r = run(torch_dir, base, tmp_path / "w")
        auth = [q.authorization for q in srv.log]
    assert r.returncode == 0, r.stderr
    assert auth == ["Basic " + base64.b64encode(b"envbuild:s3cret-token").decode()]
    assert "s3cret-token" not in r.stdout + r.stderr and "//***@" in r.stdout


def test_bad_json_arguments_are_exit_2(tmp_path):
    r = run(tmp_path, "http://127.0.0.1:9/r", tmp_path / "w", tags="{not json")
    assert r.returncode == 2 and "bad JSON argument" in r.stderr
