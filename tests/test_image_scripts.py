"""The scripts that run in the image (envbuilder/images/, issue 35 item 2): static files copied
byte for byte into every rendered folder, reading the profile's data from one sidecar the render
writes beside them (envbuild-scripts.json). A missing or broken sidecar is exit 2 with what to do,
never a traceback; a hostile value in it is data, printed back, never run; the scripts parse on
the oldest Python a profile ships."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import FIXTURES, PROFILES, resolved
from envbuilder import images
from envbuilder.render.files import SIDECAR, render, render_files

ARGS = {"prepare_gsm8k.py": ["--out", "data"]}  # (its one required argument)


def run(script: Path, *args: str, site: Path | None = None) -> subprocess.CompletedProcess:
    """The script with this Python, no site-packages (the standard library and `site` only)."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-S", str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=script.parent,
        env=env,
    )


@pytest.fixture(scope="module")
def p40(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("render") / "p40"
    render(resolved("p40"), out)
    return out


def copy_of(folder: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(folder, dest)
    return dest


# -- one source: the package's files --------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_renders_the_package_scripts_byte_for_byte(profile):
    files = render_files(resolved(profile))
    data = json.loads(files[SIDECAR])
    for name, key in images.SCRIPTS.items():
        assert (name in files) == (key in data), name  # a script and its data, or neither
        if name in files:
            assert files[name] == images.script_text(name)
    assert data["preflight"]["profile"] == profile


def test_the_sidecar_is_the_same_bytes_every_time():
    assert render_files(resolved("t4"))[SIDECAR] == render_files(resolved("t4"))[SIDECAR]


def test_each_script_reads_the_sidecar_with_the_same_code_and_name():
    """The four scripts are copied out alone (no shared module in the image): the reader is
    written in each, and held the same here."""
    readers = set()
    for name in images.SCRIPTS:
        text = images.script_text(name)
        tree = ast.parse(text)
        (reader,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "load_data"]
        readers.add(ast.get_source_segment(text, reader))
        g: dict = {}
        for node in tree.body:  # SIDECAR and KEY, as the script spells them
            if isinstance(node, ast.Assign) and node.targets[0].id in ("SIDECAR", "KEY"):
                exec(compile(ast.Module([node], []), name, "exec"), g)
        assert g["SIDECAR"] == images.SIDECAR and g["KEY"] == images.SCRIPTS[name]
    assert len(readers) == 1


def test_the_scripts_parse_on_the_oldest_python_a_profile_ships():
    oldest = min(tuple(int(p) for p in resolved(profile).python.split(".")[:2]) for profile in PROFILES)
    for name in images.SCRIPTS:
        ast.parse(images.script_text(name), name, feature_version=oldest)


# -- a missing or broken sidecar: exit 2, what to do ---------------------------------------------


@pytest.mark.parametrize("name", list(images.SCRIPTS))
@pytest.mark.parametrize(
    "sidecar, said",
    [
        (None, "cannot be read (FileNotFoundError"),
        ("{not json", "cannot be read (JSONDecodeError"),
        ("[1, 2]", "holds no"),
        ('{"other": {}}', "holds no"),
        ("{}", "holds no"),
    ],
    ids=["missing", "not-json", "not-an-object", "no-part", "empty"],
)
def test_a_missing_or_broken_sidecar_is_exit_2_with_what_to_do(p40, tmp_path, name, sidecar, said):
    folder = copy_of(p40, tmp_path)
    if sidecar is None:
        (folder / SIDECAR).unlink()
    else:
        (folder / SIDECAR).write_text(sidecar)
    r = run(folder / name, *ARGS.get(name, []))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert said in r.stderr and str(folder / SIDECAR) in r.stderr
    assert "render the profile again and keep the two together" in r.stderr
    assert not (folder / "data").exists()  # nothing done


@pytest.mark.parametrize("name", list(images.SCRIPTS))
def test_a_sidecar_part_missing_a_field_is_exit_2_naming_it(p40, tmp_path, name):
    folder = copy_of(p40, tmp_path)
    data = json.loads((folder / SIDECAR).read_text())
    del data[images.SCRIPTS[name]]["profile"]
    (folder / SIDECAR).write_text(json.dumps(data))
    r = run(folder / name, *ARGS.get(name, []))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"has no 'profile' in its '{images.SCRIPTS[name]}' part" in r.stderr


def test_the_sidecar_is_read_beside_the_script_not_in_the_working_directory(p40, tmp_path):
    """The image runs `python /opt/envbuild/audit_precision.py` from /workspace: the sidecar is
    found by the script's own path."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run(
        [sys.executable, "-S", str(p40 / "audit_precision.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=elsewhere,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "no-verl")},
    )
    assert r.returncode == 1 and "verl is not installed" in r.stderr  # (read its data, went on)


# -- a hostile value is data ---------------------------------------------------------------------

CANARY_NAME = "envbuild-canary"


def hostile(canary: Path) -> str:
    return (
        f'p40"""; __import__("os").system("touch {canary}"); """\n'
        f"$(touch {canary}) `touch {canary}` ' \\\" {{0}} %s"
    )


def test_a_hostile_profile_in_the_sidecar_is_printed_back_never_run(p40, tmp_path):
    """The profile (and the GPU's name) are data the scripts print: with quotes, triple quotes,
    $(...), backticks and a newline in them, every script runs as with a plain name, prints the
    value back as it is, and no canary file appears. Before, they were rendered into the code."""
    folder = copy_of(p40, tmp_path)
    canary = tmp_path / CANARY_NAME
    value = hostile(canary)
    data = json.loads((folder / SIDECAR).read_text())
    for part in data.values():
        part["profile"] = value
        if "gpu" in part:
            part["gpu"] = value
    data["prepare_gsm8k"]["instruction"] = value
    (folder / SIDECAR).write_text(json.dumps(data))
    site = tmp_path / "site"
    shutil.copytree(FIXTURES / "verl-0.4.1", site)

    patched = run(folder / "apply_patches.py", site=site)
    assert patched.returncode == 0, patched.stderr
    assert patched.stdout.startswith(f"apply_patches: {value} ({value}), verl 0.4.1: ")

    # (the fixture holds only the files the patches touch: the training path's others are missing)
    audit = run(folder / "audit_precision.py", site=site)
    assert audit.returncode == 1 and "Traceback" not in audit.stderr, audit.stderr
    assert f"FAILED for {value} (verl 0.4.1): 4 finding(s)" in audit.stderr

    pre = run(folder / "preflight.py", "--json", site=site)
    assert pre.returncode == 1 and "Traceback" not in pre.stderr, pre.stderr  # (no torch here)
    assert json.loads(pre.stdout)["profile"] == value

    (folder / "local").mkdir()
    for split in ("train", "test"):
        (folder / "local" / f"{split}.jsonl").write_text(
            json.dumps({"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n"
        )
    prep = subprocess.run(
        [sys.executable, str(folder / "prepare_gsm8k.py"), "--out", "data", "--from", "local"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
    )
    assert prep.returncode == 0, prep.stderr
    row = pq.read_table(folder / "data" / "train.parquet").to_pylist()[0]
    assert row["prompt"][0]["content"] == "1 + 1? " + value

    assert not canary.exists()
    assert not list(tmp_path.rglob(CANARY_NAME))
    for name in images.SCRIPTS:  # the code is the package's, whatever the data
        assert (folder / name).read_bytes() == (images.HERE / name).read_bytes()


# -- shipped in the wheel ------------------------------------------------------------------------


@pytest.mark.pypi
def test_the_wheel_ships_the_scripts_and_an_installed_envbuild_renders_them(real_pypi, tmp_path):
    """`pip install envbuild` (not editable): the wheel holds envbuilder/images/, and the
    installed envbuild renders the same bytes (the build backend, hatchling, comes from PyPI)."""
    import zipfile

    from envbuilder.tools.uv import uv_bin

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    built = subprocess.run(
        [uv_bin(), "build", "--wheel", "-o", str(tmp_path / "dist"), str(root)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("envbuild-*.whl")
    with zipfile.ZipFile(wheel) as z:
        for name in images.SCRIPTS:
            assert z.read(f"envbuilder/images/{name}") == (images.HERE / name).read_bytes()
    venv = tmp_path / "venv"
    for cmd in (
        [uv_bin(), "venv", "-q", str(venv), "-p", sys.executable],
        [uv_bin(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)],
        [str(venv / "bin" / "envbuild"), "render", "p40", "-o", str(tmp_path / "out")],
    ):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
    for name in images.SCRIPTS:
        assert (tmp_path / "out" / "p40" / name).read_bytes() == (images.HERE / name).read_bytes()
    assert json.loads((tmp_path / "out" / "p40" / SIDECAR).read_text())["preflight"]["profile"] == "p40"
