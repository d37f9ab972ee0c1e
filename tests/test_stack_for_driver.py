"""The newest stack the machine runs, not the newest there is (issue 34, item 1): on the drivers
of most clusters, detect recommends a profile whose stack the driver runs and whose model fits,
and names the upgrade path; check, render and doctor with no stack flag take that stack."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from conftest import shipped
from envbuilder.cli import cli
from envbuilder.machine.detect import detect, recommend, report_lines
from envbuilder.model.resolve import ResolveError
from test_detect import FakeNVML, smi

UPGRADE_091 = "with driver >= 580.82.07: verl 0.9.1, vLLM 0.24.0"


@pytest.mark.parametrize(
    "box, profile, stack, upgrade",
    [
        ("h100-535", "h100", "verl 0.9.0", UPGRADE_091),
        ("a100-80gb-550", "a100", "verl 0.9.0", UPGRADE_091),
        ("a100-40gb-580", "a100", "verl 0.9.1", "a newer driver adds nothing"),
        ("5090-575", "5090", "verl 0.9.0", UPGRADE_091),
        ("v100-16gb-535", "v100", "verl 0.6.1", "with driver >= 550.54.15: CUDA 12.4 natively"),
        ("l4-550", "4090", "verl 0.4.1", UPGRADE_091),
    ],
)
def test_detect_recommends_a_stack_the_driver_runs_and_a_model_that_fits(box, profile, stack, upgrade):
    m = shipped()
    machine = detect(m, FakeNVML(box), smi(box))
    rec = recommend(m, machine)
    assert rec.profile == profile, report_lines(machine, rec)
    fit = next(f for f in rec.fits if f.profile == profile)
    lines = [r.text for r in fit.reasons]
    assert any(upgrade in t for t in lines), lines
    # the command it prints resolves, with the stack it named and the machine's driver
    r = CliRunner().invoke(cli, ["check", profile, *shlex.split(fit.flags), "--driver", machine.driver])
    assert r.exit_code == 0, (fit.flags, r.output)
    assert f"{stack} with" in r.output, r.output


def test_a_driver_too_old_for_the_profile_takes_the_newest_stack_it_runs():
    r = CliRunner().invoke(cli, ["check", "h100", "--driver", "550.54.15"])
    assert r.exit_code == 0, r.output
    assert "CUDA 12.8" in r.output and "verl 0.9.0" in r.output
    assert "minor-version compatibility (no PTX JIT" in r.output and UPGRADE_091 in r.output


def test_a_driver_refusal_of_an_explicit_stack_offers_a_stack_change_that_resolves():
    r = CliRunner().invoke(cli, ["check", "h100", "--verl", "0.9.1", "--driver", "550.54.15"])
    assert isinstance(r.exception, ResolveError) and r.exception.exit_code == 2
    assert "upgrade the driver to >= 580.82.07" in str(r.exception) and "--verl 0.9.0" in str(r.exception)
    again = CliRunner().invoke(cli, ["check", "h100", "--verl", "0.9.0", "--driver", "550.54.15"])
    assert again.exit_code == 0, again.output


def test_render_with_the_driver_writes_the_stack_it_picked(tmp_path):
    r = CliRunner().invoke(cli, ["render", "h100", "--driver", "535.183.01", "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    readme = (tmp_path / "h100" / "README.md").read_text()
    assert "envbuild render h100 --driver 535.183.01 --verl 0.9.0" in readme


def test_no_driver_given_keeps_the_newest_stack():
    r = CliRunner().invoke(cli, ["check", "h100"])
    assert r.exit_code == 0 and "verl 0.9.1" in r.output and "NOTE" not in r.output


def test_doctor_checks_the_stack_the_machines_driver_runs():
    from envbuilder.machine.doctor import doctor
    from envbuilder.model.resolve import Overrides
    from test_detect import host

    report = doctor(shipped(), "h100", Overrides(), host("h100-535"))
    checks = {c.name: c for c in report.checks}
    assert checks["driver"].status == "ok" and "verl 0.9.0's stack" in checks["driver"].detail
    assert "torch 2.10.0+cu128 has sm_90" in checks["GPU 0 arch"].detail
