"""Bounded input (envbuilder/limits.py, the one reader): YAML alias bombs, a file linked to
/dev/zero, an oversized or non-UTF-8 file and a key written twice are each refused at once with
an exit-2 paragraph, through the real `envbuild` on an overlay or the config; and a bounded read
stops one byte past its limit whatever the file says. Each failed on the code before (issue 12).
"""

from __future__ import annotations
import time
import pytest


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
