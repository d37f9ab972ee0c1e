"""Issue 21, items 1 and 3: one typed, bounded reader (envbuilder/readers.py) for every JSON,
YAML or TOML file envbuild did not just write: a `render --from` file, a lock directory, a
wheelhouse's manifest.json, an image archive's index.json and sidecar, and envbuild's own caches
(used only from a private folder of the user's, validated like a fresh load). Each test here is
an attack that got through before (an internal error, or a bad value rendered): now it is an
exit-2 paragraph naming the file and the key, and nothing is written. No network, no Docker."""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest

from conftest import resolved

LOCKS = Path(__file__).resolve().parent.parent / "lockfiles"


@pytest.fixture(scope="module")
def p40_json() -> str:
    """envbuild.json of p40, as `envbuild render p40` writes it."""
    from envbuilder.render import MARKER, render_files

    return render_files(resolved("p40"))[MARKER]


def refused(code: int, err: str, *words: str) -> None:
    """Exit 2 with a paragraph (no traceback, no internal error) that says each of `words`."""
    assert code == 2, err
    assert "Traceback" not in err and "bug in envbuild" not in err, err
    assert "envbuild: error:" in err, err
    for w in words:
        assert w in err, (w, err)


# ---- render --from -----------------------------------------------------------------------------

def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _edit(path, value):
    def edit(d):
        *head, last = path
        for p in head:
            d = d[p]
        if value is KeyError:
            del d[last]
        else:
            d[last] = value
    return edit


FROM_ATTACKS = {
    # what -> (edit of the parsed file, or of its text; words the refusal must say)
    "a number in a list of module names": (_edit(("training_path", 0), 5), ["training_path[0]"]),
    "a number in the pinned packages": (_edit(("torch", "packages", 0), 2), ["torch.packages[0]"]),
    "an empty package list": (_edit(("torch", "packages"), []), ["torch.packages"]),
    "a missing memory.batch entry": (_edit(("memory", "batch", "val_batch_size"), KeyError),
                                     ["memory.batch.val_batch_size is missing"]),
    "an empty memory.batch": (_edit(("memory", "batch"), {}), ["memory.batch"]),
    "900-deep nesting in the memory plan": (
        lambda t: t.replace('"memory": {', '"memory": {"deep": ' + _nested(900) + ", ", 1),
        ["memory.deep", "nested"]),
    "a 5000-digit integer": (lambda t: t.replace('"n_gpus": 1', '"n_gpus": ' + "9" * 5000, 1),
                             ["train.n_gpus", "5,000 digits"]),
    "gpu_memory_utilization NaN": (
        lambda t: t.replace('"gpu_memory_utilization": 0.4', '"gpu_memory_utilization": NaN', 1),
        ["train.gpu_memory_utilization", "NaN"]),
    "vram Infinity": (lambda t: t.replace('"vram_gb": 24', '"vram_gb": Infinity', 1),
                      ["gpu.vram_gb", "Infinity"]),
    "a negative GPU count": (_edit(("train", "n_gpus"), -4), ["train.n_gpus", "-4"]),
    "a negative memory share": (_edit(("train", "gpu_memory_utilization"), -0.5),
                                ["train.gpu_memory_utilization", "-0.5"]),
    "a zero batch size": (_edit(("memory", "batch", "test_freq"), 0), ["memory.batch.test_freq"]),
}


@pytest.mark.parametrize("attack", list(FROM_ATTACKS))
def test_render_from_refuses_a_malformed_value_naming_its_key(cli, tmp_path, p40_json, attack):
    edit, words = FROM_ATTACKS[attack]
    assert '"gpu_memory_utilization": 0.4' in p40_json and '"vram_gb": 24' in p40_json
    try:
        text = edit(p40_json)
    except TypeError:  # an edit of the parsed document
        data = json.loads(p40_json)
        edit(data)
        text = json.dumps(data)
    assert text != p40_json
    (tmp_path / "spec.json").write_text(text)
    code, _, err = cli("render", "--from", tmp_path / "spec.json", "-o", tmp_path / "out")
    refused(code, err, "spec.json", *words)
    assert not (tmp_path / "out").exists()


def test_render_from_still_renders_the_file_render_wrote(cli, tmp_path, p40_json):
    (tmp_path / "spec.json").write_text(p40_json)
    code, _, err = cli("render", "--from", tmp_path / "spec.json", "-o", tmp_path / "out")
    assert code == 0, err
    assert (tmp_path / "out" / "envbuild.json").read_text() == p40_json


# ---- a lock directory --------------------------------------------------------------------------

def _lock_json(edit):
    def damage(lock: Path) -> None:
        meta = json.loads((lock / "lock.json").read_text())
        text = edit(meta)
        (lock / "lock.json").write_text(text if isinstance(text, str) else json.dumps(meta))
    return damage


LOCK_ATTACKS = {
    "inputs a list": (_lock_json(lambda m: m.__setitem__("inputs", [])), "inputs"),
    "parts holding a list": (_lock_json(lambda m: m.__setitem__("parts", [["pip"]])), "parts[0]"),
    "deep nesting": (_lock_json(lambda m: json.dumps(m)[:-1] + ', "x": ' + _nested(5000) + "}"),
                     "nested"),
    "a 5000-digit format": (_lock_json(lambda m: json.dumps(m).replace('"format": 2', '"format": '
                                                                       + "9" * 5000)), "format"),
}


@pytest.mark.parametrize("attack", list(LOCK_ATTACKS))
def test_a_malformed_lock_json_is_refused_by_render_and_check(cli, tmp_path, attack):
    damage, where = LOCK_ATTACKS[attack]
    lock = tmp_path / "lock"
    shutil.copytree(LOCKS / "p40", lock)
    damage(lock)
    code, _, err = cli("render", "p40", "--locked", lock, "-o", tmp_path / "out")
    refused(code, err, "lock.json", where, "envbuild lock")
    assert not (tmp_path / "out").exists()
    code, _, err = cli("lock", "p40", "--check", "-o", lock)
    refused(code, err, "lock.json", where)
