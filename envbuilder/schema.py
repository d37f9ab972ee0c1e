"""A small schema checker for the matrix files: names the file and the key on every error.

A schema is plain data: a dict of field -> type spec, where a key ending in "?" is optional;
a spec is a Python type, a `Pattern`, `ListOf`, `MapOf`, `OneOf`, or a nested dict.
(jsonschema would do, but its import alone costs more than a whole render.)
"""

from __future__ import annotations

import re
from typing import Any

from .versions import DRIVER_PATTERN, VERSION_PATTERN


class SchemaError(ValueError):
    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where


class Pattern:
    def __init__(self, regex: str, example: str):
        self.regex, self.example = regex, example

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, str):
            hint = " (quote it, YAML read it as a number)" if isinstance(value, (int, float)) else ""
            raise SchemaError(where, f"expected a string like {self.example!r}, got {value!r}{hint}")
        if not re.fullmatch(self.regex, value):
            raise SchemaError(where, f"{value!r} is not of the form {self.example!r}")


class ListOf:
    def __init__(self, item: Any):
        self.item = item


class MapOf:
    def __init__(self, value: Any, key: Pattern | None = None):
        self.value, self.key = value, key  # key: a Pattern for keys, or None for any string


class OneOf:
    def __init__(self, choices: tuple):
        self.choices = choices


class Scalar:
    """A string, number or true/false (a config value)."""

    def check(self, value: Any, where: str) -> None:
        if not isinstance(value, (str, int, float, bool)):
            raise SchemaError(where, f"expected a string, number or true/false, got {value!r}")


class Range(Pattern):
    """A version range (">=0.7.3,<=0.8.5") that envbuild's own comparison understands."""

    def __init__(self):
        super().__init__(r".*", ">=0.7.3,<=0.8.5")

    def check(self, value: Any, where: str) -> None:
        super().check(value, where)
        from .versions import in_range

        try:
            in_range("0", value)
        except ValueError:
            raise SchemaError(where, f"{value!r} is not a version range like {self.example!r}") from None


class Regex(Pattern):
    """A regular expression (GPU name patterns)."""

    def __init__(self):
        super().__init__(r".*", r"\bP40\b")

    def check(self, value: Any, where: str) -> None:
        super().check(value, where)
        try:
            re.compile(value)
        except re.error as e:
            raise SchemaError(where, f"{value!r} is not a valid regular expression ({e})") from None


VERSION = Pattern(VERSION_PATTERN, "2.6.0")  # exactly what versions.version_key orders
CC = Pattern(r"\d+\.\d", "6.1")
CUDA = Pattern(r"\d+\.\d+", "11.8")
GLIBC = Pattern(r"\d+\.\d+", "2.35")
DRIVER = Pattern(DRIVER_PATTERN, "550.54.14")
MODULE = Pattern(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", "verl.trainer.main_ppo")
HYDRA_KEY = Pattern(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
                    "actor_rollout_ref.actor.fsdp_config.dtype")
# a relative path inside a package, no way out of it (lands in a rendered script as data)
RELPATH = Pattern(r"[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*\.py", "verl/workers/fsdp_workers.py")
# PYTORCH_CUDA_ALLOC_CONF: option:value pairs, nothing a shell would read
ALLOC_CONF = Pattern(r"[a-z_]+:[A-Za-z0-9_.]+(,[a-z_]+:[A-Za-z0-9_.]+)*", "expandable_segments:True")
ABSPATH = Pattern(r"/[A-Za-z0-9_.+/-]*", "/usr/local/cuda/compat/libcuda.so.1")

_TYPE_NAMES = {str: "a string", int: "a whole number", float: "a number", bool: "true or false",
               dict: "a mapping", list: "a list"}


def check(value: Any, spec: Any, where: str) -> None:
    """Raise SchemaError naming `where` (file: dotted.key) at the first mismatch."""
    if isinstance(spec, (Pattern, Scalar)):
        spec.check(value, where)
    elif isinstance(spec, OneOf):
        if value not in spec.choices:
            raise SchemaError(where, f"{value!r} is not one of {', '.join(map(str, spec.choices))}")
    elif isinstance(spec, ListOf):
        if not isinstance(value, list):
            raise SchemaError(where, f"expected a list, got {value!r}")
        for i, item in enumerate(value):
            check(item, spec.item, f"{where}[{i}]")
    elif isinstance(spec, MapOf):
        if not isinstance(value, dict):
            raise SchemaError(where, f"expected a mapping, got {value!r}")
        for key, item in value.items():
            key_where = f"{where}.{key}"
            if spec.key is not None:
                spec.key.check(key, key_where)
            elif not isinstance(key, str):
                raise SchemaError(key_where, f"key {key!r} must be a string (quote it)")
            check(item, spec.value, key_where)
    elif isinstance(spec, dict):
        _check_record(value, spec, where)
    elif spec is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(where, f"expected a number, got {value!r}")
    elif spec is Any:
        return
    elif isinstance(spec, tuple):  # nullable: (type, None)
        if value is not None:
            check(value, spec[0], where)
    else:
        if not isinstance(value, spec) or (spec is int and isinstance(value, bool)):
            raise SchemaError(where, f"expected {_TYPE_NAMES.get(spec, spec.__name__)}, got {value!r}")


def _check_record(value: Any, spec: dict, where: str) -> None:
    if not isinstance(value, dict):
        raise SchemaError(where, f"expected a mapping, got {value!r}")
    fields = {k.rstrip("?"): k.endswith("?") for k in spec}
    for key in value:
        if key not in fields:
            import difflib

            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(fields)}"
            raise SchemaError(f"{where}.{key}", f"unknown key{hint}")
    for key, optional in fields.items():
        sub = spec[key + "?"] if optional else spec[key]
        if key not in value:
            if not optional:
                raise SchemaError(f"{where}.{key}", "required key is missing")
            continue
        check(value[key], sub, f"{where}.{key}")
