"""`envbuild verify`, the real-install tier, run for real against loopback indexes: stand-in
torch/transformers/accelerate/verl wheels and the real hydra-core (see verifyfixtures.py) behind
pypiserver; real venvs, real uv installs, real `pip check`, real imports in fresh interpreters,
and the rendered run script composed through real Hydra with verl 0.4.1's own config.

The last test (marker `heavy`) installs a shipped profile from PyPI; it runs only when asked
for (`-m heavy` or ENVBUILD_HEAVY=1 tests/run.sh), see the README.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import clean_env, envbuild_exe, frozen, need, resolved, unavailable
from envbuilder.model import matrix as M
from envbuilder.machine.verify_all import table
from envbuilder.machine.verify import (
    check_overrides,
    hydra_error,
    import_plan,
    local_pins,
    parse_printed_config,
    swap_line,
)
from envbuilder.render.context import BuildContext
from httpfixtures import closed_port_url

# installed, not imported: Hydra alone takes ~0.8 s to import, in every worker that collects this
for module in ("pypiserver", "hydra", "uv"):
    if importlib.util.find_spec(module) is None:
        unavailable(f"{module} is not installed (pip install -e '.[lock,test]')")

import lockfixtures as F  # noqa: E402
import verifyfixtures as V  # noqa: E402

TIMEOUT = 900


def tiny_env(overlay_dir: Path, **kw):
    return resolved("tiny", M.load((overlay_dir,)), **kw)


def write_overlay(folder: Path, doc: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return folder


class World:
    """An overlay, the two loopback indexes and their servers for one variant of the tiny world."""

    def __init__(self, root: Path, *, pins: dict | None = None, cuda: str = "12.4", **build):
        self.root = root
        self.overlay = write_overlay(root / "overlay", V.overlay_doc(pins))
        self.env = tiny_env(self.overlay, cuda=cuda if cuda != "12.4" else None)
        self.modules, _ = import_plan(self.env)
        V.build(root / "pypi", root / "torch", self.env.to_dict(), self.modules, **build)

    def __enter__(self):
        # one after the other: a free port is only taken once its server listens on it
        self.pypi = F.PypiServer(self.root / "pypi").__enter__()
        self.torch = F.PypiServer(self.root / "torch").__enter__()
        return self

    def __exit__(self, *exc):
        self.torch.__exit__(*exc)
        self.pypi.__exit__(*exc)


def verify(
    world: World,
    *args,
    tmp: Path,
    env: dict | None = None,
    cuda: str | None = None,
    popen: bool = False,
    cwd: Path | None = None,
):
    """Run the installed `envbuild verify tiny` in a fresh process, its temporary directories
    under `tmp`, uv's cache beside them (the developer's cache stays untouched)."""
    (tmp / "tmp").mkdir(parents=True, exist_ok=True)
    cmd = [
        envbuild_exe(),
        "verify",
        "tiny",
        "--matrix-dir",
        str(world.overlay),
        "--index-url",
        world.pypi.url,
        *(["--cuda", cuda] if cuda else []),
        *map(str, args),
    ]
    e = clean_env(TMPDIR=str(tmp / "tmp"), UV_CACHE_DIR=str(tmp / "uv-cache"), **(env or {}))
    if popen:
        return subprocess.Popen(
            cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd
        )
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd)


def venv_python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def installed_version(venv: Path, dist: str) -> str:
    return subprocess.run(
        [venv_python(venv), "-c", "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))", dist],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


# ---- the happy path, once, shared by the tests that read it ------------------------------------


@pytest.fixture(scope="module")
def happy(tmp_path_factory):
    """verify tiny on CUDA 11.8 (torch pinned +cu118) with the PyTorch index unreachable, and the
    host's pip and uv settings pointed at things that would break an install that read them."""
    root = tmp_path_factory.mktemp("verify-happy")
    bad_conf = root / "pip.conf"
    bad_conf.write_text(
        f"[global]\nindex-url = http://127.0.0.1:9/simple\nconstraint = {root / 'no-such-constraints.txt'}\n"
    )
    hostile = {
        "PIP_CONFIG_FILE": str(bad_conf),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_CONSTRAINT": str(root / "no-such.txt"),
        "PIP_FIND_LINKS": str(root),
        "UV_INDEX_URL": "http://127.0.0.1:9/simple",
        "UV_CONSTRAINT": str(root / "nope.txt"),
    }
    with World(root, cuda="11.8") as w:
        keep = root / "venv"
        t0 = time.monotonic()
        proc = verify(
            w,
            "--json",
            "--keep",
            keep,
            "--torch-index-url",
            closed_port_url("whl/cu118"),
            tmp=root,
            env=hostile,
            cuda="11.8",
        )
        seconds = time.monotonic() - t0
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return {"proc": proc, "report": report, "keep": keep, "world": w, "root": root, "seconds": seconds}


def test_happy_path_passes_every_step(happy):
    proc, report = happy["proc"], happy["report"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["ok"] is True
    (r,) = report["profiles"]
    assert r["ok"] and r["failures"] == []
    assert [x["layer"] for x in r["layers"]] == ["torch", "vllm", "verl-deps", "verl"]
    vllm = r["layers"][1]
    assert vllm.get("empty") and vllm["requirements"] == []  # the HF rollout has no vLLM layer
    for layer in (r["layers"][0], r["layers"][2], r["layers"][3]):
        assert layer["ok"] and layer["pip_check"] == {"ok": True, "problems": []}, layer
    assert "hydra-core==" + V.md.version("hydra-core") in r["layers"][2]["requirements"]


def test_torch_index_unreachable_swaps_the_cu_pins_and_says_so(happy):
    (r,) = happy["report"]["profiles"]
    assert r["torch_swapped"] == "2.6.0+cu118 -> 2.6.0 (PyPI; the PyTorch index is unreachable)"
    assert r["torch_index_url"] is None
    assert r["layers"][0]["requirements"] == ["torch==2.6.0", "torchvision==0.21.0", "torchaudio==2.6.0"]
    assert installed_version(happy["keep"], "torch") == "2.6.0"
    assert "torch 2.6.0+cu118 -> 2.6.0 (PyPI; the PyTorch index is unreachable)" in table(
        happy["report"]["profiles"]
    )


def test_the_hosts_pip_and_uv_settings_do_not_reach_the_installs(happy):
    # PIP_CONFIG_FILE / PIP_INDEX_URL / UV_INDEX_URL / *_CONSTRAINT pointed at nothing: had any
    # of them been read, resolution or pip check would have failed
    (r,) = happy["report"]["profiles"]
    assert r["index_url"] == happy["world"].pypi.url
    assert all(x["ok"] for x in r["layers"])


def test_layers_install_in_the_dockerfile_order_with_progress(happy):
    err = happy["proc"].stderr
    order = [err.index(f"[tiny] layer {name}: uv pip install") for name in ("torch", "verl-deps", "verl")]
    assert order == sorted(order)
    assert "[tiny]   layer torch: Installed " in err  # uv's own summary, forwarded
    assert (
        err.index("layer verl: installed")
        < err.index("[tiny] patches:")
        < err.index("[tiny] import ")
        < err.index("[tiny] compose:")
    )


def test_patches_are_applied_before_the_imports(happy):
    (r,) = happy["report"]["profiles"]
    assert r["patches"]["ok"] and r["patches"]["names"] == ["envbuild-test-guard"]
    site = next((happy["keep"] / "lib").glob("python*/site-packages"))
    assert (site / V.GUARD).read_text() == "GUARDED = False\n"
    # and only the venv's copy: uv's cache (hard-linked by default) keeps the released file
    cached = list((happy["root"] / "uv-cache").rglob("envbuild_guard.py"))
    assert cached and all(p.read_text() == V.GUARD_FIND for p in cached)


def test_every_module_of_the_training_path_imports_in_its_own_interpreter(happy):
    (r,) = happy["report"]["profiles"]
    d = happy["world"].env.to_dict()
    expected = list(d["training_path"])
    assert [i["module"] for i in r["imports"]] == expected
    assert all(i["ok"] and i["error"] is None for i in r["imports"]), r["imports"]
    assert r["isolation"]  # says how the imports and the compose were kept off the network


def test_the_run_scripts_overrides_compose_with_verls_hydra_config(happy):
    (r,) = happy["report"]["profiles"]
    c = r["compose"]
    assert c["ok"], c
    d = happy["world"].env.to_dict()
    from envbuilder.render.files import RUN_SCRIPT, render_files

    script = render_files(BuildContext.of(happy["world"].env))[RUN_SCRIPT]
    block = script.split("\nargs=(\n", 1)[1].split("\n)\n", 1)[0]
    n_args = sum(1 for ln in block.splitlines() if "=" in ln and not ln.strip().startswith("#"))
    assert c["overrides"] == n_args and c["checked"] == n_args and c["mismatches"] == []
    # verl's own validation: the stand-in 0.4.1 has no validate_config (0.6+ has), and the
    # composed config passes the batch arithmetic of its workers
    assert c["validation"]["validated"] is None and "validate_config" in c["validation"]["why"]
    assert c["validation"]["violations"] == []
    assert c["values"] == {
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.dtype": "bfloat16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": d["memory"]["batch"][
            "actor_ppo_micro_batch_size_per_gpu"
        ],
    }


def test_keep_leaves_the_venv_and_nothing_else(happy):
    (r,) = happy["report"]["profiles"]
    assert r["venv"] == str(happy["keep"]) and (happy["keep"] / "pyvenv.cfg").is_file()
    assert list((happy["root"] / "tmp").iterdir()) == []  # the temporary work dir is gone


def test_table_has_one_row_per_profile(happy):
    text = table(happy["report"]["profiles"])
    header, row = text.splitlines()[:2]
    assert header.split()[:2] == ["PROFILE", "PYTHON"]
    n = len(happy["report"]["profiles"][0]["imports"])
    assert row.split()[:2] == ["tiny", V.PY] and f"{n}/{n}" in row and row.endswith("ok")
    assert "3/3 layers" in row and "clean" in row and "accepted" in row


# ---- the branches that fail ---------------------------------------------------------------------


def test_conflict_import_error_and_rejected_override_are_each_reported(tmp_path):
    """accelerate (verl-deps layer) moves a package torchvision (torch layer) pinned: pip check
    fails after verl-deps; verl's FSDP workers raise on import; verl's config lacks a key the script
    sets, so Hydra refuses the override. Everything else still runs and passes."""
    config = V.CONFIG.read_text().replace("    gpu_memory_utilization: 0.5\n", "", 1)
    assert "gpu_memory_utilization" not in config
    root = tmp_path
    with World(root, conflict=True, raising="verl.workers.fsdp_workers", config=config) as w:
        proc = verify(w, "--json", tmp=root)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (r,) = json.loads(proc.stdout)["profiles"]
    assert not r["ok"]
    layers = {x["layer"]: x for x in r["layers"]}
    assert layers["torch"]["pip_check"]["ok"]
    check = layers["verl-deps"]["pip_check"]
    assert not check["ok"]
    assert any("torchvision" in p and "envbuild-shared" in p for p in check["problems"]), check
    imports = {i["module"]: i for i in r["imports"]}
    assert imports["verl.workers.fsdp_workers"]["error"] == (
        "RuntimeError: libcuda.so.1: cannot open shared object file: No such file or directory"
    )
    assert imports["verl"]["ok"] and imports["verl.trainer.main_ppo"]["ok"]
    c = r["compose"]
    assert not c["ok"]
    assert "Could not override 'actor_rollout_ref.rollout.gpu_memory_utilization'" in c["error"]
    assert "not in struct" in c["error"]
    # the table and the failure lines say the same
    assert "fails after verl-deps" in table([r]) and "rejected" in table([r])
    assert "envbuild: error: 1 of 1 profile(s) failed verification (tiny)" in proc.stderr


def test_a_layer_that_cannot_install_stops_the_later_ones(tmp_path):
    pins = {"hydra-core": V.md.version("hydra-core"), "transformers": "4.51.3", "accelerate": "1.7.0"}
    with World(tmp_path, pins=pins) as w:
        # the index has no transformers 9.9.9: the verl-deps layer cannot resolve
        write_overlay(w.overlay, V.overlay_doc({**pins, "transformers": "9.9.9"}))
        proc = verify(w, "--json", tmp=tmp_path)
    assert proc.returncode == 1
    (r,) = json.loads(proc.stdout)["profiles"]
    layers = {x["layer"]: x for x in r["layers"]}
    assert layers["torch"]["ok"] and not layers["verl-deps"]["ok"]
    assert "transformers==9.9.9" in layers["verl-deps"]["error"]
    assert layers["verl"]["error"] == "not run: an earlier layer did not install"
    assert r["imports"] == [] and r["compose"] is None and r["patches"] is None
    assert any(f.startswith("layer verl-deps did not install: ") for f in r["failures"])


def test_the_lock_of_the_profiles_plan_constrains_the_installs(tmp_path):
    """As `envbuild render` does, verify installs under the pins of the lock whose plan the
    profile is (./lockfiles/<profile>, then the shipped ones): a lock that pins an omegaconf (a
    dependency of hydra-core) the index does not have stops the layer that installs it."""
    import hashlib

    from envbuilder.lock import lockfile as L

    with World(tmp_path) as w:
        lock = tmp_path / "cwd" / "lockfiles" / "tiny"
        lock.mkdir(parents=True)
        hydra = V.md.version("hydra-core")  # what the stand-in world pins; omegaconf under it
        text = f"hydra-core=={hydra}\n    # via -r requirements.in\nomegaconf==0.0.1\n    # via hydra-core\n"
        (lock / "requirements.lock").write_text(text, encoding="utf-8")
        (lock / "lock.json").write_text(
            json.dumps(
                {
                    "format": L.FORMAT,
                    "profile": "tiny",
                    "input_sha256": "0" * 64,
                    # the pip inputs of the world's environment: the one thing a render matches on
                    "inputs": L.input_digests(w.env, ["pip"]),
                    "parts": ["pip"],
                    "files": {"requirements.lock": hashlib.sha256(text.encode()).hexdigest()},
                }
            )
        )
        proc = verify(w, "--json", "--skip-compose", tmp=tmp_path, cwd=tmp_path / "cwd")
    assert proc.returncode == 1, proc.stderr[-3000:]
    (r,) = json.loads(proc.stdout)["profiles"]
    assert r["constraints"] is True
    layers = {x["layer"]: x for x in r["layers"]}
    assert layers["torch"]["ok"] and not layers["verl-deps"]["ok"]
    assert "omegaconf==0.0.1" in layers["verl-deps"]["error"], layers["verl-deps"]["error"]


def test_a_reachable_torch_index_keeps_the_cu_builds(tmp_path):
    with World(tmp_path, cuda="11.8") as w:
        proc = verify(
            w,
            "--json",
            "--skip-compose",
            "--keep",
            tmp_path / "venv",
            "--torch-index-url",
            w.torch.url,
            tmp=tmp_path,
            cuda="11.8",
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (r,) = json.loads(proc.stdout)["profiles"]
    assert r["torch_swapped"] is None and r["torch_index_url"] == w.torch.url
    assert r["layers"][0]["requirements"][0] == "torch==2.6.0+cu118"
    assert installed_version(tmp_path / "venv", "torch") == "2.6.0+cu118"
    assert r["compose"] == {"skipped": "--skip-compose"}


def test_ctrl_c_stops_the_install_and_removes_the_venv(tmp_path):
    with World(tmp_path) as w:
        proc = verify(w, "--keep", tmp_path / "venv", tmp=tmp_path, popen=True)
        seen = ""
        deadline = time.monotonic() + 300
        while "layer torch: uv pip install" not in seen and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
        assert "layer torch: uv pip install" in seen, seen
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "[tiny] stopped: removed the unfinished venv" in err and "Aborted." in err
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "venv").exists()
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", "a child of verify outlived Ctrl-C"


# ---- bad input: exit 2, one paragraph, nothing installed -----------------------------------------


def test_no_interpreter_for_the_profiles_python_is_exit_2(tmp_path):
    doc = V.overlay_doc()
    for rec in doc["cuda"].values():
        rec["python"] = "3.99"
    doc["torch"]["2.6.0"]["python"] = doc["torch"]["2.6.0"]["python"] + ["3.99"]
    overlay = write_overlay(tmp_path / "overlay", doc)
    proc = subprocess.run(
        [envbuild_exe(), "verify", "tiny", "--matrix-dir", str(overlay)],
        env=clean_env(TMPDIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "No Python 3.99 interpreter" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and list(tmp_path.glob("envbuild-verify-*")) == []


@pytest.mark.parametrize(
    "args, text",
    [
        (["nope"], "Unknown profile 'nope'"),
        ([], "Name one or more profiles, or --all"),
        (["p40", "--all"], "Name one or more profiles, or --all"),
        (["p40", "--index-url", "not a url"], "is not an index URL"),
        (["p40", "--torch-index-url", "ftp://x"], "is not an index URL"),
        (["p40", "--rollout", "vllm"], "vLLM"),
    ],
)
def test_bad_input_is_exit_2_without_a_traceback(run_envbuild, args, text):
    proc = run_envbuild("verify", *args)
    assert proc.returncode == 2, proc.stderr
    assert text in proc.stderr and "Traceback" not in proc.stderr


def test_keep_into_a_non_empty_directory_is_refused(run_envbuild, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("not envbuild's")
    proc = run_envbuild("verify", "p40", "--keep", tmp_path / "full")
    assert proc.returncode == 2 and "is not an empty directory" in proc.stderr
    assert (tmp_path / "full" / "mine.txt").read_text() == "not envbuild's"


# ---- the pure parts -------------------------------------------------------------------------------


def test_local_pins_and_swap_keep_everything_but_the_label():
    pins = local_pins(["torch==2.6.0+cu118", "torchvision==0.21.0+cu118", "numpy==1.26.4"])
    assert pins == {"torch": ("2.6.0+cu118", "2.6.0"), "torchvision": ("0.21.0+cu118", "0.21.0")}
    assert swap_line("torch==2.6.0+cu118", pins) == "torch==2.6.0"
    assert (
        swap_line("Torch==2.6.0+cu118 ; python_version >= '3.9'", pins)
        == "Torch==2.6.0 ; python_version >= '3.9'"
    )
    assert swap_line("torch==2.6.0+cu124", pins) == "torch==2.6.0+cu124"  # not the swapped pin
    assert swap_line("numpy==1.26.4", pins) == "numpy==1.26.4"
    assert local_pins(resolved("4090").to_dict()["torch"]["packages"]) == {}


def test_the_extensions_modules_are_reported_not_imported():
    modules, ext = import_plan(resolved("p40", frozen()))
    apex = {"apex", "apex_C", "amp_C", "fused_layer_norm_cuda"}
    assert ext == dict.fromkeys(apex, "apex") and apex <= set(modules)
    modules, ext = import_plan(resolved("3090", frozen()))
    assert ext == {"flash_attn": "flash_attn", "flash_attn_2_cuda": "flash_attn"}
    assert import_plan(resolved("4090", frozen()))[1] == {}


def test_a_stub_libcuda_lets_a_module_linked_against_the_driver_load(tmp_path):
    """vllm._C links libcuda.so.1, which only a driver provides: on a machine without one, verify
    builds a stub exporting the driver-API symbols such modules name, so they load (and the
    loader checks their other symbols, torch's ABI) while nothing calls the driver."""
    from envbuilder.machine.verify import build_libcuda_stub, libcuda_users

    need(all(shutil.which(t) for t in ("cc", "readelf", "nm")), "needs cc, readelf and nm (binutils, gcc)")
    link = tmp_path / "link"  # a libcuda to link against, as the real one is at build time
    assert build_libcuda_stub(["cuInit", "cuMemCreate"], link) is True
    pkg = tmp_path / "site" / "ext"
    pkg.mkdir(parents=True)
    (tmp_path / "user.c").write_text(
        "int cuInit(unsigned); int cudaFree(void*);\nint probe(void) { return cuInit(0); }\n"
    )
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-o",
            str(pkg / "_C.so"),
            str(tmp_path / "user.c"),
            f"-L{link}",
            "-l:libcuda.so.1",
            "-Wl,--allow-shlib-undefined",
        ],
        check=True,
    )
    (pkg / "plain.so").write_bytes((pkg / "_C.so").read_bytes().replace(b"libcuda.so.1", b"libcudx.so.1"))
    users = libcuda_users(tmp_path / "site", {"ext", "absent"})
    assert users == {pkg / "_C.so": {"cuInit"}}  # not cudaFree (the runtime's), not plain.so

    load = "import ctypes, os, sys; lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW); print(lib.probe())"
    env = clean_env()
    env.pop("LD_LIBRARY_PATH", None)
    bare = subprocess.run(
        [sys.executable, "-c", load, str(pkg / "_C.so")], env=env, capture_output=True, text=True
    )
    assert bare.returncode != 0 and "libcuda.so.1" in bare.stderr
    stub = tmp_path / "stub"
    assert build_libcuda_stub(sorted(users[pkg / "_C.so"]), stub) is True
    loaded = subprocess.run(
        [sys.executable, "-c", load, str(pkg / "_C.so")],
        env={**env, "LD_LIBRARY_PATH": str(stub)},
        capture_output=True,
        text=True,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "34"  # CUDA_ERROR_STUB_LIBRARY: the driver is never reached


def test_check_overrides_compares_values_as_hydra_parses_them():
    cfg = {"a": {"b": 1e-06, "c": False, "d": ["console"], "e": "fp32", "n": None, "i": 2}}
    args = ["a.b=1e-6", "a.c=False", "a.d=[console]", "++a.e=fp32", "a.n=null", "a.i=2", "~a.x", "a.f=${a.e}"]
    assert check_overrides(cfg, args) == (6, [])
    n, wrong = check_overrides(cfg, ["a.i=3", "+a.missing=1", "a.d=[console,wandb]"])
    assert n == 3 and [w["override"] for w in wrong] == ["a.i=3", "+a.missing=1", "a.d=[console,wandb]"]
    assert wrong[1]["composed"] is None and wrong[0]["composed"] == "2"


def test_printed_config_is_found_after_import_noise():
    text = "WARNING: something printed by an import\nINFO x\ndata:\n  a: 1\ntrainer:\n  b: two\n"
    assert parse_printed_config(text) == {"data": {"a": 1}, "trainer": {"b": "two"}}
    assert parse_printed_config("nothing here\n") is None


def test_hydra_error_keeps_hydras_message_or_a_tracebacks_last_line():
    err = (
        "Could not override 'x.y'.\nTo append to your config use +x.y=1\nKey 'y' is not in "
        "struct\n    full_key: x.y\n\nSet the environment variable HYDRA_FULL_ERROR=1 for a "
        "complete stack trace.\n"
    )
    assert hydra_error(err) == (
        "Could not override 'x.y'. / To append to your config use +x.y=1 / Key 'y' is not in struct"
    )
    tb = 'Traceback (most recent call last):\n  File "x", line 1\nImportError: no ray\n'
    assert hydra_error(tb) == "ImportError: no ray"


def test_render_does_not_load_verify():
    code = (
        "import sys; from envbuilder.cli import main\n"
        "try:\n    main(['render', 'p40', '-o', sys.argv[1]])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('envbuilder')))"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "-c", code, str(Path(tmp) / "o")],
            capture_output=True,
            text=True,
            env=clean_env(),
            check=True,
        ).stdout
    assert "envbuilder.machine.verify" not in out and "envbuilder.cli.verify" not in out


# ---- the real thing (opt-in: -m heavy, or ENVBUILD_HEAVY=1 tests/run.sh) -------------------------

REAL_PROFILES = os.environ.get("ENVBUILD_VERIFY_PROFILES", "4090").split(",")


@pytest.mark.heavy
@pytest.mark.parametrize("profile", REAL_PROFILES)
def test_real_install_of_a_shipped_profile(profile, tmp_path):
    """The profile's real pins from PyPI (GBs): every layer installs with a clean pip check,
    every module of the training path imports, and verl's own config accepts the script."""
    proc = subprocess.run(
        [envbuild_exe(), "verify", profile, "--json"],
        capture_output=True,
        text=True,
        timeout=3600,
        env=clean_env(TMPDIR=str(tmp_path)),
    )
    assert proc.stdout.strip(), f"no report (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    (r,) = json.loads(proc.stdout)["profiles"]
    assert r["failures"] == [] and proc.returncode == 0, "\n".join(r["failures"])
    assert all(x["ok"] for x in r["layers"]) and r["imports"] and r["compose"]["ok"]


def test_the_multi_node_overrides_compose_with_verls_hydra_config(tmp_path):
    """`verify --nodes 2 --gpus-per-node 2 --algo grpo`: the run script's multi-node overrides
    (trainer.nnodes, trainer.n_gpus_per_node, the batches rounded to the world) and GRPO's
    compose with the release's own Hydra config, and each composed value is the one asked."""
    flags = ("--nodes", "2", "--gpus-per-node", "2", "--algo", "grpo")
    with World(tmp_path, cuda="11.8") as w:
        proc = verify(
            w, "--json", *flags, "--torch-index-url", closed_port_url("whl/cu118"), tmp=tmp_path, cuda="11.8"
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (r,) = json.loads(proc.stdout)["profiles"]
    c = r["compose"]
    from envbuilder.render.files import RUN_SCRIPT, render_files

    env = tiny_env(w.overlay, cuda="11.8", nodes=2, gpus_per_node=2, algo="grpo")
    script = render_files(BuildContext.of(env))[RUN_SCRIPT]
    block = script.split("\nargs=(\n", 1)[1].split("\n)\n", 1)[0]
    args = [ln.strip() for ln in block.splitlines() if "=" in ln and not ln.strip().startswith("#")]
    assert 'trainer.nnodes="$NNODES"' in args and 'trainer.n_gpus_per_node="$N_GPUS"' in args
    assert "NNODES=${NNODES:-2}" in script and "N_GPUS=${N_GPUS:-2}" in script
    assert "algorithm.adv_estimator=grpo" in args
    assert c["ok"], c
    assert c["overrides"] == len(args) and c["checked"] == len(args) and c["mismatches"] == []


def test_a_run_verl_would_refuse_fails_validation():
    """verify's judgement of the validate step: verl's validate_config refusing, a composed config
    whose log-prob micro-batch does not divide each GPU's share on an engine release, and no
    result at all each fail with the reason; a clean one passes."""
    from envbuilder.machine.verify import judge_validation

    cfg = {
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
        "algorithm": {"adv_estimator": "grpo"},
        "data": {"train_batch_size": 256},
        "actor_rollout_ref": {
            "actor": {"ppo_mini_batch_size": 256, "ppo_micro_batch_size_per_gpu": 16},
            "rollout": {"n": 1, "log_prob_micro_batch_size_per_gpu": 22},
        },
    }
    ok = {"ok": True, "validated": True, "config": cfg}
    entry, failure = judge_validation(ok, engine=True, critic_engine="critic.fsdp")
    assert "log_prob_micro_batch_size_per_gpu=22" in failure and entry["violations"]
    assert judge_validation(ok, engine=False, critic_engine="critic.fsdp")[1] is None
    refused = {"ok": True, "validated": False, "error": "AssertionError: real_train_batch_size (3)"}
    assert (
        "validate_config refused the run: AssertionError" in judge_validation(refused, True, "critic.fsdp")[1]
    )
    assert "no result" in judge_validation(None, True, "critic.fsdp")[1]


def test_the_gpu_step_footnote_speaks_only_of_rows_that_ran():
    """The footnote said "verl's workers ran a PPO step ... with this very configuration" under
    rows whose GPU STEP said `not run` (issue 34, item 6)."""
    base = {
        "profile": "p40",
        "python": "3.10",
        "layers": [],
        "patches": None,
        "imports": [],
        "compose": None,
        "seconds": 1.0,
        "ok": True,
        "torch_swapped": None,
        "not_installed": [],
        "failures": [],
        "venv": None,
    }
    none_ran = table([base])
    assert "not run" in none_ran and "ran a PPO step" not in none_ran
    one_ran = table([dict(base, gpu_step="ok (H200, 2 steps)"), dict(base, profile="t4")])
    assert "GPU STEP: for p40, verl's workers ran a PPO step" in one_ran and "t4, verl" not in one_ran


def test_validate_points_the_model_paths_at_a_folder_of_the_models_shape(tmp_path):
    """verl >= 0.8's validate_config reads the model's config and tokenizer (HFModelConfig; the
    critic's asserts one architecture): verify, offline, gives it the render's shape instead."""
    from envbuilder.machine.verify import with_model_shape, write_model_shape

    arch = resolved("h200").memory["arch"]
    write_model_shape(arch, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (
        arch["hidden_size"],
        arch["layers"],
        arch["kv_heads"],
    )
    tok = json.loads((tmp_path / "m" / "tokenizer.json").read_text())
    assert tok["model"]["type"] == "WordLevel" and len(tok["added_tokens"]) == 3
    assert json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"
    args = [
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
        "critic.model.path=Qwen/Qwen2.5-7B-Instruct",
        "++critic.model.path=x",
        "actor_rollout_ref.model.use_remove_padding=False",
        "data.train_files=/d/train.parquet",
    ]
    assert with_model_shape(args, tmp_path / "m") == [
        f"actor_rollout_ref.model.path={tmp_path / 'm'}",
        f"critic.model.path={tmp_path / 'm'}",
        f"++critic.model.path={tmp_path / 'm'}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "data.train_files=/d/train.parquet",
    ]


def test_a_moe_renders_model_shape_is_a_qwen3_moe_config_of_the_same_parameters(tmp_path):
    # verify's offline validate_config reads a folder of the render's shape: a Qwen3-MoE's holds
    # its experts, and reads back as the same model
    from envbuilder.machine.verify import write_model_shape
    from envbuilder.model.architectures import arch_from_config

    env = resolved("h100", model="Qwen/Qwen3-30B-A3B", algo="grpo", nodes=2)
    write_model_shape(env.memory["arch"], tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_experts"] == 128
    back = arch_from_config(config, "config.json", "m")
    assert back["parameters"] == env.memory["arch"]["parameters"] == 30_532_122_624
