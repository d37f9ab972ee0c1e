"""A plain render pins what a user gets beyond the top-level pins: constraints.txt holds the
whole resolved set from the lock whose plan the environment is, and every pip step of the
Dockerfile, requirements.txt and environment.yml installs within it. No matching lock: the files
say they float, and the CLI says how to pin them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import PROFILES

ROOT = Path(__file__).resolve().parent.parent


def pip_steps(dockerfile: str) -> list[str]:
    """Every RUN step (continuations joined) that runs `pip install`."""
    joined = dockerfile.replace("\\\n", " ")
    return [
        line
        for line in joined.splitlines()
        if line.startswith("RUN ") and re.search(r"\bpip install\b", line)
    ]


# every shipped profile has a lock, the aarch64 ones (GH200, GB200) solved for aarch64
LOCKED = PROFILES


@pytest.mark.parametrize("profile", LOCKED)
def test_every_shipped_profile_renders_with_its_locks_constraints(profile, cli, tmp_path):
    code, out, err = cli("render", profile, "-o", tmp_path / "o")
    assert code == 0, err
    o = tmp_path / "o" / profile
    cons = all_constraints(o)
    assert f"shipped lockfiles/{profile}" in cons
    pins = [line for line in cons.splitlines() if not line.startswith("#")]
    assert len(pins) > 50 and all(re.fullmatch(r"[a-z0-9-]+==\S+", p) for p in pins), pins[:5]
    assert "verl==" in cons and "numpy==" in cons
    layers = sorted(p.stem for p in (o / "constraints").iterdir())
    for step in pip_steps((o / "Dockerfile").read_text()):
        if "/wheels/*.whl" in step:  # the builder's own wheels, --no-deps
            continue
        if re.search(r"--no-deps --require-hashes -r <\(echo 'uv==", step):
            continue  # the installer itself: the one wheel the matrix pins by sha256
        assert "-c /tmp/envbuild/constraints/torch.txt" in step, step
        assert "source=constraints/torch.txt,target=/tmp/envbuild/constraints/torch.txt" in step
    for layer in layers:
        if layer == "build":  # the builder stage's own tools: not what a user's env installs
            assert "constraints/build.txt" not in (o / "requirements.txt").read_text()
            continue
        assert f"\n-c constraints/{layer}.txt\n" in (o / "requirements.txt").read_text()
        assert f"      - -c constraints/{layer}.txt\n" in (o / "environment.yml").read_text()
    assert "not pinned" not in err


def all_constraints(out: Path) -> str:
    return "".join(p.read_text() for p in sorted((out / "constraints").iterdir()))


def test_a_verl_pin_change_leaves_the_torch_layers_constraints_as_they_were(tmp_path):
    # Docker keys a RUN's cache on its bind mounts' content: the torch layer mounts only its own
    from conftest import resolved
    from envbuilder.lock.pins import constraint_layers
    from envbuilder.lock.pip import parse

    env = resolved("4090")
    text = (ROOT / "lockfiles" / "4090" / "requirements.lock").read_text()
    before = constraint_layers(env, text, False)
    bumped = text.replace("\ncodetiming==1.4.0", "\ncodetiming==1.4.1")
    assert parse(bumped)["codetiming"].version == "1.4.1"
    after = constraint_layers(env, bumped, False)
    assert after["torch"] == before["torch"] and after["verl-deps"] != before["verl-deps"]


def test_the_p40_constraints_come_from_a_lock_solved_with_pypis_torch_and_leave_torch_out(cli, tmp_path):
    code, _, err = cli("render", "p40", "-o", tmp_path / "o")
    assert code == 0, err
    cons = all_constraints(tmp_path / "o" / "p40")
    assert "solved with torch 2.6.0+cu118 -> 2.6.0" in cons
    pins = [line for line in cons.splitlines() if "==" in line]
    names = {line.split("==")[0] for line in pins}
    assert "triton" not in names and not any(n.startswith("nvidia-") for n in names)
    assert {"numpy", "transformers", "verl", "ray"} <= names
    # torch's own packages: only the profile's +cu118 pins, never the lock's PyPI build
    torch_pins = sorted(p for p in pins if p.split("==")[0] in ("torch", "torchvision", "torchaudio"))
    assert set(torch_pins) == {"torch==2.6.0+cu118", "torchvision==0.21.0+cu118", "torchaudio==2.6.0+cu118"}
    assert "torch==2.6.0+cu118" in (tmp_path / "o" / "p40" / "Dockerfile").read_text()


def test_an_environment_no_lock_matches_says_it_floats(cli, tmp_path):
    code, _, err = cli("render", "4090", "--torch", "2.5.1", "-o", tmp_path / "o")
    assert code == 0, err
    o = tmp_path / "o" / "4090"
    # the steps still cannot undo each other's top-level pins (torch stays 2.5.1), nothing more
    cons = all_constraints(o)
    assert "its top-level pins only (no lock fits)" in cons and "torch==2.5.1" in cons
    assert len([ln for ln in cons.splitlines() if "==" in ln]) < 20
    assert "NOT PINNED" in (o / "Dockerfile").read_text()
    assert "NOT PINNED" in (o / "requirements.txt").read_text()
    assert "the whole resolved set" not in (o / "environment.yml").read_text()
    assert "not pinned beyond its top-level pins" in err and "envbuild lock 4090" in err


def copy_lock(profile: str, into: Path) -> Path:
    dst = into / "lockfiles" / profile
    shutil.copytree(ROOT / "lockfiles" / profile, dst)
    return dst


def test_a_users_own_lock_in_the_working_directory_comes_first(cli, tmp_path):
    lock = copy_lock("4090", tmp_path)  # cli runs in tmp_path
    req = lock / "requirements.lock"
    text = req.read_text().replace("\ncodetiming==1.4.0", "\ncodetiming==1.4.0  ")
    req.write_text(text)
    meta = json.loads((lock / "lock.json").read_text())
    import hashlib

    meta["files"]["requirements.lock"] = hashlib.sha256(text.encode()).hexdigest()
    (lock / "lock.json").write_text(json.dumps(meta))
    code, _, err = cli("render", "4090", "-o", tmp_path / "o")
    assert code == 0, err
    assert "from lockfiles/4090." in all_constraints(tmp_path / "o" / "4090")
    assert "codetiming==1.4.0" in all_constraints(tmp_path / "o" / "4090")


def test_a_tampered_lock_is_not_used(cli, tmp_path):
    lock = copy_lock("4090", tmp_path)
    req = lock / "requirements.lock"
    req.write_text(req.read_text().replace("numpy==1.26.4", "numpy==2.2.0"))  # hash not updated
    code, _, err = cli("render", "4090", "-o", tmp_path / "o")
    assert code == 0, err
    cons = all_constraints(tmp_path / "o" / "4090")
    assert "shipped lockfiles/4090" in cons and "numpy==1.26.4" in cons


def test_render_from_replays_the_same_constraints(cli, tmp_path, monkeypatch):
    """The lock's pins a render took reach a `render --from` of its envbuild.json through the
    file alone (runplan.saved_from_json into the replayed context; the environment carries
    none): every file the same bytes, the lock's pins in them, with no lock to look at."""
    import json

    assert cli("render", "t4", "-o", tmp_path / "a")[0] == 0
    spec = tmp_path / "a" / "t4" / "envbuild.json"
    assert json.loads(spec.read_text())["constraints"]["layers"]["verl"]  # (pinned by its lock)
    assert "from envbuild's shipped lockfiles/t4" in all_constraints(tmp_path / "a" / "t4")
    from envbuilder.lock import constraints as C

    def no_lock(*a, **k):
        raise AssertionError("render --from looked for a lock")

    monkeypatch.setattr(C, "find_constraints", no_lock)  # (the pins come from the file alone)
    assert cli("render", "--from", spec, "-o", tmp_path / "b")[0] == 0
    a, b = tmp_path / "a" / "t4", tmp_path / "b" / "t4"
    assert sorted(p.relative_to(a) for p in a.rglob("*")) == sorted(p.relative_to(b) for p in b.rglob("*"))
    for path in a.rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (b / path.relative_to(a)).read_bytes(), path


def test_the_shipped_pip_locks_are_fresh(cli):
    code, out, err = cli("lock", "--all", "--check", "--only", "pip", "-o", ROOT / "lockfiles")
    assert code == 0, out + err


def _moved(env, what: str):
    """`env` with one input of its pip solve moved (what the solver sees), or one it does not see."""
    if what == "python":
        return env._replace(python="3.11" if env.python != "3.11" else "3.10")
    if what == "glibc":
        return env._replace(cuda=env.cuda._replace(glibc="2.28"))
    if what == "index":
        return env._replace(indexes=env.indexes._replace(pypi="https://pypi.example.org/simple"))
    if what == "requirement":
        return env._replace(verl=env.verl._replace(pins={**env.verl.pins, "codetiming": "1.4.1"}))
    if what == "train":  # the run's settings: no pip solve depends on them
        return env._replace(train=env.train._replace(max_response_length=env.train.max_response_length * 2))
    return env


@pytest.mark.parametrize("what", ["nothing", "train", "python", "glibc", "index", "requirement"])
def test_a_render_takes_a_locks_pins_exactly_when_the_lock_says_its_pip_part_is_current(what, tmp_path):
    """One definition of what a pip solve depends on (lockfile.solver_inputs): the lock a
    render takes constraints from and `lock --check`'s staleness verdict cannot drift apart,
    since both read it. Each input moved in turn: both change their answer, or neither does."""
    from conftest import resolved
    from envbuilder.lock import lockfile as L
    from envbuilder.lock.constraints import find_constraints

    lock = tmp_path / "4090"
    shutil.copytree(ROOT / "lockfiles" / "4090", lock)
    env = _moved(resolved("4090"), what)
    stale = [p for p in L.problems(env, lock, parts=("pip",)) if p.startswith("stale")]
    taken = find_constraints(env, ("the lock", lock))
    assert (taken is not None) == (not stale), (what, stale)
    assert (taken is None) == (what in ("python", "glibc", "index", "requirement")), what
