"""Load the compatibility matrix (matrices/*.yaml plus user overlays) and validate it.

Every file may hold any of the sections below; an overlay directory's files are read after the
shipped ones: a record under a key the matrix has is replaced whole (each file is validated on its
own, so it must be complete), a section not keyed by name is replaced whole, so users add or
override profiles without forking.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from envbuilder.errors import UserError
from envbuilder.paths import SEAL, cache_file, data_dir, read_cache, read_sealed, write_sealed
from envbuilder.model import entries as E
from envbuilder.model.versions import in_range, version_key  # noqa: F401  (re-exported)


# A record of the matrix as its YAML holds it, validated (matrix_schema.SECTIONS says what each
# holds): plain dicts, lists and scalars.
Entry = dict[str, Any]
T = TypeVar("T")


class _Sections:
    """Something that holds the matrix's sections by name (Matrix, Typed)."""

    sections: dict[str, Any]


class _Section(Generic[T]):
    """A section of the matrix as a typed attribute (`m.gpus`), read from `sections`;
    an absent section is an AttributeError, as a missing attribute is."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, m: _Sections, owner: type | None = None) -> T:
        try:
            return m.sections[self.name]  # type: ignore[no-any-return]
        except KeyError:
            raise AttributeError(self.name) from None


class Typed(_Sections):
    """The matrix's sections, each record typed field by field as matrix_schema checked it
    (entries.py): the very dicts of `Matrix.sections`, seen through TypedDicts (no copy, no
    code at run time). `Matrix.typed` is the matrix's; the resolver and the components read it
    (Matrix's own attributes, records typed `Entry`, are the rest of envbuild's until it reads
    these too)."""

    # records by key
    gpus: _Section[dict[str, E.GpuEntry]] = _Section()
    cuda: _Section[dict[str, E.CudaEntry]] = _Section()
    torch: _Section[dict[str, E.TorchEntry]] = _Section()
    vllm: _Section[dict[str, E.VllmEntry]] = _Section()
    sglang: _Section[dict[str, E.SglangEntry]] = _Section()
    features: _Section[dict[str, E.FeatureEntry]] = _Section()
    verl: _Section[dict[str, E.VerlEntry]] = _Section()
    algorithms: _Section[dict[str, E.AlgorithmEntry]] = _Section()
    interconnects: _Section[dict[str, E.InterconnectEntry]] = _Section()
    patches: _Section[dict[str, E.PatchEntry]] = _Section()
    reviewed: _Section[dict[str, E.ReviewedEntry]] = _Section()
    profiles: _Section[dict[str, E.ProfileEntry]] = _Section()
    stacks: _Section[dict[str, E.StackEntry]] = _Section()
    mirrors: _Section[dict[str, E.MirrorEntry]] = _Section()
    datasets: _Section[dict[str, E.DatasetEntry]] = _Section()
    models: _Section[dict[str, E.ModelEntry]] = _Section()
    arch_lists: _Section[dict[str, list[str]]] = _Section()
    requires: _Section[dict[str, dict[str, E.Needs]]] = _Section()
    # one record or value each: None where no matrix file has the section (the resolver takes
    # `vllm_training_path`, `cuda_compat` and `index_url` as there, as the shipped files have them)
    pypi_names: _Section[dict[str, E.PypiName] | None] = _Section()
    vllm_training_path: _Section[E.TrainingPath] = _Section()
    sglang_training_path: _Section[E.TrainingPath | None] = _Section()
    cuda_compat: _Section[E.CudaCompat] = _Section()
    flash_attn: _Section[E.FlashAttnSection | None] = _Section()
    apex: _Section[E.ApexSection | None] = _Section()
    cuda_alloc_conf: _Section[E.AllocConfSection | None] = _Section()
    memory: _Section[E.MemorySection | None] = _Section()
    defaults: _Section[E.DefaultsSection | None] = _Section()
    index_url: _Section[str] = _Section()
    min_compute_capability: _Section[str | None] = _Section()
    min_compute_capability_source: _Section[str | None] = _Section()

    def __init__(self, sections: dict[str, Any]):
        self.sections = sections


class Matrix(_Sections):
    """The merged, validated matrix: `sections` (section -> its body, as matrix_schema.SECTIONS
    checked it), each also a typed attribute; `origin`, (section, key) -> the file it came
    from. A section with no attribute here fails tests/test_matrix.py."""

    # records by key (a GPU, a CUDA major.minor, a torch or vLLM version, a profile, ...)
    gpus: _Section[dict[str, Entry]] = _Section()
    cuda: _Section[dict[str, Entry]] = _Section()
    torch: _Section[dict[str, Entry]] = _Section()
    vllm: _Section[dict[str, Entry]] = _Section()
    sglang: _Section[dict[str, Entry]] = _Section()
    features: _Section[dict[str, Entry]] = _Section()
    verl: _Section[dict[str, Entry]] = _Section()
    algorithms: _Section[dict[str, Entry]] = _Section()
    interconnects: _Section[dict[str, Entry]] = _Section()
    patches: _Section[dict[str, Entry]] = _Section()
    reviewed: _Section[dict[str, Entry]] = _Section()
    profiles: _Section[dict[str, Entry]] = _Section()
    stacks: _Section[dict[str, Entry]] = _Section()
    mirrors: _Section[dict[str, Entry]] = _Section()
    datasets: _Section[dict[str, Entry]] = _Section()
    models: _Section[dict[str, Entry]] = _Section()
    arch_lists: _Section[dict[str, list[str]]] = _Section()  # name -> compute capabilities
    requires: _Section[dict[str, dict[str, Entry]]] = _Section()  # package -> version -> needs
    pypi_names: _Section[dict[str, Entry]] = _Section()  # a PyPI name of another project -> what it is
    sources: _Section[dict[str, str]] = _Section()  # key -> URL
    # one record each
    vllm_training_path: _Section[Entry] = _Section()
    sglang_training_path: _Section[Entry] = _Section()
    cuda_compat: _Section[Entry] = _Section()
    flash_attn: _Section[Entry] = _Section()
    apex: _Section[Entry] = _Section()
    cuda_alloc_conf: _Section[Entry] = _Section()
    memory: _Section[Entry] = _Section()
    defaults: _Section[Entry] = _Section()
    # one value each
    index_url: _Section[str] = _Section()
    min_compute_capability: _Section[str] = _Section()
    min_compute_capability_source: _Section[str] = _Section()

    def __init__(self, sections: dict[str, Any], origin: dict[tuple[str, str], str] | None = None):
        self.sections = sections
        self.origin = origin or {}  # (section, key) -> the file it came from
        self.typed = Typed(sections)  # (the same sections, each record typed: the resolver's view)

    def where(self, section: str, key: str) -> str:
        where = self.origin.get((section, key))
        return _display(Path(where)) if where else f"matrices ({section})"


def _read(path: Path) -> dict[str, Any]:
    from envbuilder.limits import load_yaml, read_text_bounded  # (only when validating afresh)

    doc = load_yaml(read_text_bounded(path, "matrix file"), str(path))
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UserError(
            f"{path}: a matrix file must be a mapping of sections "
            f"(gpus, cuda, torch, profiles, ...), not {type(doc).__name__}."
        )
    return doc


SOURCE_KEYS = (
    "source",
    "min_compute_capability_source",
    "torch_source",
    "p2p_source",
    "pypi_sdist_only_source",
)


def _check_sources(doc: dict[str, Any], name: str) -> None:
    from envbuilder.model import schema as S

    known = doc.get("sources", {})

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in SOURCE_KEYS and isinstance(v, str):
                    for token in (t.strip() for t in v.split(",")):
                        if token not in known and "://" not in token:
                            raise S.SchemaError(
                                f"{where}.{k}",
                                f"source {token!r} is neither a URL nor a key of this file's `sources:`",
                            )
                else:
                    walk(v, f"{where}.{k}")

    for section, body in doc.items():
        if section != "sources":
            walk(body, f"{name}: {section}")


def _validate_file(path: Path, doc: dict[str, Any]) -> None:
    from envbuilder.model import schema as S
    from envbuilder.model.matrix_schema import SECTIONS

    name = _display(path)
    for section, body in doc.items():
        if section not in SECTIONS:
            import difflib

            close = difflib.get_close_matches(str(section), list(SECTIONS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UserError(
                f"{name}: unknown section {section!r}.{hint} Known sections: {', '.join(SECTIONS)}."
            )
        try:
            S.check(body, SECTIONS[section][0], f"{name}: {section}")
        except S.SchemaError as e:
            raise UserError(f"{e}. Fix this key in the matrix file and run again.") from None
    try:
        _check_sources(doc, name)
    except S.SchemaError as e:
        raise UserError(f"{e}. Every fact names where it comes from.") from None


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def matrix_files(overlays: tuple[Path, ...] = (), base: Path | None = None) -> list[Path]:
    """The shipped matrix files (or those of `base`, a folder of the same sections: the tests'
    frozen fixture matrix), then each overlay folder's."""
    files = sorted(Path(base).glob("*.yaml") if base is not None else data_dir("matrices").glob("*.yaml"))
    for d in overlays:
        d = Path(d)
        if not d.is_dir():
            raise UserError(
                f"Matrix overlay {d} is not a directory. Pass --matrix-dir a folder "
                "of *.yaml files (same sections as the shipped matrices)."
            )
        files += sorted(d.glob("*.yaml"))
    return files


# What the validated matrix depends on besides the files: the code that validates it.
# the code that validates a matrix (its cache is keyed by this code too): this package's,
# the bounded reader among it
_VALIDATORS = ("matrix.py", "matrix_schema.py", "schema.py", "versions.py", "readers.py")


def _cache_path(files: list[Path]) -> Path | None:
    """Where the validated matrix of exactly these files' contents is kept: the key hashes
    every file's bytes and the validating code's, so an edit anywhere (a matrix file, the
    schema, a cross-check) misses the cache, whatever the file times say."""
    import hashlib

    from envbuilder import __version__

    h = hashlib.sha256(__version__.encode())
    from envbuilder.limits import MAX_INPUT_BYTES, read_limited

    try:
        for f in [*files, *(Path(__file__).parent / name for name in _VALIDATORS)]:
            # (a device, a pipe or a huge file: no cache; reading it afresh says what is wrong)
            data = read_limited(f, MAX_INPUT_BYTES)
            h.update(f"{f.resolve()}\0{len(data)}\0".encode())
            h.update(data)
    except (OSError, ValueError):
        return None
    return cache_file(f"matrix-{h.hexdigest()[:32]}.json")


def load(overlays: tuple[Path, ...] = (), base: Path | None = None) -> Matrix:
    """The merged, validated matrix; a JSON cache keyed by the inputs' contents skips reading
    and merging the YAML files (half of loading), never the validation: what the cache holds is
    checked as a fresh load checks it (_from_cache), and it is read only from this user's
    private cache folder (paths.read_cache). Plain data only: reading it runs nothing.
    `base`: another folder in place of the shipped matrices (the tests' frozen matrix)."""

    files = matrix_files(overlays, base)
    cache = _cache_path(files) if not os.environ.get("ENVBUILD_NO_CACHE") else None
    sealed = read_sealed(cache)  # (what this envbuild validated and sealed with the user's key)
    if sealed is not None:
        m = _from_sealed(sealed)
        if m is not None:
            return m
    text = None if sealed is not None else read_cache(cache)
    if text is not None and not text.startswith(SEAL):
        m = _from_cache(text, str(cache))  # (an unsealed cache: validated as a fresh load is)
        if m is not None:
            write_sealed(cache, text)
            return m  # else: not what this code writes; validate afresh (and replace it)
    m = load_files(files)
    write_sealed(
        cache,
        json.dumps(
            {"sections": m.sections, "origin": [[sec, key, where] for (sec, key), where in m.origin.items()]}
        ),
    )
    return m


def _from_sealed(body: str) -> Matrix | None:
    """The matrix a sealed cache holds: this envbuild validated it (a fresh load, or
    _from_cache) before sealing it, and the seal proves it is unchanged since; only its JSON
    is read."""
    try:
        doc = json.loads(body)
        sections: dict[str, object] = doc["sections"]
        came_from: list[list[str]] = doc["origin"]  # [section, key, file]
        return Matrix(sections, {(sec, key): w for sec, key, w in came_from})
    except (ValueError, KeyError, TypeError):
        return None


def _from_cache(text: str, origin: str) -> Matrix | None:
    """The matrix a cache file holds, validated as a fresh load validates it (readers.py's
    bounds, every section's schema, the cross-checks between them): a file that fails any of
    it, whoever wrote it, is None and the matrix is read afresh. Only the `sources:` keys each
    fact names are not checked again (the cache keeps no `sources:`; they are provenance, and
    the fresh load that wrote the cache checked them)."""
    from envbuilder.model import schema as S
    from envbuilder.model.matrix_schema import SECTIONS
    from envbuilder.model.readers import parse_json

    where = S.Text(4096)
    shape = {"sections": S.MapOf(Any), "origin": S.ListOf(S.ListOf(where, min_len=3))}
    try:
        doc = parse_json(text, origin, shape=shape)
        sections: dict[str, object] = doc["sections"]
        came_from: list[list[str]] = doc["origin"]  # [section, key, file]
        if set(sections) != set(SECTIONS) or any(len(o) != 3 for o in came_from):
            return None
        for name, (spec, merged) in SECTIONS.items():
            body = sections[name]
            if body is None and not merged:
                continue  # (a section none of the files has)
            S.check(body, spec, f"{origin}: {name}")
        m = Matrix(sections, {(sec, key): w for sec, key, w in came_from})
        _cross_check(m)
        return m
    except (UserError, S.SchemaError):
        return None


def load_files(files: list[Path]) -> Matrix:
    """The matrix these files make, read and validated afresh (no cache read or written)."""
    from envbuilder.model.matrix_schema import SECTIONS

    sections: dict[str, Any] = {}
    origin: dict[tuple[str, str], str] = {}
    for path in files:
        doc = _read(path)
        _validate_file(path, doc)
        for section, body in doc.items():
            if section == "sources":
                continue
            merge_by_key = SECTIONS[section][1]
            if merge_by_key:
                sections.setdefault(section, {}).update(body)
                for key in body:
                    origin[(section, key)] = str(path)  # (shown relative to the cwd of the day)
            else:
                sections[section] = body
    for section in SECTIONS:
        sections.setdefault(section, {} if SECTIONS[section][1] else None)
    m = Matrix(sections, origin)
    _cross_check(m)
    return m


def _cross_check(m: Matrix) -> None:
    """References between files and facts that must agree."""
    t = m.typed
    bf16 = t.features.get("bf16")
    bf16_floor = bf16["min_compute_capability"] if bf16 else None
    for key, gpu in t.gpus.items():
        if bf16_floor and gpu["bf16"] != (cc_tuple(gpu["compute_capability"]) >= cc_tuple(bf16_floor)):
            raise UserError(
                f"{m.where('gpus', key)}: gpus.{key}.bf16 is {gpu['bf16']} but CC "
                f"{gpu['compute_capability']} vs the bf16 floor {bf16_floor} says "
                "otherwise. Correct one of the two facts."
            )
    for key, ver in t.verl.items():
        for p in ver["patches"]:
            if p not in t.patches:
                raise UserError(
                    f"{m.where('verl', key)}: verl.{key}.patches names {p!r}, which "
                    "patches.yaml does not define."
                )
        for r in ver.get("reviewed") or []:
            if r not in t.reviewed:
                raise UserError(
                    f"{m.where('verl', key)}: verl.{key}.reviewed names {r!r}, which "
                    "no `reviewed:` section defines."
                )
        for rollout in ver["training_path"]["rollouts"]:
            if rollout not in ver["rollouts"]:
                raise UserError(
                    f"{m.where('verl', key)}: verl.{key}.training_path.rollouts.{rollout}: "
                    f"verl {key} has no {rollout!r} rollout (its rollouts are "
                    f"{', '.join(ver['rollouts'])}). Remove the entry or fix `rollouts`."
                )
    for key, patch in t.patches.items():
        for i, rep in enumerate(patch["replace"]):
            _check_fields(rep["with"], f"{m.where('patches', key)}: patches.{key}.replace[{i}].with")
    for key, rec in t.reviewed.items():
        for hkey, value in rec["holds"].items():
            if isinstance(value, str):
                _check_fields(value, f"{m.where('reviewed', key)}: reviewed.{key}.holds.{hkey}")
    _check_models(m)
    refs: tuple[tuple[str, str, Mapping[str, object]], ...] = (
        ("gpu", "gpus", t.gpus),
        ("cuda", "cuda", t.cuda),
        ("torch", "torch", t.torch),
        ("verl", "verl", t.verl),
        ("vllm", "vllm", t.vllm),
    )
    for key, prof in t.profiles.items():
        both = (("components", prof["components"]), ("optional_components", prof.get("optional_components")))
        for field_, comps in both:
            for comp in comps or {}:
                if comp not in COMPONENTS:
                    raise UserError(
                        f"{m.where('profiles', key)}: profiles.{key}.{field_}.{comp}: "
                        f"unknown component; components are {', '.join(COMPONENTS)}."
                    )
        for ref, section, table in refs:
            named = prof.get(ref)
            if named is not None and named not in table:
                import difflib

                close = difflib.get_close_matches(str(named), list(table), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise UserError(
                    f"{m.where('profiles', key)}: profiles.{key}.{ref} is "
                    f"{named!r}, which {section} does not define.{hint}"
                )


def _check_fields(text: str, where: str) -> None:
    """`text` formats only the names the resolver fills in (a patch's `with`, a `holds` value)."""
    import string

    from envbuilder.model.matrix_schema import FORMAT_FIELDS

    try:
        names = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as e:
        raise UserError(
            f"{where}: {text!r} is not a valid format string ({e}); write a literal brace as {{{{ or }}}}."
        ) from None
    unknown = [n for n in names if n not in FORMAT_FIELDS]
    if unknown:
        raise UserError(
            f"{where}: {{{unknown[0]}}} is not a value envbuild fills in; known: "
            f"{', '.join('{' + f + '}' for f in FORMAT_FIELDS)}."
        )


def _check_models(m: Matrix) -> None:
    """The model table agrees with itself, and every profile's training run can be sized."""
    from envbuilder.model.arch import Arch

    for name, rec in m.models.items():
        where = f"{m.where('models', name)}: models.{name}"
        if rec["attention_heads"] % rec["kv_heads"]:
            raise UserError(
                f"{where}: attention_heads {rec['attention_heads']} is not a multiple "
                f"of kv_heads {rec['kv_heads']}. Copy both from the model's config.json."
            )
        counted = Arch(name, rec).params()
        if counted != rec["parameters"]:
            raise UserError(
                f"{where}.parameters is {rec['parameters']:,} but the architecture gives "
                f"{counted:,} (embeddings, q/k/v/o, MLP, norms"
                f"{'' if rec['tied_embeddings'] else ', lm_head'}). One of the fields is "
                "wrong: compare each with the model's config.json and its model card."
            )
    mem = m.memory
    if mem is None:
        raise UserError(
            "No `memory:` section in the matrix (matrices/memory.yaml): the memory "
            "estimate needs it. Reinstall envbuild or restore the file."
        )
    for key, lo, hi in (
        ("margin", 0, 0.9),
        ("allocator_overhead", 0, 1),
        ("hf_generate_overhead", 0, 1),
        ("validation_share", 0.01, 1),
        ("cuda_context_gib", 0, 64),
        ("nccl_gib", 0, 64),
        ("rollout_seqs_per_gpu", 1, 4096),
        ("host_memory_gib_per_gpu", 1, 1 << 20),
    ):
        if not lo <= mem[key] <= hi:
            raise UserError(
                f"{m.where('memory', key)}: memory.{key} is {mem[key]}, outside "
                f"{lo}..{hi}. Set it inside that range."
            )
    for gpu in mem["total_mib"]:
        if gpu not in m.gpus:
            raise UserError(f"matrices: memory.total_mib.{gpu} names a GPU that gpus does not define.")
    if "gsm8k" not in m.datasets:
        raise UserError(
            "No `datasets.gsm8k` in the matrix (matrices/datasets.yaml): the validation "
            "batch is sized from its test split. Restore it."
        )
    for key, prof in m.profiles.items():
        t, where = prof["train"], f"{m.where('profiles', key)}: profiles.{key}.train"
        if t["model"] not in m.models:
            import difflib

            close = difflib.get_close_matches(t["model"], list(m.models), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UserError(
                f"{where}.model {t['model']!r} is not in the model table, so its memory "
                f"cannot be estimated.{hint} Known: {', '.join(m.models)}. Add its "
                "architecture under `models:` (from its config.json) in a --matrix-dir "
                "overlay."
            )
        problems = []
        for field_ in (
            "n_gpus",
            "train_batch_size",
            "ppo_mini_batch_size",
            "max_prompt_length",
            "max_response_length",
            "micro_batch_size_per_gpu",
        ):
            if field_ in t and t[field_] < 1:
                problems.append(f"{field_} must be at least 1 (it is {t[field_]})")
        if t["lora_rank"] < 0:
            problems.append(f"lora_rank must be 0 or more (it is {t['lora_rank']})")
        if not 0 < t["gpu_memory_utilization"] <= 1:
            problems.append(f"gpu_memory_utilization must be in (0, 1] (it is {t['gpu_memory_utilization']})")
        if not problems:
            if t["train_batch_size"] % t["n_gpus"] or t["ppo_mini_batch_size"] % t["n_gpus"]:
                problems.append(
                    f"train_batch_size {t['train_batch_size']} and ppo_mini_batch_size "
                    f"{t['ppo_mini_batch_size']} must be multiples of n_gpus "
                    f"{t['n_gpus']} (verl splits both evenly over the GPUs)"
                )
            longest = m.models[t["model"]]["max_position_embeddings"]
            if t["max_prompt_length"] + t["max_response_length"] > longest:
                problems.append(
                    f"max_prompt_length + max_response_length "
                    f"({t['max_prompt_length'] + t['max_response_length']}) exceeds "
                    f"{t['model']}'s max_position_embeddings {longest}"
                )
            if t["ppo_mini_batch_size"] > t["train_batch_size"]:
                problems.append(
                    f"ppo_mini_batch_size {t['ppo_mini_batch_size']} is larger than "
                    f"train_batch_size {t['train_batch_size']}"
                )
        if problems:
            raise UserError(f"{where}: {'; '.join(problems)}. Fix the profile's train block.")


# the compiled extensions a profile may build: components/registry.py's names (its blocks import
# this module, so it cannot loop over them; tests/test_component_registry.py holds the two equal)
COMPONENTS = ("apex", "flash-attn")


_CC: dict[str, tuple[int, int]] = {}


def cc_tuple(cc: str) -> tuple[int, int]:
    found = _CC.get(cc)
    if found is None:
        major, _, minor = cc.partition(".")
        found = int(major), int(minor or 0)
        if len(_CC) < 1024:  # (a few dozen in any matrix: the cache stays small)
            _CC[cc] = found
    return found


def at_least(cc: str, floor: str) -> bool:
    """A card of compute capability `cc` is at or above `floor` ("8.6" >= "8.0")."""
    return cc_tuple(cc) >= cc_tuple(floor)


def cc_runs(gpu_cc: str, archs: list[str]) -> bool:
    """True when a cubin in `archs` runs on `gpu_cc`: same major, minor <= the GPU's."""
    major, minor = cc_tuple(gpu_cc)
    return any(a[0] == major and a[1] <= minor for a in map(cc_tuple, archs))


def overlays_from_env() -> tuple[Path, ...]:
    env = os.environ.get("ENVBUILD_MATRIX_DIR")
    return tuple(Path(p) for p in env.split(os.pathsep) if p) if env else ()
