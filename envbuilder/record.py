"""Small immutable records: envbuild's one record style.

A record is declared by annotated fields, as a frozen dataclass is, and type checkers and IDEs
follow it as one (`dataclass_transform`, PEP 681):

    class Driver(Record):
        min_driver: str
        mode: str | None = None

`dataclasses.dataclass(frozen=True, slots=True)` generates each class's methods with exec: the
resolved environment's 22 classes take ~24 ms that way against ~1.5 ms as Records
(bench/bench_records.py), and a whole `envbuild render` is ~170 ms (typing.NamedTuple costs as
much as the dataclasses). So a Record's metaclass only reads the annotations (strings, under
`from __future__ import annotations`, which every module declaring records has): the fields
become `__slots__`, a default moves into `_defaults`. A record refuses assignment, compares and
hashes by value, and converts to and from plain JSON data: nested records, tuples for lists and
read-only mappings for objects, so nothing reached through a record can be changed in place
either.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

if TYPE_CHECKING:
    from typing_extensions import Self, dataclass_transform
else:  # (only the type checker reads it: nothing to import at run time)

    def dataclass_transform(**_: Any) -> Any:
        return lambda cls: cls


# a field's annotation that names a record: `Gpu`, `Gpu | None`, `tuple[Patch, ...]`
_RECORD_ANNOTATION = re.compile(r"(?P<tuple>tuple\[)?(?P<name>\w+)(?(tuple), \.\.\.\])( \| None)?")


@dataclass_transform(frozen_default=True)
class RecordMeta(type):
    """Makes a record class of its annotated fields: `__slots__` and `_fields` in declaration
    order, each default taken out of the class into `_defaults` (a slot and a class attribute of
    one name cannot coexist). A ClassVar annotation is no field."""

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, object], **kw: object) -> RecordMeta:
        if bases:
            if "_fields" in ns or "__slots__" in ns:
                raise TypeError(f"{name}: declare a record's fields as annotations, not _fields/__slots__")
            annotations = _annotations(ns)
            if annotations is None:
                raise TypeError(f"{name}: declare records under `from __future__ import annotations`")
            fields = tuple(f for f, a in annotations.items() if not a.startswith("ClassVar"))
            records = [b for b in bases if issubclass(b, Record)]
            inherited = tuple(f for b in records for f in b._fields)
            defaults = {f: d for b in records for f, d in b._defaults.items()}
            for f in fields:
                if f in ns:
                    defaults[f] = ns.pop(f)
                elif f in defaults:
                    del defaults[f]
            ns["__slots__"] = fields
            ns["_fields"] = inherited + tuple(f for f in fields if f not in inherited)
            ns["_defaults"] = defaults
        return super().__new__(mcs, name, bases, ns, **kw)


def _annotations(ns: Mapping[str, object]) -> dict[str, str] | None:
    """A class's own annotations (its namespace's), None when one is not a string."""
    found = ns.get("__annotations__", {})
    written: dict[object, object] = found if isinstance(found, dict) else {}
    texts = {f: a for f, a in written.items() if isinstance(f, str) and isinstance(a, str)}
    return texts if len(texts) == len(written) else None


# what a field holding records holds: the record class, or `(Class,)` for a tuple of them
Nested: TypeAlias = "type[Record] | tuple[type[Record]]"
_NESTED: dict[type[Record], dict[str, Nested]] = {}  # Record.nested's, by class


class Record(metaclass=RecordMeta):
    """An immutable record of its annotated fields (`_fields`, with `_defaults`).

    `_keys` names the JSON key of a field named after a Python keyword (`from_` -> "from");
    `_omit_none` the optional fields left out of `to_dict` while None; `_absent` the keys a
    file may leave out (their defaults stand in: `_omit_none`'s unless a record says more).
    The fields that hold a record (`Gpu`, `Gpu | None`) or a tuple of them (`tuple[Patch, ...]`)
    are read off the annotations the first time plain data is turned into one (`_nested`)."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, object]] = {}
    _keys: ClassVar[dict[str, str]] = {}
    _omit_none: ClassVar[tuple[str, ...]] = ()
    _absent: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, *args: object, **kwargs: object) -> None:
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

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _asdict(self) -> dict[str, Any]:
        """field -> value (typed Any for callers that know their record's field types)."""
        return self._values()

    def _values(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self._fields}

    def _replace(self, **changes: object) -> Self:
        return type(self)(**dict(self._values(), **changes))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(_hashable(self))

    def __reduce__(self) -> tuple[object, ...]:
        """copy, deepcopy and pickle rebuild a record through its constructor (the slots refuse
        the assignment they would make; a read-only mapping travels as a dict)."""
        return (_rebuild, (type(self), tuple(_unproxied(v) for v in self._values().values())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._values().items())})"

    # -- plain data (JSON) ------------------------------------------------------------------

    @classmethod
    def omitted(cls) -> tuple[str, ...]:
        """The fields `to_dict` leaves out while None (so a file never holds them as null)."""
        return cls._omit_none

    @classmethod
    def absent(cls) -> tuple[str, ...]:
        """The fields a file may leave out (their defaults stand in)."""
        return cls.omitted() if cls._absent is None else cls._absent

    @classmethod
    def nested(cls) -> dict[str, Nested]:
        """field -> the record class it holds (`Class`), or a tuple of them (`(Class,)`), read
        off the annotations once (a record named in them may be declared after this one)."""
        found = _NESTED.get(cls)
        if found is not None:
            return found
        found = {}
        names: Mapping[str, object] = vars(sys.modules[cls.__module__])
        for klass in reversed(cls.__mro__):
            for f, text in (_annotations(klass.__dict__) or {}).items():
                m = _RECORD_ANNOTATION.fullmatch(text) if f in cls._fields else None
                kind = names.get(m["name"]) if m else None
                if isinstance(kind, type) and issubclass(kind, Record):
                    found[f] = (kind,) if m and m["tuple"] else kind
        _NESTED[cls] = found
        return found

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data: dicts, lists, strings, numbers, true/false, null."""
        keys, omit, out = self._keys, self._omit_none, {}
        for f in self._fields:
            v: object = getattr(self, f)
            if v is None and f in omit:
                continue
            out[keys.get(f, f)] = v if type(v) in _SCALARS else _plain(v)
        return out

    @classmethod
    def from_plain(cls, data: Mapping[str, object]) -> Self:
        """The record of plain data shaped as `to_dict` writes it, unchecked (data from a file
        goes through runplan.env_from_dict, which checks it first). A key the record
        does not know is left behind (a file of an older envbuild may hold keys this one no
        longer writes)."""
        values: dict[str, object] = {}
        nested = cls.nested()
        for f in cls._fields:
            key = cls._keys.get(f, f)
            if key not in data:
                continue  # (a default, or the missing-field TypeError)
            value, kind = data[key], nested.get(f)
            if value is None or kind is None:
                values[f] = _frozen(value)
            elif isinstance(kind, tuple):
                values[f] = tuple(kind[0].from_plain(_data(v)) for v in _items(value))
            else:
                values[f] = kind.from_plain(_data(value))
        return cls(**values)


def _data(value: object) -> Mapping[str, object]:
    """A nested record's plain data (from_plain's), a mapping."""
    if isinstance(value, Mapping):
        return value
    raise TypeError(f"expected a record's data (a mapping), got {type(value).__name__}")


def _items(value: object) -> Sequence[object]:
    """A tuple of records' plain data (from_plain's), a list."""
    if isinstance(value, (list, tuple)):
        return value
    raise TypeError(f"expected a list of records' data, got {type(value).__name__}")


_SCALARS = frozenset({str, int, float, bool, type(None)})  # the JSON leaves, tested first: most
# values are these, and isinstance against an ABC (Mapping) is slow


def frozen(value: object) -> Any:
    """`value` with every list a tuple and every dict a read-only mapping, all the way down.
    (Typed Any for the record field it fills, whose type the caller's data has, frozen.)"""
    return _frozen(value)


def _frozen(value: object) -> object:
    if type(value) in _SCALARS:
        return value
    if isinstance(value, (list, tuple)):
        items: Sequence[object] = value
        return tuple(_frozen(v) for v in items)
    if isinstance(value, Mapping) and not isinstance(value, MappingProxyType):
        entries: Mapping[object, object] = value
        return MappingProxyType({k: _frozen(v) for k, v in entries.items()})
    return value


def plain(value: object) -> Any:
    """Plain data of a record, a read-only mapping or a tuple, all the way down (JSON's).
    (Typed Any for its callers, which know the shape of what they pass.)"""
    return _plain(value)


def _plain(value: object) -> object:
    if type(value) in _SCALARS:
        return value
    if isinstance(value, (tuple, list)):  # (the common shapes first: no ABC checks)
        items: Sequence[object] = value
        return [_plain(v) for v in items]
    if isinstance(value, (MappingProxyType, dict)):
        entries: Mapping[object, object] = value
        return {k: _plain(v) for k, v in entries.items()}
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, Mapping):
        others: Mapping[object, object] = value
        return {k: _plain(v) for k, v in others.items()}
    return value


def _hashable(value: object) -> object:
    """`value` as nested tuples (a record's type and fields, a mapping's sorted items)."""
    if isinstance(value, Record):
        return (type(value).__name__, *(_hashable(v) for v in value._values().values()))
    if isinstance(value, Mapping):
        entries: Mapping[object, object] = value
        return tuple(sorted((k, _hashable(v)) for k, v in entries.items()))
    if isinstance(value, (list, tuple)):
        items: Sequence[object] = value
        return tuple(_hashable(v) for v in items)
    return value


def _unproxied(value: object) -> object:
    if isinstance(value, MappingProxyType):
        entries: Mapping[object, object] = value
        return {k: _unproxied(v) for k, v in entries.items()}
    if isinstance(value, tuple):
        items: tuple[object, ...] = value
        return tuple(_unproxied(v) for v in items)
    return value


def _rebuild(cls: type[Record], values: tuple[object, ...]) -> Record:
    return cls(*(_frozen(v) for v in values))
