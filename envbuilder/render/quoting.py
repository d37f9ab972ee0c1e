"""Quoting for the languages the rendered files are written in (the templates' filters).

Every value a template writes goes through the filter of the place it lands, so that whatever
it holds it stays one inert value there: a bash word (`sh`), text to the end of a `#` comment
(`comment`), text inside a Python string (`pystr`) or a Python literal (`py`), a Dockerfile
double-quoted value (`dq`) or ARG default (`arg`), one bare token of a file with no quoting to
rely on (`word`: requirements.txt, environment.yml), or a TOML string or key (`toml`,
`tomlkey`: pixi.toml). A benign value comes out as it went in, so the files read as before.
The schema (envbuilder/model/schema.py) already refuses, where values enter, what could not be
written safely; these filters are the second wall, for a value that reached a template some
other way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from envbuilder.model.schema import printable  # (what a one-line text may hold: written as itself)

# one token that no target reads specially: no whitespace, quote, `$`, backslash, `#`, `{}`,
# `&`, `*`, `;`, `<>`, `|` or backtick (a URL, a requirement `ray[default]==2.46.0`, an image)
BARE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~:/?@!%+=,\[\]-]*")
_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SHELL_SAFE = re.compile(r"[\w@%+=:,./-]+", re.ASCII)  # what shlex.quote leaves bare
# longer than any one value envbuild writes into a line (the schema's longest text is 4,000);
# BuildKit's parser refuses a Dockerfile with a line over 64 KiB outright
MAX_LINE_VALUE = 8192


def _escape(ch: str) -> str:
    """Python's escape of one character: \\n, \\x1b, \\u2028, \\U000e0001."""
    return repr(ch)[1:-1]


def sh(value: object) -> str:
    """One bash word that is exactly `value` (the run script, Dockerfile RUN lines, whose shell
    is bash): shlex's single quotes, or bash's $'...' when it holds an ASCII control character,
    which no line of a script or a Dockerfile may carry raw. A NUL cannot be in a bash string."""
    text = str(value)
    if "\x00" in text:
        raise ValueError(f"a NUL character cannot be passed to bash: {_shorten(text)!r}")
    if not _ASCII_CONTROL.search(text):  # shlex.quote's, without importing shlex on every render
        if not text:
            return "''"
        return text if _SHELL_SAFE.fullmatch(text) else "'" + text.replace("'", "'\"'\"'") + "'"
    return (
        "$'"
        + "".join(_escape(c) if _ASCII_CONTROL.match(c) else "\\" + c if c in "\\'" else c for c in text)
        + "'"
    )


def comment(value: object) -> str:
    """Text for the rest of a `#` line (Dockerfile, bash, Python, YAML, requirements.txt): a
    character that could end the line early is written as its escape (\\n, \\u2028)."""
    text = _bounded(value)
    if text.isprintable():  # (the common case, at C speed: printable() of every character)
        return text
    return "".join(c if printable(c) else _escape(c) for c in text)


def pystr(value: object) -> str:
    """Text between the double quotes of a Python string (a docstring): it can neither end the
    string nor start an escape, and reads back as exactly `value`."""
    text = str(value)
    if text.isprintable() and "\\" not in text and '"' not in text:
        return text
    return "".join("\\" + c if c in '\\"' else c if printable(c) else _escape(c) for c in text)


def py(value: object) -> str:
    """A Python literal that reads back as exactly `value` (strings, numbers, true/false, None,
    lists and dicts of them); a string is double-quoted, as JSON writes it."""
    if isinstance(value, str):
        return f'"{pystr(value)}"'
    if isinstance(value, (bool, int)) or value is None:
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(py, value)) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{py(k)}: {py(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"no Python literal for a {type(value).__name__}")


def dq(value: object) -> str:
    """Text between the double quotes of a Dockerfile value (LABEL, ENV): `\\`, `"` and `$` (the
    Dockerfile's variables) escaped; a character that would end the instruction shown as its
    escape (the Dockerfile has no way to carry it)."""
    text = _bounded(value)
    if text.isprintable() and not any(c in text for c in '\\"$'):
        return text
    return "".join("\\" + c if c in '\\"$' else c if printable(c) else _escape(c) for c in text)


def arg(value: object) -> str:
    """A Dockerfile ARG default: bare when it is one plain token (as the files always read),
    else double-quoted (dq), so no `$` or space in it is read by the Dockerfile."""
    text = _bounded(value)
    return text if BARE.fullmatch(text) else f'"{dq(text)}"'


def word(value: object) -> str:
    """One bare token of a line of requirements.txt or environment.yml, which have no quoting to
    rely on (pip expands ${VAR} and splits options on spaces; YAML reads `: `, ` #`, a leading
    `-`, `[` or `!`). Anything else is refused: the schema never lets such a value in."""
    text = _bounded(value)
    if not BARE.fullmatch(text):
        raise ValueError(
            f"{_shorten(text)!r} is not one plain token: it cannot be written into "
            "requirements.txt or environment.yml"
        )
    return text


def _bounded(value: object) -> str:
    text = str(value)
    if len(text) > MAX_LINE_VALUE:
        raise ValueError(
            f"a value of {len(text):,} characters is longer than any envbuild writes "
            f"into a line (at most {MAX_LINE_VALUE:,}): {_shorten(text)!r}"
        )
    return text


def _shorten(text: str) -> str:
    from envbuilder.text import shorten

    return shorten(text, 60)


def md(value: object) -> str:
    """Text inside a line of Markdown (a rendered folder's README.md): one line, and the
    characters that would start markup (code spans, table cells, emphasis, HTML, links, entity
    references such as `&#x202e;`, which would render as the character itself) as Markdown's
    backslash escapes."""
    return re.sub(r"([\\`*_{}\[\]<>|#!&])", r"\\\1", comment(value))


def line(value: object, limit: int = MAX_LINE_VALUE) -> str:
    """Text from outside envbuild (an index's strings, in a report) for one line of a terminal,
    a `#` comment or a Markdown code block: every character that is not printable written as its
    escape (C0 and C1 controls, so ESC and with it every CSI and OSC sequence; DEL; the bidi
    overrides and other format characters; line and paragraph separators), and text longer
    than `limit` cut, saying how long it was. Unlike `comment`, never refuses: a report shows
    what it was given."""
    from envbuilder.text import shorten

    text = shorten(str(value), limit)
    if text.isprintable():
        return text
    return "".join(c if printable(c) else _escape(c) for c in text)


def md_code_block(text: str) -> str:
    """`text` (lines already passed through `line`) as one fenced Markdown code block: the fence
    is a run of backticks longer than any in `text`, so no line of it can close the block, and
    nothing in it renders (links, HTML, mentions)."""
    runs: list[str] = re.findall(r"`+", text)
    longest = max((len(run) for run in runs), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text.rstrip(chr(10))}\n{fence}\n"


_TOML_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml(value: object) -> str:
    """A TOML basic string, quotes included, that reads back as exactly `value` (pixi.toml): `"`
    and `\\` escaped, and every character that is not printable (controls, line and paragraph
    separators, bidi overrides) written as its \\uXXXX or \\UXXXXXXXX escape, so it stays on
    its line and shows as what it is. A NUL cannot be in a value envbuild writes."""
    text = _bounded(value)
    if "\x00" in text:
        raise ValueError(f"a NUL character cannot be written into pixi.toml: {_shorten(text)!r}")
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    if any("\ud800" <= c <= "\udfff" for c in text):  # (TOML escapes only Unicode scalars)
        raise ValueError(f"a lone surrogate cannot be written into pixi.toml: {_shorten(text)!r}")

    def one(c: str) -> str:
        if c in '"\\':
            return "\\" + c
        if printable(c):
            return c
        return f"\\u{ord(c):04X}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08X}"

    return '"' + "".join(map(one, text)) + '"'


def tomlkey(value: object) -> str:
    """A TOML key: bare when it is one (letters, digits, `_`, `-`), else a quoted string
    (`ruamel.yaml` is one key, not a dotted path)."""
    text = _bounded(value)
    return text if _TOML_BARE_KEY.fullmatch(text) else toml(text)


FILTERS = {
    "sh": sh,
    "comment": comment,
    "pystr": pystr,
    "py": py,
    "dq": dq,
    "arg": arg,
    "word": word,
    "md": md,
    "toml": toml,
    "tomlkey": tomlkey,
}
