"""Small immutable records: envbuild's frozen dataclasses.

`dataclasses.dataclass(frozen=True, slots=True)` generates each class's methods with exec: the
resolved environment's 22 classes take ~24 ms that way against ~1.5 ms as Records
(bench/bench_records.py), and a whole `envbuild render` is ~170 ms (typing.NamedTuple costs as
much as the dataclasses). A Record declares its fields in
`__slots__`, refuses assignment, and converts to and from plain JSON data: nested records, tuples
for lists and read-only mappings for objects, so nothing reached through a record can be changed
in place either.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


class Record:
    """An immutable record of `_fields` (with `_defaults`).

    For the typed trees (envbuilder/model/resolved.py): `_nested` names the fields that hold a record
    (`Class`) or a tuple of them (`(Class,)`); `_keys` the JSON key of a field named after a
    Python keyword (`from_` -> "from"); `_omit_none` the optional fields left out of `to_dict`
    while None."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _defaults: dict[str, Any] = {}
    _nested: dict[str, Any] = {}
    _keys: dict[str, str] = {}
    _omit_none: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs):
        if len(args) > len(self._fields):
            raise TypeError(f"{type(self).__name__} takes {len(self._fields)} fields")
        values = dict(zip(self._fields, args))
        for k, v in kwargs.items():
            if k not in self._fields or k in values:
                raise TypeError(f"{type(self).__name__}: bad or repeated field {k!r}")
            values[k] = v
        for f in self._fields:
            if f not in values:
                if f not in self._defaults:
                    raise TypeError(f"{type(self).__name__}: missing field {f!r}")
                values[f] = self._defaults[f]
            object.__setattr__(self, f, values[f])

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _asdict(self) -> dict:
        return {f: getattr(self, f) for f in self._fields}

    def _replace(self, **changes):
        return type(self)(**dict(self._asdict(), **changes))

    def __eq__(self, other):
        return type(other) is type(self) and self._asdict() == other._asdict()

    def __hash__(self):
        return hash(_hashable(self))

    def __reduce__(self):
        """copy, deepcopy and pickle rebuild a record through its constructor (the slots refuse
        the assignment they would make; a read-only mapping travels as a dict)."""
        return (_rebuild, (type(self), tuple(_unproxied(v) for v in self._asdict().values())))

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._asdict().items())})"

    # -- plain data (JSON) ------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The record as plain data: dicts, lists, strings, numbers, true/false, null."""
        return {
            self._keys.get(f, f): plain(v)
            for f, v in self._asdict().items()
            if not (v is None and f in self._omit_none)
        }

    @classmethod
    def from_plain(cls, data: Mapping):
        """The record of plain data shaped as `to_dict` writes it, unchecked (data from a file
        goes through resolved.ResolvedEnv.from_dict, which checks it first). A key the record
        does not know is left behind (a file of an older envbuild may hold keys this one no
        longer writes)."""
        values: dict[str, Any] = {}
        for f in cls._fields:
            key = cls._keys.get(f, f)
            if key not in data:
                continue  # (a default, or the missing-field TypeError)
            value, kind = data[key], cls._nested.get(f)
            if value is None or kind is None:
                values[f] = frozen(value)
            elif isinstance(kind, tuple):
                values[f] = tuple(kind[0].from_plain(v) for v in value)
            else:
                values[f] = kind.from_plain(value)
        return cls(**values)


_SCALARS = frozenset({str, int, float, bool, type(None)})  # the JSON leaves, tested first: most
# values are these, and isinstance against an ABC (Mapping) is slow


def frozen(value):
    """`value` with every list a tuple and every dict a read-only mapping, all the way down."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    if isinstance(value, Mapping) and not isinstance(value, MappingProxyType):
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    return value


def plain(value):
    """Plain data of a record, a read-only mapping or a tuple, all the way down (JSON's)."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _hashable(value):
    """`value` as nested tuples (a record's type and fields, a mapping's sorted items)."""
    if isinstance(value, Record):
        return (type(value).__name__, *(_hashable(v) for v in value._asdict().values()))
    if isinstance(value, Mapping):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def _unproxied(value):
    if isinstance(value, MappingProxyType):
        return {k: _unproxied(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_unproxied(v) for v in value)
    return value


def _rebuild(cls, values: tuple):
    return cls(*(frozen(v) for v in values))
