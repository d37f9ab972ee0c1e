"""The one grammar of an image reference, Docker's: [HOST[:PORT]/]PATH[:TAG][@sha256:HEX].

HOST is a DNS name, `localhost` or a bracketed IPv6 address; PATH is lowercase components
separated by '/'; TAG at most 128 characters. Every place that takes an image reference checks
it with this one pattern: the matrix's images (model/schema.IMAGE), export-image and
import-image (oci/archive.py), apptainer --image (engines/apptainer.py), the launchers. It
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
REFERENCE = re.compile(PATTERN, re.ASCII)
# a repository in a registry, without its host: PATH[:TAG]
NAME = re.compile(rf"{COMPONENT}(?:/{COMPONENT})*(?::{TAG})?", re.ASCII)


def match(ref: str) -> re.Match | None:
    """The reference's parts (name, tag, digest) when `ref` is one, else None."""
    return REFERENCE.fullmatch(ref) if isinstance(ref, str) else None
