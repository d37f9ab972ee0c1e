"""The one reader of JSON, YAML and TOML that envbuild did not write in this process.

A lock directory, a wheelhouse's manifest.json, an image archive's index.json and sidecar, a
cache file, a `render --from` file: whoever wrote them, what they hold is data from outside,
and it is read here, bounded and typed, before any other code looks at it:

- the bytes: a regular file (limits.read_limited) of at most `Bounds.max_bytes`, UTF-8;
- the parse: JSON with no NaN or Infinity, no key named twice in one object, no whole number
  of more than `max_int_digits` digits (Python would spend seconds on a million-digit one),
  and no float that overflows to infinity; YAML through limits.load_yaml (alias expansion
  counted, duplicate keys refused); TOML through tomllib;
- the tree: at most `max_depth` levels, every string at most `max_string` characters, every
  list or object at most `max_items` entries, only JSON's kinds (a YAML date or a TOML time
  is none), every number finite and within schema.MAX_INT;
- the shape: what the caller declares (a schema.py spec: records, lists, maps, text kinds,
  `Int`/`Num` ranges), checked whole.

Anything else is a BadData: a UserError (exit 2) naming the file and the path inside it
(`packages[3].version`), what is wrong, and what to do (`fix`, from the caller). A reader never
lets a parser's own exception through: an edited or hostile file is bad input, not a bug.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from envbuilder.errors import UserError
from envbuilder.limits import MAX_INPUT_BYTES
from envbuilder.record import Record

if TYPE_CHECKING:
    from envbuilder.model.schema import Spec


class Bounds(Record):
    """How large a document may be. The defaults are far above any file envbuild writes (the
    deepest, envbuild.json's memory plan, is 6 levels; the longest string a patch's source)."""

    max_bytes: int = MAX_INPUT_BYTES
    max_depth: int = 32
    max_string: int = 1 << 16
    max_items: int = 100_000
    max_int_digits: int = 19  # (schema.MAX_INT has 19)


BOUNDS = Bounds()


class BadData(UserError):
    """A file that is not what its reader expects. `origin`: the file; `where`: the path inside
    it ("" for the whole document); `problem`: what is wrong; `fix`: what to do."""

    def __init__(self, origin: str, where: str, problem: str, fix: str, head: str | None = None):
        self.origin, self.where, self.problem, self.fix = origin, where, problem, fix
        if head is None:  # (a problem of the whole file reads on from its name: "is not JSON")
            head = f"{origin}: {where}: {problem}" if where else f"{origin} {problem}"
        super().__init__(f"{head.rstrip('.')}. {fix}".rstrip())

    @property
    def detail(self) -> str:
        """The message without the file's name and the fix: `where: problem`."""
        return f"{self.where + ': ' if self.where else ''}{self.problem}"


DEFAULT_FIX = "It is not as envbuild writes it (edited, damaged or made by something else)."


# ---- reading and parsing ---------------------------------------------------------------------


def read_bytes(path: Path, what: str, bounds: Bounds = BOUNDS) -> bytes | None:
    """The bytes of `path` (a regular file within bounds), None when there is no such file;
    UserError (exit 2) when it is not a regular file, too large or unreadable."""
    from envbuilder.limits import NotRegularFile, TooLarge, read_limited

    try:
        return read_limited(Path(path), bounds.max_bytes)
    except FileNotFoundError:
        return None
    except NotRegularFile:
        raise UserError(
            f"{what} {path} is not a regular file (a device, pipe or folder); "
            "envbuild reads only files. Pass the file itself."
        ) from None
    except TooLarge:
        raise UserError(
            f"{what} {path} is larger than {_size(bounds.max_bytes)}, far more than "
            "any such file envbuild writes; it is not the file you meant."
        ) from None
    except OSError as e:
        raise UserError(
            f"Cannot read {what} {path}: {e.strerror}. Check the path and its permissions."
        ) from None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} bytes"


def _text(data: bytes | str, origin: str, fix: str, bounds: Bounds) -> str:
    if isinstance(data, str):
        if len(data) > bounds.max_bytes:  # (characters: at least as many bytes)
            raise BadData(origin, "", f"is larger than {_size(bounds.max_bytes)}", fix)
        return data
    if len(data) > bounds.max_bytes:
        raise BadData(origin, "", f"is larger than {_size(bounds.max_bytes)}", fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise BadData(
            origin, "", f"is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line})", fix
        ) from None


class _Refused:
    """A value the JSON parser met and the tree check refuses, with its path (NaN, a number of
    thousands of digits, a float beyond the largest)."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


class _Duplicate(dict[str, object]):
    """An object that named a key twice (json keeps the last silently); the tree check names
    it with its path."""

    key: str = ""


def parse_json(
    data: bytes | str,
    origin: str,
    *,
    shape: Spec = None,
    fix: str = DEFAULT_FIX,
    bounds: Bounds = BOUNDS,
    partial: bool = False,
) -> Any:
    """The document `data` holds, checked (see the module's docstring); BadData otherwise.
    (Typed Any for its callers, which read into the shape it checked; it is JSON's data.)"""
    import json

    text = _text(data, origin, fix, bounds)
    digits = bounds.max_int_digits

    def number(s: str) -> int | _Refused:
        if len(s) - (s[0] == "-") > digits:
            return _Refused(
                f"a whole number of {len(s.lstrip('-')):,} digits is far beyond any value envbuild writes"
            )
        return int(s)

    def real(s: str) -> float | _Refused:
        if len(s) > 64:
            return _Refused(f"a number written with {len(s):,} characters is no value envbuild writes")
        f = float(s)
        return f if math.isfinite(f) else _Refused(f"{s} is beyond the largest number")

    def constant(s: str) -> _Refused:
        return _Refused(f"{s} is not a number envbuild reads (JSON has no {s})")

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        out = dict(items)
        if len(out) != len(items):
            seen: set[str] = set()
            dup = _Duplicate(out)
            dup.key = next(k for k, _ in items if k in seen or _added(seen, k))
            return dup
        return out

    try:
        doc: object = json.loads(
            text, parse_int=number, parse_float=real, parse_constant=constant, object_pairs_hook=pairs
        )
    except json.JSONDecodeError as e:
        raise BadData(
            origin, "", f"is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})", fix
        ) from None
    except RecursionError:
        raise BadData(origin, "", f"is nested more than {bounds.max_depth} levels deep", fix) from None
    except ValueError as e:  # (whatever else the parser refuses)
        raise BadData(origin, "", f"is not valid JSON ({_first_line(e)})", fix) from None
    check_tree(doc, origin, fix, bounds)
    if shape is not None:
        check_shape(doc, shape, origin, fix, partial)
    return doc


def _added(seen: set[str], key: str) -> bool:
    """Adds `key` to `seen`: False (a key not met before)."""
    seen.add(key)
    return False


def parse_yaml(
    data: bytes | str, origin: str, *, shape: Spec = None, fix: str = DEFAULT_FIX, bounds: Bounds = BOUNDS
) -> Any:
    """The YAML document `data` holds (safe, aliases counted, no key twice), checked like
    parse_json; None for an empty document."""
    from envbuilder.limits import load_yaml

    text = _text(data, origin, fix, bounds)
    try:
        doc: object = load_yaml(text, origin)
    except BadData:
        raise
    except UserError as e:  # load_yaml's own paragraph: malformed, an alias bomb, a key twice
        raise BadData(origin, "", str(e).removeprefix(origin).lstrip(": "), fix, head=str(e)) from None
    check_tree(doc, origin, fix, bounds)
    if shape is not None:
        check_shape(doc, shape, origin, fix)
    return doc


def parse_toml(
    data: bytes | str, origin: str, *, shape: Spec = None, fix: str = DEFAULT_FIX, bounds: Bounds = BOUNDS
) -> Any:
    """The TOML document `data` holds, checked like parse_json."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib

    text = _text(data, origin, fix, bounds)
    try:
        doc: object = tomllib.loads(text)
    except RecursionError:
        raise BadData(origin, "", f"is nested more than {bounds.max_depth} levels deep", fix) from None
    except (ValueError, TypeError, OverflowError) as e:  # (TOMLDecodeError is a ValueError)
        raise BadData(origin, "", f"is not valid TOML ({_first_line(e)})", fix) from None
    import datetime

    # (TOML has times of its own: pylock.toml's upload-time; nothing envbuild reads is one)
    check_tree(doc, origin, fix, bounds, allow=(datetime.date, datetime.time))
    if shape is not None:
        check_shape(doc, shape, origin, fix)
    return doc


class Parser(Protocol):
    """parse_json, parse_yaml or parse_toml."""

    def __call__(
        self, data: bytes | str, origin: str, *, shape: Spec = None, fix: str = ..., bounds: Bounds = ...
    ) -> object: ...


PARSERS: dict[str, Parser] = {"json": parse_json, "yaml": parse_yaml, "toml": parse_toml}


def read(
    path: Path,
    what: str,
    kind: str = "json",
    *,
    shape: Spec = None,
    fix: str = DEFAULT_FIX,
    bounds: Bounds = BOUNDS,
    missing_ok: bool = False,
) -> Any:
    """The document in the file `path` (`kind`: json, yaml or toml), read and checked; None when
    the file is missing and `missing_ok`. `what` says in a message what the file is."""
    data = read_bytes(path, what, bounds)
    if data is None:
        if missing_ok:
            return None
        raise UserError(f"{what} {path} does not exist. {fix}".rstrip())
    return PARSERS[kind](data, str(path), shape=shape, fix=fix, bounds=bounds)


def _first_line(e: BaseException) -> str:
    from envbuilder.text import shorten

    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "integer string conversion" in text:  # (Python's own limit, in its own words)
        return "a whole number of thousands of digits"
    return shorten(text, 160)


# ---- the tree and the shape ------------------------------------------------------------------


def _path(parts: tuple[object, ...]) -> str:
    """`packages[3].version` for ("packages", 3, "version"); a key that is not a plain word is
    quoted, and cut to its start."""
    from envbuilder.text import shorten

    out = ""
    for p in parts:
        if isinstance(p, int) and not isinstance(p, bool):
            out += f"[{p}]"
        else:
            key = str(p) if isinstance(p, str) else repr(p)
            if not (
                key.isascii()
                and key.isprintable()
                and key
                and all(c.isalnum() or c in "_-.+@:/" for c in key)
            ):
                key = repr(key)
            key = shorten(key, 60)
            out += f".{key}" if out else key
    return out if len(out) <= 160 else out[:80] + "..." + out[-60:]  # (a path 900 levels deep)


_KINDS = (dict, list, str, int, float, bool, type(None))


def check_tree(
    doc: object, origin: str, fix: str = DEFAULT_FIX, bounds: Bounds = BOUNDS, allow: tuple[type, ...] = ()
) -> None:
    """Depth, lengths, kinds and numbers of the whole document (iterative: a deep one cannot
    exhaust Python's stack here); BadData at the first value out of bounds. `allow`: kinds
    besides JSON's the format has (TOML's dates). A render reads dozens of documents through
    here, so the loop visits each container once and tests its items inline; the path of a
    value is rebuilt from parent links only for the message."""
    max_string, max_depth, max_items = bounds.max_string, bounds.max_depth, bounds.max_items
    limit = (1 << 63) - 1
    # (container, depth, index of its parent here, its key there)
    seen: list[tuple[dict[object, object] | list[object], int, int, object]] = []

    def path(index: int, key: object = None, has_key: bool = False) -> tuple[object, ...]:
        out = [key] if has_key else []
        while index >= 0:
            _, _, parent, k = seen[index]
            if parent >= 0:
                out.append(k)
            index = parent
        return tuple(reversed(out))

    def bad(at: tuple[object, ...], problem: str) -> BadData:
        where = _path(at)
        return BadData(origin, where, problem, fix, head=None if where else f"{origin}: {problem}")

    def odd(value: object, at: tuple[object, ...]) -> None:  # a value that is no str, dict, list, int, float
        if value is None or value is True or value is False:
            return
        if isinstance(value, _Refused):
            raise bad(at, value.why)
        if isinstance(value, (dict, list)):  # (a subclass: _Duplicate)
            return
        if allow and isinstance(value, allow):
            return
        if isinstance(value, float):
            scalar(float(value), at)
        elif isinstance(value, int) and not isinstance(value, bool):
            scalar(int(value), at)
        elif isinstance(value, str):
            scalar(str(value), at)
        else:
            raise bad(
                at,
                f"it holds {_kind_name(value)}, which no file of envbuild's has (only "
                "text, numbers, true/false, null, lists and objects)",
            )

    def scalar(value: object, at: tuple[object, ...]) -> None:  # a str, int or float out of bounds, or fine
        if isinstance(value, str):  # (exactly a str, float or int: odd() made it one)
            if len(value) > max_string:
                raise bad(
                    at,
                    f"a string of {len(value):,} characters is longer than any "
                    f"envbuild writes (at most {max_string:,})",
                )
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise bad(at, f"{value!r} is not a number envbuild reads (a finite number expected)")
        elif isinstance(value, int) and not -limit <= value <= limit:
            raise bad(at, "a whole number this large is far beyond any value envbuild writes")

    def container(value: dict[object, object] | list[object], depth: int, parent: int, key: object) -> None:
        if depth >= max_depth:
            raise bad(
                path(parent, key, parent >= 0),
                f"it is nested more than {max_depth} levels deep; no file of envbuild's is",
            )
        if len(value) > max_items:
            raise bad(
                path(parent, key, parent >= 0),
                f"{len(value):,} entries in one "
                f"{'object' if isinstance(value, dict) else 'list'} are more than any "
                f"file of envbuild's holds (at most {max_items:,})",
            )
        if isinstance(value, _Duplicate):
            raise bad(
                path(parent, key, parent >= 0),
                f"an object names the key {_key(value.key)} twice (JSON would keep only the last, silently)",
            )
        seen.append((value, depth, parent, key))

    if not isinstance(doc, (dict, list)):
        (scalar if type(doc) in (str, int, float) else odd)(doc, ())
        return
    container(doc, 0, -1, None)
    i = 0
    items: Iterable[tuple[object, object]]
    while i < len(seen):
        value, depth, _, _ = seen[i]
        if isinstance(value, list):
            items = enumerate(value)
        else:
            for k in value:
                if type(k) is str:
                    if len(k) > max_string:
                        raise bad(
                            path(i), f"a key of {len(k):,} characters is longer than any envbuild writes"
                        )
                elif not isinstance(k, (int, float, bool)) or (isinstance(k, float) and not math.isfinite(k)):
                    # (YAML's keys may be numbers or true/false: 11.8, 12, on)
                    raise bad(path(i), f"a key that is {_kind_name(k)} is no key of envbuild's files")
            items = value.items()
        for k, v in items:
            if type(v) is str:
                if len(v) > max_string:
                    scalar(v, path(i, k, True))
            elif type(v) is dict or type(v) is list:
                container(v, depth + 1, i, k)
            elif type(v) is int:
                if not -limit <= v <= limit:
                    scalar(v, path(i, k, True))
            elif type(v) is float:
                if v - v != 0.0:  # (NaN and the infinities)
                    scalar(v, path(i, k, True))
            elif v is not None and type(v) is not bool:
                if isinstance(v, (dict, list)):
                    container(v, depth + 1, i, k)
                else:
                    odd(v, path(i, k, True))
        i += 1


def _key(key: str) -> str:
    from envbuilder.text import shorten

    return shorten(repr(key), 60)


def _kind_name(value: object) -> str:
    names = {
        "date": "a date",
        "datetime": "a date and time",
        "time": "a time",
        "bytes": "binary data",
        "set": "a set",
        "tuple": "a pair",
        "NoneType": "null",
    }
    return names.get(type(value).__name__, f"a {type(value).__name__}")


def check_shape(doc: object, shape: Spec, origin: str, fix: str = DEFAULT_FIX, partial: bool = False) -> None:
    """`doc` against a schema.py spec; BadData naming the path of the first mismatch."""
    from envbuilder.model import schema as S

    try:
        S.check(doc, shape, "\0", partial)
    except S.SchemaError as e:
        problem, where = str(e)[len(e.where) + 2 :], e.where.lstrip("\0").lstrip(".")
        raise BadData(origin, where, problem, fix, head=None if where else f"{origin}: {problem}") from None
