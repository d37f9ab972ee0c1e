"""vLLM's compile cache in the run script: kept on (VLLM_DISABLE_COMPILE_CACHE=0 unless exported)
where the verl release lets the launching shell decide (verl.yaml `compile_cache`: 0.9.0 and
0.9.1 drop every runtime-env variable the shell has set) and torch writes Inductor's artifacts
atomically (2.10 and later, pytorch#162432; vLLM 0.24.0 backports it only below 2.10). Elsewhere
the script says nothing of it and verl's default (off) holds."""

from __future__ import annotations

from conftest import resolved, shipped

from envbuilder.model.components import vllm as VLLM


def test_the_gate_opens_at_torch_210():
    verl = shipped().verl["0.9.1"]
    assert VLLM.compile_cache(verl, "2.9.1") is None
    for torch_v in ("2.10.0", "2.10", "2.11.0"):
        cc = VLLM.compile_cache(verl, torch_v)
        assert cc is not None and (cc.env, cc.value) == ("VLLM_DISABLE_COMPILE_CACHE", "0")
    assert VLLM.compile_cache(shipped().verl["0.8.0"], "2.11.0") is None  # 0.8 overrides the shell


def test_the_default_vllm_stack_keeps_it_and_other_stacks_do_not():
    assert resolved("h200").vllm.compile_cache.env == "VLLM_DISABLE_COMPILE_CACHE"
    assert resolved("h100", verl="0.8.0").vllm.compile_cache is None
    assert resolved("p40").vllm is None


def test_the_run_script_and_the_readme_say_it_only_where_it_holds(tmp_path, cli):
    for p in ("h200", "p40"):
        assert cli("render", p, "-o", str(tmp_path / "r"))[0] == 0
    h200, p40 = (tmp_path / "r" / p for p in ("h200", "p40"))
    script = (h200 / "run_ppo_gsm8k.sh").read_text()
    assert "\nexport VLLM_DISABLE_COMPILE_CACHE=${VLLM_DISABLE_COMPILE_CACHE:-0}\n" in script
    assert '-v "$HOME/.cache/vllm:/root/.cache/vllm"' in (h200 / "README.md").read_text()
    assert "VLLM_DISABLE_COMPILE_CACHE" not in (p40 / "run_ppo_gsm8k.sh").read_text()
    assert ".cache/vllm" not in (p40 / "README.md").read_text()
