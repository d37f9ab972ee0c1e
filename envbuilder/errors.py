"""The two kinds of failure a user can meet, each with its exit code."""


class EnvbuildError(Exception):
    """A failure the user can act on. The message says what, why and what to do."""

    exit_code = 2


class UserError(EnvbuildError):
    """Bad input or an incompatible combination (exit 2)."""

    exit_code = 2


class ActionError(EnvbuildError):
    """An external action failed: daemon, registry, download (exit 1)."""

    exit_code = 1
