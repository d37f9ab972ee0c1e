"""The commands' work as library functions, called without click (issue 22: each command only
parses, calls one of these and formats). The commands' own tests (test_cli, test_launch,
test_apptainer, test_lock, test_verify, test_build, test_refresh) run the same functions
through the command line; these call them directly, as another program would."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from conftest import frozen, overrides, record, shipped
from envbuilder.errors import ActionError, UserError
from envbuilder.model.resolved import Overrides

DIGEST = "sha256:" + "ab" * 32


# -- model/profiles.py ------------------------------------------------------------------------


def test_split_names_takes_commas_and_repeats():
    from envbuilder.model.profiles import split_names

    assert split_names(("apex, flash-attn", "", "x")) == ("apex", "flash-attn", "x")


def test_overrides_from_flags_maps_the_flags_and_never_loads_the_matrix_without_model():
    from envbuilder.model.profiles import overrides_from_flags

    def no_matrix():
        raise AssertionError("the matrix is read only for --model")

    ov = overrides_from_flags({"torch_": "2.6.0", "with_": ("apex,flash-attn",), "nodes": 2}, no_matrix)
    assert ov == overrides(torch="2.6.0", with_=["apex", "flash-attn"], nodes=2)
    assert overrides_from_flags({}, no_matrix) == Overrides()


def test_overrides_from_flags_refuses_with_and_without_one_component():
    from envbuilder.model.profiles import overrides_from_flags

    with pytest.raises(UserError, match="--with and --without both name apex"):
        overrides_from_flags({"with_": ("apex",), "without": ("apex,flash-attn",)}, shipped)


def test_overrides_from_flags_looks_a_model_up_in_the_matrix():
    from envbuilder.model.profiles import overrides_from_flags

    m = shipped()
    key = next(iter(m.models))
    ov = overrides_from_flags({"model": key}, lambda: m)
    assert (ov.model, ov.model_arch) == (key, None)


def test_resolve_all_says_each_failure_then_refuses_once():
    from envbuilder.model.profiles import resolve_all

    said = []
    with pytest.raises(UserError, match=r"1 of 2 profiles did not resolve \(nope\); nothing was done"):
        resolve_all(frozen(), ["p40", "nope"], Overrides(), "nothing was done", say=said.append)
    assert len(said) == 1 and said[0].startswith("envbuild: nope: ")
    envs = resolve_all(frozen(), ["p40", "4090"], Overrides(), "x", say=said.append)
    assert [e.name for e in envs] == ["p40", "4090"]


# -- machine/doctor.py: implied_profile ---------------------------------------------------------


def test_implied_profile_takes_detects_pick_and_refuses_without_a_gpu():
    from test_detect import NO_NVML, FakeNVML, smi

    from envbuilder.machine.doctor import Probes, implied_profile

    said = []
    assert (
        implied_profile(frozen(), "render", Probes(nvml=FakeNVML("p40"), run=smi("p40")), said.append)
        == "p40"
    )
    assert said and "fits profile p40 best" in said[0]
    nothing = Probes(nvml=NO_NVML, run=smi("no-driver"))
    with pytest.raises(UserError, match="Name a profile: `envbuild build PROFILE`"):
        implied_profile(frozen(), "build", nothing, said.append)


# -- render/outdir.py: write_owned_file ---------------------------------------------------------


def test_write_owned_file_writes_refuses_a_foreign_file_and_replaces_its_own(tmp_path):
    from envbuilder.render.outdir import write_owned_file

    def ours(p):
        return p.read_text().startswith("# mine")

    path = tmp_path / "x.sh"
    write_owned_file(path, "# mine\n", ours, force=False, what="script", mark="no '# mine' line")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    write_owned_file(path, "# mine 2\n", ours, force=False, what="script", mark="m")
    assert path.read_text() == "# mine 2\n"
    foreign = tmp_path / "f.sh"
    foreign.write_text("someone's\n")
    with pytest.raises(UserError, match=r"did not write it \(no '# mine' line\)"):
        write_owned_file(foreign, "# mine\n", ours, force=False, what="script", mark="no '# mine' line")
    assert foreign.read_text() == "someone's\n"
    write_owned_file(foreign, "# mine\n", ours, force=True, what="script", mark="m")
    assert foreign.read_text() == "# mine\n"
    with pytest.raises(UserError, match="is a folder; -o names the script"):
        write_owned_file(tmp_path, "", ours, force=True, what="script", mark="m")
    with pytest.raises(UserError, match="does not exist. Create it"):
        write_owned_file(tmp_path / "no" / "x", "", ours, force=True, what="script", mark="m")


# -- engines/launch.py and engines/apptainer.py -------------------------------------------------


def test_write_slurm_and_kuberay_write_their_files_and_say_how_to_start_them(tmp_path):
    from envbuilder.engines.launch import KUBERAY_HEADER, SLURM_HEADER, ray_text, write_kuberay, write_slurm

    said = []
    ov = Overrides(nodes=2)
    path = write_slurm(
        shipped(), "p40", ov, image=f"reg/p40@{DIGEST}", out=str(tmp_path / "p.sbatch"), say=said.append
    )
    assert path.read_text().splitlines()[1].startswith(SLURM_HEADER)
    assert said[-1].startswith(f"wrote {path}: submit it with `sbatch {path}`")
    with pytest.raises(UserError, match="--sif PATH .* or --image REF"):
        write_slurm(shipped(), "p40", ov, sif="/x.sif", image="reg/p40", say=said.append)
    path = write_kuberay(
        shipped(), "p40", ov, image=f"reg/p40@{DIGEST}", out=str(tmp_path / "j.yaml"), say=said.append
    )
    assert path.read_text().startswith(KUBERAY_HEADER)
    assert any("--data-pvc" in s for s in said)  # two nodes, no shared data
    assert "ray start --head" in ray_text(shipped(), "p40", ov, head_ip="10.0.0.1")


def test_write_definition_writes_an_apptainer_file_from_a_digest(tmp_path):
    from envbuilder.engines.apptainer import HEADER, write_definition

    said = []
    out = tmp_path / "p40.def"
    path = write_definition(
        frozen(), "p40", Overrides(), image=f"reg/envbuild/p40@{DIGEST}", out=str(out), say=said.append
    )
    assert path == out and out.read_text().startswith(HEADER) and DIGEST in out.read_text()
    assert said[-1].startswith(f"wrote {out}: build it with `apptainer build p40.sif {out}`")
    with pytest.raises(UserError, match="not both"):
        write_definition(frozen(), "p40", Overrides(), say=said.append)


def test_bake_writes_a_target_and_a_context_per_profile_or_nothing(tmp_path):
    from envbuilder.engines.bake import BAKE_FILE, bake
    from envbuilder.render.image import default_tag

    said = []
    m = frozen()
    baked = bake(
        m, ["p40", "4090"], Overrides(), tmp_path / "out", registry="127.0.0.1:5000", say=said.append
    )
    assert baked.bake_file == tmp_path / "out" / BAKE_FILE and baked.targets == ("p40", "4090")
    assert baked.stripped == ()
    text = baked.bake_file.read_text()
    assert 'target "p40"' in text and 'target "4090"' in text and "127.0.0.1:5000" in text
    from envbuilder.model.resolve import resolve

    assert default_tag(resolve(m, "p40", Overrides())).split(":")[1] in text  # build's own tag
    assert (tmp_path / "out" / "p40" / "Dockerfile").is_file()
    # a profile that does not resolve: said, and nothing written
    with pytest.raises(UserError, match="nothing was baked"):
        bake(m, ["p40", "p40"], Overrides(torch="0.0.1"), tmp_path / "none", say=said.append)
    assert not (tmp_path / "none").exists() and any("p40" in s for s in said)


def test_export_profiles_refuses_bad_input_before_fetching_anything(tmp_path):
    from envbuilder.offline.wheelhouse import export_profiles

    m, out = frozen(), tmp_path / "wh"
    cases = [
        (dict(profiles=["p40", "4090"], lock_dir=tmp_path), "--lock-dir names one lock"),
        (dict(jobs=0), "--jobs must be at least 1"),
        (dict(build_index="pypi.org/simple"), "is not an index URL"),
        (dict(profiles=["p4O"]), "Unknown profile 'p4O'"),
    ]
    for kw, message in cases:
        with pytest.raises(UserError, match=message):
            export_profiles(m, kw.pop("profiles", ["p40"]), out, **kw)
    assert not out.exists()


# -- machine/build.py: what `build` builds ------------------------------------------------------


def test_every_build_option_is_a_buildoptions_field_by_name():
    """`envbuild build` hands its options to BuildOptions by name (listed once, in click): an
    option added without its field, or a field without its option, fails here, not at a build."""
    from envbuilder.cli.build import build
    from envbuilder.machine.build import BuildOptions
    from envbuilder.model.profiles import FLAG_FIELDS

    given = {p.name for p in build.params} - {"profile", "no_probe", "matrix_dirs", *FLAG_FIELDS}
    assert given == set(BuildOptions._fields) - {"probe"}


def test_target_env_takes_the_profile_or_the_rendered_folder(tmp_path, monkeypatch):
    from envbuilder.machine.build import full_tag, target_env
    from envbuilder.model.resolve import resolve

    said = []
    monkeypatch.chdir(tmp_path)
    env = resolve(frozen(), "p40")
    assert target_env(frozen(), "p40", Overrides(), say=said.append) == env
    (tmp_path / "envbuild.json").write_text(env.to_json())
    assert target_env(frozen(), None, Overrides(), say=said.append).name == "p40"
    assert "as ./envbuild.json holds it" in said[-1]
    with pytest.raises(UserError, match="already fixes every choice"):
        target_env(frozen(), None, Overrides(torch="2.6.0"), say=said.append)
    (tmp_path / "locked-requirements.txt").write_text("")
    with pytest.raises(UserError, match="rendered --locked or --wheelhouse"):
        target_env(frozen(), None, Overrides(), say=said.append)
    assert full_tag(env, "me/x") == "me/x:latest" and full_tag(env, "h:5000/x:1") == "h:5000/x:1"
    assert full_tag(env, None).startswith("envbuild/p40:")


# -- lock/profiles.py ---------------------------------------------------------------------------


def test_lock_parts_refuses_an_unknown_part():
    from envbuilder.lock.profiles import lock_parts

    assert lock_parts(("pip,images",), "rattler", check=True) == ("pip", "images")
    with pytest.raises(UserError, match="Unknown part wheels for --only"):
        lock_parts(("wheels",), "rattler", check=True)


def test_lock_profiles_check_names_missing_locks_and_goes_on(tmp_path):
    from envbuilder.lock.lockfile import PARTS
    from envbuilder.lock.profiles import LockFlags, lock_profiles

    said, echoed = [], []
    with pytest.raises(ActionError, match=r"2 of 2 lock\(s\) need `envbuild lock`: p40, 4090"):
        lock_profiles(
            frozen(), ["p40", "4090"], Overrides(), tmp_path, LockFlags(), tuple(PARTS),
            check=True, keep_going=True, say=said.append, echo=echoed.append,
        )  # fmt: skip
    assert [e.split(":")[0] for e in echoed] == ["p40", "4090"] and not said


# -- render/summary.py ---------------------------------------------------------------------------


def test_list_and_show_text_without_click():
    from envbuilder.model.resolve import resolve
    from envbuilder.render.summary import list_rows, list_table, memory_lines, show_text

    rows = list_rows(frozen())
    assert [r["profile"] for r in rows] == list(frozen().profiles)
    assert list_table(rows).splitlines()[0].split() == [
        "PROFILE",
        "GPU",
        "CC",
        "CUDA",
        "TORCH",
        "VERL",
        "ROLLOUT",
    ]
    text = show_text(frozen(), "p40", Overrides())
    assert text.startswith("profile    p40: ") and text.endswith("\n")
    assert json.loads(show_text(frozen(), "p40", Overrides(), as_json=True))["profile"] == "p40"
    memory = json.loads(show_text(frozen(), "p40", Overrides(), memory=True, as_json=True))
    assert memory["profile"] == "p40" and "peak" in memory["memory"]
    lines = memory_lines(resolve(frozen(), "p40"))
    assert lines[0].startswith("memory per GPU: ") and any(x.startswith("peak: ") for x in lines)


# -- upstream/commands.py: affected --------------------------------------------------------------


def test_affected_compares_two_matrices(overlay):
    from envbuilder.model import matrix as M
    from envbuilder.upstream.commands import affected

    assert affected(shipped(), shipped()) == {}
    rec = record("vllm", "0.24.0", min_compute_capability="8.0", source="https://example.org/x")
    found = affected(shipped(), M.load((overlay({"vllm": {"0.24.0": rec}}),)))
    assert "t4" in found and all(isinstance(x, str) for x in found["t4"])


# -- machine/verify_all.py -----------------------------------------------------------------------


def test_verify_profiles_refuses_bad_input_before_installing(tmp_path):
    from envbuilder.machine.verify_all import VerifyFlags, verify_profiles

    said = []
    with pytest.raises(UserError, match="did not resolve"):
        verify_profiles(frozen(), ["p40", "nope"], Overrides(), VerifyFlags(), say=said.append)
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "x").write_text("")
    with pytest.raises(UserError):
        verify_profiles(frozen(), ["p40"], Overrides(), VerifyFlags(keep=keep), say=said.append)


def test_mirror_and_detect_reports_are_library_functions():
    """What `mirrors list`, `mirrors probe` and `detect` print, as lines another program can
    print too: credentials as ***@, the probe table aligned, and no GPU said with its fix."""
    from envbuilder.machine.detect import NO_GPU_FIX, Machine, report_lines
    from envbuilder.model.mirrors import probe_table, sets_lines
    from envbuilder.oci.probe import Probe

    lines = sets_lines({"corp": {"description": "ours", "pypi": ["https://u:secret@pypi.corp/simple"]}})
    assert lines == ["corp: ours", "  pypi                   -> https://***@pypi.corp/simple"]
    table = probe_table(
        [
            Probe("pypi", "pypi", "https://u:secret@pypi.corp/simple", True, "200", 12.4),
            Probe("registry", "docker.io", "https://hub.corp", False, "timeout", 5000.0),
        ]
    )
    assert table[0].split() == ["KIND", "FOR", "ENDPOINT", "STATUS", "MS"]
    assert "secret" not in "".join(table) and "DOWN timeout" in table[2]
    assert table[1].index("ok 200") == table[0].index("STATUS") == table[2].index("DOWN")
    none = Machine(gpus=(), driver=None, cuda=None, via="", problem="NVML found no device")
    assert report_lines(none, None) == ["no NVIDIA GPU found: NVML found no device", f"  fix: {NO_GPU_FIX}"]


def test_the_table_is_a_library_function():
    from envbuilder.machine.verify_all import table

    assert table([]).splitlines()[0].split()[:2] == ["PROFILE", "PYTHON"]


def test_no_library_module_imports_click():
    """The library is callable without click: only envbuilder/cli/ imports it."""
    root = Path(__file__).resolve().parent.parent / "envbuilder"
    users = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "cli" not in p.relative_to(root).parts and "import click" in p.read_text()
    ]
    assert users == []


# -- context/render.py ----------------------------------------------------------------------------


def test_render_profiles_and_replay_without_click(tmp_path):
    from envbuilder.context.render import render_profiles, render_replay

    said, echoed = [], []
    written = render_profiles(
        shipped(), ["p40"], Overrides(), tmp_path / "out", say=said.append, echo=echoed.append
    )
    assert written == [tmp_path / "out" / "p40"] and (written[0] / "Dockerfile").is_file()
    assert echoed[0] == f"rendered p40 -> {written[0]}/"
    env, target = render_replay(written[0] / "envbuild.json", tmp_path / "again")
    assert env.name == "p40" and target == tmp_path / "again" / "p40"
    assert (target / "Dockerfile").read_bytes() == (written[0] / "Dockerfile").read_bytes()
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="is not a folder"):
        render_profiles(shipped(), ["p40"], Overrides(), tmp_path / "file", say=said.append)
