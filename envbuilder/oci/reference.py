"""The one grammar of an image reference, Docker's: [HOST[:PORT]/]PATH[:TAG][@sha256:HEX].

HOST is a DNS name, `localhost` or a bracketed IPv6 address; PATH is lowercase components
separated by '/'; TAG at most 128 characters. Every place that takes an image reference checks
it with this one pattern: the matrix's images (model/schema.IMAGE), export-image and
import-image (engines/archive.py), apptainer --image (engines/apptainer.py), the launchers. It
imports nothing, so any layer may use it."""

from __future__ import annotations

import re

LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
HOST = rf"(?:localhost|\[[0-9a-fA-F:]+\]|{LABEL}(?:\.{LABEL})*)(?::[0-9]{{1,5}})?"
COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST = r"sha256:[0-9a-f]{64}"
PATTERN = (
    rf"(?P<name>(?:{HOST}/)?{COMPONENT}(?:/{COMPONENT})*)"
    rf"(?::(?P<tag>{TAG}))?(?:@(?P<digest>{DIGEST}))?"
)
# a repository in a registry, without its host: PATH[:TAG]
NAME_PATTERN = rf"{COMPONENT}(?:/{COMPONENT})*(?::{TAG})?"
_COMPILED = {"REFERENCE": PATTERN, "NAME": NAME_PATTERN}
REFERENCE: re.Pattern[str]  # compiled on first use (module __getattr__): the render path imports
NAME: re.Pattern[str]  # this module for PATTERN alone, and compiling both cost 0.7 ms a command


def _compiled(name: str) -> re.Pattern[str]:
    found = globals().get(name)
    if found is None:
        found = globals()[name] = re.compile(_COMPILED[name], re.ASCII)
    return found


def __getattr__(name: str) -> re.Pattern[str]:
    if name not in _COMPILED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _compiled(name)


def match(ref: str) -> re.Match[str] | None:
    """The reference's parts (name, tag, digest) when `ref` is one, else None."""
    return _compiled("REFERENCE").fullmatch(ref) if isinstance(ref, str) else None
