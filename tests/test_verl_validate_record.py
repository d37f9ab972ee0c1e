"""verl's own config checks on every default render of an engine release (tests/fixtures/gpu/validate/,
`bench/verl_validate.py device`: 0.9.1's, since the speed settings (issue 42), on this machine's
CPU in the venv `envbuild verify h100 --keep` installed from PyPI, torch 2.11.0, with a model folder
of Qwen2.5-0.5B's shape (machine/verify.py write_model_shape; the H200 and then the H100 ran the
same check on earlier renders); 0.8.0's on this
machine's CPU in the venv `envbuild verify h100 --verl 0.8.0 --keep` installed from PyPI, torch
2.9.0, and 0.9.0's likewise, torch 2.10.0, each with a model folder `gpu_ppo.py make-model
--device cpu` wrote): each case's
overrides were composed with the release's Hydra config and passed main_ppo's validate_config
(the actor's, critic's and rollout's validate() with the run's world size). The record counts
only while today's render writes the same overrides: each case carries the sha256 of the
overrides it checked, and today's grid must give the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import bench_module

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "fixtures" / "gpu" / "validate" / "verl-0.9.1.json"
RECORD_080 = ROOT / "tests" / "fixtures" / "gpu" / "validate" / "verl-0.8.0.json"
RECORD_090 = ROOT / "tests" / "fixtures" / "gpu" / "validate" / "verl-0.9.0.json"


def _bench():
    return bench_module("verl_validate")


@pytest.fixture(scope="module")
def grid() -> list[dict]:
    return _bench().grid()


@pytest.fixture(scope="module")
def today(grid) -> dict[str, dict]:
    return {c["case"]: c for c in grid if c["verl"] == "0.9.1"}


def stale(rec: dict, today: dict[str, dict]) -> list[str]:
    """Today's cases the record does not hold as validated with the same overrides."""
    runs = {r["case"]: r for r in rec["runs"]}
    out = [n for n in today if n not in runs or not runs[n]["validated"]]
    out += [n for n in today if n in runs and runs[n]["fingerprint"] != today[n]["fingerprint"]]
    return sorted(set(out) | (set(runs) - set(today)))


def test_every_verl_091_case_of_todays_grid_passed_verl_own_checks(today):
    rec = json.loads(RECORD.read_text(encoding="utf-8"))
    assert rec["verl"] == "0.9.1" and rec["torch"] == "2.11.0"
    assert stale(rec, today) == []
    runs = {r["case"] for r in rec["runs"]}
    # GAE and GRPO, on the profile's one node and on two nodes of eight GPUs
    assert {n.split("/")[1] for n in runs} == {"gae", "grpo"}
    assert {n.split("/")[2].split("x")[0] for n in runs} == {"1", "2"}
    assert len(runs) == 48


def test_a_changed_override_or_a_new_case_makes_the_record_stale(today):
    rec = json.loads(RECORD.read_text(encoding="utf-8"))
    bench = _bench()
    name, case = sorted(today.items())[0]
    changed = [o.replace("ppo_mini_batch_size=", "ppo_mini_batch_size=1") for o in case["overrides"]]
    assert changed != case["overrides"]
    moved = dict(today, **{name: dict(case, fingerprint=bench.fingerprint(case["verl"], changed))})
    assert stale(rec, moved) == [name]
    assert stale(rec, dict(today, **{"x/gae/1x1": case})) == ["x/gae/1x1"]


@pytest.mark.parametrize(
    ("path", "verl", "torch"), [(RECORD_080, "0.8.0", "2.9.0"), (RECORD_090, "0.9.0", "2.10.0")]
)
def test_the_older_engine_releases_own_checks_passed_their_cases(grid, path, verl, torch):
    rec = json.loads(path.read_text(encoding="utf-8"))
    assert (rec["verl"], rec["torch"]) == (verl, torch)
    cases = {c["case"]: c for c in grid if c["verl"] == verl}
    assert len(cases) == 4 and stale(rec, cases) == []


def test_every_engine_release_of_the_grid_has_its_own_record(grid):
    recorded = {json.loads(p.read_text(encoding="utf-8"))["verl"] for p in RECORD.parent.glob("verl-*.json")}
    assert {c["verl"] for c in grid} == recorded == {"0.8.0", "0.9.0", "0.9.1"}
