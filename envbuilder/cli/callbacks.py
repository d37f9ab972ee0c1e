"""The options' click callbacks: each value checked as it is parsed, refused with exit 2 and
what a right one looks like (click.BadParameter)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence, TypeVar

import click

from envbuilder.secret import SecretUrl

T = TypeVar("T")  # an option's value, as click parsed it (text, a path, a tuple of them)


class AbsPath(click.Path):
    """A path option or argument, made absolute where it enters (against the folder envbuild
    runs in): a relative one handed to a child that runs in another folder (uv build in its
    scratch folder, skopeo in its work folder, the smoke test in the rendered one) named a file
    that is not there. Empty and '-' stay as given, for their own checks; a trailing '/' stays
    (file_out refuses it)."""

    def convert(
        self, value: str | os.PathLike[str], param: click.Parameter | None, ctx: click.Context | None
    ) -> str | bytes | os.PathLike[str]:
        got = super().convert(value, param, ctx)
        if isinstance(value, str) and value in ("", "-"):
            return got
        if isinstance(got, Path):
            return got.absolute()
        if isinstance(got, str) and not os.path.isabs(got):
            return os.path.join(os.getcwd(), got)
        return got


def no_empty_url(ctx: click.Context, param: click.Parameter, value: T) -> T:
    """URL options: an empty value (a careless `--index-url "$MIRROR"`) is refused, exit 2,
    never taken as "the default"."""
    values: Sequence[object] = value if isinstance(value, (tuple, list)) else (value,)
    if any(v is not None and not str(v).strip() for v in values):
        raise click.BadParameter(
            f"is empty. Give the {param.metavar or 'URL'}, or leave the option out to use the default."
        )
    return value


def secret_url(ctx: click.Context, param: click.Parameter, value: str | None) -> SecretUrl | None:
    """no_empty_url, and the URL carried on as a SecretUrl (its password printed as ***@)."""
    no_empty_url(ctx, param, value)
    return None if value is None else SecretUrl(value)


def not_empty(ctx: click.Context, param: click.Parameter, value: T) -> T:
    """An option whose empty value would silently mean something else (`--model ''` no model,
    `--lock-dir ''` the current folder, `--data-pvc ''` no volume) is refused, exit 2."""
    if value is not None and not str(value).strip():
        raise click.BadParameter("is empty. Give a value, or leave the option out.")
    return value


def file_out(ctx: click.Context, param: click.Parameter, value: T) -> T:
    """-o FILE (and --html FILE): not empty, and not a name ending in '/' (`-o newdir/` wrote
    a file named newdir)."""
    not_empty(ctx, param, value)
    if value is not None and str(value).endswith(("/", "/.", "/..")):
        raise click.BadParameter(
            f"{value!r} names a folder (it ends in '/'); give the file to write, e.g. {str(value).rstrip('/.')}/FILE."
        )
    return value


def driver_version(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from envbuilder.model.versions import is_driver_version

    if value is not None and not is_driver_version(value):
        raise click.BadParameter(
            f"{value!r} is not an NVIDIA driver version like 550.54.14 "
            "(nvidia-smi shows it as 'Driver Version')."
        )
    return value


INDEX_URL = re.compile(r"^(https?://[^\s/]+(/\S*)?|file:///\S*)$")


def index_url(ctx: click.Context, param: click.Parameter, value: str | None) -> SecretUrl | None:
    """An index URL option, carried from here on as a SecretUrl (its password printed as ***@)."""
    from envbuilder.text import redact

    if value is not None and not INDEX_URL.match(value):
        raise click.BadParameter(  # (echoed as ***@: --flash-attn-index does the same)
            f"{redact(value)!r} is not an index URL (http://, https:// or file:///). "
            "Pass the URL of a PEP 503 simple index, e.g. "
            "https://pypi.org/simple."
        )
    return None if value is None else SecretUrl(value)


def json_api_root(ctx: click.Context, param: click.Parameter, value: str | None) -> SecretUrl:
    """refresh's --index-url: the root of PyPI's JSON API (a trailing /simple dropped)."""
    from envbuilder.text import redact
    from envbuilder.upstream.pypi import DEFAULT_INDEX

    if value is not None and not value.strip():  # (a careless "$MIRROR" is no default)
        raise click.BadParameter(
            "is empty. Pass the root of an index that serves PyPI's JSON "
            f"API, or leave --index-url out for {DEFAULT_INDEX}."
        )
    value = (value or DEFAULT_INDEX).strip()
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
        raise click.BadParameter(
            f"{redact(value)!r} is not an http(s) URL. Pass the root of an index "
            f"that serves PyPI's JSON API, e.g. {DEFAULT_INDEX}."
        )
    value = value.rstrip("/")
    return SecretUrl(value[: -len("/simple")] if value.endswith("/simple") else value)
