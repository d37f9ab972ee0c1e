"""Issue 21, item 6: the no-traceback promise, enforced. Hypothesis makes malformed documents
(wrong kinds, lists where objects belong, empty values, deep nesting, whole numbers of
thousands of digits, NaN and Infinity, huge strings, control characters and other unicode,
aliases, tags and dates in YAML, broken TOML) and feeds them to every reader of a file
envbuild did not just write (readers.py and its callers), and through the real command line
(envbuild.cli.main, in-process) to every command's file inputs: render --from, render --locked
and lock --check (a lock directory), render --wheelhouse (manifest.json), import-image (the
archive's index.json and its sidecar), apptainer --oci-archive, render --matrix-dir (an
overlay), render -o (the record of an output folder) and the matrix cache. Any internal error
fails the test: an exception out of the reader or of main (ENVBUILD_DEBUG=1 lets it through),
an exit code other than 0, 1 or 2, or the "bug in envbuild" text. Deterministic (derandomized)
and bounded: well under a minute. No network but loopback, no Docker."""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import resolved
from envbuilder.render.context import BuildContext

LOCKS = Path(__file__).resolve().parent.parent / "lockfiles"
SETTINGS = dict(
    deadline=None,
    database=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)


# ---- hostile values and documents --------------------------------------------------------------


class Raw:
    """JSON text no encoder writes (NaN, a 5000-digit integer, 900 brackets): put into the
    document's text in place of a marker."""

    def __init__(self, text: str):
        self.text = text


RAW = [
    Raw(t)
    for t in (
        "NaN",
        "Infinity",
        "-Infinity",
        "1e999",
        "-0",
        "9" * 5000,
        "-" + "9" * 400,
        "1" + "0" * 30,
        "[" * 900 + "]" * 900,
        "[" * 5000 + "]" * 5000,
        '{"a":' * 200 + "1" + "}" * 200,
        "[" * 40 + "1" + "]" * 40,
        '"' + "x" * 70_000 + '"',
        "[" + ",".join(["0"] * 120_000) + "]",
        '"\\ud800"',
        '"\\u0000\\u001b[31m"',
    )
]

NAN, DEEP_900, DEEP_5000 = RAW[0], RAW[8], RAW[9]
assert (NAN.text, DEEP_900.text.count("["), DEEP_5000.text.count("[")) == ("NaN", 900, 5000)
DEEP = [r for r in RAW if r.text[:1] in "[{" or r.text.lstrip("-")[:3] == "999"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),  # any unicode: control characters, surrogates' neighbours, RTL marks
    st.sampled_from(
        [
            "",
            " ",
            "\n",
            "x\nRUN echo pwned",
            "../../etc/passwd",
            "sha256:" + "0" * 64,
            "0" * 64,
            "p40",
            "pip",
            "1.0",
            "https://example.org/x",
            "\u2028",
            "$(id)",
        ]
    ),
    st.sampled_from(RAW),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=12), inner, max_size=3)
    ),
    max_leaves=8,
)


def paths(doc, at=()):
    """Every path into `doc` (keys and indexes), the document itself first."""
    yield at
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, at + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, at + (i,))


@st.composite
def mutated(draw, doc):
    """`doc` with one to three of its values changed: replaced by a hostile value, removed,
    wrapped in a list, emptied, or its kind swapped (a list where an object belongs)."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from(list(paths(doc))))
        op = draw(st.sampled_from(["replace", "replace", "remove", "wrap", "empty", "swap"]))
        if not at:
            return draw(values) if op == "replace" else [doc] if op == "wrap" else doc
        parent = doc
        for k in at[:-1]:
            parent = parent[k]
        old = parent[at[-1]]
        if op == "remove":
            del parent[at[-1]]
        elif op == "wrap":
            parent[at[-1]] = [old]
        elif op == "empty":
            parent[at[-1]] = type(old)() if isinstance(old, (dict, list, str)) else None
        elif op == "swap":
            parent[at[-1]] = (
                list(old.values())
                if isinstance(old, dict)
                else {str(i): v for i, v in enumerate(old)}
                if isinstance(old, list)
                else [old]
            )
        else:
            parent[at[-1]] = draw(values)
    return doc


def dumps(doc) -> str:
    """JSON text of `doc`, each Raw as its own text."""
    raws: list[Raw] = []

    def mark(o):
        if isinstance(o, Raw):
            raws.append(o)
            return f"@@raw-{len(raws) - 1}@@"
        raise TypeError(type(o))

    text = json.dumps(doc, default=mark, ensure_ascii=False)
    for i, r in enumerate(raws):
        text = text.replace(f'"@@raw-{i}@@"', r.text, 1)
    return text


@st.composite
def raw_into(draw, doc):
    """`doc` with one value (or the document) replaced by JSON text no encoder writes."""
    doc = json.loads(json.dumps(doc))
    at = draw(st.sampled_from(list(paths(doc))))
    raw = draw(st.sampled_from(RAW + DEEP))  # (nesting and huge numbers twice as often)
    target = doc
    for k in at:
        target = target[k]
    if isinstance(target, dict) and draw(st.booleans()):
        target[draw(st.sampled_from(["zz", "x", "extra", ""]))] = raw  # a key it never had
        return doc
    if not at:
        return raw
    parent = doc
    for k in at[:-1]:
        parent = parent[k]
    parent[at[-1]] = raw
    return doc


def json_texts(doc) -> st.SearchStrategy[str]:
    """A mutation of `doc`, or plain hostile text where the document belongs."""
    return st.one_of(
        mutated(doc).map(dumps),
        mutated(doc).map(dumps),
        raw_into(doc).map(dumps),
        raw_into(doc).map(dumps),
        values.map(dumps),
        st.sampled_from(
            [
                "",
                "{",
                "null",
                "[]",
                "{}",
                '"x"',
                "\ufeff{}",
                dumps(doc)[:-3],
                dumps(doc)[:-1] + ', "format": 2}',
                "\x00",
                "{" * 3000,
            ]
        ),
        st.text(max_size=60),
    )


YAML_SNIPPETS = [
    "a: &a [1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n"
    "d: &d [*c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d]\n"
    "f: [*e, *e, *e, *e, *e, *e, *e, *e]\n",
    "a: !!python/object/apply:os.system ['id']\n",
    "a: !!binary aGVsbG8=\n",
    "a: 2024-01-01\n",
    "a: .nan\n",
    "a: -.inf\n",
    "a: " + "9" * 5000 + "\n",
    "a: 1\na: 2\n",
    "[" * 2000,
    "- " * 200 + "x\n",
    "a: !!set {x, y}\n",
    "? [1, 2]\n: x\n",
    "a: !!omap [{x: 1}]\n",
    "%YAML 1.1\n---\na: 1\n---\nb: 2\n",
    "\t- x\n",
    "a: '\\x00'\n",
    'a: "\\x1b]0;owned\\x07"\n',
    "{a: 1, a: 1}",
    "a: <<\n",
    "<<: *nothing\n",
    "a: 0x" + "f" * 100 + "\n",
    "a: 1_000_000\n",
]


def yaml_texts(doc) -> st.SearchStrategy[str]:
    import yaml

    def to_yaml(d):
        try:
            return yaml.safe_dump(json.loads(dumps(d)) if not _has_raw(d) else d, allow_unicode=True)
        except (ValueError, yaml.YAMLError, TypeError, RecursionError):
            return dumps(d)  # (JSON is YAML too, mostly)

    return st.one_of(mutated(doc).map(to_yaml), st.sampled_from(YAML_SNIPPETS), st.text(max_size=60))


def _has_raw(d) -> bool:
    return any(isinstance(v, Raw) for v in _leaves(d))


def _leaves(d):
    if isinstance(d, dict):
        for v in d.values():
            yield from _leaves(v)
    elif isinstance(d, list):
        for v in d:
            yield from _leaves(v)
    else:
        yield d


TOML_SNIPPETS = [
    "a = nan",
    "a = inf",
    "a = " + "9" * 5000,
    "a = 1979-05-27T07:32:00Z",
    "a = [" * 2000 + "]" * 2000,
    "[[packages]]\nname = 1",
    "packages = 1",
    "packages = [1, 2]",
    "[[packages]]\n[[packages.wheels]]\nurl = 'x'",
    "a = 1\na = 2",
    "a = '\x00'",
    'a = """\n' + "x" * 70_000 + '"""',
    "[a]\n[a]",
]


def toml_texts(text: str) -> st.SearchStrategy[str]:
    """Line-level damage of a real TOML text, or hostile TOML."""
    lines = text.splitlines()

    @st.composite
    def damaged(draw):
        out = list(lines)
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(out) - 1))
            out[i] = draw(st.sampled_from(["", "]", "x = ", out[i][: len(out[i]) // 2]] + TOML_SNIPPETS))
        return "\n".join(out)

    return st.one_of(damaged(), st.sampled_from(TOML_SNIPPETS), st.text(max_size=60))


# ---- the command line, in-process --------------------------------------------------------------


def envbuild(*args, env: dict | None = None) -> tuple[int, str]:
    """(exit code, stderr) of envbuilder.cli.main(args). ENVBUILD_DEBUG=1: an internal error
    raises out of here, with its traceback, and fails the test."""
    from envbuilder.cli import main

    saved = dict(os.environ)
    os.environ.update({"ENVBUILD_DEBUG": "1", **(env or {})})
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in args])
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    text = err.getvalue()
    assert code in (0, 1, 2), (code, text[-2000:])
    assert "bug in envbuild" not in text, text[-2000:]
    # a traceback of envbuild's own code (a loopback server's thread of another test may print
    # one of its own to the same stderr: that is no finding here)
    assert not ("Traceback" in text and "envbuilder" in text), text[-2000:]
    return code, text


@pytest.fixture(scope="module")
def work():
    path = Path(tempfile.mkdtemp(prefix="envbuild-readers-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def fresh(work: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=work))


# ---- the readers themselves --------------------------------------------------------------------


def only_bad_data(call):
    """`call()` returns or raises a UserError (readers.BadData is one): nothing else."""
    from envbuilder.errors import UserError

    try:
        call()
    except UserError as e:
        assert str(e) and "Traceback" not in str(e)


@settings(max_examples=120, **SETTINGS)
@given(st.one_of(json_texts({"a": [1, {"b": "c"}], "d": 1.5}), st.text(max_size=80)))
def test_parse_json_returns_or_says_what_is_wrong(text):
    from envbuilder.model import schema as S
    from envbuilder.model.readers import parse_json

    shape = {"a": S.ListOf(S.Scalar()), "d?": S.Num(0, 10), "*": S.Tree(S.Text(100))}
    only_bad_data(lambda: parse_json(text, "doc.json"))
    only_bad_data(lambda: parse_json(text.encode("utf-8", "surrogatepass"), "doc.json", shape=shape))


@settings(max_examples=80, **SETTINGS)
@given(yaml_texts({"profiles": {"p": {"train": {"n_gpus": 1}, "pins": {"a": "1"}}}}))
def test_parse_yaml_returns_or_says_what_is_wrong(text):
    from envbuilder.model.readers import parse_yaml

    only_bad_data(lambda: parse_yaml(text, "doc.yaml"))


@settings(max_examples=60, **SETTINGS)
@given(toml_texts((LOCKS / "h100" / "pylock.toml").read_text()[:4000]))
def test_parse_toml_returns_or_says_what_is_wrong(text):
    from envbuilder.lock.lockfile import PYLOCK, parse

    only_bad_data(lambda: parse(PYLOCK, text, "pylock.toml"))


# ---- render --from -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def p40_spec() -> dict:
    from envbuilder.render.files import MARKER, render_files

    return json.loads(render_files(BuildContext.of(resolved("p40")))[MARKER])


def _spec_text(edit) -> str:
    doc = copy.deepcopy(p40_spec())
    edit(doc)
    return dumps(doc)


@settings(max_examples=100, **SETTINGS)
@given(text=st.deferred(lambda: json_texts(p40_spec())))
@example(text=None)  # (the attacks that got through before, built once the spec is at hand)
def test_render_from_any_file_is_rendered_or_refused(work, text):
    if text is None:
        texts = [
            _spec_text(lambda d: d["memory"].__setitem__("deep", DEEP_900)),
            _spec_text(lambda d: d["training_path"].__setitem__(0, 5)),
            _spec_text(lambda d: d["torch"].__setitem__("packages", [])),
            _spec_text(lambda d: d["train"].__setitem__("gpu_memory_utilization", NAN)),
        ]
    else:
        texts = [text]
    for t in texts:
        folder = fresh(work)
        (folder / "spec.json").write_text(t, encoding="utf-8", errors="surrogatepass")
        envbuild("render", "--from", folder / "spec.json", "-o", folder / "out")


# ---- a lock directory: render --locked, lock --check -------------------------------------------


def _resign(lock: Path, name: str) -> None:
    meta = json.loads((lock / "lock.json").read_text())
    meta["files"][name] = hashlib.sha256((lock / name).read_bytes()).hexdigest()
    (lock / "lock.json").write_text(json.dumps(meta))


LOCK_META = json.loads((LOCKS / "h100" / "lock.json").read_text())
LISTED = {
    "sources.lock": {
        "apex": {
            "url": "https://github.com/NVIDIA/apex/archive/25.08.tar.gz",
            "sha256": "0" * 64,
            "size": 1,
            "filename": "apex-25.08.tar.gz",
            "ref": "25.08",
        }
    },
    "images.lock": {"nvidia/cuda:12.8.1-devel": {"digest": "sha256:" + "0" * 64, "media_type": "m"}},
}
lock_cases = st.one_of(
    st.tuples(st.just("lock.json"), json_texts(LOCK_META)),
    st.tuples(st.just("pylock.toml"), toml_texts((LOCKS / "h100" / "pylock.toml").read_text())),
    st.sampled_from(sorted(LISTED)).flatmap(lambda n: st.tuples(st.just(n), json_texts(LISTED[n]))),
)


@settings(max_examples=60, **SETTINGS)
@given(case=lock_cases)
@example(case=("lock.json", dumps(dict(LOCK_META, inputs=[]))))
@example(case=("lock.json", dumps(dict(LOCK_META, x=DEEP_5000))))
@example(case=("images.lock", dumps({"r": DEEP_5000})))
def test_a_lock_directory_is_used_or_refused(work, case):
    which, text = case
    lock = fresh(work) / "lock"
    shutil.copytree(LOCKS / "h100", lock)
    (lock / which).write_text(text, errors="surrogatepass")
    if which != "lock.json":  # a file the lock lists, signed: its content is what is read
        meta = json.loads((lock / "lock.json").read_text())
        if which in LISTED:
            meta["parts"] = sorted(set(meta["parts"]) | {which.split(".")[0]})
        (lock / "lock.json").write_text(json.dumps(meta))
        _resign(lock, which)
    envbuild("render", "h100", "--locked", lock, "-o", lock.parent / "out")
    envbuild("lock", "h100", "--check", "-o", lock)


# ---- a wheelhouse's manifest.json: render --wheelhouse ----------------------------------------

MANIFEST = {
    "format": 1,
    "files": {
        "pypi/x-1-py3-none-any.whl": {
            "kind": "pip",
            "name": "x",
            "version": "1",
            "size": 3,
            "sha256": "0" * 64,
            "built_from": {"path": "pypi/x-1.tar.gz", "sha256": "1" * 64},
            "build": {"python": "3.12.3", "machine": "x86_64", "glibc": "2.35"},
        }
    },
    "profiles": {
        "h100": {
            "input_sha256": "2" * 64,
            "python": "3.12",
            "files": ["pypi/x-1-py3-none-any.whl"],
            "built": {"x": "pypi/x-1-py3-none-any.whl"},
        }
    },
}


@settings(max_examples=60, **SETTINGS)
@given(text=json_texts(MANIFEST))
@example(text=dumps(dict(MANIFEST, x=DEEP_5000)))
def test_a_wheelhouse_manifest_is_used_or_refused(work, text):
    wh = fresh(work) / "wh"
    (wh / "locks").mkdir(parents=True)
    shutil.copytree(LOCKS / "h100", wh / "locks" / "h100")
    (wh / "manifest.json").write_text(text, errors="surrogatepass")
    envbuild("render", "h100", "--wheelhouse", wh, "-o", wh.parent / "out")


# ---- an image archive: import-image (index.json, sidecar), apptainer --oci-archive -------------

DIGEST = "sha256:" + "a" * 64
INDEX = {
    "schemaVersion": 2,
    "manifests": [
        {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": DIGEST,
            "size": 1,
            "annotations": {"org.opencontainers.image.ref.name": "x:1"},
        }
    ],
}


def _archive(path: Path, index: str) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in [
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", index.encode("utf-8", "surrogatepass")),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _sidecar(archive: Path) -> dict:
    data = archive.read_bytes()
    return {
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


@pytest.fixture(scope="module")
def registry():
    from httpfixtures import FileServer

    with FileServer({"v2/": b"{}"}) as server:
        yield f"127.0.0.1:{server.port}"


GOOD = "(the sidecar export-image writes for it)"
SIDECAR = {
    "format": "envbuild-image-archive/1",
    "image": "x:1",
    "name": "x:1",
    "source": "docker-daemon:x",
    "manifest_digest": DIGEST,
    "media_type": "m",
    "config_digest": None,
    "archive": "img.tar",
    "archive_sha256": "0" * 64,
    "archive_size": 10240,
}


@settings(max_examples=40, **SETTINGS)
@given(index=json_texts(INDEX), side=st.one_of(st.just(GOOD), json_texts(SIDECAR)))
@example(index="[1, 2]", side=GOOD)
@example(index=dumps({"manifests": [[1]]}), side=GOOD)
@example(index=dumps(dict(INDEX, x=DEEP_5000)), side=GOOD)
@example(index=dumps(INDEX), side=dumps(dict(SIDECAR, format=DEEP_5000)))
def test_an_image_archive_is_loaded_or_refused(work, registry, index, side):
    folder = fresh(work)
    archive = _archive(folder / "img.tar", index)
    (folder / "img.tar.json").write_text(
        json.dumps(_sidecar(archive)) if side == GOOD else side, errors="surrogatepass"
    )
    envbuild("import-image", archive, "--registry", registry, "--name", "x:1")
    envbuild("apptainer", "p40", "--oci-archive", archive, "-o", folder / "p.def")


# ---- the matrix: an overlay (render --matrix-dir) and the cache --------------------------------


def _profile() -> dict:
    from conftest import record

    return {"profiles": {"lab": record("profiles", "p40", source="https://example.org/x")}}


@settings(max_examples=40, **SETTINGS)
@given(text=st.deferred(lambda: yaml_texts(_profile())))
@example(text="profiles:\n  lab:\n    train:\n      n_gpus: " + "9" * 5000 + "\n")
def test_a_matrix_overlay_is_loaded_or_refused(work, text):
    folder = fresh(work)
    (folder / "overlay").mkdir()
    (folder / "overlay" / "lab.yaml").write_text(text, errors="surrogatepass")
    envbuild(
        "render",
        "lab",
        "--matrix-dir",
        folder / "overlay",
        "-o",
        folder / "out",
        env={"XDG_CACHE_HOME": str(folder / "cache")},
    )


@functools.lru_cache(maxsize=None)
def matrix_cache() -> dict:
    """The matrix cache as matrix.load writes it (profiles, memory and defaults: the parts a
    render of p40 reads, small enough to damage in many ways)."""
    from envbuilder.model import matrix as M

    home = Path(tempfile.mkdtemp(prefix="envbuild-cache-"))
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(home)
    try:
        M.load()
        text = M._cache_path(M.matrix_files()).read_text()
        doc = json.loads(text.split("\n", 1)[1])  # (after its seal line, paths.SEAL)
    finally:
        os.environ["XDG_CACHE_HOME"] = saved
        shutil.rmtree(home, ignore_errors=True)
    return doc


@settings(max_examples=40, **SETTINGS)
@given(
    text=st.deferred(
        lambda: json_texts(
            {
                "sections": {k: matrix_cache()["sections"][k] for k in ("profiles", "memory", "defaults")},
                "origin": matrix_cache()["origin"][:3],
            }
        )
    ),
    whole=st.booleans(),
)
@example(text='{"sections": {}, "origin": []}', whole=False)
@example(text=None, whole=True)
@example(text=None, whole=False)
def test_a_planted_matrix_cache_never_breaks_a_render(work, text, whole):
    """Planted over the cache a render of p40 reads: damaged, alone or within the whole
    matrix. A cache that is not valid is not used (the matrix is read afresh); one that is
    valid but another (p40 removed) renders what it says."""
    from envbuilder.model import matrix as M

    doc = matrix_cache()
    if text is None:  # a newline in a pin: a Dockerfile line of its own
        text = dumps(
            {
                "sections": {
                    "verl": {
                        k: dict(v, pins={"x": "1\nRUN echo pwned"})
                        for k, v in doc["sections"]["verl"].items()
                    }
                }
            }
        )
    if whole:
        try:
            part = json.loads(text)
        except ValueError:
            part = None
        if isinstance(part, dict) and isinstance(part.get("sections"), dict):
            text = dumps(dict(doc, sections=dict(doc["sections"], **part["sections"])))
    home = fresh(work) / "cache"
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(home)
    try:
        M.load()  # (writes the cache folder and file the way envbuild does)
        cache = M._cache_path(M.matrix_files())
    finally:
        os.environ["XDG_CACHE_HOME"] = saved
    cache.write_text(text, errors="surrogatepass")
    code, err = envbuild("render", "p40", "-o", home.parent / "out", env={"XDG_CACHE_HOME": str(home)})
    if code == 0:
        assert "pwned" not in (home.parent / "out" / "p40" / "Dockerfile").read_text()
    else:
        assert code == 2 and "Unknown profile 'p40'" in err, err


# ---- the record of an output folder: render -o DIR ---------------------------------------------

RECORD = {"format": 1, "files": {"Dockerfile": "0" * 64, "README.md": "1" * 64}}


@settings(max_examples=30, **SETTINGS)
@given(text=json_texts(RECORD))
@example(text=dumps(dict(RECORD, x=DEEP_5000)))
def test_a_record_in_the_output_folder_is_used_or_ignored(work, text):
    folder = fresh(work)
    out = folder / "out"
    envbuild("render", "p40", "-o", out)
    record = out / "p40" / ".envbuild-files.json"
    assert json.loads(record.read_text())["format"] == RECORD["format"]
    record.write_text(text, errors="surrogatepass")
    envbuild("render", "p40", "-o", out)


# ---- issue 33: the new inputs (a model's config.json, lock pins, launcher flags) ----------------

QWEN3 = json.loads(
    (Path(__file__).resolve().parent / "fixtures" / "hf" / "Qwen" / "Qwen3-8B" / "config.json").read_text()
)


@settings(max_examples=150, **SETTINGS)
@given(text=json_texts(QWEN3))
@example(text=json.dumps(dict(QWEN3, model_type=["qwen3"])))
@example(text=json.dumps(dict(QWEN3, model_type={"a": 1})))
@example(text=json.dumps(dict(QWEN3, num_hidden_layers="36")))
def test_a_models_config_json_sizes_the_plan_or_is_refused(work, text):
    """A hub's or a folder's config.json (--model): every malformed one is refused (exit 2),
    never an internal error (a list as model_type was one)."""
    from envbuilder.model.architectures import _parse, arch_from_config

    only_bad_data(
        lambda: arch_from_config(
            _parse(text.encode("utf-8", "surrogatepass"), "config.json"), "config.json", "m"
        )
    )
    folder = fresh(work) / "model"
    folder.mkdir()
    (folder / "config.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    code, err = envbuild("show", "h100", "--memory", "--model", folder)
    assert code in (0, 2), err


pin_versions = st.one_of(
    st.text(min_size=1, max_size=30),
    st.text(alphabet="0123456789.+!-_abcrcpostdev;$()`'\"\\ \t", min_size=1, max_size=20),
)


@settings(max_examples=200, **SETTINGS)
@given(version=pin_versions, name=st.sampled_from(["idna", "Flash_Attn", "a.b-c"]))
def test_a_lock_pin_is_a_plain_version_or_refused(version, name):
    """requirements.lock's pins: a version is one token of PEP 440's characters or the lock is
    refused (UserError); what is parsed never holds a character a pip file or shell would read."""
    import re

    from envbuilder.lock.pins import PIN_VERSION, parse

    text = f"{name}=={version} \\\n    --hash=sha256:{'a' * 64}\n    # via -r requirements.in\n"
    try:
        got = parse(text)
    except Exception as e:  # noqa: BLE001 - (only the user's one paragraph is allowed)
        from envbuilder.errors import UserError

        assert isinstance(e, UserError), repr(e)
        return
    for entry in got.values():
        assert PIN_VERSION.fullmatch(entry.version), entry.version
        assert not re.search(r"[\s;$`'\"\\()]", entry.version)


@settings(max_examples=300, **SETTINGS)
@given(value=st.one_of(st.text(max_size=70), st.from_regex(r"[a-z0-9:.\-\[\]]{1,40}", fullmatch=True)))
def test_launcher_flags_are_safe_words_or_refused(value):
    """--head-ip, --job-name (Slurm and Kubernetes), --data-pvc and a profile as a label value:
    each returns a value with no character a shell, an #SBATCH line or YAML would read, or
    refuses it (UserError)."""
    import re

    from envbuilder.engines import launch as L
    from envbuilder.errors import UserError

    for check in (
        L.head_address,
        lambda v: L.job_name(v, "p"),
        lambda v: L.job_name(v, "p", kubernetes=True),
        L.claim_name,
        L.label_value,
    ):
        try:
            got = check(value)
        except UserError:
            continue
        assert got and not re.search(r"[\s;$`'\"\\()<>|&*?{}#!~]", got), (value, got)


# ---- the image scripts' sidecar (issue 43, items 13, 21, 26) ------------------------------------


@functools.lru_cache(maxsize=None)
def p40_sidecar() -> dict:
    from envbuilder.images import SIDECAR
    from envbuilder.render.files import render_files

    return json.loads(render_files(BuildContext.of(resolved("p40")))[SIDECAR])


def _script(folder: Path, name: str) -> dict:
    """The image script `name`, copied into `folder` (the sidecar beside it is the test's),
    loaded as a module: its globals, main() not run."""
    import runpy

    from envbuilder.images import HERE

    shutil.copyfile(HERE / name, folder / name)
    return runpy.run_path(str(folder / name), run_name="envbuild_sidecar_test")


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def _sidecar_texts() -> st.SearchStrategy[str]:
    return st.deferred(lambda: json_texts(p40_sidecar()))


@settings(max_examples=60, **SETTINGS)
@given(text=_sidecar_texts(), raw=st.binary(max_size=80))
@example(text=dumps(dict(p40_sidecar(), preflight=DEEP_5000)), raw=b"")
@example(text="", raw=b"\xff\xfe{")
def test_each_image_script_reads_its_sidecar_or_refuses_it(work, capsys, text, raw):
    """Any sidecar, as any bytes or any JSON shape: each script's reader returns its part,
    every value what it should be, or None with what is wrong (the script's exit 2)."""
    from envbuilder.images import SCRIPTS, SIDECAR

    folder = fresh(work)
    for blob in (text.encode("utf-8", "surrogatepass"), raw):
        (folder / SIDECAR).write_bytes(blob)
        for name, key in SCRIPTS.items():
            g = _script(folder, name)
            part = g["load_data"](key, g["SHAPE"])
            err = capsys.readouterr().err
            if part is None:
                assert "render the profile again" in err and "Traceback" not in err
            else:
                assert g["shape_problem"](part, g["SHAPE"], key) is None and err == ""


@st.composite
def _patches_sidecar(draw) -> str:
    """The p40's apply_patches part, mutated, with paths that lead out of verl now and then."""
    doc = {"apply_patches": p40_sidecar()["apply_patches"]}
    doc = copy.deepcopy(draw(st.one_of(st.just(doc), mutated(doc), raw_into(doc))))  # (no shared state)
    part = doc.get("apply_patches") if isinstance(doc, dict) else None
    patches = part.get("patches") if isinstance(part, dict) else None
    if isinstance(patches, list) and patches and isinstance(patches[0], dict) and draw(st.booleans()):
        patches[0]["files"] = [
            draw(st.sampled_from(["../victim.py", "{victim}", "verl/../../victim.py", "verl/utils/model.py"]))
        ]
    return dumps(doc)


@settings(max_examples=60, **SETTINGS)
@given(text=_patches_sidecar())
@example(text=dumps({"apply_patches": dict(p40_sidecar()["apply_patches"], patches=[])}))
def test_apply_patches_patches_inside_verl_or_refuses(work, capsys, text):
    """apply_patches.py's main on any sidecar: exit 0, 1 or 2, no exception, and nothing written
    outside the verl it patches (a victim file beside the site keeps its bytes)."""
    from envbuilder.images import SIDECAR

    folder = fresh(work)
    site = folder / "site"
    shutil.copytree(Path(__file__).parent / "fixtures" / "verl-0.4.1", site)
    victim = folder / "victim.py"
    victim.write_text('attn_implementation="flash_attention_2"\n')
    (folder / SIDECAR).write_text(text.replace("{victim}", str(victim)), errors="surrogatepass")
    g = _script(folder, "apply_patches.py")
    outside = {p: b for p, b in _files(folder).items() if site not in p.parents}
    code = g["main"](["--site", str(site)])
    err = capsys.readouterr().err
    assert code in (0, 1, 2) and "Traceback" not in err
    assert {p: b for p, b in _files(folder).items() if site not in p.parents} == outside
    changed = [
        p
        for p, b in _files(site).items()
        if b != (Path(__file__).parent / "fixtures" / "verl-0.4.1" / p.relative_to(site)).read_bytes()
    ]
    assert all(p.relative_to(site).parts[0] == "verl" for p in changed)
    if code != 0:
        assert not changed  # (a refusal writes nothing)
