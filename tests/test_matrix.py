"""The compatibility matrix: shipped data loads, bad data is named by file and key, and a user's
--matrix-dir overlay adds or overrides records without forking."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import frozen, frozen_with, record, resolved, shipped
from envbuilder.model import matrix as M
from envbuilder.errors import UserError

URL = "https://example.org/my-lab-notes"  # an overlay fact's source may be a URL


def load_error(folder) -> str:
    with pytest.raises(UserError) as e:
        M.load((folder,))
    return str(e.value)


@pytest.mark.parametrize("path", M.matrix_files(), ids=lambda p: p.name)
def test_every_shipped_matrix_file_loads(path, tmp_path):
    # Each file validates on its own (read again as an overlay) and changes nothing when re-read.
    shutil.copy(path, tmp_path / path.name)
    assert M.load((tmp_path,)).sections == shipped().sections


def test_shipped_matrix_has_the_seed_profiles_and_the_current_stacks():
    assert {"p40", "4090", "t4", "v100", "3090", "a100", "h100"} <= set(shipped().profiles)


def test_malformed_yaml_in_an_overlay_names_the_file_and_the_line(overlay):
    folder = overlay(text='profiles:\n  mine:\n    gpu: p40\n   cuda: "11.8"\n')
    msg = load_error(folder)
    assert str(overlay.file) in msg
    assert "line 4" in msg
    assert "malformed YAML" in msg


def test_an_unquoted_compute_capability_names_file_and_key_and_says_to_quote_it(overlay):
    folder = overlay({"gpus": {"p41": record("gpus", "p40", compute_capability=6.1, source=URL)}})
    msg = load_error(folder)
    assert str(overlay.file) in msg
    assert "gpus.p41.compute_capability" in msg
    assert "quote it" in msg


def test_an_unknown_key_suggests_the_close_name(overlay):
    gpu = record("gpus", "p40", source=URL)
    gpu["compute_capabilty"] = gpu.pop("compute_capability")
    msg = load_error(overlay({"gpus": {"p41": gpu}}))
    assert "gpus.p41.compute_capabilty" in msg
    assert "did you mean 'compute_capability'" in msg


def test_an_unknown_section_suggests_the_close_name(overlay):
    msg = load_error(overlay({"profile": {"mine": record("profiles", "p40", source=URL)}}))
    assert "unknown section 'profile'" in msg
    assert "Did you mean 'profiles'" in msg


def test_a_profile_naming_an_unknown_gpu_is_rejected_with_a_suggestion(overlay):
    folder = overlay({"profiles": {"mine": record("profiles", "p40", gpu="p41", source=URL)}})
    msg = load_error(folder)
    assert "profiles.mine.gpu is 'p41', which gpus does not define" in msg
    assert "Did you mean 'p40'" in msg
    assert str(overlay.file) in msg


def test_a_source_naming_an_unknown_sources_key_is_rejected(overlay):
    folder = overlay({"profiles": {"mine": record("profiles", "p40", source="my_notes")}})
    msg = load_error(folder)
    assert str(overlay.file) in msg
    assert "profiles.mine.source" in msg
    assert "'my_notes' is neither a URL nor a key of this file's `sources:`" in msg


def test_a_source_key_defined_in_the_same_file_is_accepted(overlay):
    folder = overlay(
        {
            "sources": {"my_notes": "lab wiki, page GPU-7"},
            "profiles": {"mine": record("profiles", "p40", source="my_notes")},
        }
    )
    assert "mine" in M.load((folder,)).profiles


def test_an_overlay_adds_a_profile(overlay):
    train = dict(record("profiles", "p40")["train"], n_gpus=2)
    folder = overlay({"profiles": {"p40x2": record("profiles", "p40", train=train, source=URL)}})
    m = M.load((folder,))
    assert m.where("profiles", "p40x2") == str(overlay.file)
    assert resolved("p40x2", m).to_dict()["train"]["n_gpus"] == 2
    assert set(shipped().profiles) < set(m.profiles)


def test_an_overlay_overrides_a_shipped_profile(overlay):
    train = dict(record("profiles", "p40")["train"], max_response_length=512)
    folder = overlay(
        {"profiles": {"p40": record("profiles", "p40", description="our P40 box", train=train, source=URL)}}
    )
    env = resolved("p40", M.load((folder,))).to_dict()
    assert env["description"] == "our P40 box"
    assert env["train"]["max_response_length"] == 512


def test_a_gpu_whose_bf16_contradicts_the_feature_floor_is_rejected(overlay):
    msg = load_error(overlay({"gpus": {"p40": record("gpus", "p40", bf16=True, source=URL)}}))
    assert "gpus.p40.bf16 is True" in msg
    assert "bf16 floor 8.0" in msg


def test_a_matrix_dir_that_is_not_a_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="is not a directory"):
        M.load((tmp_path / "missing",))


def test_a_version_range_that_cannot_be_read_is_rejected_at_load(overlay):
    folder = overlay(
        {"verl": {"0.4.1": record("verl", "0.4.1", vllm="garbage", source="https://example.org")}}
    )
    with pytest.raises(UserError) as e:
        M.load((folder,))
    assert "verl.0.4.1.vllm" in str(e.value) and "not a version range" in str(e.value)


def test_an_unknown_component_in_a_profile_is_rejected(overlay):
    folder = overlay(
        {
            "profiles": {
                "lab": record(
                    "profiles", "p40", components={"flash_attn": "2.8.3"}, source="https://example.org"
                )
            }
        }
    )
    with pytest.raises(UserError) as e:
        M.load((folder,))
    assert "profiles.lab.components.flash_attn" in str(e.value) and "flash-attn" in str(e.value)


def test_a_pre_release_in_an_overlay_loads_sorts_and_resolves(overlay):
    """The schema's version grammar is the one versions.version_key orders: a 2.9.0rc1-style key
    neither passes the schema and then breaks the resolver (a traceback) nor gets refused."""
    from envbuilder.model.versions import in_range, version_key

    latest = max(frozen().verl, key=version_key)
    folder = overlay({"verl": {"9.0.0rc1": record("verl", latest, source=URL)}})
    m = frozen_with(folder)
    assert max(m.verl, key=version_key) == "9.0.0rc1"
    env = resolved("h200", m, verl="9.0.0rc1").to_dict()
    assert env["verl"]["version"] == "9.0.0rc1"
    assert sorted(["9.0.0", "9.0.0rc1", "9.0.0b1", "9.0.0.dev3", "9.0.0.post1", "8.9"], key=version_key) == [
        "8.9",
        "9.0.0.dev3",
        "9.0.0b1",
        "9.0.0rc1",
        "9.0.0",
        "9.0.0.post1",
    ]
    # pip's rules (tests/test_versions.py): <V takes no pre-release of V, >V no post-release
    assert in_range("9.0.0rc1", ">=8.9,<9.0.0rc2") and not in_range("9.0.0rc1", ">=8.9,<9.0.0")
    assert not in_range("0.8.5.post1", ">0.8.5")


def test_a_prefix_clause_matches_a_whole_series_as_pip_does():
    """vLLM 0.19.1 asks transformers!=5.0.*,...,!=5.5.0 (PEP 440 prefix matches): 5.10 is not
    in the 5.1 series, and a `!=` series never empties a range (5.9.0 fits, 5.0.3 does not)."""
    from envbuilder.model.versions import in_range, ranges_overlap

    spec = ">=4.56.0,!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0"
    fits = [
        v for v in ("4.55.0", "4.57.6", "5.0.3", "5.4.9", "5.5.0", "5.5.1", "5.10.0") if in_range(v, spec)
    ]
    assert fits == ["4.57.6", "5.5.1", "5.10.0"]
    assert in_range("5.1.3", "==5.1.*") and not in_range("5.10.1", "==5.1.*")
    assert ranges_overlap(spec, "==5.9.0") and not ranges_overlap("==5.0.*", ">=5.1")
    with pytest.raises(ValueError, match="not a version range"):
        in_range("5.0.0", ">=5.*")


def test_a_version_the_resolver_could_not_order_is_rejected_at_load(overlay):
    latest = max(frozen().verl)
    msg = load_error(overlay({"verl": {"0.7.0foo1": record("verl", latest, source=URL)}}))
    assert "0.7.0foo1" in msg and "Traceback" not in msg


def test_the_suite_keeps_its_caches_out_of_the_home_directory():
    """conftest points XDG_CACHE_HOME at a folder of this run before the matrix is first loaded."""
    import os
    from pathlib import Path

    cache = M._cache_path(M.matrix_files())
    assert cache is not None and cache.suffix == ".json"
    assert Path(os.environ["XDG_CACHE_HOME"]) in cache.parents
    assert Path.home() / ".cache" not in cache.parents


def test_the_matrix_cache_is_plain_json_keyed_on_content(tmp_path, monkeypatch):
    """An edit that keeps a file's size and time still misses the cache; a cache file that is
    not what envbuild writes is ignored, never executed."""
    import json
    import os

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ENVBUILD_NO_CACHE", raising=False)
    folder = tmp_path / "overlay"
    folder.mkdir()
    lab = folder / "lab.yaml"
    lab.write_text("sources:\n  a: https://example.org/a\n")
    first = M.load((folder,))
    cache = M._cache_path(M.matrix_files((folder,)))
    # (sealed: its first line is the seal, paths.SEAL; the rest plain JSON)
    assert cache.is_file() and json.loads(cache.read_text().split("\n", 1)[1])["sections"] == first.sections
    assert M.load((folder,)).sections == first.sections  # read back from the cache
    st = lab.stat()
    lab.write_text("sources:\n  b: https://example.org/a\n")  # same size
    os.utime(lab, ns=(st.st_atime_ns, st.st_mtime_ns))  # same time
    assert M._cache_path(M.matrix_files((folder,))) != cache
    cache2 = M._cache_path(M.matrix_files((folder,)))
    cache2.parent.mkdir(parents=True, exist_ok=True)
    cache2.write_bytes(b"\x80\x04garbage")  # e.g. a pickle: ignored, validated afresh
    assert M.load((folder,)).sections == first.sections


@pytest.mark.parametrize(
    "doc, where, says",
    [
        (
            {"profiles": {"lab": record("profiles", "p40", source=URL, description="p40\nRUN x")}},
            "profiles.lab.description",
            "U+000A",
        ),
        ({"profiles": {"../lab": record("profiles", "p40", source=URL)}}, "profiles.../lab", "no '..'"),
        ({"gpus": {"p40": record("gpus", "p40", source=URL, name='P40"""')}}, "gpus.p40.name", "a GPU name"),
        (
            {"profiles": {"p40": record("profiles", "p40", source=URL, pins={"numpy; rm -rf ~": "1"})}},
            "profiles.p40.pins.numpy; rm -rf ~",
            "a package name",
        ),
        (
            {"defaults": dict(shipped().defaults, huggingface="https://hf.example/$(id)")},
            "defaults.huggingface",
            "an http(s) URL",
        ),
        (
            {"index_url": "https://download.pytorch.org/whl/{cuda}"},
            "index_url",
            "{cuda} in 'https://download.pytorch.org/whl/{cuda}' is not a field envbuild fills in",
        ),
        (
            {
                "profiles": {
                    "p40": record(
                        "profiles",
                        "p40",
                        source=URL,
                        train=dict(record("profiles", "p40")["train"], model="Qwen/`id`"),
                    )
                }
            },
            "profiles.p40.train.model",
            "a Hugging Face repo id",
        ),
    ],
    ids=[
        "newline in text",
        "name as a path",
        "quotes in a gpu name",
        "shell in a pin",
        "$() in a URL",
        "unknown placeholder",
        "backticks in a model id",
    ],
)
def test_a_value_that_is_not_what_its_field_is_names_file_and_key(overlay, doc, where, says):
    """Every string has a kind (a name, a URL, a package, one line of text): a value of another
    is refused at load, naming the file and the key, before anything is rendered from it."""
    msg = load_error(overlay(doc))
    assert f"{overlay.file.name}: {where}" in msg and says in msg, msg


def test_a_value_is_echoed_in_an_error_cut_to_its_start(overlay):
    msg = load_error(
        overlay({"profiles": {"lab": record("profiles", "p40", source=URL, description="x" * 100_000)}})
    )
    assert "(100002 characters)" in msg and len(msg) < 400, msg


def test_every_string_of_the_schema_has_a_kind():
    """No field is a bare `str`: each says what it is (schema.py), so nothing enters unchecked."""
    from envbuilder.model import schema as S
    from envbuilder.model.matrix_schema import SECTIONS
    from envbuilder.model.resolved import field_spec

    def walk(spec, where):
        assert spec is not str, f"{where} is a bare str: give it a kind (schema.py)"
        if isinstance(spec, dict):
            for key, sub in spec.items():
                walk(sub, f"{where}.{key}")
        elif isinstance(spec, (S.ListOf, S.Tree)):
            walk(getattr(spec, "item", None) or spec.leaf, f"{where}[]")
        elif isinstance(spec, S.MapOf):
            assert spec.key is not None, f"{where}: its keys need a kind"
            walk(spec.value, f"{where}.*")
        elif isinstance(spec, tuple):
            walk(spec[0], where)

    for section, (spec, _) in SECTIONS.items():
        walk(spec, section)
    walk(field_spec(), "envbuild.json")


def test_every_section_of_the_schema_is_a_typed_attribute_of_the_matrix():
    """matrix_schema.SECTIONS and the typed attributes of Matrix name the same sections (a new
    section gets its type there, or callers and mypy cannot follow it)."""
    from envbuilder.model.matrix import Matrix, _Section
    from envbuilder.model.matrix_schema import SECTIONS

    typed = {name for name, v in vars(Matrix).items() if isinstance(v, _Section)}
    assert typed == set(SECTIONS)
    m = shipped()
    assert m.gpus is m.sections["gpus"] and m.index_url == m.sections["index_url"]
    with pytest.raises(AttributeError, match="stacks"):
        _ = type(m)({}).stacks


# -- format specs in overlay patches ------------------------------------------------------------

URL = "https://example.org/lab"
BAD_TEMPLATES = [
    "{attention:>3000000}",
    "{attention:d}",
    "{attention!z}",
    "{attention!r}",
    "{attention.upper}",
    "{attention[0]}",
    "{}",
    "{0}",
    "{attention:{attention}}",
    "{attention",
    "attention}",
    "{ attention}",
    "{nope}",
]


def _render(cli, folder, tmp_path, profile="p40"):
    return cli("render", profile, "--matrix-dir", folder, "-o", tmp_path / "out")


@pytest.mark.parametrize("template", BAD_TEMPLATES)
def test_a_patch_template_takes_name_placeholders_only(cli, overlay, tmp_path, template):
    patch = record("patches", "verl-hardcoded-fa2", source=URL)
    patch["replace"] = [
        {"find": 'attn_implementation="flash_attention_2"', "with": f'attn_implementation="{template}"'}
    ]
    folder = overlay({"patches": {"verl-hardcoded-fa2": patch}})
    code, out, err = _render(cli, folder, tmp_path)
    assert code == 2, err
    assert "lab.yaml" in err and "patches.verl-hardcoded-fa2.replace[0].with" in err
    assert "{attention}" in err and "Traceback" not in err and len(err) < 2000
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("template", ["{attention:>3000000}", "{attention!s}", "{attention:d}"])
def test_a_reviewed_holds_value_takes_name_placeholders_only(cli, overlay, tmp_path, template):
    name = next(
        k
        for k, r in shipped().reviewed.items()
        if any(isinstance(v, str) and "{attention}" in v for v in r["holds"].values())
    )
    rv = record("reviewed", name, source=URL)
    rv["holds"] = {k: template for k in rv["holds"]}
    folder = overlay({"reviewed": {name: rv}})
    code, out, err = _render(cli, folder, tmp_path, "t4")
    assert code == 2, err
    assert "lab.yaml" in err and f"reviewed.{name}.holds." in err and "Traceback" not in err


def test_placeholders_and_doubled_braces_still_fill_as_before(cli, overlay, tmp_path):
    patch = record("patches", "verl-hardcoded-fa2", source=URL)
    patch["replace"] = [
        {
            "find": 'attn_implementation="flash_attention_2"',
            "with": 'attn_implementation="{attention}"  # {{literal}} {actor_dtype}',
        }
    ]
    folder = overlay({"patches": {"verl-hardcoded-fa2": patch}})
    code, out, err = _render(cli, folder, tmp_path)
    assert code == 0, err
    spec = json.loads((tmp_path / "out" / "p40" / "envbuild.json").read_text())
    [p] = [p for p in spec["patches"] if p["name"] == "verl-hardcoded-fa2"]
    assert p["replace"][0]["with"] == 'attn_implementation="eager"  # {literal} float32'
