"""A rendered folder (envbuilder/render/outdir.py): envbuild deletes only what it wrote, names
never leave their directory, a folder or record reached through a link is not written through,
an interrupted swap is finished by the next run, and a failed write changes nothing. Each test
here failed on the code before (issues 12 and 21): a render replaced whole directories and
wrote through links.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from conftest import resolved, snapshot
from mounts import unavailable as _unavailable
from envbuilder.render import outdir
from envbuilder.errors import UserError
from envbuilder.render.context import BuildContext
from envbuilder.render.files import MARKER, render, render_files

RECORD = outdir.RECORD


# -- deletes only what it wrote -----------------------------------------------------------------


def test_a_render_into_a_project_folder_holding_an_envbuild_json_deletes_nothing(run_envbuild, tmp_path):
    """A copy of an image's /etc/envbuild.json in a project folder used to mark the folder as
    envbuild's: the render replaced the folder and every other file in it was gone."""
    project = tmp_path / "work" / "p40"  # where `render p40 -o work` writes
    project.mkdir(parents=True)
    (project / MARKER).write_text(render_files(BuildContext.of(resolved("p40")))[MARKER])
    (project / "train.py").write_text("my training code\n")
    (project / "Dockerfile").write_text("FROM my-own-image\n")
    before = snapshot(project)
    r = run_envbuild("render", "p40", "-o", tmp_path / "work")
    assert r.returncode == 2
    assert "was not written by envbuild" in r.stderr and "--force" in r.stderr
    assert snapshot(project) == before
    # --force writes envbuild's files into it and leaves the rest alone
    r = run_envbuild("render", "p40", "-o", tmp_path / "work", "--force")
    assert r.returncode == 0, r.stderr
    assert (project / "train.py").read_text() == "my training code\n"
    assert (project / "Dockerfile").read_text() != "FROM my-own-image\n"  # (asked for by --force)


def test_a_re_render_keeps_the_users_files_and_refuses_to_overwrite_their_edits(run_envbuild, tmp_path):
    out = tmp_path / "out" / "3090"
    assert run_envbuild("render", "3090").returncode == 0
    assert (out / "apply_patches.py").is_file()  # (3090's verl is patched; 0.6.1 needs none)
    ckpt = out / "checkpoints" / "global_step_10" / "model.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"\x00weights" * 100)
    (out / "notes.md").write_text("lr 1e-6 diverged\n")
    assert run_envbuild("render", "3090").returncode == 0  # unchanged files: replaced in place
    assert ckpt.read_bytes() == b"\x00weights" * 100 and (out / "notes.md").exists()
    # an edit of a rendered file is the user's now: not overwritten, not deleted
    script = out / "run_ppo_gsm8k.sh"
    script.write_text(script.read_text() + "# my tweak\n")
    before = snapshot(out)
    r = run_envbuild("render", "3090")
    assert r.returncode == 2
    assert "run_ppo_gsm8k.sh" in r.stderr and "changed since envbuild wrote" in r.stderr
    assert snapshot(out) == before
    # a variant without patches: apply_patches.py (envbuild's, unedited) goes, the user's stay
    r = run_envbuild("render", "3090", "--verl", "0.6.1", "-o", tmp_path / "out", "--force")
    assert r.returncode == 0, r.stderr
    assert not (out / "apply_patches.py").exists()
    assert ckpt.exists() and (out / "notes.md").exists()
    assert "# my tweak" not in script.read_text()  # --force overwrote the edit, as asked


def test_a_deleted_rendered_file_is_just_written_again(tmp_path):
    out = tmp_path / "o"
    render(BuildContext.of(resolved("p40")), out)
    (out / "preflight.py").unlink()
    render(BuildContext.of(resolved("p40")), out)
    assert (out / "preflight.py").is_file()


def test_a_re_render_leaves_files_that_already_hold_their_bytes_alone(tmp_path):
    """Unchanged files are not written again (their inode and mtime stay, as make leaves an
    up-to-date target); a changed one, or one whose mode was changed, is written."""
    out = tmp_path / "o"
    render(BuildContext.of(resolved("p40")), out)
    before = {p.name: p.stat() for p in out.iterdir() if p.is_file()}
    os.chmod(out / "preflight.py", 0o644)  # (rendered 0755)
    render(BuildContext.of(resolved("p40")), out)
    after = {p.name: p.stat() for p in out.iterdir() if p.is_file()}
    for name in ("Dockerfile", "run_ppo_gsm8k.sh", "requirements.txt"):
        assert (after[name].st_ino, after[name].st_mtime_ns) == (
            before[name].st_ino,
            before[name].st_mtime_ns,
        ), name
    assert after["preflight.py"].st_ino != before["preflight.py"].st_ino
    assert after["preflight.py"].st_mode & 0o777 == 0o755
    render(BuildContext.of(resolved("p40", driver="560.35.03")), out)  # envbuild.json now says the driver
    assert (out / MARKER).stat().st_ino != after[MARKER].st_ino
    assert '"driver": "560.35.03"' in (out / MARKER).read_text()
    assert outdir._read_record(out / outdir.RECORD)[MARKER] == outdir._sha256(out / MARKER)


def test_a_re_render_that_changes_nothing_writes_nothing_not_even_the_record(tmp_path):
    """Every file already holds its bytes and mode and the record says so: the folder's entries,
    the record's inode included, stay as they were (no staging folder, no journal)."""
    out = tmp_path / "o"
    render(BuildContext.of(resolved("p40")), out)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()}
    render(BuildContext.of(resolved("p40")), out)
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()} == before
    (out / outdir.RECORD).unlink()  # without its record the folder is not known to be envbuild's
    with pytest.raises(UserError, match="not written by envbuild"):
        render(BuildContext.of(resolved("p40")), out)


@pytest.mark.parametrize("name", ["../../escaped", "../p40", "a/b", "..", "/etc/x"])
def test_a_profile_name_from_a_from_file_never_leaves_out(cli, tmp_path, name):
    spec = json.loads(render_files(BuildContext.of(resolved("p40")))[MARKER])
    spec["profile"] = name
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    code, _, err = cli("render", "--from", path)
    assert code == 2, err
    assert not (tmp_path / "escaped").exists() and not Path("/etc/x").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]


def test_generated_names_are_plain_relative_paths():
    for bad in ["../x", "/abs", "a/../../b", "", "a//b", "a\\b", "./a"]:
        with pytest.raises(UserError):
            outdir.safe_relpath(bad)
    assert str(outdir.safe_relpath("constraints/torch.txt")) == "constraints/torch.txt"


def test_a_linked_folder_inside_the_output_is_not_written_through(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "o"
    render(BuildContext.of(resolved("p40")), out)
    import shutil

    shutil.rmtree(out / "constraints")
    (out / "constraints").symlink_to(elsewhere)
    with pytest.raises(UserError, match="symbolic link"):
        render(BuildContext.of(resolved("p40")), out)
    assert list(elsewhere.iterdir()) == []


def test_an_interrupted_swap_is_finished_by_the_next_run(tmp_path, monkeypatch):
    """Killed between moving files into place: some files are new, some old, a staging folder
    and the journal are left. The next run counts old and new files as envbuild's, cleans the
    debris and ends with exactly a fresh render."""
    out = tmp_path / "o"
    render(BuildContext.of(resolved("p40")), out)
    real_replace, calls = os.replace, []

    def dying_replace(src, dst, **kw):
        if kw:  # (a cache write through a folder fd, paths.write_cache: not the swap under test)
            return real_replace(src, dst, **kw)
        calls.append(dst)
        if len(calls) == 4:
            raise KeyboardInterrupt  # (as SIGKILL would stop it: nothing after runs)
        return real_replace(src, dst)

    monkeypatch.setattr(outdir.os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        render(BuildContext.of(resolved("4090")), out)
    monkeypatch.setattr(outdir.os, "replace", real_replace)
    assert any(p.name.startswith(outdir.STAGING_PREFIX) for p in out.iterdir())
    assert (out / outdir.JOURNAL).exists()
    render(
        BuildContext.of(resolved("4090")), out
    )  # not refused as "edited": the half-moved files are envbuild's
    fresh = tmp_path / "fresh"
    render(BuildContext.of(resolved("4090")), fresh)
    assert snapshot(out) == snapshot(fresh)


def test_a_failed_write_changes_nothing(tmp_path, monkeypatch):
    out = tmp_path / "o"
    render(BuildContext.of(resolved("p40")), out)
    before = snapshot(out)
    real_write = Path.write_text

    def full_disk(self, *a, **k):
        # (a file the two profiles differ in: preflight.py is the same bytes for both)
        if outdir.STAGING_PREFIX in str(self) and self.name == "envbuild-scripts.json":
            raise OSError(28, "No space left on device")
        return real_write(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full_disk)
    from envbuilder.errors import ActionError

    with pytest.raises(ActionError, match="No space left"):
        render(BuildContext.of(resolved("4090")), out)
    monkeypatch.undo()
    assert snapshot(out) == before
    assert not any(p.name.startswith(outdir.STAGING_PREFIX) for p in out.iterdir())


def test_a_tampered_record_cannot_make_envbuild_delete_outside(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "o"
    render(BuildContext.of(resolved("p40")), out)
    rec = json.loads((out / RECORD).read_text())
    import hashlib

    rec["files"]["../victim.txt"] = hashlib.sha256(b"precious\n").hexdigest()
    (out / RECORD).write_text(json.dumps(rec))
    render(BuildContext.of(resolved("3090")), out)
    assert victim.read_text() == "precious\n"


PROFILE = "t4"


# ---- 2: an output folder that is a link is not written through ---------------------------------


@pytest.mark.parametrize("how", ["out-is-a-link", "parent-is-anothers-link"])
def test_an_output_folder_reached_through_a_link_is_refused(run_envbuild, tmp_path, how):
    """The profile's folder under -o (OUT/<profile>/) a planted link to an empty folder, or a
    new folder under a link another user planted (out/ in a shared folder). Before: the render
    went into the link's target, exit 0. Failed before the fix: yes."""
    target = tmp_path / "victim"
    target.mkdir()
    if how == "out-is-a-link":
        out = tmp_path / "out"
        out.mkdir()
        link = out / PROFILE  # the very folder `render PROFILE -o out` writes into
    else:
        link = tmp_path / "out"
        out = link / "p"
    link.symlink_to(target, target_is_directory=True)
    if how == "parent-is-anothers-link":
        if os.geteuid() != 0:
            _unavailable("a link owned by another user can only be made by root")
        os.lchown(link, 65534, 65534)
    r = run_envbuild("render", PROFILE, "-o", out)
    assert r.returncode == 2, r.stderr
    assert "symbolic link" in r.stderr and str(link) in r.stderr
    assert list(target.iterdir()) == []


def test_a_new_folder_under_a_link_of_ones_own_is_written(run_envbuild, tmp_path):
    """A home or scratch folder that is the user's own link (or root's) stays usable: only the
    folder written into must not be a link. (A guard for the fix: it passed before.)"""
    target = tmp_path / "scratch"
    target.mkdir()
    link = tmp_path / "home"
    link.symlink_to(target, target_is_directory=True)
    r = run_envbuild("render", PROFILE, "-o", link / "envs")
    assert r.returncode == 0, r.stderr
    assert (target / "envs" / PROFILE / "Dockerfile").is_file()


def test_a_record_that_is_a_link_is_no_record(run_envbuild, tmp_path):
    """A planted .envbuild-files.json that links to a record elsewhere, claiming the user's
    notes as envbuild's files. Before: read through the link, and the notes deleted as a stale
    file of an earlier render (exit 0). Failed before the fix: yes."""
    out = tmp_path / "out" / PROFILE  # where `render PROFILE -o out` writes
    out.mkdir(parents=True)
    notes = out / "notes.txt"
    notes.write_text("my notes\n")
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(
        json.dumps(
            {
                "format": 1,
                "written_by": "envbuild",
                "files": {"notes.txt": hashlib.sha256(notes.read_bytes()).hexdigest()},
            }
        )
    )
    (out / ".envbuild-files.json").symlink_to(elsewhere)
    r = run_envbuild("render", PROFILE, "-o", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert "was not written by envbuild" in r.stderr
    assert notes.read_text() == "my notes\n" and sorted(p.name for p in out.iterdir()) == [
        ".envbuild-files.json",
        "notes.txt",
    ]
