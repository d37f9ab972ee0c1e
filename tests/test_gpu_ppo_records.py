"""The device records of the rendered run script (tests/fixtures/gpu/ppo/, bench/gpu_ppo.py on an
H200): each counts only while today's render is what ran. Replayed here without a GPU: the run
went through a first validation and two PPO steps with rc 0; it changed nothing of the render but
the keys a device run may cut (never a per-GPU micro-batch); the values it changed from are
today's render's; the versions are today's pins; and its memory stayed under the card it
emulated. A record of another card's profile (`emulated`: a 5090's on the H200) shows that its
render's preflight refused only the card's compute capability, and that the run changed nothing
else of the render."""

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


def test_the_records_cover_the_whole_card_a_capped_one_and_a_consumer_card():
    cases = {record(p)["case"]: record(p) for p in RECORDS}
    assert {"h200-gae", "h100-gae", "5090-grpo"} <= set(cases)
    assert cases["h200-gae"]["card_gib"] is None and cases["h100-gae"]["card_gib"] == 80.0
    # the RTX 5090's profile (CC 12.0, 32 GiB) ran as itself on the H200 (CC 9.0), capped to 32 GiB
    five = cases["5090-grpo"]
    assert five["card_gib"] == 32.0 and five["emulated"]["profile_gpu"] == "NVIDIA GeForce RTX 5090"
    assert {r["case"].split("-")[-1] for r in cases.values()} == {"gae", "grpo"}


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_an_emulated_card_was_refused_only_for_its_compute_capability(path):
    r = record(path)
    e = r.get("emulated")
    if e is None:
        assert r["profile"] in r["gpu"].lower() or r["card_gib"], "a record of another card says so"
        return
    # a card of the profile's compute capability or above passes the check: nothing refused
    assert [c["check"] for c in e["preflight_refused"]] in (["GPU 0 profile"], [])
    assert all(f"rendered for CC {e['profile_cc']}" in c["detail"] for c in e["preflight_refused"])
    assert e["sidecar_changed"] == {"preflight.compute_capability": [e["profile_cc"], e["device_cc"]]}
    assert e["profile_cc"] == resolved(r["profile"], model=r["model"]).gpu.compute_capability


def demand_mib(r: dict) -> float:
    """nvidia-smi's peak, less the least of the bytes torch's allocator held cached but free
    (max reserved - max allocated, per step), where the run had more memory than the card it
    emulates: on the bigger card the cache grows into room the real card does not have (the
    allocator frees cached blocks and retries before it fails), so the demand is what must fit.
    An estimate: the two maxima of a step need not coincide, and vLLM's sleeping memory stays in.
    On the card itself, nvidia-smi's peak."""
    peak = float(r["smi"]["peak_mib"])
    if not r["card_gib"]:
        return peak
    slack = [
        (m["actor/perf/max_memory_reserved_gb"] - m["actor/perf/max_memory_allocated_gb"]) * 1024
        for m in r["step_metrics"].values()
        if "actor/perf/max_memory_reserved_gb" in m
    ]
    return peak - min(slack, default=0.0)


def test_the_demand_takes_off_only_the_allocators_cache():
    r = {"card_gib": 32.0, "smi": {"peak_mib": 34505}, "step_metrics": {}}
    assert demand_mib(r) == 34505  # no torch figures: nvidia-smi's peak stands
    r["step_metrics"] = {
        "1": {"actor/perf/max_memory_reserved_gb": 28.0, "actor/perf/max_memory_allocated_gb": 22.0},
        "2": {"actor/perf/max_memory_reserved_gb": 31.0, "actor/perf/max_memory_allocated_gb": 22.0},
    }
    assert demand_mib(r) == 34505 - 6 * 1024  # the smaller slack of the two steps
    assert demand_mib(dict(r, card_gib=None)) == 34505  # the whole card: what nvidia-smi saw


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
    if "render_overrides" in r:  # records from 2026-12-05 on carry the render's whole plan
        assert r["render_overrides"] == {k: str(v) for k, v in plan.items()}
    for key, change in r["overrides_changed"].items():
        if change["render"] is not None:  # the value it was changed from is today's render's
            assert key in plan and str(plan[key]) == change["render"], (key, plan.get(key), change)
    pins = {
        "verl": env.verl.version,
        "vllm": env.vllm.version if env.vllm else None,
        "torch": env.torch.version,
    }
    assert {k: r["versions"][k] for k in pins} == pins
    if "script_exports" in r:  # what the run script exported is what today's would
        cache = env.vllm.compile_cache if env.vllm else None
        exported = r["script_exports"].get(cache.env) if cache else None
        assert (exported is not None) == (cache is not None)
        if cache:
            assert exported == f"${{{cache.env}:-{cache.value}}}"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_a_records_memory_stayed_under_the_card_it_ran_as(path):
    r = record(path)
    card_mib = r["gpu_total_mib"]
    if r["card_gib"]:  # the card it emulated: the smaller of the cap and the profile's card
        plan_card = resolved(r["profile"], model=r["model"]).memory["card"]["mib"]
        card_mib = min(r["card_gib"] * 1024, plan_card)
    peaks = r["smi"]["phase_peak_mib"]
    assert max(peaks.values()) == r["smi"]["peak_mib"]
    assert demand_mib(r) <= card_mib, (demand_mib(r), card_mib)
    # the rollout server holds its share (gpu_memory_utilization x the device's memory) from its
    # start on: the rollout phase is at least the trainer's workers plus 90% of that share
    util = (r.get("scaled_util") or {}).get("run")
    if util is None:
        env = resolved(r["profile"], model=r["model"], gpus_per_node=1, algo=r["case"].split("-")[-1])
        util = float({a.key: a.value for a in env.run}["actor_rollout_ref.rollout.gpu_memory_utilization"])
    share_mib = util * r["gpu_total_mib"]
    assert peaks["rollout_start->validation_done"] >= peaks["launch->workers_ready"] + 0.9 * share_mib
