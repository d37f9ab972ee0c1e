"""The device tier's own tools, where no GPU is: bench/gpu_ppo.py (its log parser, override diff
and card scaling by its selftest; its emulation of another card refusing when the render's
preflight refuses more than the card) and bench/first_step.py (the phases it reads from two
records, and its refusals)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "gpu"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_ppo_selftest_passes():
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_ppo.py"), "selftest"], capture_output=True, text=True
    )
    assert r.returncode == 0 and "selftest: ok" in r.stdout, r.stdout + r.stderr


def test_the_run_scripts_exports_are_read_as_written():
    g = _load("gpu_ppo")
    text = "x=1\nexport HF_ENDPOINT=${HF_ENDPOINT:-https://huggingface.co}\n  export NOT_TOP=1\nexport VLLM_DISABLE_COMPILE_CACHE=${VLLM_DISABLE_COMPILE_CACHE:-0}\n"
    assert g.script_exports(text) == {
        "HF_ENDPOINT": "${HF_ENDPOINT:-https://huggingface.co}",
        "VLLM_DISABLE_COMPILE_CACHE": "${VLLM_DISABLE_COMPILE_CACHE:-0}",
    }


def test_emulation_stops_where_the_preflight_refuses_more_than_the_card(tmp_path, cli):
    """The rendered 5090 preflight on this machine (no GPU: it refuses 'GPU visible'): an emulated
    run would hide that, so it stops with the checks named and runs nothing."""
    out = tmp_path / "r"
    assert cli("render", "5090", "-o", str(out))[0] == 0
    g = _load("gpu_ppo")
    gpus = [{"name": "NVIDIA H200", "memory_total_mib": 143771, "driver": "580.159.04", "compute_cap": "9.0"}]
    got = g.emulate(str(out / "5090"), str(tmp_path), dict(__import__("os").environ), gpus)
    assert got["profile_cc"] == "12.0" and got["device_cc"] == "9.0"
    assert "preflight refused more than the card" in got["error"] and "GPU visible" in got["error"]
    assert "render" not in got and not (tmp_path / "render-emulated").exists()
    assert "needs nvidia-smi's compute_cap" in g.emulate(str(out / "5090"), str(tmp_path), {}, [])["error"]


def test_first_step_reads_each_phase_from_the_two_records():
    fs = _load("first_step")
    before = json.loads((FIX / "first_step" / "5090-grpo-cold.json").read_text())
    after = json.loads((FIX / "ppo" / "5090-grpo.json").read_text())
    rep = fs.report(before, after, None)
    rows = {r["phase"]: r for r in rep["rows"]}
    tb, ta = before["timeline"], after["timeline"]
    compile_row = rows["rollout server: start and compile"]
    assert compile_row["before_s"] == round(tb["graph_capture"] - tb["workers_ready"], 1)
    assert compile_row["after_s"] == round(ta["graph_capture"] - ta["workers_ready"], 1)
    assert rows["to step 1"]["ratio"] == round(ta["step1"] / tb["step1"], 3)
    # the change under test: the second launch read vLLM's compile cache the script kept on
    assert after["script_exports"]["VLLM_DISABLE_COMPILE_CACHE"] == "${VLLM_DISABLE_COMPILE_CACHE:-0}"
    assert compile_row["ratio"] < 0.8


def test_first_step_refuses_two_cases_or_a_missing_record(tmp_path, capsys):
    fs = _load("first_step")
    assert (
        fs.main(
            ["--before", str(FIX / "ppo" / "h200-gae.json"), "--after", str(FIX / "ppo" / "5090-grpo.json")]
        )
        == 2
    )
    assert "compare one case" in capsys.readouterr().err
    assert fs.main(["--before", str(tmp_path / "none.json")]) == 2
    assert "cannot read a record" in capsys.readouterr().err
    assert fs.main([]) == 0 and "to step 1" in capsys.readouterr().out
