"""uv, the resolver and installer envbuild drives (lock, verify, the wheelhouse's sdist builds):
where its binary is, its version, and the environment it runs in."""

from __future__ import annotations

import os
import subprocess

from envbuilder.errors import UserError
from envbuilder.secret import SecretUrl


def uv_bin(command: str | None = None) -> str:
    """The uv binary: the `uv` package's (envbuild's lock extra), else one on PATH; `command`
    names the envbuild command that needs it in the refusal."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        import shutil

        found = shutil.which("uv")
        if not found:
            who = f"`envbuild {command}`" if command else "envbuild (lock, check --resolve, verify)"
            raise UserError(
                f"uv is not installed: {who} resolves and installs Python packages with it. "
                "It comes with envbuild's `lock` extra: pip install 'envbuild[lock]' (from a "
                "checkout: pip install -e '.[lock]'); a uv on PATH serves too."
            ) from None
        return found


def uv_version() -> str:
    out = subprocess.run([uv_bin(), "--version"], capture_output=True, text=True).stdout.split()
    return out[1] if len(out) > 1 else "unknown"


def uv_env() -> dict[str, str]:
    """The caller's environment minus uv's index settings: envbuild names its indexes itself."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (
            k.startswith("UV_")
            and k not in ("UV_CACHE_DIR", "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT", "UV_CONCURRENT_DOWNLOADS")
        )
    }
    env["UV_PYTHON_DOWNLOADS"] = "never"  # wheels resolve from tags; never fetch a CPython
    return env


def index_env(index: SecretUrl, extra: SecretUrl | None = None) -> dict[str, str]:
    """The indexes a uv (or pip) child installs or resolves from, as its environment, never its
    argv: a URL's user:password@ on a command line is readable by every local user in
    /proc/PID/cmdline, a process's environment by its owner alone. uv searches the extra index
    first, as with --index-url / --extra-index-url; pip reads PIP_INDEX_URL the same way."""
    env = {"UV_INDEX_URL": index.reveal(), "PIP_INDEX_URL": index.reveal()}
    if extra:
        env.update(UV_EXTRA_INDEX_URL=extra.reveal(), PIP_EXTRA_INDEX_URL=extra.reveal())
    return env
