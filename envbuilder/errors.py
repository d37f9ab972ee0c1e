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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread (cli.main's handler) as Ctrl-C is: every cleanup that
    ends children and removes work folders on Ctrl-C runs for it too; the command exits 143."""


# the optional-dependency groups of pyproject.toml: which command needs which packages
EXTRAS = {"actions": ("docker", "requests"), "lock": ("rattler", "conda_lock", "requests")}


def need_extra(command: str, extra: str, modules: tuple[str, ...] | None = None) -> None:
    """Refuse (exit 2) before `command` starts when a module of its extra is not installed,
    naming the extra and the pip command; a missing SDK is never reported as something else (a
    daemon that does not answer, a registry that did)."""
    import importlib.util
    import sys

    def absent(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is None
        except (ImportError, ValueError):  # a module blocked or half there: not usable either
            return True

    missing = [m for m in (modules or EXTRAS[extra]) if absent(m)]
    if missing:
        raise UserError(
            f"`envbuild {command}` needs the Python package"
            f"{'s' if len(missing) > 1 else ''} {', '.join(missing)} (envbuild's "
            f"`{extra}` extra), which {'are' if len(missing) > 1 else 'is'} not "
            f"installed in the Python envbuild runs from ({sys.executable}). Install "
            f"it: pip install 'envbuild[{extra}]' (from a checkout: pip install "
            f"-e '.[{extra}]')."
        )
