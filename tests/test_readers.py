"""Issue 21, items 1 and 3: one typed, bounded reader (envbuilder/model/readers.py) for every JSON,
YAML or TOML file envbuild did not just write: a `render --from` file, a lock directory, a
wheelhouse's manifest.json, an image archive's index.json and sidecar, and envbuild's own caches
(used only from a private folder of the user's, validated like a fresh load). Each test here is
an attack that got through before (an internal error, or a bad value rendered): now it is an
exit-2 paragraph naming the file and the key, and nothing is written. No network, no Docker."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest

from conftest import resolved
from envbuilder.render.context import BuildContext

LOCKS = Path(__file__).resolve().parent.parent / "lockfiles"


@pytest.fixture(scope="module")
def p40_json() -> str:
    """envbuild.json of p40, as `envbuild render p40` writes it."""
    from envbuilder.render.files import MARKER, render_files

    return render_files(BuildContext.of(resolved("p40")))[MARKER]


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
    "a missing memory.batch entry": (
        _edit(("memory", "batch", "val_batch_size"), KeyError),
        ["memory.batch.val_batch_size is missing"],
    ),
    "an empty memory.batch": (_edit(("memory", "batch"), {}), ["memory.batch"]),
    "900-deep nesting in the memory plan": (
        lambda t: t.replace('"memory": {', '"memory": {"deep": ' + _nested(900) + ", ", 1),
        ["memory.deep", "nested"],
    ),
    "a 5000-digit integer": (
        lambda t: t.replace('"n_gpus": 1', '"n_gpus": ' + "9" * 5000, 1),
        ["train.n_gpus", "5,000 digits"],
    ),
    "gpu_memory_utilization NaN": (
        lambda t: t.replace('"gpu_memory_utilization": 0.4', '"gpu_memory_utilization": NaN', 1),
        ["train.gpu_memory_utilization", "NaN"],
    ),
    "vram Infinity": (
        lambda t: t.replace('"vram_gb": 24', '"vram_gb": Infinity', 1),
        ["gpu.vram_gb", "Infinity"],
    ),
    "a negative GPU count": (_edit(("train", "n_gpus"), -4), ["train.n_gpus", "-4"]),
    "a negative memory share": (
        _edit(("train", "gpu_memory_utilization"), -0.5),
        ["train.gpu_memory_utilization", "-0.5"],
    ),
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
    assert (tmp_path / "out" / "p40" / "envbuild.json").read_text() == p40_json


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
    "deep nesting": (_lock_json(lambda m: json.dumps(m)[:-1] + ', "x": ' + _nested(5000) + "}"), "nested"),
    "a 5000-digit format": (
        _lock_json(lambda m: json.dumps(m).replace('"format": 2', '"format": ' + "9" * 5000)),
        "format",
    ),
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


# ---- a wheelhouse's manifest.json (render --wheelhouse) ----------------------------------------


def _wheelhouse(tmp_path: Path, manifest: str) -> Path:
    """A wheelhouse as `render --wheelhouse` reads it: manifest.json and the lock of h100 (pip
    only, as the shipped one is) under locks/."""
    wh = tmp_path / "wh"
    (wh / "locks").mkdir(parents=True)
    shutil.copytree(LOCKS / "h100", wh / "locks" / "h100")
    (wh / "manifest.json").write_text(manifest)
    return wh


WHL = "pypi/x-1-py3-none-any.whl"
MANIFEST_ATTACKS = {
    "deep nesting": ('{"format": 1, "files": {}, "profiles": {}, "x": ' + _nested(5000) + "}", "nested"),
    "a profile nested 3000 deep": (
        '{"format": 1, "files": {}, "profiles": {"h100": ' + _nested(3000) + "}}",
        "nested",
    ),
    "a negative size": (
        json.dumps(
            {
                "format": 1,
                "files": {WHL: {"kind": "pip", "name": "x", "version": "1", "size": -5, "sha256": "0" * 64}},
                "profiles": {"h100": {"files": [WHL], "built": {}}},
            }
        ),
        f"files.{WHL}.size",
    ),
}


@pytest.mark.parametrize("attack", list(MANIFEST_ATTACKS))
def test_a_malformed_wheelhouse_manifest_is_refused_by_render(cli, tmp_path, attack):
    manifest, words = MANIFEST_ATTACKS[attack]
    wh = _wheelhouse(tmp_path, manifest)
    code, _, err = cli("render", "h100", "--wheelhouse", wh, "-o", tmp_path / "out")
    refused(code, err, "manifest.json", words, "envbuild wheelhouse")
    assert not (tmp_path / "out").exists()


def test_a_wheelhouse_without_the_profile_is_still_named_as_such(cli, tmp_path):
    wh = _wheelhouse(tmp_path, json.dumps({"format": 1, "files": {}, "profiles": {}}))
    code, _, err = cli("render", "h100", "--wheelhouse", wh, "-o", tmp_path / "out")
    refused(code, err, "holds no complete export of h100")


# ---- an image archive: index.json and the sidecar (import-image, apptainer --oci-archive) -------

DIGEST = "sha256:" + "a" * 64


def oci_archive(path: Path, index: bytes) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in [("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), ("index.json", index)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sidecar(archive: Path, text: str | None = None) -> None:
    """The sidecar export-image writes for `archive` (its sha256 and size right), or `text`."""
    import hashlib

    data = archive.read_bytes()
    archive.with_name(archive.name + ".json").write_text(
        text
        if text is not None
        else json.dumps(
            {
                "format": "envbuild-image-archive/1",
                "image": "x:1",
                "name": "x:1",
                "source": "docker-daemon:x",
                "manifest_digest": DIGEST,
                "media_type": "m",
                "config_digest": None,
                "archive": archive.name,
                "archive_sha256": hashlib.sha256(data).hexdigest(),
                "archive_size": len(data),
            }
        )
    )


@pytest.fixture
def registry():
    """A loopback stand-in that answers /v2/ as a registry does (import-image asks it first)."""
    from httpfixtures import FileServer

    with FileServer({"v2/": b"{}"}) as server:
        yield f"127.0.0.1:{server.port}"


INDEX_ATTACKS = {
    "a list where the index belongs": (b"[1, 2]", "index.json"),
    "a manifest entry that is a list": (b'{"manifests": [[1]]}', "manifests[0]"),
    "deep nesting": (b'{"manifests": [], "x": ' + _nested(5000).encode() + b"}", "nested"),
}


@pytest.mark.parametrize("attack", list(INDEX_ATTACKS))
def test_import_image_refuses_a_malformed_index_json(cli, tmp_path, registry, attack):
    index, words = INDEX_ATTACKS[attack]
    archive = oci_archive(tmp_path / "img.tar", index)
    sidecar(archive)
    code, _, err = cli("import-image", archive, "--registry", registry, "--name", "x:1")
    refused(code, err, "img.tar: index.json", words)


def test_import_image_refuses_a_deeply_nested_sidecar(cli, tmp_path, registry):
    archive = oci_archive(tmp_path / "img.tar", json.dumps({"manifests": [{"digest": DIGEST}]}).encode())
    sidecar(archive, '{"format": ' + _nested(5000) + "}")
    code, _, err = cli("import-image", archive, "--registry", registry, "--name", "x:1")
    refused(code, err, "img.tar.json", "nested")


def test_apptainer_reads_index_json_through_the_same_reader(cli, tmp_path):
    archive = oci_archive(tmp_path / "img.tar", b'{"manifests": [], "x": ' + _nested(5000).encode() + b"}")
    code, _, err = cli("apptainer", "p40", "--oci-archive", archive, "-o", tmp_path / "p.def")
    refused(code, err, "index.json", "nested", "not an OCI image archive")
    assert not (tmp_path / "p.def").exists()
    oci_archive(archive, json.dumps({"manifests": [{"digest": DIGEST, "size": 1}]}).encode())
    code, _, err = cli("apptainer", "p40", "--oci-archive", archive, "-o", tmp_path / "p.def")
    assert code == 0, err
    assert f"io.envbuild.image-digest {DIGEST}" in (tmp_path / "p.def").read_text()


# ---- envbuild's own caches: a private folder, validated content, exclusive temp files ---------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache home of this test's own, and the matrix cache file a load writes there."""
    from envbuilder.model import matrix as M

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cachehome"))
    monkeypatch.delenv("ENVBUILD_NO_CACHE", raising=False)
    M.load()
    path = M._cache_path(M.matrix_files())
    assert path.is_file()
    return path


def _render(cli, out: Path) -> dict:
    code, _, err = cli("render", "p40", "-o", out)
    assert code == 0, err
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def test_a_planted_matrix_cache_is_validated_like_a_fresh_load(cli, tmp_path, cache):
    """A value no matrix file may hold (a newline: a Dockerfile line of its own) in the cache
    is refused as a fresh load would refuse it; the matrix is read afresh and the cache
    rewritten."""
    clean = _render(cli, tmp_path / "clean")
    doc = _cache_doc(cache)
    verl = doc["sections"]["verl"][doc["sections"]["profiles"]["p40"]["verl"]]
    verl["pins"] = {k: v + "\nRUN echo pwned" for k, v in verl["pins"].items()}
    doc["sections"]["cuda"]["11.8"]["conda_nvcc"] += "\nRUN echo pwned"
    cache.write_text(json.dumps(doc))
    assert _render(cli, tmp_path / "planted") == clean
    assert "pwned" not in cache.read_text()


def _cache_doc(cache: Path) -> dict:
    """The matrix cache's JSON (its seal line, paths.SEAL, left off)."""
    from envbuilder.paths import SEAL

    text = cache.read_text()
    return json.loads(text.split("\n", 1)[1] if text.startswith(SEAL) else text)


def _plant_description(cache: Path, text: str) -> None:
    doc = _cache_doc(cache)
    doc["sections"]["profiles"]["p40"]["description"] = text  # (valid text: only where it is)
    cache.write_text(json.dumps(doc))


def test_a_cache_folder_others_may_write_into_is_not_used(cli, tmp_path, cache):
    clean = _render(cli, tmp_path / "clean")
    _plant_description(cache, "planted by someone else")
    cache.parent.chmod(0o777)
    assert _render(cli, tmp_path / "planted") == clean
    assert stat.S_IMODE(cache.parent.stat().st_mode) == 0o777  # (not ours to fix: not used)


def test_a_cache_folder_of_another_user_is_not_used(cli, tmp_path, cache):
    clean = _render(cli, tmp_path / "clean")
    _plant_description(cache, "planted by someone else")
    try:
        os.chown(cache.parent, 65534, 65534)
    except PermissionError:
        pytest.skip("making a folder of another user needs root")
    assert _render(cli, tmp_path / "planted") == clean


def test_a_cache_folder_of_ours_that_others_may_read_is_made_private(cli, tmp_path, cache):
    """What an older envbuild (or jinja's mkdir -p) left at 0755 is ours: it is tightened to
    0700 and used."""
    cache.parent.chmod(0o755)
    _render(cli, tmp_path / "out")
    assert stat.S_IMODE(cache.parent.stat().st_mode) == 0o700


def test_a_cache_file_that_is_a_link_is_not_followed(cli, tmp_path, cache):
    clean = _render(cli, tmp_path / "clean")
    elsewhere = tmp_path / "elsewhere.json"
    shutil.copy(cache, elsewhere)
    _plant_description(elsewhere, "read through a link")
    cache.unlink()
    cache.symlink_to(elsewhere)
    assert _render(cli, tmp_path / "planted") == clean


def test_the_cache_temp_file_is_never_opened_through_a_planted_link(tmp_path, cache):
    """`<cache>.<pid>.tmp` was opened by name: a link planted there overwrote its target."""
    from envbuilder.paths import write_cache

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        cache.with_suffix(f".{pid}.tmp").symlink_to(victim)
    write_cache(cache, '{"planted": 1}')
    assert victim.read_text() == "precious\n"
    assert json.loads(cache.read_text()) == {"planted": 1} and not cache.is_symlink()
    assert not [p for p in cache.parent.iterdir() if p.name.startswith(f".{cache.name}.")]


def test_envbuild_json_text_from_the_cache_is_the_environment_kind_for_kind(tmp_path, monkeypatch):
    """A cached text that equals the environment only in Python's eyes (true == 1) is not it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ENVBUILD_NO_CACHE", raising=False)
    env = resolved("p40")
    want = env.to_json()
    [cached] = (tmp_path / "envbuild").glob("env-*.json")
    assert '"n_gpus": 1,' in want
    cached.write_text(want.replace('"n_gpus": 1,', '"n_gpus": true,'))
    assert env.to_json() == want


# ---- the record of an output folder (render -o DIR) --------------------------------------------


def test_a_deeply_nested_record_in_the_output_folder_is_ignored_not_a_crash(cli, tmp_path):
    """The record of what envbuild wrote into a folder is read back on the next render: one
    nested 5000 deep was an internal error; now it counts as no record (the careful case)."""
    out = tmp_path / "out"
    assert cli("render", "p40", "-o", out)[0] == 0
    record = out / "p40" / ".envbuild-files.json"
    record.write_text(record.read_text()[:-2] + ', "x": ' + _nested(5000) + "}\n")
    code, _, err = cli("render", "p40", "-o", out)
    assert code == 0, err
    assert "x" not in json.loads(record.read_text())  # (written afresh)


def test_a_planted_lock_cache_never_reaches_the_constraints(cli, tmp_path, monkeypatch):
    """plan.py keeps each lock's layered pins in the cache folder: a pin planted there with a
    newline once added a line of its own to constraints/*.txt. Only what this user's envbuild
    sealed is read back; a planted file is worked out afresh and sealed anew."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cachehome"))
    monkeypatch.delenv("ENVBUILD_NO_CACHE", raising=False)
    assert cli("render", "h100", "-o", tmp_path / "clean")[0] == 0
    [cached] = (tmp_path / "cachehome" / "envbuild").glob("lock-*.json")
    doc = _cache_doc(cached)
    doc = {layer: [p + "\n--index-url http://127.0.0.1:9/evil" for p in pins] for layer, pins in doc.items()}
    cached.write_text(json.dumps(doc))
    assert cli("render", "h100", "-o", tmp_path / "planted")[0] == 0
    for f in (tmp_path / "clean" / "h100" / "constraints").iterdir():
        assert (tmp_path / "planted" / "h100" / "constraints" / f.name).read_text() == f.read_text()
    # the cache written afresh is used again as it is (validation passes what parse() wrote)
    before = cached.stat().st_mtime_ns
    assert cli("render", "h100", "-o", tmp_path / "again")[0] == 0
    assert cached.stat().st_mtime_ns == before


def test_a_valid_matrix_cache_is_used_as_it_is(cli, tmp_path, cache):
    """Validation passes what matrix.load wrote: the cache is read, not rewritten."""
    before = cache.stat().st_mtime_ns
    _render(cli, tmp_path / "out")
    assert cache.stat().st_mtime_ns == before
