"""The `envbuild` command group: every command loads lazily (heavy imports such as docker,
requests or rattler stay inside the commands that need them, so `render` starts fast), and
`main` turns every failure into one paragraph and its exit code."""

from __future__ import annotations

import importlib
import sys

import click

from envbuilder.errors import EnvbuildError, UserError
from envbuilder.tools.run import interruption, sigterm_as_interrupt

# The actions' commands live in modules of their own, imported only when one runs (or help lists
# them): `render` pays nothing for build, lock or detect. click's lazy subcommands, name -> "module:command".
LAZY_COMMANDS = {
    "list": "envbuilder.cli.show:list_",
    "show": "envbuilder.cli.show:show",
    "check": "envbuilder.cli.check:check",
    "grid": "envbuilder.cli.grid:grid",
    "render": "envbuilder.cli.render:render",
    "build": "envbuilder.cli.build:build",
    "bake": "envbuilder.cli.bake:bake",
    "mirrors": "envbuilder.cli.mirrors:mirrors",
    "lock": "envbuilder.cli.lock:lock",
    "wheelhouse": "envbuilder.cli.wheelhouse:wheelhouse",
    "sbom": "envbuilder.cli.sbom:sbom",
    "detect": "envbuilder.cli.machine:detect",
    "doctor": "envbuilder.cli.machine:doctor",
    "diagnose": "envbuilder.cli.diagnose:diagnose",
    "verify": "envbuilder.cli.verify:verify",
    "install": "envbuilder.cli.install:install",
    "refresh": "envbuilder.cli.refresh:refresh",
    "affected": "envbuilder.cli.refresh:affected",
    "export-image": "envbuilder.cli.image:export_image",
    "import-image": "envbuilder.cli.image:import_image",
    "apptainer": "envbuilder.cli.apptainer:apptainer",
    "launch": "envbuilder.cli.launch:launch",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(LAZY_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            module, attr = LAZY_COMMANDS[name].split(":")
            command: click.Command = getattr(importlib.import_module(module), attr)
            return command
        return super().get_command(ctx, name)


# No auto_envvar_prefix: an option is read from the environment only where it says so
# (envvar=...), and docs/reference.md names every variable envbuild reads (tests/test_docs.py)
@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="envbuild")
def cli() -> None:
    """Reproducible GPU environments for LLM RL training, right for the GPU you have."""


# Optional dependencies -> the extra that installs them (pyproject.toml's optional-dependencies).
EXTRAS = {
    "docker": "actions",
    "requests": "actions",
    "pynvml": "actions",
    "rattler": "lock",
    "conda_lock": "lock",
    "uv": "lock",
    "tomli": "lock",
    "packaging": "actions",
}


def main(argv: list[str] | None = None) -> None:
    try:
        try:
            with sigterm_as_interrupt():
                cli.main(args=argv, prog_name="envbuild", standalone_mode=False)
        except ModuleNotFoundError as e:
            extra = EXTRAS.get((e.name or "").split(".")[0])
            if not extra:
                raise
            raise UserError(
                f"This command needs the {e.name!r} package, which is not installed: "
                f"it comes with envbuild's [{extra}] extra. Install it with "
                f"`pip install 'envbuild[{extra}]'` (from a checkout: "
                f"`.venv/bin/pip install -e '.[actions,lock]'`)."
            ) from None
    except (click.exceptions.Abort, KeyboardInterrupt) as e:  # (click wraps Ctrl-C in Abort)
        said, code = interruption(e)
        click.echo(said, err=True)
        sys.exit(code)
    except click.ClickException as e:
        e.show()
        sys.exit(2 if e.exit_code == 2 else e.exit_code)
    except EnvbuildError as e:
        click.echo(f"envbuild: error: {bounded_message(str(e))}", err=True)
        sys.exit(e.exit_code)
    except Exception as e:  # a bug: one paragraph, not a traceback (ENVBUILD_DEBUG=1 shows it)
        import os

        if os.environ.get("ENVBUILD_DEBUG") == "1":
            raise
        click.echo(internal_error_text(argv if argv is not None else sys.argv[1:], e), err=True)
        sys.exit(1)
    sys.exit(0)


def bounded_message(text: str) -> str:
    """A message as printed: any run of 200+ characters without a space (a value someone pasted
    or a hostile file carried, echoed back) cut to its start and its length; a URL's
    user:password@ as ***@; a control character (an overlay's file name's ESC) as its escape."""
    import re

    from envbuilder.text import printable, redact

    text = printable(redact(text))
    return re.sub(r"\S{200,}", lambda m: f"{m[0][:80]}...({len(m[0])} characters)", text)


def internal_error_text(argv: list[str], exc: BaseException) -> str:
    """The paragraph for an exception envbuild did not expect: which command, what broke, that
    it is envbuild's fault, and where to report it."""
    from envbuilder.text import printable, shorten

    command = printable(next((a for a in argv if not str(a).startswith("-")), ""))
    detail = printable(shorten(str(exc).splitlines()[0] if str(exc) else "", 200))
    return (
        f"envbuild: internal error in `envbuild {command}`: {type(exc).__name__}"
        + (f": {detail}" if detail else "")
        + ". This is a bug in envbuild, not in your input. "
        f"Please report it at {issue_tracker()} with this message, the command line and "
        "`envbuild --version`; run again with ENVBUILD_DEBUG=1 to get the full traceback."
    )


def issue_tracker() -> str:
    """Where to report bugs: the package's Project-URL (Issues), if the metadata has one."""
    try:
        from importlib.metadata import metadata

        for entry in map(str, metadata("envbuild").get_all("Project-URL") or []):
            label, _, url = entry.partition(",")
            if label.strip().lower() in ("issues", "bug tracker", "tracker"):
                return str(url).strip()
    except Exception:
        pass
    return "envbuild's issue tracker"
