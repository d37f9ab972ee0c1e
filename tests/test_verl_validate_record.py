"""verl 0.9.1's own config checks on every default render of it (tests/fixtures/gpu/validate/,
`bench/verl_validate.py device` on the H200, where verl imports with its torch): each case's
overrides were composed with the release's Hydra config and passed main_ppo's validate_config
(the actor's, critic's and rollout's validate() with the run's world size). The record counts
only while today's render writes the same overrides: each case carries the sha256 of the
overrides it checked, and today's grid must give the same."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "fixtures" / "gpu" / "validate" / "verl-0.9.1.json"


def _bench():
    spec = importlib.util.spec_from_file_location("verl_validate", ROOT / "bench" / "verl_validate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def today() -> dict[str, dict]:
    return {c["case"]: c for c in _bench().grid() if c["verl"] == "0.9.1"}


def test_every_verl_091_case_of_todays_grid_passed_verl_own_checks(today):
    rec = json.loads(RECORD.read_text(encoding="utf-8"))
    assert rec["verl"] == "0.9.1" and rec["torch"] == "2.11.0"
    runs = {r["case"]: r for r in rec["runs"]}
    assert set(runs) == set(today), sorted(set(runs) ^ set(today))
    for name, case in today.items():
        run = runs[name]
        assert run["validated"] is True, (name, run.get("error"))
        assert run["fingerprint"] == case["fingerprint"], (
            f"{name}: today's overrides are not what verl checked"
        )
    # GAE and GRPO, on the profile's one node and on two nodes of eight GPUs
    assert {n.split("/")[1] for n in runs} == {"gae", "grpo"}
    assert {n.split("/")[2].split("x")[0] for n in runs} == {"1", "2"}
    assert len(runs) == 48


def test_a_changed_override_no_longer_counts(today):
    bench = _bench()
    name, case = next(iter(sorted(today.items())))
    changed = [o.replace("ppo_mini_batch_size=", "ppo_mini_batch_size=1") for o in case["overrides"]]
    assert changed != case["overrides"]
    assert bench.fingerprint(case["verl"], changed) != case["fingerprint"]
