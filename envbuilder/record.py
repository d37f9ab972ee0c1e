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
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

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

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kw: Any) -> RecordMeta:
        if bases:
            if "_fields" in ns or "__slots__" in ns:
                raise TypeError(f"{name}: declare a record's fields as annotations, not _fields/__slots__")
            annotations: dict[str, Any] = ns.get("__annotations__", {})
            if any(not isinstance(a, str) for a in annotations.values()):
                raise TypeError(f"{name}: declare records under `from __future__ import annotations`")
            fields = tuple(f for f, a in annotations.items() if not a.startswith("ClassVar"))
            inherited = tuple(f for b in bases for f in getattr(b, "_fields", ()))
            defaults = {f: d for b in bases for f, d in getattr(b, "_defaults", {}).items()}
            for f in fields:
                if f in ns:
                    defaults[f] = ns.pop(f)
                elif f in defaults:
                    del defaults[f]
            ns["__slots__"] = fields
            ns["_fields"] = inherited + tuple(f for f in fields if f not in inherited)
            ns["_defaults"] = defaults
        return super().__new__(mcs, name, bases, ns, **kw)


class Record(metaclass=RecordMeta):
    """An immutable record of its annotated fields (`_fields`, with `_defaults`).

    `_keys` names the JSON key of a field named after a Python keyword (`from_` -> "from");
    `_omit_none` the optional fields left out of `to_dict` while None; `_absent` the keys a
    file may leave out (their defaults stand in: `_omit_none`'s unless a record says more).
    The fields that hold a record (`Gpu`, `Gpu | None`) or a tuple of them (`tuple[Patch, ...]`)
    are read off the annotations the first time plain data is turned into one (`_nested`)."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}
    _keys: ClassVar[dict[str, str]] = {}
    _omit_none: ClassVar[tuple[str, ...]] = ()
    _absent: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
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

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _asdict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self._fields}

    def _replace(self, **changes: Any) -> Self:
        return type(self)(**dict(self._asdict(), **changes))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and type(other) is type(self) and self._asdict() == other._asdict()

    def __hash__(self) -> int:
        return hash(_hashable(self))

    def __reduce__(self) -> tuple[Any, ...]:
        """copy, deepcopy and pickle rebuild a record through its constructor (the slots refuse
        the assignment they would make; a read-only mapping travels as a dict)."""
        return (_rebuild, (type(self), tuple(_unproxied(v) for v in self._asdict().values())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._asdict().items())})"

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
    def nested(cls) -> dict[str, Any]:
        """field -> the record class it holds (`Class`), or a tuple of them (`(Class,)`), read
        off the annotations once (a record named in them may be declared after this one)."""
        found = cls.__dict__.get("_nested_cache")
        if found is not None:
            return found  # type: ignore[no-any-return]
        found = {}
        names = vars(sys.modules[cls.__module__])
        for klass in reversed(cls.__mro__):
            for f, text in klass.__dict__.get("__annotations__", {}).items():
                m = _RECORD_ANNOTATION.fullmatch(text) if f in cls._fields else None
                kind = names.get(m["name"]) if m else None
                if isinstance(kind, type) and issubclass(kind, Record):
                    found[f] = (kind,) if m and m["tuple"] else kind
        type.__setattr__(cls, "_nested_cache", found)
        return found

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data: dicts, lists, strings, numbers, true/false, null."""
        keys, omit, out = self._keys, self._omit_none, {}
        for f in self._fields:
            v = getattr(self, f)
            if v is None and f in omit:
                continue
            out[keys.get(f, f)] = v if type(v) in _SCALARS else plain(v)
        return out

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> Self:
        """The record of plain data shaped as `to_dict` writes it, unchecked (data from a file
        goes through runplan.env_from_dict, which checks it first). A key the record
        does not know is left behind (a file of an older envbuild may hold keys this one no
        longer writes)."""
        values: dict[str, Any] = {}
        nested = cls.nested()
        for f in cls._fields:
            key = cls._keys.get(f, f)
            if key not in data:
                continue  # (a default, or the missing-field TypeError)
            value, kind = data[key], nested.get(f)
            if value is None or kind is None:
                values[f] = frozen(value)
            elif isinstance(kind, tuple):
                values[f] = tuple(kind[0].from_plain(v) for v in value)
            else:
                values[f] = kind.from_plain(value)
        return cls(**values)


_SCALARS = frozenset({str, int, float, bool, type(None)})  # the JSON leaves, tested first: most
# values are these, and isinstance against an ABC (Mapping) is slow


def frozen(value: Any) -> Any:
    """`value` with every list a tuple and every dict a read-only mapping, all the way down."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    if isinstance(value, Mapping) and not isinstance(value, MappingProxyType):
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    return value


def plain(value: Any) -> Any:
    """Plain data of a record, a read-only mapping or a tuple, all the way down (JSON's)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is tuple or kind is list:  # (the common shapes first: exact types, no ABC checks)
        return [plain(v) for v in value]
    if kind is MappingProxyType or kind is dict:
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _hashable(value: Any) -> Any:
    """`value` as nested tuples (a record's type and fields, a mapping's sorted items)."""
    if isinstance(value, Record):
        return (type(value).__name__, *(_hashable(v) for v in value._asdict().values()))
    if isinstance(value, Mapping):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def _unproxied(value: Any) -> Any:
    if isinstance(value, MappingProxyType):
        return {k: _unproxied(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_unproxied(v) for v in value)
    return value


def _rebuild(cls: type[Record], values: tuple[Any, ...]) -> Record:
    return cls(*(frozen(v) for v in values))
