"""The `locked` context of the templates (`render --locked`, `--wheelhouse`): what a lock pins of
one profile, as lock.lockfile.for_render reads it from the lock folder or a wheelhouse's copy.

Its own module in render/, below the lock package (context.prepare and lock.lockfile make it; the
templates read it), so render names the type without importing the lock."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from envbuilder.record import Record

if TYPE_CHECKING:
    from envbuilder.render.outdir import Checked


class LockedContext(Record):
    """sbom: the CycloneDX SBOM of what the image holds (lock/sbom.py), and its sha256 (a label);
    images: role (devel, runtime) -> the base image, by digest where the lock has it
    (images_pinned); layers: install layer -> its hashed requirement file (None: the layer is
    empty); files: those files' names -> text; input_sha256: the lock's input hash (a label);
    wheelhouse: installs come from a wheelhouse with no index; links: build-context path -> the
    wheelhouse file placed there; apex_source: the apex archive the lock pins (filename,
    sha256); flash_attn_wheels: {file name: sha256} of the flash-attn wheels it pins; uv_wheel:
    the uv wheel's file name where the wheelhouse carries it (None: pip installs)."""

    sbom: str
    sbom_sha256: str
    images: Mapping[str, str]
    images_pinned: bool
    layers: Mapping[str, str | None]
    files: Mapping[str, str]
    input_sha256: str
    wheelhouse: bool
    links: Mapping[str, Checked]
    apex_source: Mapping[str, object] | None
    flash_attn_wheels: Mapping[str, str] | None
    uv_wheel: str | None
    # the sdist of TransformerEngine's PyTorch extension the lock pins (filename, sha256), which
    # the builder compiles from the wheelhouse (the Megatron engine); None elsewhere
    te_source: Mapping[str, object] | None = None
