"""The `envbuild` command line: the group and `main` (cli/app.py); each command in a module of
its own, loaded when it runs (cli/app.py LAZY_COMMANDS)."""

from envbuilder.cli.app import cli, main  # noqa: F401  (the console script: envbuilder.cli:main)
