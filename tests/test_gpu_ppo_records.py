"""The device records of the rendered run script (tests/fixtures/gpu/ppo/, bench/gpu_ppo.py on an
H200): each counts only while today's render is what ran. Replayed here without a GPU: the run
went through a first validation and two PPO steps with rc 0; it changed nothing of the render but
the keys a device run may cut (never a per-GPU micro-batch); the values it changed from are
today's render's; the versions are today's pins; and its memory stayed under the card it
emulated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import resolved

ROOT = Path(__file__).resolve().parent.parent
RECORDS = sorted((ROOT / "tests" / "fixtures" / "gpu" / "ppo").glob("*.json"))
# what a device run may change: its length (steps, a first validation), the train batch and the
# response length (device time), and vLLM's memory share where it emulates a smaller card
MAY_CHANGE = {
    "trainer.total_training_steps",
    "trainer.val_before_train",
    "data.train_batch_size",
    "data.max_response_length",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
}


def record(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_records_cover_the_whole_card_and_a_capped_one():
    cases = {record(p)["case"]: record(p) for p in RECORDS}
    assert {"h200-gae", "h100-gae"} <= set(cases)
    assert cases["h200-gae"]["card_gib"] is None and cases["h100-gae"]["card_gib"] == 80.0


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_a_record_ran_two_steps_of_todays_render(path):
    r = record(path)
    assert (r["rc"], r["status"]) == (0, "ok")
    t = r["timeline"]
    assert (
        t["ray_init"]
        < t["workers_ready"]
        < t["rollout_start"]
        < t["validation_done"]
        < t["step1"]
        < t["step2"]
    )
    assert {"0", "1", "2"} <= set(r["steps"])  # the first validation, then steps 1 and 2
    assert set(r["overrides_changed"]) <= MAY_CHANGE, sorted(set(r["overrides_changed"]) - MAY_CHANGE)
    env = resolved(r["profile"], model=r["model"], gpus_per_node=1, algo=r["case"].split("-")[-1])
    plan = {a.key.lstrip("+"): a.value for a in env.run}
    for key, change in r["overrides_changed"].items():
        if change["render"] is not None:  # the value it was changed from is today's render's
            assert key in plan and str(plan[key]) == change["render"], (key, plan.get(key), change)
    pins = {
        "verl": env.verl.version,
        "vllm": env.vllm.version if env.vllm else None,
        "torch": env.torch.version,
    }
    assert {k: r["versions"][k] for k in pins} == pins


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_a_records_memory_stayed_under_the_card_it_ran_as(path):
    r = record(path)
    card_mib = r["card_gib"] * 1024 if r["card_gib"] else r["gpu_total_mib"]
    peaks = r["smi"]["phase_peak_mib"]
    assert max(peaks.values()) == r["smi"]["peak_mib"] <= card_mib
    # the rollout server holds its share from its start on: the phases after it are its size at least
    assert peaks["rollout_start->validation_done"] > 10 * peaks["launch->workers_ready"]
