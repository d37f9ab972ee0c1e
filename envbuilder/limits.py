"""Reading what users hand envbuild (overlays, the config, --from specs), bounded.

A file is read only when it is a regular file of at most MAX_INPUT_BYTES (a link to /dev/zero or
a FIFO would never end); YAML is composed first and its expanded size counted before anything is
built from it (a few hundred bytes of nested aliases expand to billions of nodes), its nesting
bounded (MAX_YAML_DEPTH), a whole number of hundreds of digits refused before Python converts
it, and a mapping that names a key twice is refused instead of keeping the last value silently.
model/readers.py builds the typed reader of every other file on these.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from envbuilder.errors import UserError

if TYPE_CHECKING:
    import yaml

# Far above any real input: the shipped matrices together are ~100 KB and ~20,000 nodes.
MAX_INPUT_BYTES = 8 << 20
MAX_YAML_NODES = 1_000_000
MAX_YAML_DEPTH = 64  # the deepest shipped matrix file has 6 levels
MAX_YAML_INT_CHARS = 40  # (a whole number of the matrix has at most 11 digits)


class NotRegularFile(ValueError):
    """A path that is a device, a pipe or a folder: reading it might never end."""


class TooLarge(ValueError):
    """A file over the limit its reader set."""


def read_upto(f: BinaryIO, limit: int) -> bytes:
    """At most `limit` + 1 bytes of the open file `f` (one more, so the caller sees that it was
    longer), asked for in the size the file has: `f.read(n)` sets n bytes aside before it reads,
    and setting aside a 16 MiB limit took three times as long as reading a 30 KB file."""
    try:
        size = os.fstat(f.fileno()).st_size
    except (OSError, AttributeError, ValueError):
        size = 0
    want = min(size, limit) + 1
    data = f.read(want)
    if len(data) < want or len(data) > limit:  # (the end, or already past the limit)
        return data
    parts, total = [data], len(data)  # (it grew since, or it is a pipe: on in chunks)
    while total <= limit:
        chunk = f.read(min(1 << 20, limit + 1 - total))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


def open_regular(path: Path, follow: bool = True) -> BinaryIO:
    """`path` open for reading when it is a regular file (OSError, FileNotFoundError when
    missing; NotRegularFile otherwise). It never blocks: opened with O_NONBLOCK (a FIFO with no
    writer would wait for one for good), checked with fstat before a byte is read, and read in
    blocking mode only once it is known to be a file. `follow=False`: a link is refused too
    (O_NOFOLLOW: what envbuild wrote, or a cache, is never read through one)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise NotRegularFile(str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: Path, limit: int, follow: bool = True) -> bytes:
    """The bytes of `path`, read only when it is a regular file and at most `limit` bytes long
    (open_regular: a FIFO or a device is refused before a byte is read, never waited on).
    OSError (FileNotFoundError when missing), NotRegularFile or TooLarge otherwise: each reader
    says what that means for its file."""
    with open_regular(path, follow) as f:
        data = read_upto(f, limit)
    if len(data) > limit:
        raise TooLarge(str(path))
    return data


def read_text_bounded(path: Path, what: str, limit: int = MAX_INPUT_BYTES) -> str:
    """The text of `path` (UTF-8), or an exit-2 paragraph: what, why, what to do."""
    try:
        data = read_limited(path, limit)
    except NotRegularFile:
        raise UserError(
            f"{what} {path} is not a regular file (a device, pipe or folder); "
            "envbuild reads only files. Pass the file itself."
        ) from None
    except TooLarge:
        raise UserError(
            f"{what} {path} is larger than {limit >> 20} MiB, far more than any "
            "envbuild input; it is not the file you meant. Pass the right file."
        ) from None
    except OSError as e:
        raise UserError(
            f"Cannot read {path} ({what}): {e.strerror}. Check the path and its permissions."
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}). Save it as UTF-8."
        ) from None


def load_yaml(text: str, origin: str) -> Any:
    """Safe YAML with the expansion and duplicate-key checks; yaml errors become UserError."""
    import yaml

    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        loader = loader_cls(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_nodes(node, origin)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = e.problem_mark if isinstance(e, yaml.MarkedYAMLError) else None
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = (e.problem if isinstance(e, yaml.MarkedYAMLError) else None) or str(e).splitlines()[0][:200]
        raise UserError(
            f"{origin}{at}: malformed YAML ({problem}). Fix the file's syntax "
            "(indentation, quotes, colons) and run again."
        ) from None
    except RecursionError:
        raise UserError(f"{origin}: nested too deeply to be an envbuild file. Pass the right file.") from None
    except (ValueError, TypeError, OverflowError) as e:  # a constructor's: a bad date, !!binary
        from envbuilder.text import shorten

        raise UserError(
            f"{origin}: holds a value YAML cannot build "
            f"({shorten(str(e).splitlines()[0] if str(e) else type(e).__name__, 160)})"
            ". Fix that value (quote it to make it text)."
        ) from None


def _check_nodes(root: yaml.Node, origin: str) -> None:
    """Count the nodes the document expands to (an alias counts its whole target again) without
    expanding it, and refuse duplicate keys in any mapping."""
    import yaml

    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool, int]] = [(root, False, 0)]
    while stack:
        node, done, depth = stack.pop()
        key = id(node)
        if key in sizes and not done:
            continue
        if isinstance(node, yaml.ScalarNode):
            text = _text(node)
            if node.tag == "tag:yaml.org,2002:int" and len(text) > MAX_YAML_INT_CHARS:
                from envbuilder.text import shorten

                raise UserError(
                    f"{origin}: line {node.start_mark.line + 1} holds a whole number "
                    f"of {len(text):,} characters ({shorten(text, 30)}), "
                    "far beyond any value of an envbuild file. Fix that value."
                )
            sizes[key] = 1
            continue
        if depth >= MAX_YAML_DEPTH:
            raise UserError(
                f"{origin}: nested more than {MAX_YAML_DEPTH} levels deep at line "
                f"{node.start_mark.line + 1}; no envbuild file is. Pass the right "
                "file."
            )
        children = _children(node)
        if not done:
            if key in sizes:
                continue
            sizes[key] = -1  # in progress (a recursive alias is refused by the composer already)
            stack.append((node, True, depth))
            stack.extend((c, False, depth + 1) for c in children if id(c) not in sizes)
            if isinstance(node, yaml.MappingNode):
                _duplicates(node, origin)
            continue
        if any(sizes.get(id(c)) == -1 for c in children):
            raise UserError(
                f"{origin}: an alias at line {node.start_mark.line + 1} refers to a "
                "value that contains it (a recursive structure); no envbuild file has "
                "one. Remove the '*' alias."
            )
        total = 1 + sum(sizes.get(id(c), 1) for c in children)
        if total > MAX_YAML_NODES:
            raise UserError(
                f"{origin}: its aliases expand to more than {MAX_YAML_NODES:,} values "
                f"(line {node.start_mark.line + 1}); no envbuild file is that large. "
                "It looks like an alias bomb: remove the nested '*' aliases."
            )
        sizes[key] = total


def _text(node: yaml.ScalarNode) -> str:
    value: object = node.value  # (a scalar's: its text)
    return value if isinstance(value, str) else str(value)


def _children(node: yaml.Node) -> list[yaml.Node]:
    """A collection's nodes in order: a sequence's items, a mapping's keys and values."""
    import yaml

    value: object = node.value
    items: list[object] = value if isinstance(value, list) else []
    if isinstance(node, yaml.MappingNode):
        pairs: list[tuple[yaml.Node, yaml.Node]] = [p for p in items if isinstance(p, tuple)]
        return [n for pair in pairs for n in pair]
    return [n for n in items if isinstance(n, yaml.Node)]


def _duplicates(node: yaml.MappingNode, origin: str) -> None:
    import yaml

    seen: dict[str, int] = {}
    for k in _children(node)[::2]:
        if not isinstance(k, yaml.ScalarNode) or k.tag == "tag:yaml.org,2002:merge":
            continue
        key = _text(k)
        if key in seen:
            from envbuilder.text import shorten

            raise UserError(
                f"{origin}: the key {shorten(key, 60)!r} appears twice in one "
                f"mapping (lines {seen[key]} and {k.start_mark.line + 1}); YAML "
                "would keep only the last silently. Keep one of them."
            )
        seen[key] = k.start_mark.line + 1
