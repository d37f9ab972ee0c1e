"""Text as envbuild prints it: values echoed back in a message (shortened), and a URL's
credentials, which no message, file or label ever shows. The one place for both; everything
that prints or writes a URL goes through `redact` or `without_credentials`.

(images/flash_attn_wheel.py keeps a copy of the redaction: it runs alone in the image's builder stage,
with the standard library only.)"""

from __future__ import annotations

import re
from typing import Iterable

# a URL's `user:password@` (any scheme), as a message or a file may carry it: up to the LAST '@'
# of the authority (it ends at the first '/', '?' or '#'), where requests, uv and pip split it, so a
# raw '@' in a password (`Re@Tail77`) is hidden whole
USERINFO = re.compile(r"(://)[^/?#\s]*@")
# an Authorization value (compiled by `re` when a message is first redacted, not at import)
_AUTH_VALUE = r"\b(Bearer|Basic)(\s+)(?![A-Za-z]+=\")[A-Za-z0-9._~+/-]{6,}=*"


def shorten(text: str, limit: int = 80) -> str:
    """A value as echoed back in a message: at most `limit` characters."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def redact(text: str) -> str:
    """`text` (a URL, or a message naming URLs) with every URL's user:password@ shown as ***@
    and every Authorization value (Bearer/Basic ...) as ***: what any message may print."""
    text = USERINFO.sub(r"\1***@", str(text))
    return re.sub(_AUTH_VALUE, lambda m: f"{m[1]}{m[2]}***", text, flags=re.I)


# what a terminal acts on rather than shows: C0 controls but newline and tab, DEL, C1 controls
# (ESC starts a title change, a screen clear, a hyperlink), and the Unicode line separators
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """`text` with every control character a terminal would act on shown as its escape
    (ESC as \\x1b): a file name or value from outside reaches the terminal as text."""
    return _CONTROL.sub(lambda m: ascii(m[0])[1:-1], str(text))


def sentences(clauses: Iterable[str]) -> str:
    """Clauses written as one message: each its own sentence (a capital, a full stop), each once."""
    out = []
    for clause in dict.fromkeys(c.strip().rstrip(".") for c in clauses if c.strip()):
        out.append(clause[:1].upper() + clause[1:] + ".")
    return " ".join(out)


def without_credentials(url: str) -> str:
    """`url` without its user:password@ (what files, labels and the image may name)."""
    return USERINFO.sub(r"\1", url)


def canonical_name(name: str) -> str:
    """A Python package's name as PEP 503 compares names (extras and spaces left off):
    `Flash_Attn[x]` -> `flash-attn`."""
    return _SEPARATORS.sub("-", name.split("[")[0].strip()).lower()


_SEPARATORS = re.compile(r"[-_.]+")


def is_plain_name(name: object) -> bool:
    """One file or folder name that stays in its folder: a non-empty printable string with no
    separator, not '.' or '..', not hidden. The one test of such a name: a profile's folder under
    out/ or lockfiles/, a wheelhouse's file names, a lock's part names."""
    return (
        isinstance(name, str)
        and name != ""
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and name.isprintable()
    )
