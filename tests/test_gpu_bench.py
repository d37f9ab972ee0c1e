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
    assert "cannot read a record" in capsys.readouterr().err
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
