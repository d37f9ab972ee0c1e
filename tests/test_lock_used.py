"""One finder for a profile's lock (render.prepare.find_lock) behind `lock --check`, `sbom`,
`render` and `wheelhouse`, and each of them saying on stderr which lock it used: its folder,
verl and Python (issue 34 #6: outside a checkout `lock --all --check` called every lock
"missing" and `sbom` said "No lock in lockfiles/4090" while render and wheelhouse found the
shipped ones; a verl 0.9.1 lock in ./lockfiles was exported with no word of it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envbuilder.paths import data_dir
from envbuilder.lock.locate import find_lock, lock_used

SHIPPED = data_dir("lockfiles")


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working folder outside the checkout: no ./lockfiles."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(argv, capsys):
    from envbuilder.cli.app import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_outside_a_checkout_every_command_finds_the_shipped_lock(elsewhere, capsys):
    from envbuilder.lock.profiles import lock_dir_for
    from envbuilder.model import matrix
    from envbuilder.model.resolve import resolve
    from envbuilder.lock.locate import named_lock

    assert find_lock("4090") == SHIPPED / "4090"
    assert lock_dir_for("4090", None, check=True) == SHIPPED / "4090"  # lock --check
    env = resolve(matrix.load(()), "4090")
    assert named_lock(env, "-") == SHIPPED / "4090"  # sbom, render --locked
    code, out, err = run(["lock", "4090", "--check"], capsys)
    assert "missing" not in out + err
    assert str(SHIPPED / "4090") in out + err


def test_the_projects_own_lock_comes_first(elsewhere):
    shutil.copytree(SHIPPED / "p40", elsewhere / "lockfiles" / "p40")
    assert find_lock("p40").resolve() == (elsewhere / "lockfiles" / "p40").resolve()
    assert find_lock("p40", elsewhere / "lockfiles") == elsewhere / "lockfiles" / "p40"
    # no lock anywhere: the project's path, which the caller's error names
    assert find_lock("no-such-profile") == Path("lockfiles") / "no-such-profile"


def test_lock_used_names_folder_verl_and_python():
    assert lock_used(SHIPPED / "p40") == f"{SHIPPED / 'p40'} (verl 0.4.1, Python 3.10)"
    assert lock_used(SHIPPED / "no-such") == f"{SHIPPED / 'no-such'} (verl ?, Python ?)"


def test_render_says_which_lock_it_pinned_from(elsewhere, capsys):
    code, out, err = run(["render", "p40", "-o", str(elsewhere / "out")], capsys)
    assert code == 0, err
    assert f"p40: pins from the lock {SHIPPED / 'p40'} (verl 0.4.1, Python 3.10)" in err
    assert "pins from" not in out  # (stdout holds the result)


def test_sbom_and_wheelhouse_say_which_lock_they_used(elsewhere, capsys):
    said = f"the lock {SHIPPED / '4090'} (verl 0.4.1, Python 3.10)"
    code, out, err = run(["sbom", "4090"], capsys)
    # the shipped lock is pip only: its SBOM declares the rest missing, naming the lock it found
    # (not "No lock in"); --require-complete refuses it as render --locked does
    assert code == 0 and said in err and "does not pin conda, images" in err, err
    code, out, err = run(["sbom", "4090", "--require-complete"], capsys)
    assert code == 2 and f"The lock in {SHIPPED / '4090'} has no images.lock" in err, err
    whole = Path(__file__).parent / "fixtures" / "locks"  # (a whole lock: pip, conda, images)
    code, out, err = run(["sbom", "4090", "--lock-dir", str(whole)], capsys)
    assert code == 0 and f"4090: the lock {whole / '4090'} (verl 0.4.1, Python 3.10)" in err, err
    assert out.startswith("{")  # (stdout holds the SBOM alone)
    code, out, err = run(["wheelhouse", "4090", "-o", str(elsewhere / "wh")], capsys)
    assert said in err, err


def test_render_locked_and_from_say_which_lock(elsewhere, capsys):
    whole = Path(__file__).parent / "fixtures" / "locks"
    said = f"4090: pins from the lock {whole / '4090'} (verl 0.4.1, Python 3.10)"
    code, out, err = run(["render", "4090", "--locked", str(whole), "-o", "a"], capsys)
    assert code == 0 and said in err, err
    code, out, err = run(
        ["render", "--from", "a/4090/envbuild.json", "--locked", str(whole), "-o", "b"], capsys
    )
    assert code == 0 and said in err, err
