"""A small schema checker for the matrix files: names the file and the key on every error.

A schema is plain data: a dict of field -> type spec, where a key ending in "?" is optional
(and a key "*" gives the kind of every key the record does not name); a spec is a Python type,
a `Pattern`, `Text`, `Code`, `Int`, `Num`, `ListOf`, `MapOf`, `OneOf`, `Tree`, or a nested dict.
(jsonschema would do, but its import alone costs more than a whole render.)

Every string has a kind that says what it is (a name, a version, a URL, a model id, a package,
one line of text...), checked where it enters: the rendered files quote what they write
(quoting.py), and these kinds keep out what no quoting could make harmless (a newline in a
Dockerfile instruction, a `$` in a bare ARG default, a name that is a path out of its folder).
An error echoes a value cut to its start (a 100,000-character value is not printed back).

Every number is finite (no NaN or infinity) and a whole number is within MAX_INT of zero; `Int`
and `Num` give the range a field means (a count is never negative, a share is in (0, 1]).
"""

from __future__ import annotations

import re

from collections.abc import Mapping
from typing import Any, TypeAlias

from envbuilder.oci.reference import PATTERN as _REFERENCE  # (the one image grammar)

from envbuilder.model.versions import DRIVER_PATTERN, VERSION_PATTERN

MAX_INT = 2**63 - 1  # any whole number a file of envbuild's holds (bytes, counts) is far below


# A spec: a Python type, a `Pattern`, `Text`, `Code`, `Scalar`, `Int`, `Num`, `ListOf`, `MapOf`,
# `OneOf`, `Tree`, a dict of field -> spec, `(spec, None)` for a nullable value, or `typing.Any`
# for any value. Written as plain data by every module that reads a file, so its type is any
# object: check() and json_schema() tell the kinds apart.
Spec: TypeAlias = object


class SchemaError(ValueError):
    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where


def shown(value: object, limit: int = 60) -> str:
    """A value as a message echoes it: its repr, cut to `limit` characters and its length."""
    from envbuilder.text import shorten

    try:
        text = repr(value)
    except (ValueError, RecursionError):  # a whole number of thousands of digits (no repr), or
        # a value nested too deeply to print
        text = f"<{type(value).__name__} too large to show>"
    return shorten(text, limit)


def _at(where: str, key: object) -> str:
    """`where`.key (or `where` key after "file: "); a huge key is not printed whole either."""
    if not (isinstance(key, str) and len(key) <= 60):
        from envbuilder.text import shorten

        key = shorten(key, 60) if isinstance(key, str) else shown(key)
    return f"{where}{key}" if where.endswith(": ") else f"{where}.{key}"


def _not_a_string(value: object, what: str, where: str) -> SchemaError:
    hint = " (quote it, YAML read it as a number)" if isinstance(value, (int, float)) else ""
    return SchemaError(where, f"expected {what}, got {shown(value)}{hint}")


def printable(ch: str) -> bool:
    """A character text may hold: printable or a space (no control, format or surrogate
    character, no line or paragraph separator: nothing that ends a line for some reader or
    reorders what is shown). quoting.py writes these as themselves, the rest as escapes."""
    return ch == " " or ch.isprintable()


def unprintable(text: str, allow: str = "") -> int | None:
    """The index of the first character of `text` that is not printable, `allow` excepted;
    None when there is none."""
    if text.isascii() and text.isprintable():
        return None
    return next((i for i, ch in enumerate(text) if not printable(ch) and ch not in allow), None)


def _check_text(value: str, where: str, max_len: int, what: str, allow: str = "") -> None:
    if len(value) > max_len:
        raise SchemaError(where, f"{shown(value)} is too long for {what} (at most {max_len:,} characters)")
    i = unprintable(value, allow)
    if i is not None:
        raise SchemaError(
            where,
            f"{shown(value)} holds the character U+{ord(value[i]):04X} at "
            f"position {i}: {what} is printable characters only"
            + (", and tabs and newlines" if "\n" in allow else ", on one line")
            + " (it lands in comments, labels and scripts of the rendered files)",
        )


class Pattern:
    """A string of a fixed form (a version, a name, a URL), at most `max_len` characters;
    `what` says in an error what the form is."""

    def __init__(self, regex: str, example: str, what: str | None = None, max_len: int = 200):
        self.regex, self.example, self.max_len = regex, example, max_len
        self.what = what or f"of the form {example!r}"

        self._compiled: re.Pattern[str] | None = None  # (compiled at its first use)

    def check(self, value: object, where: str) -> None:
        self.string(value, where)

    def string(self, value: object, where: str) -> str:
        """`value`, a string of this form; SchemaError otherwise."""
        if not isinstance(value, str):
            raise _not_a_string(value, f"a string like {self.example!r}", where)
        # (ASCII: a \d is 0-9, not any script's digit, which no version or name may hold)
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(self.regex, re.ASCII)
        if len(value) > self.max_len or not compiled.fullmatch(value):
            raise SchemaError(where, f"{shown(value)} is not {self.what}")
        return value


class Text:
    """Free text (a description, a why): one line of printable characters, at most `max_len`
    (it lands in comments, labels and docstrings of the rendered files)."""

    def __init__(self, max_len: int = 300):
        self.max_len = max_len

    def check(self, value: object, where: str) -> None:
        self.string(value, where)

    def string(self, value: object, where: str) -> str:
        """`value`, text of this kind; SchemaError otherwise."""
        if not isinstance(value, str):
            raise _not_a_string(value, "text", where)
        _check_text(value, where, self.max_len, "text here")
        return value


class Code(Text):
    """Source text (a patch's find / with): lines of printable characters and tabs."""

    def string(self, value: object, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise _not_a_string(value, "non-empty source text", where)
        _check_text(value, where, self.max_len, "source text", allow="\n\t")
        return value


class Tree:
    """Any JSON data (mappings, lists, numbers, true/false, null) whose every string, keys
    included, is of the kind `leaf` (the parts of a resolved environment no template reads
    one by one, such as the memory plan's phases)."""

    def __init__(self, leaf: Spec):
        self.leaf = leaf


class ListOf:
    """A list of `item`s, at least `min_len` of them (a torch install names torch first)."""

    def __init__(self, item: Spec, min_len: int = 0):
        self.item, self.min_len = item, min_len


class MapOf:
    """A mapping of `value`s; `key`: a Pattern, OneOf or Text for the keys, or None for any string."""

    def __init__(self, value: Spec, key: Pattern | OneOf | Text | None = None):
        self.value, self.key = value, key


class OneOf:
    def __init__(self, choices: tuple[object, ...]):
        self.choices = choices


class Scalar:
    """A string (one line of text), number or true/false (a config value)."""

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, (str, int, float, bool)):
            raise SchemaError(where, f"expected a string, number or true/false, got {shown(value)}")
        if isinstance(value, str):
            _check_text(value, where, 300, "a value here")
        elif not isinstance(value, bool):
            _number(value, False, where)


def _number(value: object, whole: bool, where: str) -> int | float:
    """`value`, a number of this kind (see _number_problem); SchemaError otherwise."""
    why = _number_problem(value, whole)
    if why or not isinstance(value, (int, float)):
        raise SchemaError(where, why or f"expected a number, got {shown(value)}")
    return value


def _number_problem(value: object, whole: bool) -> str | None:
    """Why `value` is no number of this kind (None when it is one): true/false, text, NaN,
    infinity and a whole number beyond MAX_INT are none."""
    import math

    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (whole and not isinstance(value, int))
    ):
        return f"expected {'a whole number' if whole else 'a number'}, got {shown(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a number envbuild reads (a finite number expected)"
    if isinstance(value, int) and abs(value) > MAX_INT:
        return (
            f"a whole number of about {int(value.bit_length() * 0.30103) + 1:,} digits is far "
            f"beyond any value here (at most {MAX_INT:,})"
        )
    return None


class Int:
    """A whole number from `lo` to `hi` (never true/false): a count, a size in bytes."""

    def __init__(self, lo: int = 0, hi: int = MAX_INT):
        self.lo, self.hi = lo, hi

    def check(self, value: object, where: str) -> None:
        value = _number(value, True, where)
        if not self.lo <= value <= self.hi:
            raise SchemaError(where, f"{shown(value)} is outside {self.lo:,}..{self.hi:,}")


class Num:
    """A finite number from `lo` to `hi`; `above`: greater than `lo`, not equal to it (a share
    of memory in (0, 1])."""

    def __init__(self, lo: float = 0, hi: float = 1e12, above: bool = False):
        self.lo, self.hi, self.above = lo, hi, above

    def check(self, value: object, where: str) -> None:
        value = _number(value, False, where)
        if not ((self.lo < value) if self.above else (self.lo <= value)) or value > self.hi:
            interval = f"({self.lo}, {self.hi}]" if self.above else f"{self.lo}..{self.hi}"
            raise SchemaError(where, f"{shown(value)} is outside {interval}")


class Range(Pattern):
    """A version range (">=0.7.3,<=0.8.5") that envbuild's own comparison understands."""

    def __init__(self) -> None:
        super().__init__(r"[ -~]*", ">=0.7.3,<=0.8.5", "a version range like '>=0.7.3,<=0.8.5'")

    def string(self, value: object, where: str) -> str:
        text = super().string(value, where)
        from envbuilder.model.versions import in_range

        try:
            in_range("0", text)
        except ValueError:
            raise SchemaError(where, f"{shown(value)} is not {self.what}") from None
        return text


class Regex(Pattern):
    """A regular expression (GPU name patterns)."""

    def __init__(self) -> None:
        super().__init__(r"[^\x00-\x1f\x7f]*", r"\bP40\b", "a regular expression on one line")

    def string(self, value: object, where: str) -> str:
        text = super().string(value, where)
        try:
            re.compile(text)
        except re.error as e:
            raise SchemaError(where, f"{shown(value)} is not a valid regular expression ({e})") from None
        return text


_URL_CHAR = r"[A-Za-z0-9._~:/?@!%+=,\[\]-]"  # (quoting.BARE's characters: a URL is one plain word)
_USERINFO = r"[A-Za-z0-9._~%!+=,-]+(?::[A-Za-z0-9._~%!+=,-]*)?"  # user:password (a mirror's)
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
_NAME = r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_PACKAGE = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?"  # a PEP 508 name


class Url(Pattern):
    """An http(s) URL of the characters no shell, Dockerfile, sed or requirements file reads
    specially (no whitespace, quote, `$`, backslash, `#`, `&`, `;`, `*`); `{field}` only for the
    `fields` envbuild formats in (an index's {variant})."""

    def __init__(self, fields: tuple[str, ...] = (), example: str = "https://pypi.org/simple"):
        self.fields = fields
        chars = "|".join([_URL_CHAR, *(r"\{%s\}" % f for f in fields)])
        super().__init__(
            rf"https?://(?:{_USERINFO}@)?{_HOST}(?::\d{{1,5}})?(?:[/?](?:{chars})*)?",
            example,
            f"an http(s) URL like {example!r}, of letters, digits and "
            "-._~:/?@!%+=,[] only (no spaces, quotes, $, backslash, #, &, ;)",
            500,
        )

    def string(self, value: object, where: str) -> str:
        if isinstance(value, str) and "{" in value and len(value) <= self.max_len:
            import string

            from envbuilder.text import shorten

            try:
                names = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
            except ValueError:
                names = []
            unknown = [n for n in names if n not in self.fields]
            if unknown:
                fills = (
                    f"it fills in {', '.join('{' + f + '}' for f in self.fields)}"
                    if self.fields
                    else "this URL takes none"
                )
                raise SchemaError(
                    where,
                    f"{{{shorten(unknown[0], 40)}}} in {shown(value)} is not a "
                    f"field envbuild fills in ({fills}): write the value itself",
                )
        return super().string(value, where)


VERSION = Pattern(VERSION_PATTERN, "2.6.0", max_len=64)  # exactly what versions.version_key orders
CC = Pattern(r"\d+\.\d", "6.1")
CUDA = Pattern(r"\d+\.\d+", "11.8", max_len=16)
GLIBC = Pattern(r"\d+\.\d+", "2.35", max_len=16)
DRIVER = Pattern(DRIVER_PATTERN, "550.54.14", max_len=32)
MODULE = Pattern(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", "verl.trainer.main_ppo")
HYDRA_KEY = Pattern(
    r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", "actor_rollout_ref.actor.fsdp_config.dtype"
)
# a Hydra override of a key the config may lack (+) or have (++): one word of the run script
HYDRA_OVERRIDE = Pattern(
    r"\+{0,2}" + HYDRA_KEY.regex, "+actor_rollout_ref.model.override_config.attn_implementation"
)
# a relative path inside a package, no way out of it (lands in a rendered script as data)
RELPATH = Pattern(r"[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*\.py", "verl/workers/fsdp_workers.py")
# PYTORCH_CUDA_ALLOC_CONF: option:value pairs, nothing a shell would read
ALLOC_CONF = Pattern(r"[a-z_]+:[A-Za-z0-9_.]+(,[a-z_]+:[A-Za-z0-9_.]+)*", "expandable_segments:True")
ABSPATH = Pattern(r"/[A-Za-z0-9_.+/-]*", "/usr/local/cuda/compat/libcuda.so.1")
# A name (a profile, a GPU, a patch, a mirror set ...): also a folder or file name somewhere
# (out/<profile>, lockfiles/<profile>), so never a path: no '/', no '..', no leading '.' or '-'.
NAME = Pattern(
    _NAME,
    "p40",
    "a name of letters, digits, '.', '_' and '-' (at most 64, starting with a letter or digit, no '..')",
    64,
)
# a Hugging Face repo id, `org/name` (a model, a dataset): the hub's own rules
_HF_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
MODEL_ID = Pattern(
    rf"(?!.*(?:\.\.|--))(?:{_HF_PART}/)?{_HF_PART}",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "a Hugging Face repo id like 'Qwen/Qwen2.5-0.5B-Instruct' (letters, digits, "
    "'.', '_', '-'; at most 96 each side of the '/'; no '..' or '--')",
    193,
)
# what a run trains: a hub repo id, or (--model FOLDER) the folder's absolute path
MODEL_REF = Pattern(
    rf"{MODEL_ID.regex}|/(?!.*(?:\.\.|//))[A-Za-z0-9_.+/-]{{1,200}}",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "a Hugging Face repo id like 'Qwen/Qwen2.5-0.5B-Instruct' or a model folder's absolute path",
    201,
)
# a pip package as a pin names it: a PEP 508 name with optional extras (ray[default])
PACKAGE = Pattern(
    rf"{_PACKAGE}(?:\[{_PACKAGE}(?:,{_PACKAGE})*\])?",
    "ray[default]",
    "a package name (PEP 508: letters, digits, '.', '_', '-'; extras in [])",
)
# name==version, as the resolver writes a requirement and a lock a pin (+local, as pip's are)
REQUIREMENT = Pattern(
    rf"{PACKAGE.regex}==[A-Za-z0-9][A-Za-z0-9.+!_-]{{0,63}}",
    "torch==2.6.0+cu118",
    "a pin of the form 'torch==2.6.0+cu118'",
)
URL = Url()
# a container image reference: [registry[:port]/]repository[:tag][@sha256:digest]
IMAGE = Pattern(_REFERENCE, "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", max_len=300)
# a registry endpoint, [SCHEME://]HOST[:PORT][/PREFIX], and a registry as images name it
REGISTRY = Pattern(
    rf"(?:https?://)?{_HOST}(?::\d{{1,5}})?(?:/[A-Za-z0-9._-]+)*/?",
    "docker.m.daocloud.io",
    "a registry endpoint like 'registry.example:5000/prefix'",
)
REGISTRY_HOST = Pattern(rf"{_HOST}(?::\d{{1,5}})?", "docker.io", "a registry host like 'docker.io'")
# a conda channel: a name (conda-forge) or a URL (a mirror's)
CHANNEL = Pattern(rf"{_NAME}|{URL.regex}", "conda-forge", "a conda channel name or http(s) URL", URL.max_len)
CONDA_SPEC = Pattern(
    r"[A-Za-z0-9][A-Za-z0-9._-]*(?:(?:==|>=|<=|!=|=|<|>)[A-Za-z0-9.*+_-]+)?",
    "cuda-nvcc=12.4",
    "a conda package spec like 'cuda-nvcc=12.4'",
)
# a git tag or branch (apex's ref, a dataset's revision), formatted into a URL
GIT_REF = Pattern(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._/-]{0,99}", "25.08")
# a file inside a repository (a dataset's split), relative, no way out of it
REPO_FILE = Pattern(
    r"(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*",
    "main/train-00000-of-00001.parquet",
)
# a GPU model as NVML names it
GPU_NAME = Pattern(
    r"[A-Za-z0-9][A-Za-z0-9 ._()+/-]{0,63}",
    "NVIDIA GeForce RTX 4090",
    "a GPU name like 'NVIDIA GeForce RTX 4090' (letters, digits, spaces, '._()+/-'; at most 64)",
    64,
)
SHA256 = Pattern(r"[0-9a-f]{64}", "e3b0c442...")

_TYPE_NAMES = {
    str: "a string",
    int: "a whole number",
    float: "a number",
    bool: "true or false",
    dict: "a mapping",
    list: "a list",
}


def check(value: object, spec: Spec, where: str, partial: bool = False) -> None:
    """Raise SchemaError naming `where` (file: dotted.key) at the first mismatch. `partial`: a
    document someone may have edited or an older envbuild wrote (render --from), whose missing
    keys and numbers in place of text the caller's shape check names, all at once, and whose keys
    this envbuild no longer writes are any data of one-line text; every value that is there is
    checked all the same, and nothing but a scalar sits where a scalar belongs."""
    if partial and isinstance(value, (int, float)) and _is_text_kind(spec):
        return
    if isinstance(spec, (Pattern, Scalar, Text, Int, Num)):
        spec.check(value, where)
    elif isinstance(spec, OneOf):
        if value not in spec.choices:
            raise SchemaError(where, f"{shown(value)} is not one of {', '.join(map(str, spec.choices))}")
    elif isinstance(spec, ListOf):
        if not isinstance(value, list):
            raise SchemaError(where, f"expected a list, got {shown(value)}")
        items: list[object] = value
        if len(items) < spec.min_len:
            raise SchemaError(
                where,
                f"expected a list of at least {spec.min_len} "
                f"item{'s' if spec.min_len > 1 else ''}, got {shown(value)}",
            )
        for i, item in enumerate(items):
            check(item, spec.item, f"{where}[{i}]", partial)
    elif isinstance(spec, MapOf):
        if not isinstance(value, dict):
            raise SchemaError(where, f"expected a mapping, got {shown(value)}")
        entries: dict[object, object] = value
        for key, item in entries.items():
            key_where = _at(where, key)
            if spec.key is not None:
                check(key, spec.key, key_where)
            elif not isinstance(key, str):
                raise SchemaError(key_where, f"key {shown(key)} must be a string (quote it)")
            check(item, spec.value, key_where, partial)
    elif isinstance(spec, Tree):
        _check_tree(value, spec.leaf, where)
    elif isinstance(spec, dict):
        _check_record(value, spec, where, partial)
    elif spec is float or spec is int:
        _number(value, spec is int, where)
    elif spec is Any:
        return
    elif isinstance(spec, tuple):  # nullable: (type, None)
        if value is not None:
            check(value, _nullable(spec), where, partial)
    elif not isinstance(spec, type):
        raise TypeError(f"{spec!r} is no schema spec")
    elif not isinstance(value, spec) or (spec is int and isinstance(value, bool)):
        raise SchemaError(where, f"expected {_TYPE_NAMES.get(spec, spec.__name__)}, got {shown(value)}")


def _nullable(spec: tuple[object, ...]) -> Spec:
    """The spec of a nullable value's `(spec, None)`."""
    return spec[0]


def _is_text_kind(spec: Spec) -> bool:
    if isinstance(spec, tuple):
        return _is_text_kind(_nullable(spec))
    return (
        spec is str
        or isinstance(spec, (Pattern, Text))
        or isinstance(spec, OneOf)
        and all(isinstance(c, str) for c in spec.choices)
    )


def _check_tree(value: object, leaf: Spec, where: str) -> None:
    if isinstance(value, dict):
        entries: dict[object, object] = value
        for key, item in entries.items():
            check(key, leaf, _at(where, key))
            _check_tree(item, leaf, _at(where, key))
    elif isinstance(value, list):
        items: list[object] = value
        for i, item in enumerate(items):
            _check_tree(item, leaf, f"{where}[{i}]")
    elif isinstance(value, str):
        check(value, leaf, where)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _number(value, False, where)
    elif value is not None and not isinstance(value, bool):
        raise SchemaError(where, f"expected data, got {shown(value)}")


_OLD_KEY = Text(4000)


def _check_record(value: object, spec: Mapping[str, Spec], where: str, partial: bool = False) -> None:
    if not isinstance(value, dict):
        raise SchemaError(where, f"expected a mapping, got {shown(value)}")
    record: dict[object, object] = value
    fields = {k.rstrip("?"): k.endswith("?") for k in spec if k != "*"}
    for key in record:
        if key not in fields:
            if "*" in spec and isinstance(key, str):  # any other key, of this kind
                check(record[key], spec["*"], _at(where, key), partial)
                continue
            if partial and isinstance(key, str):  # (one an older envbuild wrote: no template
                _check_tree(record[key], _OLD_KEY, _at(where, key))  # reads it, but it is text)
                continue
            import difflib

            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(fields)}"
            raise SchemaError(_at(where, key), f"unknown key{hint}")
    for key, optional in fields.items():
        sub = spec[key + "?"] if optional else spec[key]
        if key not in record:
            if not optional and not partial:
                raise SchemaError(_at(where, key), "required key is missing")
            continue
        check(record[key], sub, _at(where, key), partial)


# ---- the same declarations as a JSON Schema (for editors and other tools) -------------------

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def json_schema(spec: Spec) -> dict[str, object]:
    """The JSON Schema (draft 2020-12) of what `check(value, spec, ...)` accepts, from the same
    spec. It says less than check() does: a text kind's printable-characters rule, a Range's
    comparison and a Regex's compiling are check()'s alone, and a pattern is matched as written
    (check() reads `\\d` and `\\w` as ASCII only); check() stays the one validator envbuild runs."""
    if isinstance(spec, Pattern):
        # (named groups are Python's spelling: plain groups read the same in ECMA-262's)
        regex = re.sub(r"\(\?P<\w+>", "(", spec.regex)
        return {"type": "string", "pattern": f"^(?:{regex})$", "maxLength": spec.max_len}
    if isinstance(spec, Code):
        return {"type": "string", "minLength": 1, "maxLength": spec.max_len}
    if isinstance(spec, Text):
        return {"type": "string", "maxLength": spec.max_len}
    if isinstance(spec, Scalar):
        return {"type": ["string", "number", "boolean"]}
    if isinstance(spec, Int):
        return {"type": "integer", "minimum": spec.lo, "maximum": spec.hi}
    if isinstance(spec, Num):
        low = "exclusiveMinimum" if spec.above else "minimum"
        return {"type": "number", low: spec.lo, "maximum": spec.hi}
    if isinstance(spec, OneOf):
        return {"enum": list(spec.choices)}
    if isinstance(spec, ListOf):
        out: dict[str, object] = {"type": "array", "items": json_schema(spec.item)}
        return dict(out, minItems=spec.min_len) if spec.min_len else out
    if isinstance(spec, MapOf):
        out = {"type": "object", "additionalProperties": json_schema(spec.value)}
        return dict(out, propertyNames=json_schema(spec.key)) if spec.key is not None else out
    if isinstance(spec, Tree) or spec is Any:
        return {}
    if isinstance(spec, dict):
        return _record_schema(spec)
    if isinstance(spec, tuple):  # nullable: (spec, None)
        return {"anyOf": [json_schema(_nullable(spec)), {"type": "null"}]}
    if isinstance(spec, type) and spec in _JSON_TYPES:
        return {"type": _JSON_TYPES[spec]}
    raise TypeError(f"{spec!r} is no schema spec")


def _record_schema(spec: Mapping[str, Spec]) -> dict[str, object]:
    fields = {k.rstrip("?"): v for k, v in spec.items() if k != "*"}
    return {
        "type": "object",
        "properties": {k: json_schema(v) for k, v in fields.items()},
        "required": [k for k in spec if k != "*" and not k.endswith("?")],
        "additionalProperties": json_schema(spec["*"]) if "*" in spec else False,
    }
