"""A URL that may carry user:password@ (an index, a mirror's endpoint, HF_ENDPOINT): the one type
that carries it from where it enters (an option, the config's mirror set, the environment) to
where it is used. Printed, formatted or repr'd it shows ***@; only `reveal()` gives the URL
itself, and only the HTTP session (oci/http) and a child's environment (tools.uv.index_env)
call it. It is no str, so mypy --strict refuses it on a command line or in a written file."""

from __future__ import annotations

from envbuilder.text import redact, without_credentials


class SecretUrl:
    __slots__ = ("_url",)

    def __init__(self, url: str | SecretUrl) -> None:
        self._url = url.reveal() if isinstance(url, SecretUrl) else str(url)

    def reveal(self) -> str:
        """The URL with its credentials: for the HTTP session and a child's environment only."""
        return self._url

    @property
    def public(self) -> str:
        """The URL without its user:password@ (what a file or a label may name)."""
        return without_credentials(self._url)

    def __str__(self) -> str:
        return redact(self._url)

    def __repr__(self) -> str:
        return f"SecretUrl({redact(self._url)!r})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretUrl) and other._url == self._url

    def __hash__(self) -> int:
        return hash(self._url)

    def __reduce__(self) -> tuple[object, ...]:  # (a pickle is a file: it names no password)
        raise TypeError("a SecretUrl is not pickled: pass reveal() where a child needs it")


def secret(url: str | SecretUrl | None) -> SecretUrl | None:
    """`url` carried as a SecretUrl (None stays None)."""
    return None if url is None else SecretUrl(url)
