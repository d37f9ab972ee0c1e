"""The `envbuild` command line: the group and `main` (cli/app.py); each command in a module of
its own, loaded when it runs (cli/app.py LAZY_COMMANDS)."""

from envbuilder.cli.app import cli, main

__all__ = ["cli", "main"]  # the console script: envbuilder.cli:main
