"""The world table (docs/world.md, issue 45): each model × setup × algorithm is a plan whose batch
arithmetic holds and whose run overrides passed verl 0.9.1's own validate_config, or a refusal
whose every fix resolves. The page is regenerated from today's matrix and must equal it; the
verl record (tests/fixtures/gpu/validate/world-verl-0.9.1.json: `bench/world_table.py cases`,
then `bench/verl_validate.py device --model-dir` on this machine's CPU in the venv `envbuild
verify h100 --keep` made, torch 2.11.0, each case with a model folder of its own model's shape)
counts only while each case's overrides are today's, by their fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import bench_module
from envbuilder.model import runplan
from envbuilder.model.batches import violations as batch_violations
from envbuilder.model.fixes import alternatives, applied, concrete
from envbuilder.model.matrix import load
from envbuilder.model.resolve import Overrides, resolve

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "world.md"
RECORD = ROOT / "tests" / "fixtures" / "gpu" / "validate" / "world-verl-0.9.1.json"


@pytest.fixture(scope="module")
def wt():
    return bench_module("world_table")


@pytest.fixture(scope="module")
def cells(wt) -> list[tuple[str, str, dict, str, str, dict]]:
    """(label, profile, overrides, model, algo, cell) for every cell of the table."""
    return [
        (label, profile, over, model, algo, wt.cell(profile, model, algo, over))
        for label, profile, over in wt.SETUPS
        for model in wt.MODELS
        for algo in wt.ALGOS
    ]


def test_docs_world_md_is_the_table_todays_matrix_plans(wt):
    today = wt.table()
    assert PAGE.read_text(encoding="utf-8") == today, (
        "docs/world.md differs from today's plans: run `python bench/world_table.py > docs/world.md`"
    )
    # every model and setup of issue 45, both algorithms
    assert [s[0] for s in wt.SETUPS] == [
        "24 GB × 1",
        "48 GB × 1",
        "A100-80 × 8",
        "H100 × 8",
        "H200 × 8",
        "B200 × 8",
        "2 × 8 H100",
    ]
    assert [wt.size_of(m) for m in wt.MODELS] == ["0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B", "30B-A3B"]
    assert "| 30B-A3B MoE |" in today  # the mixture of experts
    assert today.count("\n| ") == 2 * (len(wt.MODELS) + 1) + len(wt.ANCHORS) + 1


def test_the_table_has_plans_and_refusals_on_every_scale(cells):
    planned = {(label, model) for label, _, _, model, _, c in cells if "env" in c}
    refused = [c for *_, c in cells if "env" not in c]
    assert refused and planned
    # a 0.5B fits every setup; a 72B none without more nodes
    assert all((label, "Qwen/Qwen2.5-0.5B-Instruct") in planned for label, *_ in cells)
    assert not any(m == "Qwen/Qwen2.5-72B-Instruct" for _, m in planned)
    assert ("2 × 8 H100", "Qwen/Qwen3-30B-A3B") in planned  # the MoE on two nodes
    # every refusal is the memory rule's: the table's models all exist and every setup is valid
    assert {c["refused"] for c in refused} == {"memory"}


def test_every_refusal_in_the_table_offers_fixes_that_each_resolve(cells):
    m = load()
    for label, profile, over, model, algo, c in cells:
        if "env" in c:
            continue
        ov = Overrides(model=model, algo=algo, **over)
        fixes = [f for f in (concrete(m, a) for a in alternatives(c["fix"])) if f]
        assert fixes, (label, model, algo, c["fix"])
        for flags in fixes:
            env = resolve(m, profile, applied(ov, flags))  # raises when the fix does not resolve
            assert not env.memory["problems"], (label, model, algo, flags)


def test_every_plan_in_the_table_keeps_verl_batch_arithmetic(cells):
    for label, _, _, model, algo, c in cells:
        if "env" in c:
            env = c["env"]
            cfg = runplan.as_config(env.run, runplan.world(env))
            assert batch_violations(cfg, env.verl.engine_batches) == [], (label, model, algo)


def test_every_plan_in_the_table_passed_verl_own_validate_config(wt):
    rec = json.loads(RECORD.read_text(encoding="utf-8"))
    assert (rec["verl"], rec["torch"]) == ("0.9.1", "2.11.0")
    runs = {r["case"]: r for r in rec["runs"]}
    today = {c["case"]: c for c in wt.cases()}
    assert {c["verl"] for c in today.values()} == {"0.9.1"}
    assert sorted(n for n in today if n not in runs or not runs[n]["validated"]) == []
    assert sorted(n for n in today if n in runs and runs[n]["fingerprint"] != today[n]["fingerprint"]) == []
    assert sorted(set(runs) - set(today)) == []
    # a TP > 1 rollout, an offloaded actor and two nodes are among what verl checked
    ov = [" ".join(c["overrides"]) for c in today.values()]
    assert any("tensor_model_parallel_size=4" in o for o in ov)
    assert any("actor.fsdp_config.optimizer_offload=True" in o for o in ov)
    assert any("trainer.nnodes=2" in o for o in ov)
    assert any("/30B-A3B/" in n for n in today)  # and the mixture of experts


def test_the_32b_gae_on_verl_examples_world_takes_its_rollout_layout(wt):
    # verl's examples/ppo_trainer/run_qwen2.5-32b.sh: 4 × 8 GPUs, rollout TP 4, nothing offloaded
    c = wt.cell("h100", "Qwen/Qwen2.5-32B-Instruct", "gae", {"nodes": 4})
    env = c["env"]
    assert env.memory["rollout_tp"] == 4
    assert not env.train.param_offload and not env.train.optimizer_offload
    assert (env.cluster.nodes, env.train.n_gpus) == (4, 8)
