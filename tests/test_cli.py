"""The `envbuild` command as a user types it: exit 0 done, 2 bad input or an incompatible
combination, each error one paragraph saying what, why and what to do."""

from __future__ import annotations

import json
from pathlib import Path
import os
import subprocess
import sys

import pytest

from conftest import PROFILES, clean_env, record, resolved, shipped
from httpfixtures import closed_port_url
from envbuilder.render.files import MARKER


def test_list_shows_every_profile_with_gpu_cc_cuda_torch_and_rollout(run_envbuild):
    r = run_envbuild("list")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
    assert list(rows) == PROFILES
    assert all(word in rows["p40"] for word in ("Tesla P40", "6.1", "11.8", "2.6.0", "hf"))


def test_list_json_is_machine_readable(cli):
    code, out, _ = cli("list", "--json")
    assert code == 0
    assert [row["profile"] for row in json.loads(out)] == PROFILES


def test_show_json_is_the_resolved_environment(run_envbuild):
    r = run_envbuild("show", "4090", "--json")
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)
    assert env["gpu"]["compute_capability"] == "8.9"
    assert env["profile"] == "4090"


def test_show_says_what_was_chosen_for_the_gpu(cli):
    code, out, _ = cli("show", "p40")
    assert code == 0
    assert "precision  fp32, attention eager" in out
    assert "patches    verl-hardcoded-fa2" in out


def test_check_explains_why_vllm_cannot_run_on_a_p40(run_envbuild):
    r = run_envbuild("check", "p40", "--rollout", "vllm")
    assert r.returncode == 2
    assert "6.1" in r.stderr
    assert "--rollout hf" in r.stderr
    assert r.stdout == ""


def test_check_accepts_the_p40_profile(run_envbuild):
    r = run_envbuild("check", "p40")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK: p40 resolves")


def test_check_takes_comma_separated_components(cli):
    code, out, _ = cli("check", "v100", "--cuda", "12.8", "--without", "apex,flash-attn")
    assert code == 0
    assert "torch 2.6.0+cu126" in out


def test_check_with_allow_unsupported_prints_the_warning(cli):
    code, out, _ = cli("check", "t4", "--verl", "0.6.1", "--with", "flash-attn", "--allow-unsupported")
    assert code == 0
    assert "WARNING: flash-attn on the Tesla T4 (CC 7.5)" in out


def test_render_writes_the_profile_directory(cli, tmp_path):
    """-o names the folder that gets one folder per profile: OUT/p40/, with one profile as
    with --all (not OUT itself)."""
    code, out, _ = cli("render", "p40", "-o", tmp_path / "out")
    assert code == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["p40"]
    assert (tmp_path / "out" / "p40" / MARKER).is_file()
    assert f"rendered p40 -> {tmp_path / 'out' / 'p40'}/" in out


def test_the_not_pinned_hint_names_the_lock_of_this_very_variant(cli, tmp_path):
    """A render with overrides that no lock fits: the hint carries the user's flags and -o, and
    puts the variant's lock in a folder of its own (lockfiles/p40 is the profile's own)."""
    import shlex

    code, _, err = cli("render", "p40", "--verl", "0.5.0", "--without", "apex", "-o", tmp_path / "o")
    assert code == 0
    hint = err.split("not pinned", 1)[1]
    lock, render = [c for c in hint.split("`")[1::2]]
    assert shlex.split(lock) == [
        "envbuild",
        "lock",
        "p40",
        "--verl",
        "0.5.0",
        "--without",
        "apex",
        "-o",
        "lockfiles/p40-verl0.5.0-withoutapex",
    ]
    assert shlex.split(render) == [
        "envbuild",
        "render",
        "p40",
        "--verl",
        "0.5.0",
        "--without",
        "apex",
        "--locked",
        "lockfiles/p40-verl0.5.0-withoutapex",
        "-o",
        str(tmp_path / "o"),
    ]
    code, _, err = cli("render", "t4", "--verl", "0.6.1")
    assert "`envbuild lock t4 --verl 0.6.1 -o lockfiles/t4-verl0.6.1`" in err


def test_render_all_writes_every_profile(cli, tmp_path):
    code, _, _ = cli("render", "--all", "-o", tmp_path / "out")
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(PROFILES)


def test_render_without_a_profile_is_exit_2(run_envbuild, tmp_path):
    r = run_envbuild("render")  # (no GPU here: detect picks no profile for this machine)
    assert r.returncode == 2
    assert "Name a profile: `envbuild render PROFILE` (or --all, or --from envbuild.json)" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_render_an_unknown_profile_is_exit_2_with_a_suggestion(run_envbuild, tmp_path):
    r = run_envbuild("render", "nosuch")
    assert r.returncode == 2
    assert "Unknown profile 'nosuch'" in r.stderr
    assert "envbuild list" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_misspelt_profile_gets_did_you_mean(cli):
    code, _, err = cli("render", "t5", "-o", "x")
    assert code == 2
    assert "did you mean 't4'" in err


def test_render_from_a_file_that_is_not_json_is_exit_2(run_envbuild, tmp_path):
    (tmp_path / "garbage.json").write_text("Dockerfile\x00\x01 not json {")
    r = run_envbuild("render", "--from", "garbage.json", "-o", "out")
    assert r.returncode == 2
    assert "garbage.json is not valid JSON" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_render_from_json_that_is_not_an_envbuild_spec_is_exit_2(cli, tmp_path):
    (tmp_path / "other.json").write_text('{"name": "something else"}\n')
    code, _, err = cli("render", "--from", "other.json", "-o", "out")
    assert code == 2
    assert "not an envbuild resolved environment" in err


def test_render_from_a_truncated_envbuild_json_is_exit_2(run_envbuild, tmp_path):
    # A hand-edited spec that lost most of its keys: bad input, not a crash.
    (tmp_path / "envbuild.json").write_text('{"schema_version": 1, "profile": "p40"}\n')
    r = run_envbuild("render", "--from", "envbuild.json", "-o", "out")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2
    assert "envbuild.json" in r.stderr
    assert not (tmp_path / "out").exists()


def test_render_from_a_missing_file_is_exit_2(cli):
    code, _, err = cli("render", "--from", "nowhere.json")
    assert code == 2
    assert "Cannot read " in err and "nowhere.json (--from file)" in err


def test_an_unknown_option_is_exit_2(cli):
    code, _, err = cli("check", "p40", "--gpu", "p40")
    assert code == 2
    assert "No such option" in err


def test_matrix_dir_adds_a_profile_to_every_command(cli, overlay):
    folder = overlay({"profiles": {"lab-p40": record("profiles", "p40", source="https://example.org/lab")}})
    code, out, _ = cli("list", "--matrix-dir", folder)
    assert code == 0 and "lab-p40" in out
    code, out, _ = cli("check", "lab-p40", "--matrix-dir", folder)
    assert code == 0 and out.startswith("OK: lab-p40 resolves")


def test_envbuild_matrix_dir_in_the_environment_works_like_the_flag(run_envbuild, overlay):
    folder = overlay({"profiles": {"lab-p40": record("profiles", "p40", source="https://example.org/lab")}})
    r = run_envbuild("check", "lab-p40", env={"ENVBUILD_MATRIX_DIR": str(folder)})
    assert r.returncode == 0, r.stderr


def test_a_broken_matrix_overlay_is_exit_2_naming_the_file(run_envbuild, overlay):
    folder = overlay(text="profiles: [\n")
    r = run_envbuild("list", "--matrix-dir", folder)
    assert r.returncode == 2
    assert str(overlay.file) in r.stderr


def test_python_m_envbuilder_cli_runs_the_same_command(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "envbuilder.cli", "check", "p40"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK: p40 resolves")


def test_the_profiles_listed_are_the_shipped_matrix(cli):
    _, out, _ = cli("list")
    for name, profile in shipped().profiles.items():
        assert name in out and profile["torch"] in out


def test_a_driver_that_is_not_a_version_is_exit_2(cli):
    code, out, err = cli("check", "p40", "--driver", "notaversion")
    assert code == 2
    assert "not an NVIDIA driver version" in err and "Traceback" not in err


def test_render_all_that_cannot_resolve_every_profile_writes_nothing(cli, tmp_path):
    code, _, err = cli("render", "--all", "-o", tmp_path / "all", "--torch", "2.8.0", "--cuda", "12.8")
    assert code == 2
    assert "nothing was written" in err
    assert not (tmp_path / "all").exists()


def test_render_from_a_hand_edited_spec_names_what_changed_shape(cli, tmp_path):
    """A key the resolver always writes is gone or holds another kind of value: named, exit 2,
    before any template reads it (a template failing past this check is a bug, not bad input)."""
    import json

    assert cli("render", "p40", "-o", tmp_path / "a")[0] == 0
    spec = json.loads((tmp_path / "a" / "p40" / "envbuild.json").read_text())
    spec["gpu"]["compute_capability"] = 6.1
    del spec["memory"]["batch"]
    (tmp_path / "edited.json").write_text(json.dumps(spec))
    code, _, err = cli("render", "--from", tmp_path / "edited.json", "-o", tmp_path / "b")
    assert code == 2 and "Traceback" not in err
    assert "gpu.compute_capability is a number, not a string" in err
    assert "memory.batch is missing" in err
    assert not (tmp_path / "b").exists()
    code, _, err = cli("render", "--from", tmp_path / "a" / "p40" / "envbuild.json", "-o", tmp_path / "c")
    assert code == 0, err
    assert (tmp_path / "c" / "p40" / "envbuild.json").is_file()  # the name the file holds


def test_affected_names_the_profiles_an_overlay_changes(cli, overlay):
    """refresh's pull request checks and verifies these: a changed fact that reaches a profile's
    resolved environment (here vLLM 0.24.0's hardware floor refusing the T4), nothing for a fact
    that reaches none (a Python its profiles don't use)."""
    from conftest import record

    rec = record("vllm", "0.24.0", min_compute_capability="8.0", source="https://example.org/x")
    code, out, err = cli("affected", overlay({"vllm": {"0.24.0": rec}}))
    assert (code, out.split()) == (0, ["t4"]), err
    code, out, _ = cli(
        "affected",
        overlay({"vllm": {"0.24.0": dict(rec, min_compute_capability="7.5", python=["3.11", "3.12"])}}),
    )
    assert (code, out) == (0, "")


@pytest.mark.parametrize(
    "argv,extra",
    [(["build", "p40", "--push", "local"], "actions"), (["wheelhouse", "p40", "-o", "wh"], "lock")],
)
def test_a_missing_extra_is_named_before_the_command_starts(argv, extra, tmp_path):
    """Without the docker SDK, build used to say the Docker daemon does not answer, fall back
    to podman and claim a registry had answered; now it stops at once (exit 2) naming the extra
    and the pip command, and writes nothing."""
    blocked = ["docker", "requests"] if argv[0] == "wheelhouse" else ["docker"]
    code = (
        "import sys\n"
        + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
        + f"from envbuilder.cli import main\nmain({argv!r})\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"envbuild[{extra}]" in r.stderr and f"`{extra}` extra" in r.stderr
    assert "does not answer" not in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, blocked, extra",
    [
        (["check", "p40", "--resolve"], ["uv"], "lock"),
        (["verify", "p40"], ["uv"], "lock"),
        (["lock", "p40", "-o", "lk"], ["rattler"], "lock"),
        (["lock", "p40", "--only", "pip", "-o", "lk"], ["uv"], "lock"),
        (["export-image", "foo:1", "-o", "x.tar"], ["docker"], "actions"),
        (["import-image", "x.tar"], ["requests"], "actions"),
        (["refresh"], ["packaging"], "actions"),
        # issue 44: with [actions] alone, wheelhouse fetched 141 files, then named uv and [lock]
        (["wheelhouse", "4090", "-o", "wh", "--accept-partial"], ["uv"], "lock"),
    ],
)
def test_the_extra_named_is_the_one_missing_before_any_probe(argv, blocked, extra, tmp_path):
    """Issue 34: verify, check --resolve and lock named `[actions]` after 5 s of probing, and
    without uv sent you to `[lock]` naming `lock`; export-image exited 1; refresh said `pip
    install packaging`. Each now stops at once (exit 2), naming itself and the extra that holds
    what is missing."""
    code = (
        "import sys\n"
        + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
        + f"from envbuilder.cli import main\nmain({argv!r})\n"
    )
    env = dict(os.environ, PATH=str(tmp_path / "no-bin"))  # (no uv on PATH either)
    dead = closed_port_url("")  # (what would fetch anything reaches only a closed loopback port)
    env.update(HTTP_PROXY=dead, HTTPS_PROXY=dead, http_proxy=dead, https_proxy=dead, NO_PROXY="", no_proxy="")
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 2, r.stdout + r.stderr
    command = argv[0] + (" --resolve" if "--resolve" in argv else "")
    assert f"`envbuild {command}`" in r.stderr and f"envbuild[{extra}]" in r.stderr, r.stderr
    assert f"`{extra}` extra" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_build_with_no_profile_in_a_rendered_folder_builds_what_its_envbuild_json_holds(
    cli, tmp_path, monkeypatch
):
    """`envbuild build --push local` inside out/p40, as people type it: the folder's
    envbuild.json is the environment (here the engine is then out of reach: exit 1 naming it,
    after saying what it was about to build). Overrides there are refused: the file fixes them."""
    assert cli("render", "t4", "--verl", "0.6.1", "-o", tmp_path / "out")[0] == 0
    monkeypatch.chdir(tmp_path / "out" / "t4")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    code, _, err = cli("build", "--push", "local", "--builder", "docker", "--no-smoke")
    assert "building t4 as ./envbuild.json holds it" in err, err
    assert code == 1 and "no-docker.sock" in err
    code, _, err = cli("build", "--verl", "0.9.1", "--builder", "docker")
    assert code == 2 and "already fixes every choice" in err


def test_build_with_no_profile_refuses_a_folder_rendered_from_a_wheelhouse(cli, tmp_path, monkeypatch):
    """envbuild.json does not hold the lock a --wheelhouse/--locked render used: building the
    folder from it would be another, unpinned image, so build refuses and says how."""
    from conftest import FIXTURES

    assert cli("render", "4090", "--wheelhouse", FIXTURES / "wheelhouse-4090", "-o", tmp_path / "o")[0] == 0
    monkeypatch.chdir(tmp_path / "o" / "4090")
    code, _, err = cli("build", "--push", "local", "--builder", "docker")
    assert code == 2 and "rendered --locked or --wheelhouse" in err
    assert "--wheelhouse DIR" in err


def test_a_stale_lock_for_a_variant_names_the_lock_of_that_variant(cli, tmp_path):
    """`render 4090 --verl 0.9.1 --locked lockfiles` said to re-lock with `envbuild lock 4090`,
    which locks the default verl (issue 34): the hint carries the overrides, into a folder of
    the variant's own (-o lockfiles would replace the profile's lock)."""
    import envbuilder

    shipped_locks = Path(envbuilder.__file__).resolve().parent.parent / "lockfiles"
    if not (shipped_locks / "4090").is_dir():
        shipped_locks = Path(envbuilder.__file__).resolve().parent / "_data" / "lockfiles"
    code, _, err = cli("render", "4090", "--verl", "0.9.1", "--locked", shipped_locks, "-o", tmp_path / "o")
    assert code == 2, err
    assert "`envbuild lock 4090 --verl 0.9.1 -o lockfiles/4090-verl0.9.1` makes one" in err
    assert "`envbuild lock 4090`" not in err


ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m\r"  # a window title, a screen clear, C1 CSI, a carriage return


@pytest.mark.parametrize("case", ["overlay file name", "profile argument"])
def test_terminal_escapes_in_a_message_are_shown_not_acted_on(run_envbuild, tmp_path, case):
    """Issue 33 #14: an overlay's file name (or any value echoed back) reached the terminal raw
    in an error: ESC ] 0; set the window title, ESC [2J cleared the screen. Every control
    character of a message is printed as its escape. (On the code before, the raw ESC.)"""
    if case == "overlay file name":
        folder = tmp_path / "overlay"
        folder.mkdir()
        (folder / f"lab{ESCAPES}.yaml").write_text("profiles: [\n")
        r = run_envbuild("list", "--matrix-dir", folder)
    else:
        r = run_envbuild("show", f"p40{ESCAPES}")
    assert r.returncode == 2, r.stderr
    for raw in ("\x1b", "\x07", "\x9b", "\r"):
        assert raw not in r.stderr
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\r" in r.stderr


def test_an_option_is_read_from_the_environment_only_where_the_reference_names_it(cli, monkeypatch, tmp_path):
    """click's auto_envvar_prefix made every option a variable no page named: ENVBUILD_RENDER_OUT
    moved a render's output, ENVBUILD_LIST_JSON turned list into JSON. Neither is read now."""
    monkeypatch.setenv("ENVBUILD_RENDER_OUT", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("ENVBUILD_LIST_JSON", "1")
    code, _, err = cli("render", "p40")
    assert code == 0, err
    assert (tmp_path / "out" / "p40" / "Dockerfile").is_file()
    assert not (tmp_path / "elsewhere").exists()
    code, out, _ = cli("list")
    assert code == 0
    assert out.splitlines()[0].split()[0] == "PROFILE"  # the table, not JSON


# -- the CLI's own bad input ---------------------------------------------------------------------


def test_with_and_without_the_same_component_is_refused(cli):
    code, _, err = cli("render", "p40", "--with", "apex", "--without", "apex")
    assert code == 2 and "both name apex" in err


def test_locked_and_wheelhouse_together_are_refused(cli, tmp_path):
    code, _, err = cli("render", "4090", "--locked", tmp_path, "--wheelhouse", tmp_path)
    assert code == 2 and "--locked and --wheelhouse" in err


def test_a_huge_name_is_not_echoed_back_whole(cli):
    code, _, err = cli("render", "x" * 100_000)
    assert code == 2
    assert len(err) < 2000, len(err)


def test_an_unknown_push_name_is_bad_input(cli, tmp_path, monkeypatch):
    (tmp_path / "config.yaml").write_text("registries:\n  lab: 127.0.0.1:5999\n")
    monkeypatch.setenv("ENVBUILD_CONFIG", str(tmp_path / "config.yaml"))
    from envbuilder.model import config

    config._load.cache_clear()
    try:
        code, _, err = cli("build", "p40", "--push", "nosuchregistry")
    finally:
        config._load.cache_clear()
    assert code == 2, err
    assert "No registry named 'nosuchregistry'" in err


# -- one handler for what is left -------------------------------------------------------------


def test_an_unexpected_exception_is_one_paragraph_naming_the_command(capsys, monkeypatch):
    from envbuilder import cli as C
    from envbuilder.render import files as R

    def broken(*a, **k):
        raise RuntimeError("template exploded\nsecond line")

    monkeypatch.delenv("ENVBUILD_DEBUG", raising=False)
    monkeypatch.setattr(R, "render_files", broken)
    with pytest.raises(SystemExit) as e:
        C.main(["render", "--from", str(write_spec(monkeypatch))])
    err = capsys.readouterr().err
    assert e.value.code == 1
    assert "internal error in `envbuild render`" in err and "RuntimeError: template exploded" in err
    assert "Traceback" not in err and "second line" not in err and "ENVBUILD_DEBUG=1" in err
    # and with ENVBUILD_DEBUG=1 (as the tests' fixtures set it) the bug raises, so a test fails
    monkeypatch.setenv("ENVBUILD_DEBUG", "1")
    with pytest.raises(RuntimeError):
        C.main(["render", "--from", str(write_spec(monkeypatch))])


def write_spec(monkeypatch) -> Path:
    import tempfile

    d = Path(tempfile.mkdtemp())
    monkeypatch.chdir(d)
    (d / "spec.json").write_text(resolved("p40").to_json())
    return d / "spec.json"
