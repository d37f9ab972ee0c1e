"""The device tier's own tools, where no GPU is: bench/gpu_ppo.py (its log parser, override diff
and card scaling by its selftest; its emulation of another card refusing when the render's
preflight refuses more than the card) and bench/first_step.py (the phases it reads from two
records, and its refusals)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import bench_module

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "gpu"


def test_gpu_ppo_selftest_passes():
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_ppo.py"), "selftest"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "selftest: ok" in r.stdout, r.stdout + r.stderr


def test_the_run_scripts_exports_are_read_as_written():
    g = bench_module("gpu_ppo")
    text = "x=1\nexport HF_ENDPOINT=${HF_ENDPOINT:-https://huggingface.co}\n  export NOT_TOP=1\nexport VLLM_DISABLE_COMPILE_CACHE=${VLLM_DISABLE_COMPILE_CACHE:-0}\n"
    assert g.script_exports(text) == {
        "HF_ENDPOINT": "${HF_ENDPOINT:-https://huggingface.co}",
        "VLLM_DISABLE_COMPILE_CACHE": "${VLLM_DISABLE_COMPILE_CACHE:-0}",
    }


H200 = [{"name": "NVIDIA H200", "memory_total_mib": 143771, "driver": "580.159.04", "compute_cap": "9.0"}]


def _render_with_preflight(tmp_path: Path, cli, refused: list[str]) -> Path:
    """The real 5090 render, its preflight.py replaced by one reporting `refused` as failed
    checks (the checks a GPU machine would give: this one has no GPU)."""
    out = tmp_path / "r"
    assert cli("render", "5090", "-o", str(out))[0] == 0
    checks = [{"check": c, "ok": False, "detail": f"{c} detail", "fix": "x"} for c in refused]
    checks.append({"check": "driver", "ok": True, "detail": "580", "fix": None})
    (out / "5090" / "preflight.py").write_text(
        f"import json\nprint(json.dumps({{'checks': {checks!r}}}))\nraise SystemExit(1)\n"
    )
    return out / "5090"


def test_emulation_runs_a_copy_naming_the_devices_compute_capability(tmp_path, cli):
    render = _render_with_preflight(tmp_path, cli, ["GPU 0 profile"])
    g = bench_module("gpu_ppo")
    got = g.emulate(str(render), str(tmp_path), dict(os.environ), H200)
    assert "error" not in got, got
    assert (got["profile_cc"], got["device_cc"], got["profile_gpu"]) == (
        "12.0",
        "9.0",
        "NVIDIA GeForce RTX 5090",
    )
    assert [c["check"] for c in got["preflight_refused"]] == ["GPU 0 profile"]
    copy = Path(got["render"])
    assert copy == tmp_path / "render-emulated"
    before = json.loads((render / "envbuild-scripts.json").read_text())
    after = json.loads((copy / "envbuild-scripts.json").read_text())
    assert after["preflight"].pop("compute_capability") == "9.0"
    assert before["preflight"].pop("compute_capability") == "12.0"
    assert after == before  # the sidecar's one change
    for f in ("run_ppo_gsm8k.sh", "envbuild.json", "apply_patches.py"):
        assert (copy / f).read_bytes() == (render / f).read_bytes()
    assert got["sidecar_changed"] == {"preflight.compute_capability": ["12.0", "9.0"]}


def test_emulation_stops_where_the_preflight_refuses_more_than_the_card(tmp_path, cli):
    render = _render_with_preflight(tmp_path, cli, ["GPU 0 profile", "GPU 0 memory"])
    g = bench_module("gpu_ppo")
    got = g.emulate(str(render), str(tmp_path), dict(os.environ), H200)
    assert got["error"] == "preflight refused more than the card: GPU 0 memory"
    assert "render" not in got and not (tmp_path / "render-emulated").exists()
    assert "needs nvidia-smi's compute_cap" in g.emulate(str(render), str(tmp_path), {}, [])["error"]
    (render / "envbuild-scripts.json").write_text("{")
    assert "the render's sidecar" in g.emulate(str(render), str(tmp_path), {}, H200)["error"]


def test_first_step_reads_each_phase_from_the_two_records():
    fs = bench_module("first_step")
    before = json.loads((FIX / "first_step" / "5090-grpo-cold.json").read_text())
    after = json.loads((FIX / "ppo" / "5090-grpo.json").read_text())
    rows = {r["phase"]: r for r in fs.report(before, after, None)["rows"]}
    # the records' timelines: vLLM's server line at 175.0 / 157.4 s, its first CUDA-graph capture
    # at 274.0 / 215.5 s, step 1 at 413.7 / 344.4 s
    assert (
        rows["rollout server: load and compile"]["before_s"],
        rows["rollout server: load and compile"]["after_s"],
    ) == (99.0, 58.1)
    assert rows["rollout server: load and compile"]["ratio"] == 0.587
    assert (rows["to step 1"]["before_s"], rows["to step 1"]["after_s"], rows["to step 1"]["ratio"]) == (
        413.7,
        344.4,
        0.832,
    )
    # both launches ran the script that keeps vLLM's compile cache on (the second found it filled)
    for rec in (before, after):
        assert rec["script_exports"]["VLLM_DISABLE_COMPILE_CACHE"] == "${VLLM_DISABLE_COMPILE_CACHE:-0}"


def test_first_step_refuses_two_cases_or_a_missing_record(tmp_path, capsys):
    fs = bench_module("first_step")
    assert (
        fs.main(
            ["--before", str(FIX / "ppo" / "h200-gae.json"), "--after", str(FIX / "ppo" / "5090-grpo.json")]
        )
        == 2
    )
    assert "differ in case, profile, card_gib, extra_overrides" in capsys.readouterr().err
    assert fs.main(["--before", str(tmp_path / "none.json")]) == 2
    assert "cannot read --before" in capsys.readouterr().err
    assert fs.main([]) == 0 and "to step 1" in capsys.readouterr().out
    assert fs.main(["--ref", "none"]) == 0 and "reference" not in capsys.readouterr().out


def test_a_records_render_overrides_are_todays_plan_in_the_same_form(tmp_path, cli):
    """gpu_ppo records the rendered script's whole args=( ) block; the replay compares it with
    today's run plan key for key, so the two must read alike for an unchanged render."""
    from conftest import resolved

    out = tmp_path / "r"
    flags = ("--model", "Qwen/Qwen2.5-0.5B-Instruct", "--gpus-per-node", "1", "--algo", "grpo")
    assert cli("render", "5090", *flags, "-o", str(out))[0] == 0
    got = bench_module("gpu_ppo").render_overrides((out / "5090" / "run_ppo_gsm8k.sh").read_text())
    env = resolved("5090", model="Qwen/Qwen2.5-0.5B-Instruct", gpus_per_node=1, algo="grpo")
    plan = {a.key.lstrip("+"): str(a.value) for a in env.run}
    assert got == plan and len(plan) > 40
    assert got["actor_rollout_ref.rollout.n"] == "5"


# -- what the bench scripts delete, install and read (issue 43: items 9, 10, 11, 25, 31) -----------


def _wheel(folder: Path) -> Path:
    """A tiny valid wheel (one module) pip installs without an index."""
    import zipfile

    whl = folder / "demo_bench-1.0-py3-none-any.whl"
    files = {
        "demo_bench/__init__.py": "X = 1\n",
        "demo_bench-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: demo-bench\nVersion: 1.0\n",
        "demo_bench-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + "demo_bench-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(whl, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
        z.writestr("demo_bench-1.0.dist-info/RECORD", record)
    return whl


def _parts(tmp_path: Path, sums: bool = True) -> Path:
    """A bundle as gpu_bundle.py splits it: parts/part-00, a tar of wheels/ (+ SHA256SUMS)."""
    import hashlib
    import tarfile

    src = tmp_path / "src"
    (src / "wheels").mkdir(parents=True)
    whl = _wheel(src / "wheels")
    if sums:
        (src / "SHA256SUMS").write_text(f"{hashlib.sha256(whl.read_bytes()).hexdigest()}  {whl.name}\n")
    parts = tmp_path / "parts"
    parts.mkdir()
    with tarfile.open(parts / "part-00", "w") as tar:
        tar.add(src / "wheels", "wheels")
        if sums:
            tar.add(src / "SHA256SUMS", "SHA256SUMS")
    return parts


def test_setup_refuses_a_site_or_bundle_folder_it_did_not_make(tmp_path, capsys):
    g = bench_module("gpu_ppo")
    parts = _parts(tmp_path)
    site, bundle = tmp_path / "home" / "site", tmp_path / "home" / "bundle"
    site.mkdir(parents=True)
    (site / "mine.txt").write_text("the user's")
    assert g.main(["setup", "--parts", str(parts), "--site", str(site)]) == 2
    assert "not a folder gpu_ppo.py made" in capsys.readouterr().err
    assert (site / "mine.txt").read_text() == "the user's"
    # the sibling bundle/ (where the wheels are unpacked) likewise, the site itself new
    site, bundle = tmp_path / "home2" / "site", tmp_path / "home2" / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "notes.txt").write_text("the user's")
    assert g.main(["setup", "--parts", str(parts), "--site", str(site)]) == 2
    assert (bundle / "notes.txt").read_text() == "the user's" and not site.exists()
    assert "not a folder gpu_ppo.py made" in capsys.readouterr().err


def test_setup_installs_into_a_new_site_and_redoes_its_own(tmp_path):
    g = bench_module("gpu_ppo")
    parts, site = _parts(tmp_path), tmp_path / "site"
    assert g.main(["setup", "--parts", str(parts), "--site", str(site)]) == 0
    assert (site / "demo_bench" / "__init__.py").is_file()
    assert g.main(["setup", "--parts", str(parts), "--site", str(site), "--force"]) == 0  # its own: redone
    assert (site / "demo_bench" / "__init__.py").is_file()


def test_setup_refuses_a_bundle_without_sha256sums(tmp_path, capsys):
    g = bench_module("gpu_ppo")
    site = tmp_path / "site"
    assert g.main(["setup", "--parts", str(_parts(tmp_path, sums=False)), "--site", str(site)]) == 2
    assert "SHA256SUMS" in capsys.readouterr().err
    assert not (site / "demo_bench").exists()


def _fake_render(tmp_path: Path) -> Path:
    render = tmp_path / "render"
    render.mkdir()
    (render / "envbuild.json").write_text(json.dumps({"profile": "x", "memory": {"arch": {"vocab_size": 8}}}))
    (render / "run_ppo_gsm8k.sh").write_text("args=(\n  data.train_batch_size=4\n)\n")
    return render


def test_run_refuses_a_work_folder_it_did_not_make_dry_run_included(tmp_path, capsys):
    g = bench_module("gpu_ppo")
    work = tmp_path / "home"
    (work / "data").mkdir(parents=True)
    (work / "data" / "gsm8k.parquet").write_text("the user's")
    (work / "gsm8k-raw").mkdir()
    args = ["run", "--render", str(_fake_render(tmp_path)), "--site", str(tmp_path / "site")]
    args += ["--out", str(tmp_path / "out"), "--case", "c", "--work", str(work), "--dry-run"]
    assert g.main(args) == 2
    assert "not a folder gpu_ppo.py made" in capsys.readouterr().err
    assert (work / "data" / "gsm8k.parquet").read_text() == "the user's" and (work / "gsm8k-raw").is_dir()


@pytest.mark.parametrize("case", ["../../home/me", "../x", ".hidden", "a/b", "", "x y"])
def test_run_takes_a_plain_case_name_only(tmp_path, capsys, case):
    g = bench_module("gpu_ppo")
    out = tmp_path / "a" / "out"
    args = ["run", "--render", str(_fake_render(tmp_path)), "--site", str(tmp_path / "site")]
    args += ["--out", str(out), "--case", case, "--work", str(tmp_path / "w"), "--dry-run"]
    assert g.main(args) == 2
    assert "is not a plain name" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "w").exists() and not list((tmp_path / "a").glob("*.json"))


def test_the_bench_folder_rule(tmp_path):
    """benchsafe: a folder is claimed new, empty or marked by the same script; a link, a file,
    another script's folder or a non-empty unmarked one is refused; emptying keeps the marker."""
    bs = bench_module("benchsafe")
    new = tmp_path / "new"
    bs.claim(str(new), "a.py")
    assert (new / bs.MARK).read_text() == "a.py\n"
    (new / "sub").mkdir()
    (new / "sub" / "f").write_text("x")
    (new / "link").symlink_to(tmp_path)
    bs.empty(str(new), "a.py")
    assert sorted(os.listdir(new)) == [bs.MARK] and tmp_path.is_dir()
    with pytest.raises(bs.Refused, match="is a.py's"):
        bs.claim(str(new), "b.py")
    (tmp_path / "link").symlink_to(new)
    with pytest.raises(bs.Refused, match="is a link"):
        bs.empty(str(tmp_path / "link"), "a.py")
    (tmp_path / "file").write_text("x")
    with pytest.raises(bs.Refused, match="not a folder"):
        bs.claim(str(tmp_path / "file"), "a.py")
    bs.claim(str(tmp_path / "empty-dir"), "a.py")  # (created)
    for bad in ("..", ".x", "a/b", "x" * 129):
        with pytest.raises(bs.Refused):
            bs.plain_name(bad, "--case")
    assert bs.plain_name("h200-gae_1.2", "--case") == "h200-gae_1.2"


def test_gpu_bundle_refuses_an_out_folder_it_did_not_make(tmp_path):
    """--out DIR with the user's files in DIR/wheels/ and DIR/parts/: refused before any
    download (today's script deleted every file there it did not plan)."""
    out = tmp_path / "out"
    (out / "wheels").mkdir(parents=True)
    (out / "parts").mkdir()
    (out / "wheels" / "mine.whl").write_text("the user's")
    (out / "parts" / "part-mine").write_text("the user's")
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull)
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_bundle.py"), "--profile", "h200", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "not a folder gpu_bundle.py made" in r.stderr, r.stdout + r.stderr
    assert (
        (out / "wheels" / "mine.whl").read_text() == (out / "parts" / "part-mine").read_text() == "the user's"
    )
    # a link as one of its folders is refused too, even inside a folder it made
    new = tmp_path / "new"
    new.mkdir()
    (new / ".envbuild-bench").write_text("gpu_bundle.py\n")
    (new / "wheels").symlink_to(out / "wheels")
    r = subprocess.run([*cmd[:-1], str(new)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "is a link" in r.stderr, r.stdout + r.stderr
    assert (out / "wheels" / "mine.whl").is_file()


def _first_step(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "bench" / "first_step.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def test_first_step_refuses_a_record_without_a_timeline(tmp_path):
    rec = json.loads((FIX / "ppo" / "5090-grpo.json").read_text())
    for broken in ({k: v for k, v in rec.items() if k != "timeline"}, dict(rec, timeline=[1]), [rec]):
        (tmp_path / "r.json").write_text(json.dumps(broken))
        r = _first_step("--after", str(tmp_path / "r.json"), "--ref", "none")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "not a gpu_ppo.py run record" in r.stderr


def test_first_step_refuses_a_fifo_without_waiting(tmp_path):
    fifo = tmp_path / "rec.json"
    os.mkfifo(fifo)
    r = _first_step("--before", str(fifo))  # (today's script waits for a writer for good)
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
