"""py-rattler's solve, run in a child process.

py-rattler 0.28 now and then kills the interpreter at exit, after its work is done (SIGSEGV, or
an abort in PyGILState_Release from one of its runtime threads; about one run in seven here).
In a child that writes its result to stdout and then leaves with os._exit, such a crash cannot
turn a finished lock, or a clean error, into a wrong exit code of `envbuild`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TypedDict, Union

MARK = "envbuild-rattler-result: "


class SolveRequest(TypedDict):
    channels: list[str]
    specs: list[str]
    platforms: list[str]
    virtual_packages: dict[str, str]


class IndexRequest(TypedDict):
    op: str  # "index"
    channel_dir: str


class Solved(TypedDict):
    """A package of the solution, as conda.CondaRecord takes it."""

    name: str
    version: str
    build: str
    url: str
    md5: str
    sha256: str
    depends: list[str]


class Result(TypedDict, total=False):
    """The worker's answer: one key, ok (the solution, or True for an index), unsat, fetch or
    invalid (rattler's message)."""

    ok: Union[list[Solved], bool]
    unsat: str
    fetch: str
    invalid: str


def call(request: Union[SolveRequest, IndexRequest]) -> Result:
    """Run the solve described by `request` in a fresh interpreter; its result as a dict with
    one key: ok (records), unsat, fetch or invalid (rattler's message)."""
    proc = subprocess.run(
        [sys.executable, "-m", __name__], input=json.dumps(request), capture_output=True, text=True
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            result: Result = json.loads(line[len(MARK) :])  # (main's own, written just now)
            return result
    raise RuntimeError(
        f"the py-rattler worker ended with exit code {proc.returncode} and no "
        f"result:\n{proc.stderr.strip()[-2000:]}"
    )


def _solve(req: SolveRequest) -> list[Solved]:
    import asyncio

    from rattler import Channel, GenericVirtualPackage, PackageName, Version, solve
    from rattler.package import BuildString
    from rattler.platform import Subdir

    def vp(name: str, spec: str) -> GenericVirtualPackage:
        version, _, build = spec.partition(" ")
        return GenericVirtualPackage(PackageName(name), Version(version), BuildString(build or "0"))

    records = asyncio.run(
        solve(
            sources=[Channel(c) for c in req["channels"]],
            specs=req["specs"],
            platforms=[Subdir(p) for p in req["platforms"]],
            virtual_packages=[vp(n, s) for n, s in sorted(req["virtual_packages"].items())],
        )
    )
    return [
        {
            "name": r.name.normalized,
            "version": str(r.version),
            "build": str(r.build),
            "url": r.url,
            "md5": r.md5.hex() if r.md5 else "",
            "sha256": r.sha256.hex() if r.sha256 else "",
            "depends": [str(d) for d in r.depends],
        }
        for r in records
    ]


def _index(req: IndexRequest) -> bool:
    """Write repodata.json for every subdir of a local channel folder."""
    import asyncio
    from pathlib import Path

    from rattler.index import index_fs

    asyncio.run(index_fs(Path(req["channel_dir"]), write_zst=False, write_shards=False, force=True))
    return True


def main() -> None:
    from rattler import exceptions as rx

    req = json.loads(sys.stdin.read())  # (call's request)
    result: Result
    try:
        result = {"ok": _index(req) if req.get("op") == "index" else _solve(req)}
    except rx.SolverError as e:
        result = {"unsat": str(e)}
    except (rx.GatewayError, rx.FetchRepoDataError, rx.IoError, OSError) as e:
        result = {"fetch": str(e)}
    except (
        rx.InvalidChannelError,
        rx.InvalidMatchSpecError,
        rx.InvalidUrlError,
        rx.InvalidPackageNameError,
        rx.InvalidVersionError,
    ) as e:
        result = {"invalid": str(e)}
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
