"""The scripts that run in the image (envbuilder/images/, issue 35 item 2): static files copied
byte for byte into every rendered folder, reading the profile's data from one sidecar the render
writes beside them (envbuild-scripts.json). A missing or broken sidecar is exit 2 with what to do,
never a traceback; a hostile value in it is data, printed back, never run; the scripts parse on
the oldest Python a profile ships."""

from __future__ import annotations

import ast
import json
import os
import runpy
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import FIXTURES, PROFILES, resolved
from envbuilder import images
from envbuilder.render.context import BuildContext
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
    render(BuildContext.of(resolved("p40")), out)
    return out


def copy_of(folder: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(folder, dest)
    return dest


# -- one source: the package's files --------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_renders_the_package_scripts_byte_for_byte(profile):
    files = render_files(BuildContext.of(resolved(profile)))
    data = json.loads(files[SIDECAR])
    for name, key in images.SCRIPTS.items():
        assert (name in files) == (key in data), name  # a script and its data, or neither
        if name in files:
            assert files[name] == images.script_text(name)
    assert data["preflight"]["profile"] == profile


# one render of t4's sidecar in a process of its own; with "reversed", every dict of the data is
# built in the opposite order first (a refactor that fills it otherwise must not change a byte)
_RENDER_SIDECAR = """
import sys
from envbuilder.model.matrix import load
from envbuilder.model.resolve import Overrides, resolve
from envbuilder.render import files
from envbuilder.render.context import BuildContext

def reverse(value):
    if isinstance(value, dict):
        return {k: reverse(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reverse(v) for v in value]
    return value

if sys.argv[1] == "reversed":
    data = files.script_data
    files.script_data = lambda env: reverse(data(env))
sys.stdout.write(files.render_files(BuildContext.of(resolve(load(), "t4", Overrides())))[files.SIDECAR])
"""


def test_the_sidecar_is_the_same_bytes_every_time():
    """Two processes, each with its own hash seed (set order) and the second with every dict
    filled in reverse, write the same bytes: the sidecar is sorted where it is written."""
    tests = Path(__file__).resolve().parent
    renders = []
    for seed, order in (("1", "as-built"), ("2", "reversed")):
        env = {
            **os.environ,
            "PYTHONHASHSEED": seed,
            "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)]),
        }
        r = subprocess.run(
            [sys.executable, "-c", _RENDER_SIDECAR, order],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        renders.append(r.stdout)
    assert renders[0] == renders[1]
    assert renders[0] == render_files(BuildContext.of(resolved("t4")))[SIDECAR]


# the bounded reader and the checker of each value, written in each script (no shared module in
# the image), with the constants they read
SHARED = ("read_regular", "kind_ok", "shape_problem", "load_data", "MAX_SIDECAR_BYTES", "KINDS", "PATTERNS")


def test_each_script_reads_the_sidecar_with_the_same_code_and_name():
    """The four scripts are copied out alone (no shared module in the image): the reader is
    written in each, and held the same here."""
    readers = set()
    for name in images.SCRIPTS:
        text = images.script_text(name)
        tree = ast.parse(text)
        named = {}
        for n in tree.body:
            if isinstance(n, ast.FunctionDef):
                named[n.name] = ast.get_source_segment(text, n)
            elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                target = n.targets[0] if isinstance(n, ast.Assign) else n.target
                if isinstance(target, ast.Name):
                    named[target.id] = ast.get_source_segment(text, n)
        readers.add(tuple(named[s] for s in SHARED))
        g: dict = {}
        for node in tree.body:  # SIDECAR and KEY, as the script spells them
            if isinstance(node, ast.Assign) and node.targets[0].id in ("SIDECAR", "KEY"):
                exec(compile(ast.Module([node], []), name, "exec"), g)
        assert g["SIDECAR"] == images.SIDECAR and g["KEY"] == images.SCRIPTS[name]
    assert len(readers) == 1


def test_a_patch_names_only_what_the_matrix_lets_it_name():
    """The scripts' rule for a patched file is the matrix's (render, overlays and --from)."""
    from envbuilder.model.matrix_schema import PATCH_FILES

    g = runpy.run_path(str(images.HERE / "apply_patches.py"), run_name="envbuild_test")
    assert g["PATTERNS"]["path"] == PATCH_FILES.item.regex


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

    patched = run(folder / "apply_patches.py", "--site", str(site), site=site)
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


# -- the sidecar is read through one bounded reader (issue 43, item 21) ---------------------------


@pytest.mark.parametrize("name", list(images.SCRIPTS))
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "too-large"])
def test_a_sidecar_that_is_no_regular_file_or_too_large_is_refused_not_waited_on(p40, tmp_path, name, kind):
    """A FIFO as the sidecar hung every script (read_text waits for a writer); /dev/zero was read
    without end. Each is refused at once, as is a file larger than any sidecar: exit 2."""
    folder = copy_of(p40, tmp_path)
    side = folder / SIDECAR
    side.unlink()
    if kind == "fifo":
        os.mkfifo(side)
    elif kind == "dev-zero":
        side.symlink_to("/dev/zero")
    else:
        side.write_bytes(b" " * ((4 << 20) + 1))
    r = run(folder / name, *ARGS.get(name, []))  # (120 s: a hang fails as TimeoutExpired)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    said = "larger than 4194304 bytes" if kind == "too-large" else "not a regular file"
    assert f"cannot be read (OSError: [Errno {27 if kind == 'too-large' else 22}] {said})" in r.stderr


# -- every value is what it should be (issue 43, item 26) -----------------------------------------

BAD_VALUES = {
    "apply_patches.py": [
        ("patches", "verl-hardcoded-fa2", "apply_patches.patches = 'verl-hardcoded-fa2', not a list"),
        ("patches", [{"name": "x", "files": "verl/utils/model.py", "replace": []}], "files = "),
        ("patches", [{"name": "x", "files": ["verl/utils/model.py"], "replace": [["x"]]}], "not a list of 2"),
        (
            "patches",
            [{"name": "x", "files": ["verl/utils/model.py"], "replace": [[1, "x"]]}],
            "not a non-empty",
        ),
        ("patches", [{"name": "x", "files": ["verl/utils/model.py"]}], "has no 'replace' in its"),
        ("profile", None, "apply_patches.profile = None, not a string"),
        ("profile", "\ud800", "not a string"),
    ],
    "audit_precision.py": [
        ("checks", ["fp8"], "audit_precision.checks[0] = 'fp8', not one of"),
        ("modules", [5], "audit_precision.modules[0] = 5, not a dotted module name"),
        ("reviewed", [{"file": "verl/x.py"}], "has no 'check' in its 'audit_precision.reviewed[0]' part"),
        ("reasons", [], "audit_precision.reasons = a list, not an object"),
    ],
    "preflight.py": [
        ("training_path", 5, "preflight.training_path = 5, not a list"),
        ("torch_dtype", "float8", "preflight.torch_dtype = 'float8', not one of bfloat16, float16, float32"),
        ("compute_capability", "six", "not a version"),
        ("model_vram_gb", True, "not a number"),
        ("built", {"apex": 5}, "preflight.built.apex = 5, not a string or null"),
    ],
    "prepare_gsm8k.py": [
        ("answer_pattern", "(", "prepare_gsm8k.answer_pattern = '(', not a regular expression"),
        ("files", {"train": 5, "test": "x"}, "prepare_gsm8k.files.train = 5, not a non-empty string"),
        ("repo", "", "not a non-empty string"),
    ],
}


@pytest.mark.parametrize(
    "name, field, value, said",
    [(name, *case) for name, cases in BAD_VALUES.items() for case in cases],
)
def test_a_sidecar_value_of_the_wrong_kind_is_exit_2_naming_it(p40, tmp_path, name, field, value, said):
    """Before, each of these was a traceback (exit 1) or went on with the value."""
    folder = copy_of(p40, tmp_path)
    data = json.loads((folder / SIDECAR).read_text())
    data[images.SCRIPTS[name]][field] = value
    (folder / SIDECAR).write_text(json.dumps(data))
    site = tmp_path / "site"
    shutil.copytree(FIXTURES / "verl-0.4.1", site)
    before = {p: p.read_bytes() for p in site.rglob("*.py")}
    args = ["--site", str(site)] if name == "apply_patches.py" else ARGS.get(name, [])
    r = run(folder / name, *args, site=site)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert said in r.stderr and "render the profile again" in r.stderr
    assert {p: p.read_bytes() for p in site.rglob("*.py")} == before
    assert not (folder / "data").exists()


def test_an_empty_find_is_refused_not_inserted_everywhere(p40, tmp_path):
    """`find: ""` matched between every two characters: apply_patches wrote the replacement
    thousands of times into verl's files and said exit 0."""
    folder = copy_of(p40, tmp_path)
    data = json.loads((folder / SIDECAR).read_text())
    data["apply_patches"]["patches"][0]["replace"] = [["", "X"]]
    (folder / SIDECAR).write_text(json.dumps(data))
    site = tmp_path / "site"
    shutil.copytree(FIXTURES / "verl-0.4.1", site)
    workers = (site / "verl/workers/fsdp_workers.py").read_bytes()
    r = run(folder / "apply_patches.py", "--site", str(site), site=site)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "apply_patches.patches[0].replace[0][0] = '', not a non-empty string" in r.stderr
    assert (site / "verl/workers/fsdp_workers.py").read_bytes() == workers


# -- a patch writes only inside the environment's verl (issue 43, items 13 and 2) -----------------


@pytest.mark.parametrize(
    "rel",
    ["{outside}", "verl/../../victim.py", "../victim.py", "verl/./utils/model.py", "verl//utils/model.py"],
)
def test_a_patch_naming_a_file_outside_verl_is_refused(p40, tmp_path, rel):
    """A crafted sidecar made apply_patches write any file it could (an absolute path or `..`
    in `files`): the sidecar's paths follow the matrix's rule, as render's do."""
    folder = copy_of(p40, tmp_path)
    site = tmp_path / "a" / "site"
    shutil.copytree(FIXTURES / "verl-0.4.1", site)
    victim = tmp_path / "a" / "victim.py"
    victim.write_text('attn_implementation="flash_attention_2"\n')
    rel = rel.format(outside=victim)
    data = json.loads((folder / SIDECAR).read_text())
    data["apply_patches"]["patches"][0]["files"] = [rel]
    (folder / SIDECAR).write_text(json.dumps(data))
    r = run(folder / "apply_patches.py", "--site", str(site), site=site)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "apply_patches.patches[0].files[0] = " in r.stderr and "a relative path of a .py file" in r.stderr
    assert victim.read_text() == 'attn_implementation="flash_attention_2"\n'


def test_a_link_out_of_the_environment_is_never_followed(p40, tmp_path):
    """A patched file that is a symbolic link to a file elsewhere: refused (exit 1), the file it
    names untouched."""
    folder = copy_of(p40, tmp_path)
    site = tmp_path / "site"
    shutil.copytree(FIXTURES / "verl-0.4.1", site)
    elsewhere = tmp_path / "elsewhere.py"
    shutil.move(site / "verl/utils/model.py", elsewhere)
    (site / "verl/utils/model.py").symlink_to(elsewhere)
    before = elsewhere.read_bytes()
    r = run(folder / "apply_patches.py", "--site", str(site), site=site)
    assert r.returncode == 1 and "verl/utils/model.py does not exist in" in r.stderr, r.stdout + r.stderr
    assert elsewhere.read_bytes() == before
    assert 'attn_implementation="flash_attention_2"' in (site / "verl/workers/fsdp_workers.py").read_text()


def test_a_hard_linked_file_is_copied_before_it_is_patched(p40, tmp_path):
    """uv hard-links installed files to its cache: apply_patches wrote through the link, and
    every later `uv pip install verl==0.4.1` on the machine got the P40's patches. Each patched
    file is a new file now, with the old one's mode; the cache keeps its bytes."""
    folder = copy_of(p40, tmp_path)
    cache, site = tmp_path / "uv-cache", tmp_path / "site"
    shutil.copytree(FIXTURES / "verl-0.4.1", cache)
    for src in cache.rglob("*"):
        dest = site / src.relative_to(cache)
        if src.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(src, dest)
    (cache / "verl/utils/model.py").chmod(0o640)
    cached = {p: p.read_bytes() for p in cache.rglob("*.py")}
    r = run(folder / "apply_patches.py", "--site", str(site), site=site)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {p: p.read_bytes() for p in cache.rglob("*.py")} == cached
    model = site / "verl/utils/model.py"
    assert 'attn_implementation="eager"' in model.read_text()
    assert model.stat().st_nlink == 1 and stat.S_IMODE(model.stat().st_mode) == 0o640
    assert not [p for p in site.rglob(".*envbuild-patch*")]  # (no temporary file left)
    again = run(folder / "apply_patches.py", "--site", str(site), site=site)
    assert again.returncode == 0 and "already patched" in again.stdout


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> tuple[Path, Path]:
    """A venv (the target environment) without pip, and its site-packages."""
    venv = tmp_path_factory.mktemp("target") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python*/site-packages")
    return venv, site


def test_the_verl_patched_is_the_environments_own_not_a_checkout_on_the_path(p40, tmp_path, target):
    """A checkout of verl on PYTHONPATH (and one in the working directory) came first for
    importlib: apply_patches rewrote it and left the environment's verl unpatched. Every route
    runs the script as envbuild's helper says, or runs it by hand, or through pixi's `patch`
    task: each patches the environment's own verl and leaves the checkout alone."""
    import tomllib

    from envbuilder.images import patch_command

    venv, site = target
    folder = copy_of(p40, tmp_path)
    checkout = tmp_path / "checkout"
    shutil.copytree(FIXTURES / "verl-0.4.1", checkout)
    shutil.copytree(FIXTURES / "verl-0.4.1" / "verl", folder / "verl")  # (the working directory's)
    mine = {p: p.read_bytes() for p in [*checkout.rglob("*.py"), *(folder / "verl").rglob("*.py")]}
    environ = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "PYTHONPATH": str(checkout),
        "PYTHONSAFEPATH": "",
        "LANG": "C.UTF-8",
    }
    render(BuildContext.of(resolved("p40")), tmp_path / "pixi")
    task = tomllib.loads((tmp_path / "pixi" / "pixi.toml").read_text())["tasks"]["patch"]["cmd"]
    patch_task = task.split(" && ")[0]  # (the audit that follows audits the training path's files)
    routes = {
        "helper": patch_command(venv / "bin" / "python", folder / "apply_patches.py", environ),
        "by hand": ([str(venv / "bin" / "python"), "apply_patches.py"], environ),
        "pixi": (["bash", "-c", patch_task], environ),
    }
    for route, (argv, env) in routes.items():
        shutil.rmtree(site / "verl", ignore_errors=True)
        shutil.copytree(FIXTURES / "verl-0.4.1" / "verl", site / "verl")
        r = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (route, r.stdout + r.stderr)
        assert 'attn_implementation="eager"' in (site / "verl/utils/model.py").read_text(), route
        assert {p: p.read_bytes() for p in mine} == mine, route
    argv, env = routes["helper"]
    assert argv[1] == "-I" and not [k for k in env if k.startswith("PYTHON")]


def test_a_verl_only_on_the_path_is_not_installed_for_the_patches(p40, tmp_path, target):
    """The environment has no verl of its own (an editable install, a checkout): nothing is
    patched, exit 1, and the message says why and what to do."""
    venv, site = target
    shutil.rmtree(site / "verl", ignore_errors=True)
    folder = copy_of(p40, tmp_path)
    checkout = tmp_path / "checkout"
    shutil.copytree(FIXTURES / "verl-0.4.1", checkout)
    r = subprocess.run(
        [str(venv / "bin" / "python"), str(folder / "apply_patches.py")],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"verl is not installed in {site}" in r.stderr and "never a checkout on PYTHONPATH" in r.stderr
    assert 'attn_implementation="flash_attention_2"' in (checkout / "verl/utils/model.py").read_text()
