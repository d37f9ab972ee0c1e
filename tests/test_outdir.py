"""Issue 12: envbuild deletes only what it wrote, names never leave their directory, user input
is bounded, and what is left of a bug is one paragraph (exit 1), not a traceback. Each test
here failed on the code before: a render replaced whole directories, loaders read any size
and expanded any alias, and unexpected exceptions printed tracebacks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from conftest import resolved, snapshot
from envbuilder.render import outdir
from envbuilder.errors import UserError
from envbuilder.render.files import MARKER, render, render_files

RECORD = outdir.RECORD


# -- deletes only what it wrote -----------------------------------------------------------------


def test_a_render_into_a_project_folder_holding_an_envbuild_json_deletes_nothing(run_envbuild, tmp_path):
    """A copy of an image's /etc/envbuild.json in a project folder used to mark the folder as
    envbuild's: the render replaced the folder and every other file in it was gone."""
    project = tmp_path / "work" / "p40"  # where `render p40 -o work` writes
    project.mkdir(parents=True)
    (project / MARKER).write_text(render_files(resolved("p40"))[MARKER])
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
    render(resolved("p40"), out)
    (out / "preflight.py").unlink()
    render(resolved("p40"), out)
    assert (out / "preflight.py").is_file()


def test_a_re_render_leaves_files_that_already_hold_their_bytes_alone(tmp_path):
    """Unchanged files are not written again (their inode and mtime stay, as make leaves an
    up-to-date target); a changed one, or one whose mode was changed, is written."""
    out = tmp_path / "o"
    render(resolved("p40"), out)
    before = {p.name: p.stat() for p in out.iterdir() if p.is_file()}
    os.chmod(out / "preflight.py", 0o644)  # (rendered 0755)
    render(resolved("p40"), out)
    after = {p.name: p.stat() for p in out.iterdir() if p.is_file()}
    for name in ("Dockerfile", "run_ppo_gsm8k.sh", "requirements.txt"):
        assert (after[name].st_ino, after[name].st_mtime_ns) == (
            before[name].st_ino,
            before[name].st_mtime_ns,
        ), name
    assert after["preflight.py"].st_ino != before["preflight.py"].st_ino
    assert after["preflight.py"].st_mode & 0o777 == 0o755
    render(resolved("p40", driver="560.35.03"), out)  # envbuild.json now says the driver
    assert (out / MARKER).stat().st_ino != after[MARKER].st_ino
    assert '"driver": "560.35.03"' in (out / MARKER).read_text()
    assert outdir._read_record(out / outdir.RECORD)[MARKER] == outdir._sha256(out / MARKER)


def test_a_re_render_that_changes_nothing_writes_nothing_not_even_the_record(tmp_path):
    """Every file already holds its bytes and mode and the record says so: the folder's entries,
    the record's inode included, stay as they were (no staging folder, no journal)."""
    out = tmp_path / "o"
    render(resolved("p40"), out)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()}
    render(resolved("p40"), out)
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir()} == before
    (out / outdir.RECORD).unlink()  # without its record the folder is not known to be envbuild's
    with pytest.raises(UserError, match="not written by envbuild"):
        render(resolved("p40"), out)


@pytest.mark.parametrize("name", ["../../escaped", "../p40", "a/b", "..", "/etc/x"])
def test_a_profile_name_from_a_from_file_never_leaves_out(cli, tmp_path, name):
    spec = json.loads(render_files(resolved("p40"))[MARKER])
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
    render(resolved("p40"), out)
    import shutil

    shutil.rmtree(out / "constraints")
    (out / "constraints").symlink_to(elsewhere)
    with pytest.raises(UserError, match="symbolic link"):
        render(resolved("p40"), out)
    assert list(elsewhere.iterdir()) == []


def test_an_interrupted_swap_is_finished_by_the_next_run(tmp_path, monkeypatch):
    """Killed between moving files into place: some files are new, some old, a staging folder
    and the journal are left. The next run counts old and new files as envbuild's, cleans the
    debris and ends with exactly a fresh render."""
    out = tmp_path / "o"
    render(resolved("p40"), out)
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
        render(resolved("4090"), out)
    monkeypatch.setattr(outdir.os, "replace", real_replace)
    assert any(p.name.startswith(outdir.STAGING_PREFIX) for p in out.iterdir())
    assert (out / outdir.JOURNAL).exists()
    render(resolved("4090"), out)  # not refused as "edited": the half-moved files are envbuild's
    fresh = tmp_path / "fresh"
    render(resolved("4090"), fresh)
    assert snapshot(out) == snapshot(fresh)


def test_a_failed_write_changes_nothing(tmp_path, monkeypatch):
    out = tmp_path / "o"
    render(resolved("p40"), out)
    before = snapshot(out)
    real_write = Path.write_text

    def full_disk(self, *a, **k):
        if outdir.STAGING_PREFIX in str(self) and self.name == "preflight.py":
            raise OSError(28, "No space left on device")
        return real_write(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full_disk)
    from envbuilder.errors import ActionError

    with pytest.raises(ActionError, match="No space left"):
        render(resolved("4090"), out)
    monkeypatch.undo()
    assert snapshot(out) == before
    assert not any(p.name.startswith(outdir.STAGING_PREFIX) for p in out.iterdir())


def test_a_tampered_record_cannot_make_envbuild_delete_outside(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "o"
    render(resolved("p40"), out)
    rec = json.loads((out / RECORD).read_text())
    import hashlib

    rec["files"]["../victim.txt"] = hashlib.sha256(b"precious\n").hexdigest()
    (out / RECORD).write_text(json.dumps(rec))
    render(resolved("3090"), out)
    assert victim.read_text() == "precious\n"


# -- bounded input -------------------------------------------------------------------------------


def alias_bomb() -> str:
    text, prev = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n', "a"
    for n in "bcdefghi":
        text += f"{n}: &{n} [" + ",".join([f"*{prev}"] * 9) + "]\n"
        prev = n
    return text


def test_an_alias_bomb_in_an_overlay_is_refused_at_once(run_envbuild, overlay):
    folder = overlay(
        text="profiles:\n  bomb:\n    description: x\n"
        + "  "
        + alias_bomb().replace("\n", "\n  ").rstrip()
        + "\n"
    )
    assert len(alias_bomb()) < 1500
    t0 = time.monotonic()
    r = run_envbuild("list", "--matrix-dir", folder)
    assert r.returncode == 2, r.stderr
    assert "alias" in r.stderr and time.monotonic() - t0 < 20
    assert len(r.stderr) < 600


def test_an_alias_bomb_in_the_config_is_refused_at_once(run_envbuild, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("mirrors:\n  x:\n    " + alias_bomb().replace("\n", "\n    ").rstrip() + "\n")
    t0 = time.monotonic()
    r = run_envbuild("mirrors", "list", env={"ENVBUILD_CONFIG": str(cfg)})
    assert r.returncode == 2, r.stderr
    assert "alias" in r.stderr and time.monotonic() - t0 < 20


def test_an_overlay_linked_to_dev_zero_is_refused(run_envbuild, tmp_path):
    folder = tmp_path / "ov"
    folder.mkdir()
    (folder / "zero.yaml").symlink_to("/dev/zero")
    r = run_envbuild("render", "p40", "--matrix-dir", folder, "-o", tmp_path / "o")
    assert r.returncode == 2, r.stderr
    assert "not a regular file" in r.stderr
    assert not (tmp_path / "o").exists()


def test_an_oversized_overlay_is_refused(run_envbuild, overlay, tmp_path):
    folder = overlay(text="# " + "x" * (outdir_limit() + 10) + "\n")
    r = run_envbuild("list", "--matrix-dir", folder)
    assert r.returncode == 2 and "larger than" in r.stderr


def outdir_limit() -> int:
    from envbuilder.limits import MAX_INPUT_BYTES

    return MAX_INPUT_BYTES


def test_a_bounded_read_stops_one_byte_past_its_limit_whatever_the_file_says(tmp_path):
    """limits.read_upto asks for the size the file has (a 16 MiB request set 16 MiB aside for a
    30 KB cache file), yet a pipe, which has no size, is still read to its end or to one byte
    past the limit."""
    import os

    from envbuilder.limits import read_upto

    f = tmp_path / "f"
    f.write_bytes(b"x" * 1000)
    for limit, want in ((10, 11), (999, 1000), (1000, 1000), (1 << 24, 1000)):
        with open(f, "rb") as fh:
            assert len(read_upto(fh, limit)) == want
    import threading

    for limit, want in ((100, 101), (100_000, 70_000)):  # a pipe has no size: read on in chunks
        r, w = os.pipe()

        def feed(w=w):
            try:
                os.write(w, b"z" * 70_000)
            except BrokenPipeError:
                pass  # (the reader stopped at its limit)
            finally:
                os.close(w)

        t = threading.Thread(target=feed)
        t.start()
        with os.fdopen(r, "rb") as fh:
            assert len(read_upto(fh, limit)) == want
        t.join()


@pytest.mark.parametrize("where", ["overlay", "config", "from"])
def test_a_file_that_is_not_utf8_is_an_exit_2_paragraph(run_envbuild, tmp_path, where):
    bad = tmp_path / ("spec.json" if where == "from" else "f.yaml")
    bad.write_bytes(b'profiles:\n  x:\n    description: "caf\xe9"\n')
    if where == "overlay":
        folder = tmp_path / "ov"
        folder.mkdir()
        bad.rename(folder / "f.yaml")
        r = run_envbuild("list", "--matrix-dir", folder)
    elif where == "config":
        r = run_envbuild("mirrors", "list", env={"ENVBUILD_CONFIG": str(bad)})
    else:
        r = run_envbuild("render", "--from", bad)
    assert r.returncode == 2, r.stderr
    assert "not UTF-8" in r.stderr


def test_a_key_written_twice_is_refused_not_last_wins(run_envbuild, overlay):
    folder = overlay(text="gpus:\n  p40:\n    vram_gb: 24\n    vram_gb: 48\n")
    r = run_envbuild("list", "--matrix-dir", folder)
    assert r.returncode == 2
    assert "appears twice" in r.stderr and "vram_gb" in r.stderr


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
